"""A prepared corpus on disk: ``<data root>/<name>/`` with ``meta.json`` and one ``.npy`` array per split.

The directory is written under a temporary name inside the data root and renamed into place when
complete, so a reader never sees half a corpus. Split arrays are memory-mapped when read.

The temporary names (``.<name>.partial-<host>-<pid>-<token>``, and ``.previous-`` for the version
being replaced) say which process made them, so that a later preparation can remove those of a
process that was killed (``kill -9``) and leave alone those of one still at work.
"""

import json
import os
import re
import shutil
import socket
import uuid
from pathlib import Path

import numpy as np

from charlm.corpora.splits import SPLITS
from charlm.corpora.tokenizer import Tokenizer
from charlm.errors import CharlmError
from charlm.files import read_bytes, writing

FORMAT_VERSION = 1
META = "meta.json"
SUBWORD_MODEL = "tokenizer.model"  # the sentencepiece model of a subword corpus
DEFAULT_DATA_ROOT = "data"
STAGING_NAME = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|previous)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")


def data_root(data_dir: str | Path | None = None) -> Path:
    """Where prepared corpora live: ``data_dir``, else ``$CHARLM_DATA``, else ``./data``."""
    if data_dir:
        return Path(data_dir)
    return Path(os.environ.get("CHARLM_DATA") or DEFAULT_DATA_ROOT)


class PreparedCorpus:
    """A prepared corpus: its metadata, its tokenizer, and memory-mapped token ids per split."""

    def __init__(self, path: Path, meta: dict, tokenizer: Tokenizer):
        self.name = meta["name"]
        self.path = Path(path)
        self.meta = meta
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def unit(self) -> str:
        """``"char"``, ``"byte"`` or ``"subword"``."""
        return self.meta["unit"]

    @property
    def verified(self) -> bool:
        """False when the corpus was made from inputs whose checksums were not enforced (``--no-verify``).

        Metadata written before this was recorded counts as verified.
        """
        return self.meta.get("verified", True) is not False

    def split(self, which: str) -> np.ndarray:
        """The token ids of split ``which`` ("train", "valid" or "test"), memory-mapped."""
        path = self.path / f"{_check_split(which)}.npy"
        if path.exists() and not path.is_file():  # a FIFO would be waited on for ever
            raise CharlmError(f"{path} is not a regular file: prepare the corpus again")
        return np.load(path, mmap_mode="r")

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
    """The metadata of the prepared corpus at ``path``, or None if there is none (or it is unreadable)."""
    try:  # a FIFO is refused, not waited on
        return json.loads(read_bytes(Path(path) / META, "corpus metadata").decode("utf-8"))
    except (CharlmError, ValueError):
        return None


def open_prepared(path: Path) -> PreparedCorpus:
    """The prepared corpus at ``path``."""
    path = Path(path)
    meta = read_meta(path)
    if meta is None:
        raise CharlmError(f"{path} is not a prepared corpus (no readable {META})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CharlmError(f"{path} was prepared in format {meta.get('format_version')}, this charlm reads "
                          f"format {FORMAT_VERSION}: prepare it again")
    state = dict(meta["tokenizer"])
    if state["kind"] == "subword":
        state["model"] = read_bytes(path / SUBWORD_MODEL, "subword model")
    return PreparedCorpus(path, meta, Tokenizer.from_state(state))


def write_prepared(root: Path, name: str, arrays: dict[str, np.ndarray], meta: dict, tokenizer: Tokenizer) -> Path:
    """Write a corpus to ``root/name`` atomically, replacing any earlier version; returns its path."""
    meta = {**meta, "tokenizer": tokenizer.plain_state()}
    extra_files = {SUBWORD_MODEL: tokenizer.model} if tokenizer.model is not None else {}
    target, staging = root / name, staging_path(root, name, "partial")
    with writing(target):
        root.mkdir(parents=True, exist_ok=True)
    try:
        with writing(target, partial=staging):  # a full disk or a file-size limit: one line naming the corpus
            staging.mkdir()
            for which, array in arrays.items():
                np.save(staging / f"{which}.npy", array)
            for filename, data in extra_files.items():
                (staging / filename).write_bytes(data)
            (staging / META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            if target.exists():
                previous = staging_path(root, name, "previous")
                os.replace(target, previous)
                os.replace(staging, target)
                shutil.rmtree(previous)
            else:
                os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


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
