"""A prepared corpus on disk: ``<data root>/<name>/`` with ``meta.json`` and one ``.npy`` array per split.

The directory is written under a temporary name inside the data root, every file flushed to disk,
and renamed into place when complete, so a reader never sees half a corpus, even after a power cut.
``meta.json`` records the size and sha256 of every array. Everything read is checked first
(``charlm.corpora.store_reader``): the metadata and array headers when the corpus is opened, a
split's ids and checksum when it is first used. Split arrays are memory-mapped when read.

The temporary names (``.<name>.partial-<host>-<pid>-<token>``, and ``.previous-`` for the version
being replaced) say which process made them, so that a later preparation can remove those of a
process that was killed (``kill -9``) and leave alone those of one still at work.

A corpus prepared again from other inputs never changes the data under the runs that used the
earlier version: that version is kept, whole, in ``<data root>/.versions/<name>/<fingerprint>/``,
where a run finds it by the fingerprint its provenance records (``charlm.corpora.catalog``).
"""

import hashlib
import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

import numpy as np

from charlm.corpora.splits import SPLITS
from charlm.corpora.store_reader import (
    META,
    SUBWORD_MODEL,
    array_layout,
    build_tokenizer,
    check_ids,
    file_record,
    read_checked_meta,
)
from charlm.corpora.tokenizer import Tokenizer
from charlm.errors import CharlmError
from charlm.files import flush_directory, read_bytes, writing

FORMAT_VERSION = 1
VERSIONS = ".versions"  # earlier versions of the corpora of a data root, by name and fingerprint
FINGERPRINT = re.compile(r"[0-9a-f]{64}")
STAGING_NAME = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|previous)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")


class PreparedCorpus:
    """A prepared corpus: its metadata, its tokenizer, and memory-mapped token ids per split."""

    def __init__(self, path: Path, meta: dict, tokenizer: Tokenizer):
        self.name = meta["name"]
        self.path = Path(path)
        self.meta = meta
        self.tokenizer = tokenizer
        self._checked = set()  # the splits whose ids (and checksum) have been checked

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def unit(self) -> str:
        """``"char"``, ``"byte"`` or ``"subword"``."""
        return self.meta["unit"]

    @property
    def fingerprint(self) -> str | None:
        """The sha256 of the options and inputs it was prepared from (None for a corpus of charlm 0.1)."""
        fingerprint = self.meta.get("fingerprint")
        return fingerprint if isinstance(fingerprint, str) else None

    @property
    def content(self) -> str | None:
        """A sha256 of what a model sees of the corpus: its vocabulary, split sizes and the checksums of its
        files; unlike ``fingerprint``, the same wherever its inputs lay. None where no checksums are recorded."""
        files = self.meta.get("files")
        if not isinstance(files, dict) or not files:
            return None
        checksums = {name: record.get("sha256") for name, record in files.items() if isinstance(record, dict)}
        value = {"vocab": self.meta["vocab"], "splits": self.meta["splits"], "files": checksums}
        return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()

    @property
    def is_kept_version(self) -> bool:
        """Whether this is an earlier version, kept because the corpus was prepared again since."""
        return self.path.parent.parent.name == VERSIONS

    @property
    def verified(self) -> bool:
        """False when the corpus was made from inputs whose checksums were not enforced (``--no-verify``).

        Metadata written before this was recorded counts as verified.
        """
        return self.meta.get("verified", True) is not False

    def split(self, which: str) -> np.ndarray:
        """The token ids of split ``which`` ("train", "valid" or "test"), memory-mapped. The first
        time, its ids are checked to be in the vocabulary and the file against its checksum."""
        path = self.path / f"{_check_split(which)}.npy"
        layout = array_layout(path, which, self.meta, self.path)  # again: the file may have changed since
        if layout.length == 0:
            return np.zeros(0, dtype=layout.dtype)
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if which not in self._checked:
            check_ids(path, array, layout, self.meta, self.path)
            self._checked.add(which)
        return array

    def verify(self) -> None:
        """Check every split's ids and checksum now (``split`` does it for each when first used)."""
        for which in SPLITS:
            self.split(which)

    def tokens(self, which: str) -> int:
        return self.meta["splits"][_check_split(which)]["tokens"]

    def characters(self, which: str) -> int:
        """Characters of original text in the split (bytes for a byte corpus): the bits-per-character divisor."""
        return self.meta["splits"][_check_split(which)]["characters"]

    def __repr__(self):
        sizes = " / ".join(f"{self.tokens(s):,}" for s in SPLITS)
        return f"PreparedCorpus({self.name!r}, unit={self.unit!r}, vocab_size={self.vocab_size}, tokens={sizes})"


def _check_split(which: str) -> str:
    if which not in SPLITS:
        raise CharlmError(f"unknown split {which!r}: choose one of {', '.join(SPLITS)}")
    return which


def read_meta(path: Path) -> dict | None:
    """The metadata of the prepared corpus at ``path``, or None if there is none (or it is unreadable
    or not a JSON object). Unchecked: ``open_prepared`` checks it."""
    try:
        meta = json.loads(read_bytes(Path(path) / META, "corpus metadata").decode("utf-8"))
    except (CharlmError, ValueError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def open_prepared(path: Path) -> PreparedCorpus:
    """The prepared corpus at ``path``, its metadata, tokenizer and array headers checked (a
    ``DamagedCorpus`` error otherwise); each split's ids are checked when it is first used."""
    path = Path(path)
    meta = read_checked_meta(path, FORMAT_VERSION)
    tokenizer = build_tokenizer(meta, path)
    for which in SPLITS:  # sizes only: a split's ids are read when it is used
        array_layout(path / f"{which}.npy", which, meta, path)
    return PreparedCorpus(path, meta, tokenizer)


def write_prepared(root: Path, name: str, arrays: dict[str, np.ndarray], meta: dict, tokenizer: Tokenizer) -> Path:
    """Write a corpus to ``root/name`` atomically, replacing any earlier version; returns its path."""
    meta = {**meta, "tokenizer": tokenizer.plain_state(), "files": {}}
    extra_files = {SUBWORD_MODEL: tokenizer.model} if tokenizer.model is not None else {}
    target, staging = root / name, staging_path(root, name, "partial")
    with writing(target):
        root.mkdir(parents=True, exist_ok=True)
    try:
        with writing(target):  # a full disk or a file-size limit: one line naming the corpus
            staging.mkdir()
            for which, array in arrays.items():
                write_array(staging / f"{which}.npy", array)
            for filename, data in extra_files.items():
                (staging / filename).write_bytes(data)
            for filename in [f"{which}.npy" for which in arrays] + list(extra_files):
                _flush_to_disk(staging / filename)  # before the rename: a power cut cannot leave it short
                meta["files"][filename] = file_record(staging / filename)
            (staging / META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            _flush_to_disk(staging / META)
            flush_directory(staging)
            previous = staging_path(root, name, "previous") if target.exists() else None
            if previous:
                os.replace(target, previous)
            os.replace(staging, target)
            flush_directory(root)
            if previous:
                keep_or_remove(previous, root, name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def kept_version_path(root: Path, name: str, fingerprint: str) -> Path:
    """Where the version of corpus ``name`` with ``fingerprint`` is kept once the corpus is prepared again."""
    return Path(root) / VERSIONS / name / fingerprint


def keep_or_remove(previous: Path, root: Path, name: str) -> bool:
    """The replaced version ``previous`` of corpus ``name``: kept under ``.versions`` when it was made
    from other inputs than the corpus now in place (a run may have trained on it), else removed.
    Returns whether it was kept."""
    old, new = read_meta(previous), read_meta(root / name)
    fingerprint = old.get("fingerprint") if old else None
    if (
        isinstance(fingerprint, str)
        and FINGERPRINT.fullmatch(fingerprint)
        and fingerprint != (new or {}).get("fingerprint")
        and not kept_version_path(root, name, fingerprint).exists()
    ):
        kept = kept_version_path(root, name, fingerprint)
        kept.parent.mkdir(parents=True, exist_ok=True)
        os.replace(previous, kept)
        flush_directory(kept.parent)
        return True
    shutil.rmtree(previous)
    return False


def write_array(path: Path, array: np.ndarray) -> None:
    """The file ``np.save`` writes, written with Python's own file calls: numpy's writer (``tofile``)
    turns a full disk or a file-size limit into "4000 requested and 866 written", losing the reason."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as file:
        np.lib.format.write_array_header_1_0(file, np.lib.format.header_data_from_array_1_0(array))
        file.write(memoryview(array).cast("B"))


def _flush_to_disk(path: Path) -> None:
    """Make what was written to ``path`` durable (fsync; Windows needs a handle open for writing)."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def staging_path(root: Path, name: str, kind: str) -> Path:
    """A temporary directory name for corpus ``name`` that records this host and process."""
    return root / f".{name}.{kind}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def remove_abandoned_staging(root: Path) -> list[str]:
    """Clear away the temporary directories in ``root`` of preparations killed on this host.

    A ``.partial-`` directory is removed. A ``.previous-`` one (a replaced version) is removed when
    its corpus is in place, and put back as the corpus when the process died between the two renames.
    Directories of live processes, or made on another host (a shared data root), are left alone.
    Returns what was done, one phrase per directory (``removed .wp.partial-…``).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    cleared = []
    for path in sorted(root.glob(".*")):
        staging = STAGING_NAME.fullmatch(path.name)
        if not staging or staging["host"] != _host() or _process_is_alive(int(staging["pid"])):
            continue
        target = root / staging["name"]
        if staging["kind"] == "previous" and not target.exists():
            _rename_if_still_there(path, target)
            done = f"put back {path.name} as {target.name}"
        elif staging["kind"] == "previous":
            try:
                kept = keep_or_remove(path, root, staging["name"])
            except OSError:
                continue
            done = f"kept {path.name} as an earlier version" if kept else f"removed {path.name}"
        else:
            shutil.rmtree(path, ignore_errors=True)
            done = f"removed {path.name}"
        if not path.exists():
            cleared.append(done)
    return cleared


def _rename_if_still_there(path: Path, target: Path) -> None:
    """Rename ``path`` to ``target``, unless a preparation running beside this one got there first."""
    try:
        os.replace(path, target)
    except OSError:
        pass


def _process_is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (assumed so where that cannot be asked)."""
    if os.name != "posix":
        return True  # os.kill would terminate the process on Windows
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: it exists, under another user
        return True
    return True
