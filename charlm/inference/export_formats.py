"""The formats `charlm export` writes, and whether the packages a format needs are installed
(without importing torch, so that the command line starts fast)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from charlm.errors import CharlmError

FORMATS = ("charlm", "safetensors", "torchscript", "onnx")
STEP_FORMATS = ("torchscript", "onnx")  # the one-symbol step, with a description beside it
ONNX_HINT = (
    "install the extra from charlm's clone: python3 -m pip install -e '.[onnx]' (or: pip install onnx onnxruntime)"
)


def check_available(format: str) -> None:
    """Refuse before any work when ``format`` is unknown or needs packages that are missing."""
    if format not in FORMATS:
        raise CharlmError(f"--format must be one of {', '.join(FORMATS)}, not {format!r}")
    if format == "onnx":
        missing = [name for name in ("onnx", "onnxruntime") if _missing(name)]
        if missing:
            raise CharlmError(f"--format onnx needs {' and '.join(missing)}: {ONNX_HINT}")
    if format == "safetensors" and _missing("safetensors"):
        from charlm.checkpoint_safetensors import needs_safetensors  # imports torch: only on the way to an error

        raise needs_safetensors("--format safetensors")


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a module set to None in sys.modules (how the tests hide one)
        return True


def description_path(path: Path) -> Path:
    """Where the JSON that describes an exported step goes: beside it, ``PATH.json``."""
    return path.with_name(path.name + ".json")
