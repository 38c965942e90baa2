"""The exported model as a safetensors file: the weights as its tensors, everything else charlm
needs in its header's metadata, so that any safetensors reader loads it and ``charlm.load`` reads
it back as the same model (``charlm export --format safetensors``).

The tensors are the model's ``state_dict``, each contiguous; a tensor held under several names
(tied layers) is stored once, the other names listed in ``charlm.shared``. The metadata is
``format: "pt"`` (the safetensors convention for torch) and, as JSON strings, the parts of an
export checkpoint (``charlm.checkpoint``'s payload) other than its weights:

    charlm.format, charlm.format_version, charlm.charlm_version, charlm.kind,
    charlm.model_config, charlm.train_config, charlm.tokenizer, charlm.scores,
    charlm.provenance, charlm.dynamic, charlm.shared {alias: stored name}

and, for a sentencepiece vocabulary, its model's bytes as a base64 string in ``charlm.tokenizer_model``.
Reading gives that payload back; ``Checkpoint.from_payload`` checks it as it checks any file.
The ``safetensors`` package is imported only when such a file is written or read.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from pathlib import Path

import torch

from charlm.errors import CharlmError

PARTS = (
    "format",
    "format_version",
    "charlm_version",
    "kind",
    "model_config",
    "train_config",
    "tokenizer",
    "scores",
    "provenance",
    "dynamic",
)
SHARED = "charlm.shared"
TOKENIZER_MODEL = "charlm.tokenizer_model"
TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")  # as charlm.checkpoint: a zip archive, or a pickle


def safetensors_torch(purpose: str):
    """``safetensors.torch``, or one line saying how to install it."""
    try:
        import safetensors.torch
    except ImportError:
        raise needs_safetensors(purpose) from None
    return safetensors.torch


def needs_safetensors(purpose: str) -> CharlmError:
    return CharlmError(
        f"{purpose} needs the safetensors package: install the extra from charlm's clone: "
        "python3 -m pip install -e '.[safetensors]' (or: pip install safetensors)"
    )


# --- writing ---------------------------------------------------------------------------------------


def encode(checkpoint) -> bytes:
    """The safetensors file of ``checkpoint``'s export (a :class:`charlm.checkpoint.Checkpoint`)."""
    library = safetensors_torch("--format safetensors")
    aliases = shared_names(checkpoint.weights)
    payload = checkpoint.exported().to_payload()
    tensors = {name: tensor.contiguous() for name, tensor in payload["weights"].items() if name not in aliases}
    tokenizer = dict(payload["tokenizer"])
    metadata = {"format": "pt", SHARED: json.dumps(aliases)}
    if "model" in tokenizer:  # a sentencepiece model: bytes, carried as a uint8 tensor in a checkpoint
        metadata[TOKENIZER_MODEL] = json.dumps(base64.b64encode(model_bytes(tokenizer.pop("model"))).decode("ascii"))
    payload["tokenizer"] = tokenizer
    for part in PARTS:
        try:
            metadata[f"charlm.{part}"] = json.dumps(payload[part], ensure_ascii=False)
        except (TypeError, ValueError) as error:
            raise CharlmError(f"cannot write the checkpoint's {part} as JSON for safetensors ({error})") from None
    return library.save(tensors, metadata=metadata)


def shared_names(weights: dict) -> dict[str, str]:
    """``{name: first name}`` for each weight that is the same tensor as one named before it."""
    first, aliases = {}, {}
    for name, tensor in weights.items():
        key = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if key in first and tensor.numel() > 0:
            aliases[name] = first[key]
        else:
            first.setdefault(key, name)
    return aliases


def model_bytes(model) -> bytes:
    if torch.is_tensor(model):
        return model.numpy().tobytes()
    return bytes(model)


# --- reading ---------------------------------------------------------------------------------------


def is_safetensors(path: Path) -> bool:
    """Whether ``path`` is to be read as safetensors: it starts as one (an 8-byte little-endian header
    length that fits the file, then ``{``), or it is named ``*.safetensors`` and is no torch file."""
    try:
        with open(path, "rb") as file:
            start = file.read(9)
        size = path.stat().st_size
    except OSError:
        return False  # torch's reader says why it cannot be read
    if len(start) == 9 and start[8:9] == b"{" and struct.unpack("<Q", start[:8])[0] <= size - 8:
        return True  # first: the length's low byte may be torch's 0x80
    return path.suffix.lower() == ".safetensors" and not start.startswith(TORCH_FILE_STARTS)


def read_payload(path: Path) -> dict:
    """The checkpoint payload a safetensors file of ``encode`` holds; one line for a file that is
    damaged or not charlm's."""
    library = safetensors_torch(f"reading {path}")
    try:
        with library.safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
            if "charlm.format" not in metadata:
                raise CharlmError(
                    f"{path} is a safetensors file without charlm's settings (no charlm.format in its metadata): "
                    "charlm reads the ones `charlm export --format safetensors` writes"
                )
            weights = {name: file.get_tensor(name) for name in file.keys()}
    except CharlmError:
        raise
    except Exception as error:  # safetensors' own error on a damaged header or a file cut short
        raise CharlmError(f"{path} is not a readable safetensors file: {first_line(error)}") from None
    payload = {part: decoded(metadata, f"charlm.{part}", path) for part in PARTS}
    payload["weights"] = with_aliases(weights, decoded(metadata, SHARED, path) or {}, path)
    payload["training"] = None
    tokenizer = payload["tokenizer"]
    if TOKENIZER_MODEL in metadata and isinstance(tokenizer, dict):
        try:
            model = base64.b64decode(decoded(metadata, TOKENIZER_MODEL, path), validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise CharlmError(f"{path} is a damaged charlm safetensors file: its {TOKENIZER_MODEL} is not base64")
        tokenizer["model"] = (
            torch.frombuffer(bytearray(model), dtype=torch.uint8) if model else torch.empty(0, dtype=torch.uint8)
        )
    return payload


def decoded(metadata: dict, key: str, path: Path):
    """The JSON value under ``key`` (None where absent: the checks of the payload say what is missing)."""
    if key not in metadata:
        return None
    try:
        return json.loads(metadata[key])
    except (ValueError, RecursionError) as error:  # RecursionError: arrays nested thousands deep
        raise CharlmError(f"{path} is a damaged charlm safetensors file: its {key} is not JSON ({error})") from None


def with_aliases(weights: dict, aliases, path: Path) -> dict:
    """``weights`` with each name of ``charlm.shared`` given the tensor it names."""
    if not isinstance(aliases, dict):
        raise CharlmError(f"{path} is a damaged charlm safetensors file: its {SHARED} is not a mapping")
    for alias, name in aliases.items():
        if not isinstance(name, str) or name not in weights or alias in weights:
            raise CharlmError(
                f"{path} is a damaged charlm safetensors file: its {SHARED} gives {alias[:60]!r} the tensor "
                f"{str(name)[:60]!r}, where it must name a stored tensor for a name that has none"
            )
        weights[alias] = weights[name]
    return weights


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:160]
