"""Fetching a remote file into the download cache: progress bar, HTTP Range resume, retries, verification.

A download is written to ``<name>.part`` and renamed to ``<name>`` only once it is complete and
matches its expected size and checksums. A file that fails verification is never used and never
deleted: it is moved aside to ``<name>.bad-<first 8 hex digits of its sha256>``.
"""

import errno
import hashlib
import http.client
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from charlm import __version__
from charlm.logs import info as log_info
from charlm.errors import CharlmError
from charlm.files import WriteError, writing

BLOCK = 1 << 16
DOWNLOAD_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class RemoteFile:
    """A file a recipe downloads, and what it must look like once complete (None: not known)."""

    url: str
    filename: str
    size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    note: str = ""  # provenance of the expected values, or why some are missing


@dataclass(frozen=True)
class DownloadPolicy:
    """How hard to try: ``attempts`` in all, waiting ``backoff`` seconds, then twice that, and so on."""

    attempts: int = 5
    backoff: float = 1.0
    timeout: float = 60.0

    @classmethod
    def from_environment(cls, environ=os.environ) -> "DownloadPolicy":
        """Defaults, overridden by CHARLM_DOWNLOAD_ATTEMPTS (1 to 100), CHARLM_DOWNLOAD_BACKOFF (seconds, 0 to
        an hour) and CHARLM_DOWNLOAD_TIMEOUT (seconds, above 0 up to a day); anything else is one line naming the
        variable."""
        default = cls()
        return cls(
            attempts=int(_bounded(environ, "CHARLM_DOWNLOAD_ATTEMPTS", default.attempts, int, 1, MAX_ATTEMPTS)),
            backoff=_bounded(environ, "CHARLM_DOWNLOAD_BACKOFF", default.backoff, float, 0, MAX_WAIT),
            timeout=_bounded(environ, "CHARLM_DOWNLOAD_TIMEOUT", default.timeout, float, 0, MAX_TIMEOUT, low_open=True),
        )


MAX_ATTEMPTS = 100
MAX_WAIT = 3600.0  # seconds: the longest wait between two attempts (the backoff doubles up to it)
MAX_TIMEOUT = 86400.0  # seconds: socket timeouts beyond a day overflow on some platforms


def _bounded(environ, name: str, default, kind: type, low, high, low_open: bool = False):
    """The environment variable ``name`` as a ``kind`` (int: a whole number) from ``low`` to ``high``, or
    ``default``."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip()) if kind is int else float(text)
    except ValueError:
        value = None
    if value is None or not (value > low if low_open else value >= low) or not value <= high:  # NaN fails both
        words = "a whole number" if kind is int else "a number of seconds"
        bound = f"above {low:g}" if low_open else f"from {low:g}"
        raise CharlmError(f"{name} must be {words} {bound} to {high:g}, not {text!r}")
    return value


class _Incomplete(Exception):
    """The server closed the connection before sending the length it announced."""


def file_digests(path: Path) -> tuple[str, str]:
    """The sha256 and md5 hex digests of a file, read once."""
    sha256, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            sha256.update(block)
            md5.update(block)
    return sha256.hexdigest(), md5.hexdigest()


def mismatches(expected: RemoteFile, size: int, sha256: str, md5: str) -> list[str]:
    """One phrase per expected property that the actual file lacks: ``size: expected 3, got 2``."""
    actual = {"size": size, "sha256": sha256, "md5": md5}
    return [
        f"{name}: expected {getattr(expected, name)}, got {actual[name]}"
        for name in ("size", "sha256", "md5")
        if getattr(expected, name) is not None and getattr(expected, name) != actual[name]
    ]


def move_aside(path: Path, sha256: str, name: str | None = None) -> Path:
    """Rename a bad file to ``<name>.bad-<sha8>`` next to it, so that it is kept but never used."""
    aside = path.with_name(f"{name or path.name}.bad-{sha256[:8]}")
    os.replace(path, aside)
    return aside


def verify_download(path: Path, expected: RemoteFile, final: Path, what: str) -> None:
    """Check a downloaded file against ``expected``; on a mismatch move it aside and raise.

    ``what`` names the file in the error: where it was downloaded from, or that it was cached.
    """
    sha256, md5 = file_digests(path)
    problems = mismatches(expected, path.stat().st_size, sha256, md5)
    if problems:
        aside = move_aside(path, sha256, final.name)
        raise CharlmError(f"{what} does not match: {'; '.join(problems)}; moved aside to {aside} (not used)")


def check_download_url(url: str) -> str:
    """``url`` if it is an http(s) address with a host; otherwise a CharlmError naming it."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme.lower() not in DOWNLOAD_SCHEMES or not parts.hostname:
        raise CharlmError(
            f"cannot download from {url!r}: only http:// and https:// addresses are accepted; "
            "for a file on this machine use --source PATH"
        )
    return url


def fetch(
    remote: RemoteFile,
    cache_dir: Path,
    *,
    url: str | None = None,
    verify: bool = True,
    policy: DownloadPolicy | None = None,
    progress: bool = True,
    log=None,
) -> Path:
    """The verified local copy of ``remote`` in ``cache_dir``, downloading (from ``url`` if given) when absent."""
    log = log or log_info
    policy = policy or DownloadPolicy.from_environment()
    url = check_download_url(url or remote.url)
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / remote.filename
    expected = remote if verify else RemoteFile(url, remote.filename)
    if not verify:
        log(f"warning: --no-verify: not checking the size and checksum of {remote.filename}")

    if final.exists():
        verify_download(final, expected, final, f"the cached {final.name}")
        if progress:
            log(f"using cached {final}")
        return final

    part = final.with_name(final.name + ".part")
    _download_with_retries(url, part, policy, progress, log)
    verify_download(part, expected, final, f"{final.name} downloaded from {url}")
    os.replace(part, final)
    return final


def _download_with_retries(url: str, part: Path, policy: DownloadPolicy, progress: bool, log) -> None:
    host = urllib.parse.urlsplit(url).netloc or url
    for attempt in range(1, policy.attempts + 1):
        try:
            _transfer(url, part, policy.timeout, progress)
            return
        except WriteError:  # an OSError too, but no retry fills a full disk
            raise
        except urllib.error.HTTPError as error:
            if error.code < 500:
                raise CharlmError(
                    f"{url}: HTTP {error.code} {error.reason}; check the address (--url), "
                    "or pass a local copy with --source PATH"
                ) from None
            failure = f"HTTP {error.code} {error.reason}"
        except urllib.error.URLError as error:
            failure = f"cannot reach {host} ({_reason(error.reason)})"
            if _offline(error.reason):
                raise _given_up(f"{failure}, which no retry mends (is this machine offline?)", url, part) from None
        except (_Incomplete, http.client.HTTPException, OSError) as error:
            failure = f"transfer from {host} broke off ({_reason(error)})"
        if attempt < policy.attempts:
            wait = min(policy.backoff * 2.0 ** min(attempt - 1, 64), MAX_WAIT)
            log(f"{failure}; retrying in {wait:g}s (attempt {attempt + 1} of {policy.attempts})")
            time.sleep(wait)
    attempts = "1 attempt" if policy.attempts == 1 else f"{policy.attempts} attempts"
    raise _given_up(f"{failure} after {attempts}", url, part)


def _given_up(failure: str, url: str, part: Path) -> CharlmError:
    kept = f"; the partial file {part} is kept and resumed next time" if part.exists() else ""
    return CharlmError(
        f"{failure}{kept}. Download {url} another way and pass it with --source PATH, or use a mirror with --url URL"
    )


def _offline(reason) -> bool:
    """Whether a connection failed for want of a name lookup or of any route to the network: what
    retrying within seconds does not mend (a refused connection, a timeout or a reset may be)."""
    return isinstance(reason, socket.gaierror) or (isinstance(reason, OSError) and reason.errno == errno.ENETUNREACH)


def _transfer(url: str, part: Path, timeout: float, progress: bool) -> None:
    """Download ``url`` into ``part``, continuing a partial file with an HTTP Range request."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": f"charlm/{__version__}"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:  # nothing after offset: the part is complete (verification decides)
            return
        raise
    with response:
        resumed = offset > 0 and response.status == 206 and _range_start(response) == offset
        if not resumed:
            offset = 0
        announced = response.headers.get("Content-Length")
        total = offset + int(announced) if announced is not None else None
        received = 0
        target = part.with_name(part.name.removesuffix(".part"))  # the file meant, in a failed write's line
        with writing(target):
            file = open(part, "ab" if resumed else "wb")
        with (
            file,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=part.name.removesuffix(".part"),
                disable=not progress,
                file=sys.stderr,
                leave=False,
            ) as bar,
        ):
            while block := response.read(BLOCK):
                with writing(target):  # the disk, not the network: no retry
                    file.write(block)
                received += len(block)
                bar.update(len(block))
            with writing(target):
                file.flush()
        if announced is not None and received < int(announced):
            raise _Incomplete(f"got {offset + received:,} of {total:,} bytes")


def _range_start(response) -> int | None:
    """The first byte position of a 206 response's ``Content-Range: bytes START-END/TOTAL``."""
    content_range = response.headers.get("Content-Range", "")
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _reason(error) -> str:
    if isinstance(error, http.client.IncompleteRead):
        return f"connection closed after {len(error.partial):,} bytes of a block"
    return str(error) or type(error).__name__
