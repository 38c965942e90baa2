"""Files: reading a file the user named (a pipe too) and one charlm wrote into a run or sweep directory
(a regular file of a bounded size, nothing else), the plain names that files may give to paths, and
writing files atomically (a temporary file beside the target, flushed to disk, then a rename).

At every moment a target being written is either its old or its new complete contents, whatever
kills the process (``kill -9``, a full disk, a power cut once the data reached the disk).

A write that fails (a full disk, a file-size limit, a read-only file system, an I/O error, or
PyTorch's zip writer failing) becomes one ``WriteError`` naming the file meant,
never its temporary file: ``writing`` is the one place that decides, and every writer goes through
it (``atomic_write``, ``append_text``, prepared corpora, downloads, the run directory's lock).
"""

from __future__ import annotations

import contextlib
import errno as errnos
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from charlm.errors import CharlmError, shown

BAD_PATH = {errnos.ENOENT, errnos.ENOTDIR, errnos.EISDIR, errnos.EEXIST, errnos.ENAMETOOLONG, errnos.ELOOP}
TORCH_WRITER = ("inline_container", "PytorchStreamWriter", "file write failed")  # its zip writer's failures


# --- write failures: one line naming the file meant ---------------------------------------------


class WriteError(CharlmError, OSError):
    """A file could not be written; ``filename`` is the file meant and ``strerror`` the reason.
    Exit code 1 (the machine: a full disk, a file-size limit, a read-only file system, an I/O
    error), or 2 where the path itself is wrong (a missing directory, a directory in the way).
    An ``OSError`` too, so that code catching the ``OSError`` of a write catches this one."""

    def __init__(self, target: str | Path, reason: str, errno: int | None = None, action: str = "write"):
        super().__init__(f"cannot {action} {target}: {reason}")
        self.errno, self.strerror, self.filename = errno, reason, str(target)
        self.exit_code = 2 if errno in BAD_PATH else 1

    def __str__(self) -> str:
        return self.args[0]


def access_error(error: OSError) -> CharlmError:
    """The one line for an ``OSError`` that reached a boundary (the command line, ``charlm.load``,
    ``charlm.train``): the file it names and the system's reason. Exit code 2 for a path given as input
    that cannot be used (missing, a directory where a file belongs, too long, no permission), 1 for the
    machine (an I/O error). A ``WriteError`` is one already and passes as it is."""
    if isinstance(error, CharlmError):
        return error
    where = f" {error.filename}" if error.filename is not None else ""
    problem = CharlmError(f"cannot access{where}: {error.strerror or error}")
    problem.exit_code = 2 if error.errno in BAD_PATH | {errnos.EACCES, errnos.EPERM} else 1
    return problem


@contextlib.contextmanager
def writing(target: str | Path) -> Iterator[None]:
    """Writing ``target``: a write that fails inside the block raises ``WriteError`` naming ``target``
    (never a temporary file); other errors pass as they are."""
    try:
        yield
    except WriteError:
        raise
    except (OSError, RuntimeError) as error:
        if not is_write_failure(error):
            raise
        raise write_error(target, error) from error


def is_write_failure(error: BaseException) -> bool:
    """An ``OSError``, or a ``RuntimeError`` of PyTorch's writer or with an ``OSError`` behind it."""
    if isinstance(error, OSError):
        return True
    return isinstance(error, RuntimeError) and (
        any(mark in str(error) for mark in TORCH_WRITER) or _errno_of(error) is not None
    )


def write_error(target: str | Path, error: BaseException) -> WriteError:
    """The ``WriteError`` that says why writing ``target`` failed with ``error``."""
    number = _errno_of(error)
    if number is None:
        text = str(error.strerror if isinstance(error, OSError) and error.strerror else error).strip()
        return WriteError(target, f"the write failed ({text.splitlines()[0] if text else type(error).__name__})")
    return WriteError(target, os.strerror(number), number)


def _errno_of(error: BaseException) -> int | None:
    """The errno that ``error`` or an exception behind it carries."""
    seen, chain = error, 0
    while seen is not None and chain < 8:
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        seen, chain = seen.__cause__ or seen.__context__, chain + 1
    return None


# --- writing --------------------------------------------------------------------------------------


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(temporary_path)``, then rename the result onto ``path``; a failure leaves
    ``path`` as it was and no temporary file behind; a failed write raises ``WriteError``. A
    directory where the file belongs (``.`` too) is refused before anything is written, as is an empty path."""
    path = path_value(path, "the file to write")
    if path.is_dir():  # a rename onto it would fail after the write, and on "." with EBUSY, not as a wrong path
        raise WriteError(path, os.strerror(errnos.EISDIR), errnos.EISDIR)
    with writing(path):
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        with writing(path):
            write(Path(temporary))
            try:
                os.chmod(temporary, 0o666 & ~UMASK)  # mkstemp makes files owner-only; give the usual mode
            except OSError:  # file systems without modes (vfat, some network mounts)
                pass
            _flush_to_disk(temporary)
            os.replace(temporary, path)
            flush_directory(path.parent)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path``, made if absent; a failed write cuts the file back to
    its length before, so no half line is left, and raises ``WriteError``."""
    path, data = Path(path), text.encode("utf-8")
    with writing(path):  # non-blocking: a FIFO without a reader fails at once (ENXIO), never waits for one
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o666)
        try:
            start = os.fstat(descriptor).st_size
            try:
                while data:
                    data = data[os.write(descriptor, data) :]
            except BaseException:
                with contextlib.suppress(OSError):
                    os.ftruncate(descriptor, start)
                raise
        finally:
            os.close(descriptor)


def read_text(path: str | Path, what: str) -> str:
    """A UTF-8 text file the user named; one-line errors say which ``what`` ("prime file") is wrong."""
    path = path_value(path, what)
    try:
        return read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise CharlmError(f"{what} {path} is not UTF-8 text") from None


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of a file the user named (a pipe too: ``charlm score RUN <(zcat text.gz)``)."""
    path = path_value(path, what)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CharlmError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise CharlmError(f"{what} {path} is a directory") from None
    except OSError as error:  # no permission, a loop of links, an I/O error
        raise CharlmError(f"cannot read {what} {path}: {error.strerror or error}") from None


OWN_FILE_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}
JSON_LIMIT = 64 << 20  # config.json, provenance.json, sweep.json: a few KB as charlm writes them
RECORDS_LIMIT = 1 << 30  # metrics.jsonl: some 300 bytes a record, a million records a long run


def read_own_file(path: str | Path, what: str, limit: int = JSON_LIMIT) -> bytes:
    """The bytes of a file charlm wrote into a run or sweep directory: a regular file (through links) of
    at most ``limit`` bytes. Anything else is a one-line ``CharlmError`` at once: a named pipe is never
    waited on (it is opened without blocking, then refused), a device (/dev/zero) never read without end,
    so that one damaged run cannot hang or exhaust a listing of many."""
    path = Path(path)
    try:
        _refuse_unless_regular(path, os.stat(path), what)  # a device is refused before it is even opened
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(descriptor, "rb") as file:
            info = os.fstat(descriptor)
            _refuse_unless_regular(path, info, what)  # replaced by something else since the first look
            _refuse_over(path, info.st_size, limit, what)
            data = file.read(info.st_size + 1)  # the size it had: what is appended meanwhile waits for the next read
    except FileNotFoundError:
        raise CharlmError(f"{what} {path} does not exist") from None
    except OSError as error:  # no permission, a loop of links, an I/O error
        raise CharlmError(f"cannot read {what} {path}: {error.strerror or error}") from None
    _refuse_over(path, len(data), limit, what)
    return data


def _refuse_unless_regular(path: Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        kind = OWN_FILE_KINDS.get(stat.S_IFMT(info.st_mode))
        raise CharlmError(f"{what} {path}{link} is {f'{kind}, not' if kind else 'not'} a regular file")


def _refuse_over(path: Path, size: int, limit: int, what: str) -> None:
    if size > limit:
        words = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"
        raise CharlmError(f"{what} {path} is larger than {words}, more than charlm ever writes")


def path_value(value, what: str) -> Path:
    """``value``, a path a caller gave (a str or an os.PathLike), as a Path; anything else (None, bytes,
    a number), an empty path (which pathlib reads as ".": `--out "$UNSET"` would write into the current
    directory) or a path holding a NUL character, is a one-line error naming ``what`` ("data_dir", "--out")."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise CharlmError(f"{what} must be a path (a str or a pathlib.Path), not {shown(value)}")
    if text == "":
        raise CharlmError(f"{what} is an empty path, which names no file or directory")
    if "\x00" in text:
        raise CharlmError(f"{what} {shown(text)} holds a NUL character, which no path can hold")
    return Path(text)


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # one path component: never '..', '/', hidden or an option


def is_plain_name(value) -> bool:
    """Whether ``value`` (read from a file: a plan's name, a corpus's) may become a path component."""
    return isinstance(value, str) and PLAIN_NAME.fullmatch(value) is not None


def plain_name(value, what: str) -> str:
    """``value`` when it is a plain name; else a one-line error saying that ``what`` ("plan name") must be one."""
    if not is_plain_name(value):
        raise CharlmError(
            f"{what} {shown(value)} is not a plain name (letters, digits, '.', '_' and '-', starting with a "
            "letter or a digit, at most 200 characters)"
        )
    return value


def make_directory(path: str | Path, action: str = "create directory") -> None:
    """``mkdir -p path``; a failure is a ``WriteError`` (``cannot ACTION PATH: ...``), which names what
    is in the way where a file stands at ``path`` or at one of its parents."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        in_the_way = next((place for place in (path, *path.parents) if place.is_file()), None)
        reason = f"the file {in_the_way} is in the way" if in_the_way else error.strerror or str(error)
        raise WriteError(path, reason, error.errno, action=action) from None


def check_directory(path: str | Path | None, flag: str) -> None:
    """A directory option (``--data-dir``): a directory, or a path where one can be made; a file is bad input."""
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        raise CharlmError(f"{flag} must be a directory: {path} is a file")


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes | memoryview) -> None:
    atomic_write(path, lambda temporary: temporary.write_bytes(data))


def _flush_to_disk(path: str) -> None:
    descriptor = os.open(path, os.O_RDWR)  # Windows fsyncs only handles open for writing
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def flush_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (POSIX; elsewhere directories cannot be opened)."""
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
