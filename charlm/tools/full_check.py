"""``charlm check --full``: everything a GPU machine should be asked, in one command and a time budget.

The steps, in order, each in a child process with a time limit:

1. **check**: every row of ``charlm check --json`` (fast paths against the equations and eager);
2. **cuda tests**: ``pytest -m cuda`` and the cells' float64 checks on the device
   (``CHARLM_TEST_DEVICE``), from a source checkout (a GPU only);
3. **benchmark**: ``charlm bench --cells ... --json`` in fp32, bf16 and bf16 with CUDA graphs, each
   cell's ratio to PyTorch's fused LSTM (cuDNN on a GPU), per character and per FLOP;
4. **training**: each cell trained briefly on the embedded corpus (``pydoc``), eagerly and with
   CUDA graphs: both validation bpc, the ``cuda_graph`` record, characters a second;
5. **benchmark (compile)**: the benchmark under ``--compile``, last, in the time that is left.

A step's limit is its share of the time left, so a step that finishes early leaves its time to
the next ones; a step that runs past its limit is stopped and named as out of time, and the steps
after it still run. ``report.json`` and ``report.md`` are rewritten after every step, so a
machine taken away midway still leaves what was measured. On the CPU the sizes are small and
the CUDA-only parts are skipped, saying so.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from charlm.tools.full_check_report import bench_problems, markdown, performance_notes, training_verdicts

SHARES = {"check": 3, "cuda tests": 2, "benchmark": 4, "training": 3, "benchmark (compile)": 1}


@dataclasses.dataclass(frozen=True)
class Scale:
    """How big the benchmark and the trainings are on this kind of device."""

    bench: tuple[str, ...]  # charlm bench options
    params: str  # each training's parameter budget
    batch_size: int
    bptt: int
    windows: int  # training windows per run


GPU_SCALE = Scale(
    ("--params", "10M", "--steps", "3", "--repeat", "2", "--sample-length", "100"),
    params="1M",
    batch_size=64,
    bptt=50,
    windows=60,
)
CPU_SCALE = Scale(
    ("--params", "50K", "--batch-size", "16", "--bptt", "20", "--steps", "1", "--repeat", "1", "--sample-length", "10"),
    params="50K",
    batch_size=16,
    bptt=20,
    windows=10,
)


@dataclasses.dataclass
class Step:
    """One step's outcome: ``status`` is pass, fail, skipped (with why) or out of time."""

    name: str
    status: str = "not run"
    seconds: float = 0.0
    limit_seconds: float = 0.0
    detail: str = ""  # one line: what it found


class FullCheck:
    """The steps against ``device`` for ``cells``, within ``budget_seconds``, reported under ``out``."""

    def __init__(self, device: torch.device, cells: list[str], budget_seconds: float, out: Path, progress=None):
        self.device, self.cells, self.out = device, cells, out
        self.cuda = device.type == "cuda"
        self.scale = GPU_SCALE if self.cuda else CPU_SCALE
        self.deadline = time.monotonic() + budget_seconds
        self.budget_seconds = budget_seconds
        self.progress = progress or (lambda message: None)
        self.steps = {name: Step(name) for name in SHARES}
        self.report: dict = {
            "budget_seconds": budget_seconds,
            "cells": cells,
            "device": str(device),
            "environment": environment(device),
        }
        self.failures: list[str] = []

    def run(self) -> dict:
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        runners = {
            "check": self._check,
            "cuda tests": self._cuda_tests,
            "benchmark": self._benchmark,
            "training": self._training,
            "benchmark (compile)": self._benchmark_compile,
        }
        for name, step in self.steps.items():
            self.progress(f"check --full: {name}")
            started = self._step_started = time.monotonic()
            step.status, step.limit_seconds = "running", self._limit(name)
            runners[name](step)
            step.seconds = round(time.monotonic() - started, 1)
            self._write()
        return self.report

    # --- the steps -------------------------------------------------------------------------------
    def _check(self, step: Step) -> None:
        result = self._child(
            step, "check", [*charlm(), "check", "--device", str(self.device), "--cells", ",".join(self.cells), "--json"]
        )
        if result is None:
            return
        try:
            rows = json.loads(result.stdout)["rows"]
        except (ValueError, KeyError):
            return self._fail(step, f"check gave no rows (exit {result.returncode}): {last_line(result.stderr)}")
        self.report["check"] = rows
        failed = [row for row in rows if row["result"] == "fail"]
        for row in failed:
            self.failures.append(f"check: {row['check']}: {row['figure']}")
        passed = sum(row["result"] == "pass" for row in rows)
        step.status, step.detail = (
            ("fail" if failed else "pass"),
            f"{passed} pass, {len(failed)} fail, {len(rows)} rows",
        )

    def _cuda_tests(self, step: Step) -> None:
        tests = Path(__file__).resolve().parents[2] / "tests"
        if not self.cuda:
            step.status = "skipped: no CUDA device (the cuda tests are skipped there)"
            return
        if not (tests / "conftest.py").is_file():
            step.status = "skipped: not a source checkout (the tests are in charlm's repository)"
            return
        if importlib.util.find_spec("pytest") is None:
            step.status = "skipped: pytest is not installed"
            return
        summaries = []
        for label, arguments, environment_extra in (
            ("pytest -m cuda", ["-m", "cuda", str(tests / "runtime" / "test_cuda.py")], {}),
            (
                f"CHARLM_TEST_DEVICE={self.device} pytest tests/cells",
                [str(tests / "cells")],
                {"CHARLM_TEST_DEVICE": str(self.device)},
            ),
        ):
            workers = ["-n", "4"] if importlib.util.find_spec("xdist") else []
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-o",
                "addopts=",
                "-q",
                "-p",
                "no:cacheprovider",
                *workers,
                *arguments,
            ]
            result = self._child(
                step,
                label,
                command,
                environment_extra,
                cwd=tests.parent,
                limit=max(1.0, self._left_in(step) / (2 - len(summaries))),
            )
            if result is None:
                return
            summary = last_line(result.stdout)
            summaries.append({"command": label, "exit": result.returncode, "summary": summary})
            if result.returncode not in (0, 5):  # 5: nothing collected
                self.failures.append(f"cuda tests: {label}: {summary}")
        self.report["cuda_tests"] = summaries
        step.status = "fail" if any(s["exit"] not in (0, 5) for s in summaries) else "pass"
        step.detail = "; ".join(f"{s['command']}: {s['summary']}" for s in summaries)

    def _benchmark(self, step: Step) -> None:
        variants = [("fp32", []), ("bf16", ["--precision", "bf16"])]
        if self.cuda:
            variants.append(("bf16 + graphs", ["--precision", "bf16", "--cuda-graph"]))
        self._bench_variants(step, variants)
        if not self.cuda:
            step.detail += "; bf16 + graphs skipped: no CUDA device"

    def _benchmark_compile(self, step: Step) -> None:
        if not self.cuda:
            step.status = "skipped: compiling every cell takes minutes on a CPU (charlm bench --compile)"
            return
        self._bench_variants(step, [("fp32 + compile", ["--compile"])])

    def _bench_variants(self, step: Step, variants: list) -> None:
        tables = self.report.setdefault("benchmark", {})
        earlier = len(self.failures)
        for index, (label, options) in enumerate(variants):
            command = [
                *charlm(),
                "bench",
                "--cells",
                ",".join(self.cells),
                "--device",
                str(self.device),
                *self.scale.bench,
                *options,
                "--json",
            ]
            result = self._child(step, f"bench {label}", command, limit=self._left_in(step) / (len(variants) - index))
            if result is None:
                return
            try:
                tables[label] = json.loads(result.stdout)
            except ValueError:
                return self._fail(step, f"bench {label} crashed (exit {result.returncode}): {last_line(result.stderr)}")
            for problem in bench_problems(label, tables[label], self.cuda):
                self.failures.append(f"bench {label}: {problem}")
            self._write()
        problems = self.failures[earlier:]
        step.status = "fail" if problems else "pass"
        step.detail = f"{', '.join(label for label, _ in variants)}: " + (
            f"{len(problems)} problem(s)" if problems else "every cell ran"
        )
        self.report["performance"] = performance_notes(tables)

    def _training(self, step: Step) -> None:
        log = self.out / "training.jsonl"
        arguments = {
            "out": str(self.out),
            "device": str(self.device),
            "cells": self.cells,
            **{key: getattr(self.scale, key) for key in ("params", "batch_size", "bptt", "windows")},
        }
        result = self._child(
            step, "training", [sys.executable, "-m", "charlm.tools.full_check_training", json.dumps(arguments)]
        )
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        self.report["training"] = rows = training_verdicts(rows, self.cuda)
        problems = [row for row in rows if row.get("problem")]
        for row in problems:
            self.failures.append(f"training {row['cell']} ({row['mode']}): {row['problem']}")
        if result is None:  # out of time: what finished is reported
            step.detail = f"{len(rows)} run(s) finished before the limit; " + step.detail
        elif result.returncode != 0:
            self._fail(step, f"training stopped (exit {result.returncode}): {last_line(result.stderr)}")
        else:
            step.status = "fail" if problems else "pass"
            step.detail = f"{len(rows)} runs" + (f", {len(problems)} with a problem" if problems else "")

    # --- plumbing ------------------------------------------------------------------------------------
    def _limit(self, name: str) -> float:
        names = list(SHARES)
        later = sum(SHARES[other] for other in names[names.index(name) :])
        return max(0.0, (self.deadline - time.monotonic()) * SHARES[name] / later)

    def _left_in(self, step: Step) -> float:
        return max(1.0, step.limit_seconds - (time.monotonic() - self._step_started))

    def _child(self, step: Step, label: str, command: list[str], environment_extra=None, cwd=None, limit=None):
        """Runs ``command`` within the step's time (or ``limit``); its output is kept in logs/. None
        where it ran out of time (the step is then out of time)."""
        limit = self._left_in(step) if limit is None else limit
        log = self.out / "logs" / (label.replace(" ", "_").replace("/", "_").replace("=", "-") + ".txt")
        env = {**os.environ, **(environment_extra or {})}
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=cwd)
        except subprocess.TimeoutExpired as expired:
            log.write_text(
                f"$ {' '.join(command)}\n(out of time after {limit:.0f} "
                f"s)\n{text_of(expired.stdout)}\n{text_of(expired.stderr)}"
            )
            step.status = "out of time"
            step.detail = f"{label} ran past its {limit:.0f} s"
            self.failures.append(f"{step.name}: out of time ({label} ran past its {limit:.0f} s)")
            return None
        log.write_text(f"$ {' '.join(command)}\n(exit {result.returncode})\n{result.stdout}\n{result.stderr}")
        return result

    def _fail(self, step: Step, message: str) -> None:
        step.status, step.detail = "fail", message
        self.failures.append(f"{step.name}: {message}")

    def _write(self) -> None:
        self.report["steps"] = [dataclasses.asdict(step) for step in self.steps.values()]
        self.report["failures"] = self.failures
        self.report["out_of_time"] = [step.name for step in self.steps.values() if step.status == "out of time"]
        (self.out / "report.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (self.out / "report.md").write_text(markdown(self.report))


def charlm() -> list[str]:
    return [sys.executable, "-m", "charlm"]


def text_of(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def environment(device: torch.device) -> dict:
    """What the figures were measured on."""
    facts = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
        "tf32": "off unless --tf32 (matmul and cuDNN alike)",
        "cpu_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts.update(
            gpu=properties.name,
            gpu_memory_gib=round(properties.total_memory / 2**30, 1),
            capability=f"{properties.major}.{properties.minor}",
        )
    else:
        facts["cpu"] = platform.processor() or platform.machine()
    return facts
