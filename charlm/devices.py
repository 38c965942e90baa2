"""Choosing the device: ``auto`` takes CUDA when there is one."""

import torch

from charlm.errors import CharlmError


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CharlmError(f"device {name!r} is not available: this torch sees no CUDA GPU (use --device cpu)")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CharlmError(f"device {name!r} is not available: only {torch.cuda.device_count()} CUDA device(s)")
        return device
    if name == "cpu":
        return torch.device("cpu")
    raise CharlmError(f"unknown device {name!r}: use auto, cpu or cuda")
