"""Where a run came from: the command line, versions, machine, corpus fingerprint, times."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from charlm import __version__


def git_commit() -> str | None:
    """The commit of the charlm checkout this package is installed from (``+dirty`` if modified)."""
    package = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return platform.processor() or platform.machine() or "cpu"
    return device.type


def _program(argv0: str) -> str:
    """The name the command was run as: ``charlm`` for the script and for ``python -m charlm``."""
    path = Path(argv0)
    return path.parent.name if path.name == "__main__.py" else path.name


def collect(device: torch.device, corpus=None) -> dict:
    """Plain values describing this process, for config.json, the checkpoint and `charlm runs`."""
    meta = getattr(corpus, "meta", {}) or {}
    return {
        "command": shlex.join([_program(sys.argv[0]), *sys.argv[1:]]) if sys.argv and sys.argv[0] else None,
        "charlm_version": __version__,
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        "device": str(device),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "tf32": {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)},
        "host": platform.node(),
        "pid": os.getpid(),
        "corpus": None if corpus is None else corpus.name,
        "corpus_fingerprint": meta.get("fingerprint"),
        "corpus_content": None if corpus is None else corpus.content,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
