"""Checkpoints: plain tensors and containers only, written atomically, checked on load."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from charlm import __version__
from charlm.errors import CharlmError

FORMAT = "charlm-checkpoint"
FORMAT_VERSION = 1


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write ``payload`` (plus format tags) to ``path`` through a temporary file and a rename."""
    path = Path(path)
    payload = {**payload, "format": FORMAT, "format_version": FORMAT_VERSION, "charlm_version": __version__}
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def resolve_checkpoint(reference: str | Path, prefer: str = "best") -> Path:
    """A run directory means its ``best.pt`` (or ``last.pt`` if there is no best yet)."""
    path = Path(reference)
    if path.is_dir():
        for name in (f"{prefer}.pt", "best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise CharlmError(f"run directory {path} holds no checkpoint (best.pt or last.pt)")
    if not path.is_file():
        raise CharlmError(f"no such checkpoint or run directory: {path}")
    return path


def load_checkpoint(reference: str | Path, map_location="cpu", prefer: str = "best") -> dict:
    path = resolve_checkpoint(reference, prefer)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch.load raises many kinds on a file that is not a checkpoint
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CharlmError(f"{path} is not a readable charlm checkpoint ({first_line[:120]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CharlmError(f"{path} is not a charlm checkpoint")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CharlmError(
            f"{path} was written by charlm {payload.get('charlm_version')} in checkpoint format "
            f"{payload.get('format_version')}; this charlm {__version__} reads format {FORMAT_VERSION}"
        )
    payload["path"] = str(path)
    return payload
