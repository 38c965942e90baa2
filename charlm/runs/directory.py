"""A run directory: config.json, provenance.json, metrics.jsonl, train.log, last.pt and best.pt.

``Run`` is the one place that writes them. Every record goes to ``metrics.jsonl`` (one JSON
object per line, typed and versioned by ``charlm.runs.records``) and to any extra sinks
(TensorBoard); ``history()`` reads the records back and ``summary()`` a run for `charlm runs`
(``charlm.runs.listing``).

One training at a time owns a run directory: it holds an advisory lock on ``lock`` (``flock``,
released by the kernel when the process dies, so a killed run never blocks its resumption).
Saving ``last.pt`` first keeps the one it replaces as ``previous.pt``, the fallback when a
``last.pt`` cannot be read (or a kill fell between the two renames of ``save_last``). Epoch checkpoints and
`charlm runs --prune`: ``charlm.runs.retention``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import stat
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, one training per directory is up to the user
    fcntl = None

from charlm.errors import CharlmError, RunInUse, kind_of, shown
from charlm.files import (
    WriteError,
    append_text,
    atomic_write_text,
    flush_directory,
    make_directory,
    path_value,
    read_own_file,
    writing,
)
from charlm.logs import get_logger
from charlm.runs.history import RunHistory
from charlm.runs.records import KIND_WORDS, encode, is_of_kind, new_record
from charlm.runs.listing import summary_of

UNTRAINED_METRICS_BYTES = 1 << 16  # a run that never trained has written a few records; a larger file trained

STATUSES = ("finished", "interrupted", "diverged", "running", "created")
# The settings of config.json that listings and reports read, and the type each must have.
CONFIG_FIELDS = {
    "train": {
        "corpus": str,
        "cell": str,
        "params": str,
        "layers": int,
        "hidden_size": int,
        "train_fraction": float,
        "seed": int,
        "keep_checkpoints": int,
    },
    "model": {"cell": str, "layers": int, "hidden_size": int},
}


class Run:
    def __init__(self, path: str | Path):
        self.path = path_value(path, "a run directory")
        self.sinks = []  # objects with write(event, fields) and close()
        self._lock = None  # the open lock file while this process owns the directory

    # --- files ---------------------------------------------------------------------------------
    last = property(lambda self: self.path / "last.pt")
    previous = property(lambda self: self.path / "previous.pt")
    lock_file = property(lambda self: self.path / "lock")
    best = property(lambda self: self.path / "best.pt")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    config_file = property(lambda self: self.path / "config.json")
    provenance_file = property(lambda self: self.path / "provenance.json")
    log_file = property(lambda self: self.path / "train.log")
    running_file = property(lambda self: self.path / "running.json")

    @classmethod
    def create(cls, path: str | Path, config: dict, provenance: dict) -> "Run":
        """A new run directory, locked by this process; refuses one that already holds a run."""
        run = cls(path)
        make_directory(run.path, action="create run directory")
        run._refuse_existing()
        run.acquire()
        run._refuse_existing(locked=True)  # written by another process between the first look and the lock
        atomic_write_text(run.config_file, json.dumps(config, indent=2, sort_keys=True) + "\n")
        run.write_provenance(provenance)
        return run

    def _refuse_existing(self, locked: bool = False) -> None:
        """Refuse a directory that holds a run; one that never trained (it failed before its first step)
        is cleared, under the lock, for the new run."""
        if not (self.last.exists() or self.best.exists()) and self._never_trained():
            if locked:
                for leftover in (self.metrics, self.log_file, self.running_file, self.provenance_file):
                    leftover.unlink(missing_ok=True)
            return
        if self.last.exists() or self.best.exists() or self.metrics.exists():
            self.release()
            holder = self.holder()
            if holder:
                raise _in_use(self.path, holder)
            raise CharlmError(
                f"run directory {self.path} already holds a run: resume it with --resume {self.path}, "
                "or choose another --run-dir"
            )

    def _never_trained(self) -> bool:
        """Whether metrics.jsonl (if any) records no training at all: a start, and at most how it ended."""
        try:
            status = os.lstat(self.metrics)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if not stat.S_ISREG(status.st_mode) or status.st_size > UNTRAINED_METRICS_BYTES:
            return False
        try:
            lines = self.metrics.read_text(encoding="utf-8").splitlines()
            events = {json.loads(line).get("event") for line in lines if line.strip()}
        except (OSError, ValueError, AttributeError):
            return False
        return events <= {"start", "interrupted", "compile", "cuda_graph", "fast_path"}

    @classmethod
    def resume(cls, path: str | Path) -> "Run":
        """An existing run directory, locked by this process; temporary files a killed write left are removed."""
        run = cls(path)
        if not run.path.is_dir():
            raise CharlmError(f"no run directory {run.path} to resume")
        if not (run.config_file.exists() or run.last.exists()):
            raise CharlmError(f"{run.path} is not a run directory (it has no config.json or last.pt)")
        run.acquire()
        for leftover in run.path.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)
        return run

    # --- owning the directory --------------------------------------------------------------------
    def acquire(self, claim: bool = True) -> None:
        """Take the directory's lock, or refuse: another live process is training into it.
        ``claim=False`` (`charlm runs --prune`) leaves the holder line of the last training as it was."""
        if self._lock is not None or fcntl is None:
            return
        with writing(self.lock_file):  # a read-only file system is the machine (exit 1), as for every other file
            handle = open(self.lock_file, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise _in_use(self.path, holder) from None
        if claim:
            handle.seek(0)
            handle.truncate()
            try:
                with writing(self.lock_file):
                    handle.write(f"pid {os.getpid()} on {platform.node()}\n")
                    handle.flush()
            except BaseException:
                try:
                    handle.close()  # the lock goes with it (closing tries the failed write once more)
                except OSError:
                    pass
                raise
        self._lock = handle

    def holder(self) -> str | None:
        """Who holds the directory's lock ("pid N on HOST"), when another process does."""
        if fcntl is None or self._lock is not None or not self.lock_file.is_file():
            return None
        try:
            with open(self.lock_file, "r", encoding="utf-8") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:
                    return handle.read().strip() or "another process"
                fcntl.flock(handle, fcntl.LOCK_UN)
        except OSError:
            pass
        return None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def save_last(self, checkpoint) -> None:
        """Write ``last.pt``, keeping the one it replaces as ``previous.pt``: the new checkpoint is
        written whole under a temporary name first, then two renames rotate it in (never a link).
        A failed write changes nothing; a kill between the renames leaves ``previous.pt`` and no
        ``last.pt``, which a resume falls back to (and the temporary file, which it removes)."""
        pending = self.path / ".last.pt.pending.tmp"
        try:
            checkpoint.save(pending)
        except OSError as error:  # name the file being saved, not its temporary stand-in (WriteError is an OSError)
            raise WriteError(self.last, error.strerror or str(error), error.errno) from None
        if self.last.exists():
            os.replace(self.last, self.previous)
        os.replace(pending, self.last)
        flush_directory(self.path)

    def write_provenance(self, provenance: dict) -> None:
        atomic_write_text(self.provenance_file, json.dumps(provenance, indent=2, sort_keys=True) + "\n")

    def read_json(self, path: Path) -> dict:
        """A JSON object from a file of the run; {} when it is missing, unreadable, not an object, or
        holding NaN or Infinity (no run writes them, and `charlm runs --json` would pass them on to
        readers that refuse them)."""
        try:
            value = json.loads(read_own_file(path, "run file").decode("utf-8"), parse_constant=_not_json)
        except (CharlmError, ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
            return {}
        return value if isinstance(value, dict) else {}

    def read_config(self) -> dict:
        """``config.json`` checked: an object, its ``train`` and ``model`` objects, and the settings that
        `charlm runs` and `charlm report` read of their types; a ``CharlmError`` saying what is wrong
        otherwise. A run without a config.json (only a last.pt) reads as {}."""
        if not os.path.lexists(self.config_file):
            return {}
        try:
            config = json.loads(read_own_file(self.config_file, "run settings file").decode("utf-8"))
        except ValueError as error:
            raise CharlmError(f"{self.config_file} is not valid JSON ({error})") from None
        except RecursionError:
            raise CharlmError(f"{self.config_file} is not valid JSON (its values are nested too deeply)") from None
        if not isinstance(config, dict):
            raise CharlmError(f"{self.config_file} must hold a JSON object, not {kind_of(config)}")
        for section, fields in CONFIG_FIELDS.items():
            values = config.get(section, {})
            if not isinstance(values, dict):
                raise CharlmError(f"{self.config_file}: {section} must be an object, not {kind_of(values)}")
            for name, kind in fields.items():
                value = values.get(name)
                if value is not None and (
                    not is_of_kind(value, kind) or (isinstance(value, float) and not math.isfinite(value))
                ):
                    raise CharlmError(
                        f"{self.config_file}: {section}.{name} must be {KIND_WORDS[kind]}"
                        f"{' (finite)' if kind is float else ''}, not {shown(value, 60)}"
                    )
        return config

    # --- what happens during a run ---------------------------------------------------------------
    def record(self, event: str, **fields) -> None:
        """Append one record to metrics.jsonl (``charlm.runs.records``), and hand it to every sink."""
        record = new_record(event, round(time.time(), 3), fields)
        line = encode(record)
        prefix = "\n" if _ends_without_newline(self.metrics) else ""
        append_text(self.metrics, prefix + line + "\n")
        for sink in self.sinks:
            sink.write(event, record.to_dict())

    def log(self, message: str) -> None:
        """A line for the person watching (the charlm logger) and for the run's train.log."""
        get_logger().info(message)
        append_text(self.log_file, message + "\n")

    def mark_running(self) -> None:
        atomic_write_text(
            self.running_file, json.dumps({"pid": os.getpid(), "host": platform.node(), "since": time.time()})
        )

    def mark_stopped(self) -> None:
        """The training has ended: no running mark, sinks closed, the lock released."""
        self.running_file.unlink(missing_ok=True)
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        self.release()

    # --- reading a run back ----------------------------------------------------------------------
    def history(self) -> RunHistory:
        """The records of metrics.jsonl (``charlm.runs.history.RunHistory``)."""
        return RunHistory.read(self.metrics)

    def status(self, history: RunHistory | None = None) -> str:
        if self.holder():
            return "running"
        if fcntl is None:  # no locks here (Windows): trust the running mark of a live process on this host
            running = self.read_json(self.running_file)
            pid = running.get("pid")
            if running.get("host") == platform.node() and pid != os.getpid() and _alive(pid):
                return "running"
        return (self.history() if history is None else history).status

    def summary(self) -> dict:
        """One row of `charlm runs` (``charlm.runs.listing.summary_of``)."""
        return summary_of(self)


def _in_use(path: Path, holder: str) -> RunInUse:
    return RunInUse(
        f"run directory {path} is in use by another training ({holder}): wait for it to end, "
        "or choose another --run-dir"
    )


def find_runs(root: str | Path) -> list[Run]:
    """Every run directory (one holding config.json) at or below ``root``."""
    root = path_value(root, "a directory of runs")
    if not root.is_dir():
        raise CharlmError(f"no such directory: {root}")
    return [
        Run(path.parent)
        for path in sorted(root.rglob("config.json"))
        if (path.parent / "metrics.jsonl").exists() or (path.parent / "last.pt").exists()
    ]


class FollowerRun(Run):
    """A run directory as a process that does not write it sees it (the ranks other than 0 under
    torchrun): it reads checkpoints; the lock, the records and every file are rank 0's."""

    def acquire(self, claim: bool = True) -> None:
        pass

    def release(self) -> None:
        pass

    def save_last(self, checkpoint) -> None:
        pass

    def write_provenance(self, provenance: dict) -> None:
        pass

    def record(self, event: str, **fields) -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def mark_running(self) -> None:
        pass

    def mark_stopped(self) -> None:
        pass


def default_run_dir(corpus: str, cell: str) -> Path:
    safe_corpus = re.sub(r"[^A-Za-z0-9._-]+", "-", str(corpus)).lstrip(".-")  # one plain component, whatever the corpus
    safe_cell = re.sub(r"[^A-Za-z0-9_-]+", "-", str(cell))
    return Path("runs") / f"{safe_corpus}-{safe_cell}-{time.strftime('%Y%m%d-%H%M%S')}"


def _not_json(constant: str):
    """``json.loads``'s ``parse_constant``: NaN, Infinity and -Infinity are not JSON."""
    raise ValueError(f"{constant} is not JSON")


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ends_without_newline(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except OSError:
        return False
