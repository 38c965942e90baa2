"""Files: reading a text file the user named, and writing files atomically (a temporary file
beside the target, flushed to disk, then a rename).

At every moment a target being written is either its old or its new complete contents, whatever
kills the process (``kill -9``, a full disk, a power cut once the data reached the disk).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from charlm.errors import CharlmError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)``, then rename the result onto ``path``; a failure leaves
    ``path`` as it was and no temporary file behind."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        write(Path(temporary))
        try:
            os.chmod(temporary, 0o666 & ~UMASK)  # mkstemp makes files owner-only; give the usual mode
        except OSError:  # file systems without modes (vfat, some network mounts)
            pass
        _flush_to_disk(temporary)
        os.replace(temporary, path)
        _flush_directory(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file the user named; one-line errors say which ``what`` ("prime file") is wrong."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CharlmError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise CharlmError(f"{what} {path} is a directory") from None
    except UnicodeDecodeError:
        raise CharlmError(f"{what} {path} is not UTF-8 text") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def _flush_to_disk(path: str) -> None:
    descriptor = os.open(path, os.O_RDWR)  # Windows fsyncs only handles open for writing
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _flush_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX; elsewhere directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()  # read once, at import: changing the umask is not thread-safe
