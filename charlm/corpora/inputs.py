"""Where a recipe's raw files come from: a download (or a local copy of it), the user's paths, or Python itself.

Each kind of input gathers the files as ``{name: bytes}``; the recipe's parser turns them into
splits. Checksums are checked here, so a parser only ever sees verified bytes (or bytes the user
chose to use with ``--no-verify``).
"""

import hashlib
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from charlm.corpora.download import DownloadPolicy, RemoteFile, fetch, file_digests, mismatches, move_aside
from charlm.corpora.sources import TAR_SUFFIXES, SizeLimits, archive_kind, read_members, shown_name
from charlm.logs import info as log_info
from charlm.errors import CharlmError


@dataclass(frozen=True)
class GatherRequest:
    """What the user asked for: where to find inputs, and how to treat them."""

    data_root: Path
    source: Path | None = None
    url: str | None = None
    paths: tuple[Path, ...] = ()
    verify: bool = True
    policy: DownloadPolicy | None = None
    progress: bool = True
    log: Callable[[str], None] = log_info


@dataclass
class Gathered:
    """The raw files of a corpus, where they came from, and whether every known checksum was checked."""

    files: dict[str, bytes]
    origin: str
    verified: bool


@dataclass(frozen=True)
class RemoteInputs:
    """Members of a file that is downloaded, or given as a local copy with ``--source``."""

    file: RemoteFile
    members: tuple[str, ...]
    limits: SizeLimits  # refuses members (zip bombs, lying headers) far larger than the corpus's own
    member_sha256: Mapping[str, str] = field(default_factory=dict)
    member_crc32: Mapping[str, int] = field(default_factory=dict)  # where no sha256 is published
    downloads = True

    def gather(self, request: GatherRequest) -> Gathered:
        if request.paths:
            raise CharlmError("only `charlm prepare text` takes PATHS; pass a local copy with --source PATH")
        if request.source is not None and request.url is not None:
            raise CharlmError("pass either --source (a local copy) or --url (a mirror to download from), not both")
        if request.source is not None:
            return self._gather_local_copy(Path(request.source), request)
        return self._gather_download(request)

    def _gather_local_copy(self, source: Path, request: GatherRequest) -> Gathered:
        if self.file_is_archive() and source.is_file() and archive_kind(source):
            sha256, md5 = file_digests(source)
            self._judge_local_copy(source, mismatches(self.file, source.stat().st_size, sha256, md5), request)
        files = read_members(source, self.members, self.limits)
        self._judge_local_copy(source, self._member_mismatches(files), request)
        return Gathered(files, origin=str(source), verified=request.verify)

    @staticmethod
    def _judge_local_copy(source: Path, problems: list[str], request: GatherRequest) -> None:
        if not problems:
            return
        problems = [
            f"its {problem[len(str(source)) + 1 :]}" if problem.startswith(f"{source} ") else problem
            for problem in problems
        ]
        if request.verify:
            raise CharlmError(
                f"--source {source} differs from the published corpus: {'; '.join(problems)}. "
                "Pass --no-verify to use a modified local copy"
            )
        request.log(f"warning: using a modified local copy {source}: {'; '.join(problems)}")

    def _gather_download(self, request: GatherRequest) -> Gathered:
        if self.file.note and request.verify and request.progress:
            request.log(f"note: {self.file.filename}: {self.file.note}")
        downloads = request.data_root / "downloads"
        url = request.url or self.file.url
        what = (
            f"the cached {self.file.filename}"
            if (downloads / self.file.filename).exists()
            else f"{self.file.filename} downloaded from {url}"
        )
        archive = fetch(
            self.file,
            downloads,
            url=request.url,
            verify=request.verify,
            policy=request.policy,
            progress=request.progress,
            log=request.log,
        )
        try:
            files = read_members(archive, self.members, self.limits)
            problems = self._member_mismatches(files)
            if problems and request.verify:
                raise CharlmError(f"{what} holds files that differ from the published corpus: {'; '.join(problems)}")
        except CharlmError as error:
            aside = move_aside(archive, file_digests(archive)[0])
            raise CharlmError(f"{error}; moved aside to {aside} (not used)") from None
        if problems:
            request.log(f"warning: --no-verify: using {archive.name} although {'; '.join(problems)}")
        return Gathered(files, origin=url, verified=request.verify)

    def _member_mismatches(self, files: dict[str, bytes]) -> list[str]:
        problems = []
        for name, expected in self.member_sha256.items():
            actual = hashlib.sha256(files[name]).hexdigest()
            if actual != expected:
                problems.append(f"{shown_name(files, name)} sha256: expected {expected}, got {actual}")
        for name, expected in self.member_crc32.items():
            actual = zlib.crc32(files[name])
            if actual != expected:
                problems.append(f"{shown_name(files, name)} CRC-32: expected {expected:#010x}, got {actual:#010x}")
        return problems

    def file_is_archive(self) -> bool:
        return self.file.filename.lower().endswith((".zip", *TAR_SUFFIXES))


def _reject_download_options(name: str, request: GatherRequest) -> None:
    if request.source is not None or request.url is not None:
        raise CharlmError(f"{name} downloads nothing: --source and --url do not apply")


@dataclass(frozen=True)
class LocalTextFiles:
    """The UTF-8 files and directories (read recursively, in name order) given as PATHS."""

    downloads = False

    def gather(self, request: GatherRequest) -> Gathered:
        _reject_download_options("`charlm prepare text`", request)
        if not request.paths:
            raise CharlmError("`charlm prepare text` needs at least one PATH (a file or a directory)")
        files = {}
        for path in map(Path, request.paths):
            if not path.exists():
                raise CharlmError(f"{path} does not exist")
            for file in _visible_files(path):
                files[str(file)] = file.read_bytes()
        if not files:
            raise CharlmError(f"no files under {', '.join(map(str, request.paths))}")
        return Gathered(files, origin=", ".join(map(str, request.paths)), verified=True)


def _visible_files(path: Path) -> list[Path]:
    """``path`` itself, or the files under it whose names do not start with a dot, sorted."""
    if path.is_file():
        return [path]
    return [
        file
        for file in sorted(path.rglob("*"))
        if file.is_file() and not any(part.startswith(".") for part in file.relative_to(path).parts)
    ]


@dataclass(frozen=True)
class PythonDocumentation:
    """The reference documentation inside CPython (``pydoc_data.topics``), in sorted topic order."""

    member: str = "pydoc_data.topics"
    downloads = False

    def gather(self, request: GatherRequest) -> Gathered:
        _reject_download_options("pydoc", request)
        if request.paths:
            raise CharlmError("pydoc takes no PATHS: it reads the documentation inside Python")
        from pydoc_data import topics

        text = "".join(topics.topics[key] for key in sorted(topics.topics))
        version = ".".join(map(str, sys.version_info[:3]))
        return Gathered({self.member: text.encode("utf-8")}, origin=f"pydoc_data of Python {version}", verified=True)
