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

SHARES = {"check": 3, "cuda tests": 2, "benchmark": 4, "training": 3, "benchmark (compile)": 1}
# A graphed run against the eager one: the same arithmetic, so a mistake in the graphs (a state not
# carried, a weight read stale) shows within the first windows, in the loss at step 10. The validation
# bpc at the end is compared too, but only noted: some runs are not repeatable on a GPU (rnn through
# cuDNN on an H200: two eager runs of one seed ended at 3.58 and 3.98 bpc, their step-10 losses equal).
FIRST_LOSS_GAP = 1e-3  # a failure: the loss at step 10
GRAPH_BPC_GAP = 0.01  # a note: the validation bpc at the end
GOAL_PER_FLOP = 0.5  # the performance goal: bf16 with graphs at least half the fused LSTM's rate per FLOP
SLOWER_MARGIN = 0.95  # graphs "slower than eager" below this fraction of eager's rate (the rounds' noise)


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
        result = self._child(step, "training", [sys.executable, "-m", "charlm.tools.full_check", json.dumps(arguments)])
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


def bench_problems(label: str, table: dict, cuda: bool) -> list[str]:
    """What in one benchmark run is a failure: a fast path not used, a wrong layer type."""
    problems = []
    for result in table["results"][1:]:
        name = result["name"]
        if cuda and result.get("eval_path") != "cuda graph":
            problems.append(f"{name}: evaluation {result.get('eval_path')}")
        wanted = {"graphs": "cuda graph", "compile": "compiled"}
        for word, path in wanted.items():
            if word in label and result.get("train_path") != path:
                problems.append(f"{name}: training {result.get('train_path')}")
        if "bf16" in label and "float16" in result.get("layer_dtypes", []):
            problems.append(f"{name}: a layer ran in float16 under bf16")
    return problems


def performance_notes(tables: dict) -> dict:
    """The goal, measured: cells under half the fused LSTM's rate per FLOP in bf16 with graphs, and
    cells whose graphs trained slower than eager (bf16 both)."""
    notes = {}
    graphed, eager = tables.get("bf16 + graphs"), tables.get("bf16")
    if graphed:
        notes["below_goal_per_flop"] = [
            {"cell": r["name"], "ratio": round(r["train_ratio_flop_normalised"], 3)}
            for r in graphed["results"][1:]
            if r["train_ratio_flop_normalised"] < GOAL_PER_FLOP
        ]
    if graphed and eager:
        rates = {r["name"]: r["train_chars_per_second"]["median"] for r in eager["results"][1:]}
        notes["graphs_slower_than_eager"] = [
            {"cell": r["name"], "graphs_over_eager": round(r["train_chars_per_second"]["median"] / rates[r["name"]], 3)}
            for r in graphed["results"][1:]
            if r["name"] in rates and r["train_chars_per_second"]["median"] < SLOWER_MARGIN * rates[r["name"]]
        ]
    return notes


def training_verdicts(rows: list[dict], cuda: bool) -> list[dict]:
    """Each run's ``problem``, if it has one: an error, a graph not used or not checked, or a graphed
    loss at step 10 more than ``FIRST_LOSS_GAP`` from the eager run's; and a ``note`` where only the
    validation bpc at the end differs (by more than ``GRAPH_BPC_GAP``)."""
    eager = {row["cell"]: row for row in rows if row["mode"] == "eager"}
    for row in rows:
        if row.get("error"):
            row["problem"] = row["error"]
        elif row["mode"] == "cuda graph":
            record = row.get("cuda_graph") or {}
            if not (record.get("active") and record.get("checked")):
                row["problem"] = f"graphs not used: {record.get('failure')}"
            elif row["cell"] in eager and eager[row["cell"]].get("valid_bpc") is not None:
                reference = eager[row["cell"]]
                row["bpc_gap"] = abs(row["valid_bpc"] - reference["valid_bpc"])
                loss_gap = abs((row.get("first_loss") or 0.0) - (reference.get("first_loss") or 0.0))
                if loss_gap > FIRST_LOSS_GAP:
                    row["problem"] = (
                        f"loss at step 10 {row['first_loss']:.5f} against eager {reference['first_loss']:.5f}"
                    )
                elif row["bpc_gap"] > GRAPH_BPC_GAP:
                    row["note"] = (
                        f"validation bpc {row['valid_bpc']:.4f} against eager {reference['valid_bpc']:.4f}, "
                        "the loss at step 10 the same: a run that does not repeat exactly"
                    )
    return rows


def train_each_cell(arguments: dict) -> None:
    """The training step's child: each cell eagerly (and with graphs on a GPU), one JSON line each."""
    import charlm
    from charlm.corpora import prepare_corpus

    out, device = Path(arguments["out"]), arguments["device"]
    data = out / "data"
    prepare_corpus("pydoc", data_dir=data, progress=False)
    modes = ("eager", "cuda graph") if device.startswith("cuda") else ("eager",)
    tokens = arguments["batch_size"] * arguments["bptt"] * arguments["windows"]
    for cell in arguments["cells"]:
        for mode in modes:
            run_dir = out / "runs" / f"{cell}-{mode.replace(' ', '-')}"
            row = {"cell": cell, "mode": mode}
            started = time.monotonic()
            try:
                summary = charlm.train(
                    corpus="pydoc",
                    data_dir=str(data),
                    cell=cell,
                    params=arguments["params"],
                    batch_size=arguments["batch_size"],
                    bptt=arguments["bptt"],
                    max_tokens=tokens,
                    eval_fraction=0.25,
                    log_every=10,
                    device=device,
                    cuda_graph=mode == "cuda graph",
                    run_dir=str(run_dir),
                    save_every="0",
                )
                records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                epoch = [r for r in records if r.get("event") == "epoch"][-1]
                graph = [r for r in records if r.get("event") == "cuda_graph"]
                steps = [r for r in records if r.get("event") == "step"]
                row.update(
                    first_loss=steps[0]["loss"] if steps else None,
                    valid_bpc=summary["best_valid_bpc"],
                    test_bpc=summary["test_bpc_at_best"],
                    chars_per_s=round(epoch["chars_per_second"]),
                    parameters=summary["parameters"],
                    cuda_graph={k: v for k, v in graph[0].items() if k not in ("event", "time", "schema")}
                    if graph
                    else None,
                )
            except Exception as error:  # one cell's failure is a row of the report; the others still run
                row["error"] = f"{type(error).__name__}: {error}"[:400]
            row["seconds"] = round(time.monotonic() - started, 1)
            for checkpoint in run_dir.glob("*.pt"):
                checkpoint.unlink()  # the report needs the records, not the weights
            with open(out / "training.jsonl", "a") as log:
                log.write(json.dumps(row) + "\n")


# --- report.md ---------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# charlm check --full on {env.get('gpu') or env.get('cpu') or env['device']}, {env['date']}",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {key} | {value} |" for key, value in env.items()]
    lines += ["", "## Steps", "", "| step | status | seconds | limit | found |", "|---|---|---:|---:|---|"]
    lines += [
        f"| {s['name']} | {s['status']} | {s['seconds']} | {s['limit_seconds']:.0f} | {s['detail']} |"
        for s in report.get("steps", [])
    ]
    if report.get("failures"):
        lines += ["", "## Failures", ""] + [f"- {failure}" for failure in report["failures"]]
    if report.get("check"):
        lines += ["", "## check", "", "| check | result | figure | tolerance |", "|---|---|---|---|"]
        lines += [f"| {r['check']} | {r['result']} | {r['figure']} | {r['tolerance']} |" for r in report["check"]]
    if report.get("cuda_tests"):
        lines += ["", "## cuda tests", ""] + [f"- `{s['command']}`: {s['summary']}" for s in report["cuda_tests"]]
    for label, table in report.get("benchmark", {}).items():
        settings = table["settings"]
        untrusted = (
            "" if table.get("trustworthy", True) else "; not trustworthy: " + "; ".join(table.get("disturbances", []))
        )
        lines += [
            "",
            f"## Benchmark, {label} ({settings['params']} parameters, batch {settings['batch_size']} × "
            f"{settings['bptt']} steps{untrusted})",
            "",
            "| model | hidden | train chars/s | × fused LSTM | × per FLOP | eval chars/s | eval path | train path |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for r in table["results"]:
            lines.append(
                f"| {r['name']} | {r['hidden_size']} | {r['train_chars_per_second']['median']:,.0f} | "
                f"{r['train_ratio']:.2f} | {r['train_ratio_flop_normalised']:.2f} | "
                f"{r['eval_chars_per_second']['median']:,.0f} | {r['eval_path']} | {r.get('train_path', 'eager')} |"
            )
    notes = report.get("performance", {})
    if notes:
        below = ", ".join(f"{n['cell']} {n['ratio']}" for n in notes.get("below_goal_per_flop", [])) or "none"
        slower = (
            ", ".join(f"{n['cell']} {n['graphs_over_eager']}×" for n in notes.get("graphs_slower_than_eager", []))
            or "none"
        )
        lines += [
            "",
            "## Performance goal",
            "",
            f"- bf16 with graphs under {GOAL_PER_FLOP}× the fused LSTM per FLOP: {below}",
            f"- graphs slower than eager (bf16): {slower}",
        ]
    if report.get("training"):
        lines += [
            "",
            "## Training (embedded corpus `pydoc`)",
            "",
            "| cell | mode | loss at step 10 | valid bpc | test bpc | chars/s | graph check | problem or note |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for r in report["training"]:
            graph = r.get("cuda_graph") or {}
            check = (
                (
                    f"active {graph.get('active')}, checked {graph.get('checked')}, "
                    f"{graph.get('max_difference')} ≤ {graph.get('tolerance')}"
                )
                if graph
                else "-"
            )

            def bpc(value):
                return f"{value:.4f}" if isinstance(value, (int, float)) else "-"

            lines.append(
                f"| {r['cell']} | {r['mode']} | {bpc(r.get('first_loss'))} | {bpc(r.get('valid_bpc'))} | "
                f"{bpc(r.get('test_bpc'))} | "
                f"{r.get('chars_per_s', '-')} | {check} | {r.get('problem') or r.get('note', '')} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the training step's child process
    train_each_cell(json.loads(sys.argv[1]))
