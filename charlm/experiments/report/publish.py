"""Where a report is written and how it replaces an earlier one: into a staging directory inside
the report directory first, then moved into place file by file, so that a write that fails leaves
the earlier report whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from charlm.files import WriteError, flush_directory, make_directory, writing


@contextlib.contextmanager
def staged(out: Path):
    """A directory inside ``out`` that the new report is written into whole before any of its files
    replaces the earlier report's: a write that fails (a full disk, a file-size limit) leaves that
    report as it was, and is said naming the file of ``out`` meant, never the staging copy."""
    with writing(out):
        staging = Path(tempfile.mkdtemp(prefix=".report.", suffix=".partial", dir=out))
    try:
        yield staging
    except WriteError as error:
        if error.filename and Path(error.filename).parent == staging:
            raise WriteError(out / Path(error.filename).name, error.strerror, error.errno) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, out: Path, files: list[str], known: tuple[str, ...]) -> None:
    """Move the files of the new report from ``staging`` into ``out`` (renames: no space needed), then
    remove the files of an earlier report (any of ``known``) that this one did not write."""
    for name in files:
        os.replace(staging / name, out / name)
    flush_directory(out)
    for name in known:
        if name not in files:
            (out / name).unlink(missing_ok=True)


def report_directory(directories, out) -> Path:
    """``out``, or DIR/report for a single directory, created."""
    out = Path(out) if out is not None else Path(directories[0]) / "report"
    make_directory(out, action="create report directory")
    return out
