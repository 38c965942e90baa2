"""Choosing the device: ``auto`` takes the accelerator torch sees (CUDA, MPS), else the CPU."""

from __future__ import annotations

import torch

from charlm.config_rules import DEVICE_PATTERN
from charlm.errors import CharlmError


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def _auto() -> torch.device:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        if accelerator.is_available():
            found = accelerator.current_accelerator()
            if found is not None and found.type in ("cuda", "mps"):
                return torch.device(found.type)
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps" if _mps_available() else "cpu")


def resolve_device(name: str = "auto") -> torch.device:
    name = str(name)
    if not DEVICE_PATTERN.fullmatch(name):
        raise CharlmError(f"unknown device {name!r}: use auto, cpu, cuda, cuda:N or mps")
    if name == "auto":
        return _auto()
    if name == "cpu":
        return torch.device("cpu")
    if name == "mps":
        if not _mps_available():
            raise CharlmError("device 'mps' is not available: this torch sees no Apple GPU (use --device cpu)")
        return torch.device("mps")
    if not torch.cuda.is_available():
        raise CharlmError(f"device {name!r} is not available: this torch sees no CUDA GPU (use --device cpu)")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise CharlmError(f"device {name!r} is not available: only {torch.cuda.device_count()} CUDA device(s)")
    if device.index is not None:
        # What runs on "the current device" (a CUDA graph's capture stream, a library's workspace)
        # must be on this one, not on cuda:0.
        torch.cuda.set_device(device)
    return device
