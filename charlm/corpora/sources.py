"""Reading a recipe's files from a local source: a tar or zip archive, a directory, or a single file.

Members are asked for in two ways. A plain name (``ptb.char.train.txt``) matches the one file of that
name anywhere in the source, so an archive's ``./simple-examples/data/`` prefix and a flat directory
both work. A pattern with ``*`` (``*/train/pos/*.txt``) matches any number of member paths.
"""

import fnmatch
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from charlm.errors import CharlmError

TAR_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz")
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"


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


def read_members(source: Path, members: tuple[str, ...]) -> dict[str, bytes]:
    """The contents of ``members`` in ``source``: plain names keyed by name, pattern matches by path."""
    source = Path(source)
    if not source.exists():
        raise CharlmError(f"--source {source} does not exist")
    names = {member for member in members if not is_pattern(member)}
    patterns = [member for member in members if is_pattern(member)]
    if source.is_file() and archive_kind(source) is None:
        if len(members) == 1 and names:
            return {members[0]: source.read_bytes()}
        raise CharlmError(f"--source {source} is a single file, but this corpus needs {', '.join(members)}: "
                          "pass the archive or a directory holding them")

    def wanted(path: str) -> bool:
        return PurePosixPath(path).name in names or any(fnmatch.fnmatch(path, p) for p in patterns)

    found = list(_matching_files(source, wanted))
    files = {}
    for name in sorted(names):
        paths = [path for path, _ in found if PurePosixPath(path).name == name]
        if not paths:
            raise CharlmError(f"{source} has no file named {name}")
        if len(paths) > 1:
            raise CharlmError(f"{source} has several files named {name} ({', '.join(paths)}): "
                              "point --source at the one to use")
        files[name] = next(data for path, data in found if path == paths[0])
    for pattern in patterns:
        matched = {path: data for path, data in found if fnmatch.fnmatch(path, pattern)}
        if not matched:
            raise CharlmError(f"{source} has no files matching {pattern}")
        files.update(matched)
    return files


def _matching_files(source: Path, wanted):
    """(member path, contents) of every file in ``source`` whose path ``wanted`` accepts."""
    if source.is_dir():
        for path in sorted(source.rglob("*")):
            relative = path.relative_to(source).as_posix()
            if path.is_file() and wanted(relative):
                yield relative, path.read_bytes()
        return
    try:
        if archive_kind(source) == "zip":
            yield from _zip_members(source, wanted)
        else:
            yield from _tar_members(source, wanted)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as error:
        reason = "; ".join(line.strip(" -") for line in str(error).splitlines() if line.strip())
        raise CharlmError(f"{source} is a corrupt or truncated archive ({reason})") from None


def _member_path(name: str) -> str:
    return name.removeprefix("./")


def _zip_members(source: Path, wanted):
    with zipfile.ZipFile(source) as archive:
        for info in archive.infolist():
            path = _member_path(info.filename)
            if not info.is_dir() and wanted(path):
                yield path, archive.read(info)  # checks the member's CRC-32


def _tar_members(source: Path, wanted):
    with tarfile.open(source, "r:*") as archive:
        for member in archive:
            path = _member_path(member.name)
            if member.isfile() and wanted(path):
                yield path, archive.extractfile(member).read()
