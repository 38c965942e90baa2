"""Reading a recipe's files from a local source: a tar or zip archive, a directory, or a single file.

Members are asked for in two ways. A plain name (``ptb.char.train.txt``) matches the one file of that
name anywhere in the source, so an archive's ``./simple-examples/data/`` prefix and a flat directory
both work. A pattern with ``*`` (``*/train/pos/*.txt``) matches any number of member paths.

Nothing is ever extracted: the members asked for are read into memory, one block at a time, and
the rest are never touched. A wanted member that is not a regular file, or whose path is absolute
or climbs out with ``..``, is refused; so is one larger than the recipe's ``SizeLimits``, before any
of it is read when its header says so, else as soon as its bytes pass what it declared. A damaged
archive (a corrupt or truncated stream, an encrypted zip member, a compression method that Python
cannot read) is one line naming it; a compressed tar is read to its end, so its checksum is checked.
"""

import fnmatch
import lzma
import re
import stat
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from charlm.errors import CharlmError

TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
BLOCK = 1 << 20
WINDOWS_DRIVE = re.compile(r"[A-Za-z]:")
ZIP_METHODS = {
    zipfile.ZIP_STORED: "stored",
    zipfile.ZIP_DEFLATED: "deflate",
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "LZMA",
}  # the compression methods Python reads
TAR_COMPRESSIONS = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}  # first bytes → tarfile's method
# What Python's readers raise on a damaged archive (struct.error and IndexError from a mangled zip
# header, NotImplementedError from an unknown method or zip version, RuntimeError from encryption).
ARCHIVE_ERRORS = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    OSError,
    ValueError,
    IndexError,
    KeyError,
    struct.error,
    NotImplementedError,
    RuntimeError,
)
ZIP_FILE_TYPES = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


@dataclass(frozen=True)
class SizeLimits:
    """The most bytes a recipe reads from its source: any one member, and all the members it reads.

    Set well above the real corpus (about twice), so that only a damaged or malicious source, such
    as a zip bomb, reaches them.
    """

    member: int
    total: int


class SourceFiles(dict):
    """What ``read_members`` read: bytes by member name, and what a message calls a member whose name is
    not the source's own (a single file given as --source is called by its path, not ``input.txt``)."""

    def __init__(self, files=(), shown_as: dict[str, str] | None = None):
        super().__init__(files)
        self.shown_as = dict(shown_as or {})


def shown_name(files: dict, member: str) -> str:
    """``member`` as messages name it (``SourceFiles``); a plain dict's members by their own names."""
    return getattr(files, "shown_as", {}).get(member, member)


def archive_kind(path: Path) -> str | None:
    """``"zip"``, ``"tar"`` or None (not an archive), judged by the file's first bytes and its name."""
    with open(path, "rb") as file:
        head = file.read(4)
    name = path.name.lower()
    if head == ZIP_MAGIC or name.endswith(".zip"):
        return "zip"
    if head[:2] == GZIP_MAGIC or name.endswith(TAR_SUFFIXES) or tarfile.is_tarfile(path):
        return "tar"
    return None


def is_pattern(member: str) -> bool:
    return "*" in member


def read_members(source: Path, members: tuple[str, ...], limits: SizeLimits) -> dict[str, bytes]:
    """The contents of ``members`` in ``source``: plain names keyed by name, pattern matches by path.

    The contents are bytes-like (a ``bytearray`` for what is read block by block).
    """
    source = Path(source)
    if not source.exists():
        raise CharlmError(f"--source {source} does not exist")
    names = {member for member in members if not is_pattern(member)}
    patterns = [member for member in members if is_pattern(member)]
    reader = BoundedReader(source, limits)
    if source.is_file() and archive_kind(source) is None:
        if len(members) == 1 and names:
            return SourceFiles({members[0]: reader.read_file(source, source.name)}, {members[0]: str(source)})
        raise CharlmError(
            f"--source {source} is a single file, but this corpus needs {', '.join(members)}: "
            "pass the archive or a directory holding them"
        )

    def wanted(path: str) -> bool:
        return PurePosixPath(path).name in names or any(fnmatch.fnmatch(path, p) for p in patterns)

    found = list(_matching_files(source, wanted, reader))
    files = {}
    for name in sorted(names):
        paths = [path for path, _ in found if PurePosixPath(path).name == name]
        if not paths:
            raise CharlmError(f"{source} has no file named {name}")
        if len(paths) > 1:
            raise CharlmError(
                f"{source} has several files named {name} ({', '.join(paths)}): point --source at the one to use"
            )
        files[name] = next(data for path, data in found if path == paths[0])
    for pattern in patterns:
        matched = {path: data for path, data in found if fnmatch.fnmatch(path, pattern)}
        if not matched:
            raise CharlmError(f"{source} has no files matching {pattern}")
        files.update(matched)
    return files


class BoundedReader:
    """Reads the members of one source in blocks, keeping each and all of them within ``limits``."""

    def __init__(self, source: Path, limits: SizeLimits):
        self.source, self.limits, self.total = source, limits, 0

    def read_file(self, path: Path, label: str) -> bytearray:
        """A plain file of the source (the source itself, or a file of a directory)."""
        with open(path, "rb") as file:
            return self.read(file, f"file {label}", path.stat().st_size)

    def read(self, stream, what: str, declared: int) -> bytearray:
        """All of ``stream``, which says it holds ``declared`` bytes; ``what`` names it in errors."""
        self.check_declared(what, declared)
        data = bytearray(declared)
        view, filled = memoryview(data), 0
        while filled < declared and (count := stream.readinto(view[filled : filled + BLOCK])):
            filled += count
        if filled < declared:
            raise CharlmError(f"{self.source}: {what} ends after {filled:,} of the {declared:,} bytes it declares")
        if stream.read(1):
            raise CharlmError(
                f"{self.source}: {what} holds more than the {declared:,} bytes it declares; "
                "refused as damaged or malicious"
            )
        self.total += declared
        return data

    def check_declared(self, what: str, declared: int) -> None:
        """Refuse, before reading anything, a member that would pass a limit."""
        if declared > self.limits.member:
            raise CharlmError(
                f"{self.source}: {what} is {declared:,} bytes long, more than the "
                f"{self.limits.member:,} this corpus allows; refused without reading it"
            )
        if self.total + declared > self.limits.total:
            raise CharlmError(
                f"{self.source}: the files this corpus reads hold more than the "
                f"{self.limits.total:,} bytes it allows in all (at {what}); refused"
            )


def _matching_files(source: Path, wanted, reader: BoundedReader):
    """(member path, contents) of every file in ``source`` whose path ``wanted`` accepts."""
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source).as_posix()
            if path.is_file() and wanted(relative):
                yield relative, reader.read_file(path, relative)
        return
    try:
        if archive_kind(source) == "zip":
            yield from _zip_members(source, wanted, reader)
        else:
            yield from _tar_members(source, wanted, reader)
    except ARCHIVE_ERRORS as error:
        raise CharlmError(f"{source} is a corrupt or truncated archive ({_archive_failure(source, error)})") from None


def _archive_failure(source: Path, error: BaseException) -> str:
    """Why reading the archive failed, in a phrase: for a tar that no method opened, what the method its
    first bytes name said."""
    lines = [line.strip(" -") for line in str(error).splitlines() if line.strip(" -")]
    if isinstance(error, tarfile.ReadError) and lines and lines[0].startswith("file could not be opened"):
        with open(source, "rb") as file:
            head = file.read(6)
        method = next((name for magic, name in TAR_COMPRESSIONS.items() if head.startswith(magic)), None)
        said = next((line.split(":", 1)[1].strip() for line in lines if line.startswith(f"method {method}:")), None)
        if method is None:
            return "not a tar archive, plain or compressed with gzip, bzip2 or xz"
        said = re.sub(r"^\w+\('(.*)'\)$", r"\1", said or "")
        return f"damaged {method} data: {said}" if said else f"damaged {method} data"
    return "; ".join(lines)[:200] or type(error).__name__


def _member_path(name: str) -> str:
    return name.removeprefix("./")


def is_unsafe_path(name: str) -> bool:
    """Whether an archive member's path is absolute or climbs out of the archive with ``..``."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or bool(WINDOWS_DRIVE.match(name)) or ".." in parts


def _refuse_unsafe(source: Path, name: str, not_regular: str | None) -> None:
    """Refuse a wanted member with an unsafe path, or that is not a regular file (``not_regular`` says what)."""
    if is_unsafe_path(name):
        raise CharlmError(
            f"{source}: member {name!r} has an absolute path or one with '..'; refused as damaged or malicious"
        )
    if not_regular:
        raise CharlmError(
            f"{source}: member {name!r} is {not_regular}, not a regular file; refused as damaged or malicious"
        )


def _zip_members(source: Path, wanted, reader: BoundedReader):
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            path = _member_path(info.filename)
            if info.is_dir() or not wanted(path):
                continue
            _refuse_unsafe(source, info.filename, _zip_member_kind(info))
            _refuse_unreadable(source, info)
            reader.check_declared(f"member {path}", info.file_size)
            with archive.open(info) as stream:  # stops at the declared size, then checks the CRC-32
                yield path, reader.read(stream, f"member {path}", info.file_size)


def _refuse_unreadable(source: Path, info: zipfile.ZipInfo) -> None:
    """Refuse a wanted zip member that is encrypted, or compressed by a method Python cannot read."""
    if info.flag_bits & 0x1:
        raise CharlmError(
            f"{source}: member {info.filename!r} is encrypted; charlm reads only unencrypted "
            "archives: extract it with the password and pass the files with --source"
        )
    if info.compress_type not in ZIP_METHODS:
        raise CharlmError(
            f"{source}: member {info.filename!r} is compressed with method {info.compress_type}, which "
            f"charlm cannot read (it reads {', '.join(ZIP_METHODS.values())}): extract it with "
            "another tool and pass the files with --source"
        )


def _zip_member_kind(info: zipfile.ZipInfo) -> str | None:
    """What a zip member is when its Unix mode says it is not a regular file, else None."""
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind in (0, stat.S_IFREG):  # 0: no Unix mode recorded (an archive made elsewhere)
        return None
    return ZIP_FILE_TYPES.get(kind, "a special file")


def _tar_members(source: Path, wanted, reader: BoundedReader):
    with tarfile.open(source, "r:*") as archive:
        for member in archive:
            path = _member_path(member.name)
            if member.isdir() or not wanted(path):
                continue
            _refuse_unsafe(source, member.name, _tar_member_kind(member))
            reader.check_declared(f"member {path}", member.size)
            with archive.extractfile(member) as stream:
                yield path, reader.read(stream, f"member {path}", member.size)
        _read_to_the_end(source, archive.fileobj)


def _read_to_the_end(source: Path, stream) -> None:
    """Read what follows a tar's last member (its end blocks and padding, a few kilobytes), so that
    a compressed stream's checksum is checked; more than a block of it is refused."""
    if stream.read(BLOCK) and stream.read(1):
        raise CharlmError(
            f"{source}: more than {BLOCK:,} bytes follow the archive's end; refused as damaged or malicious"
        )


def _tar_member_kind(member: tarfile.TarInfo) -> str | None:
    """What a tar member is when it is not a regular file, else None."""
    if member.isfile():
        return None
    if member.issym():
        return f"a symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"a hard link to {member.linkname!r}"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "a special file"
