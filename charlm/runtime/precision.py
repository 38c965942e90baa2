"""Mixed precision: ``--precision fp32|bf16|fp16``.

The recurrent layers' matrix products run under ``torch.autocast`` in the chosen type; the
softmax and the loss always run in float32 (``token_nats`` and the training loss promote the
logits), and the weights, their gradients and Adam's moments stay float32. fp16 needs a CUDA
device and a gradient scaler (its range is too narrow for small gradients); bf16 has float32's
range and runs on the CPU too.
"""

from __future__ import annotations

import contextlib

import torch

from charlm.errors import CharlmError

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    """One line when ``precision`` cannot run on ``device``."""
    if precision == "fp16" and device.type != "cuda":
        raise CharlmError(f"--precision fp16 needs a CUDA device, not {device.type} (bf16 runs on the CPU)")
    if precision == "bf16" and device.type not in ("cpu", "cuda"):
        raise CharlmError(f"--precision bf16 runs on cpu or cuda, not {device.type}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise CharlmError("--precision bf16: this GPU has no bfloat16 support; use fp16")


def autocast(precision: str, device: torch.device):
    """The context the forward pass runs in."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def set_tf32(enabled: bool) -> None:
    """``--tf32``: float32 matrix products and cuDNN on TensorFloat-32 units, or (the default) not.
    torch's own defaults differ between the two (cuDNN on, matmul off), which would make ``fp32``
    lstm (cuDNN) and charlm's own loops (matmul) run different arithmetic."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def tf32_in_use() -> dict:
    """What provenance records: whether matmul and cuDNN may use TensorFloat-32."""
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}


def layer_output_dtypes(model, precision: str, device: torch.device, batch_size: int = 2, steps: int = 3) -> list:
    """The type of each layer's depth output in a training forward pass under ``precision``."""
    seen = []
    hooks = [
        layer.register_forward_hook(lambda module, inputs, output: seen.append(output[0].dtype))
        for layer in model.layers
    ]
    was_training = model.training
    try:
        model.train()
        tokens = torch.zeros(batch_size, steps, dtype=torch.long, device=device)
        with torch.enable_grad(), autocast(precision, device):  # the training path (without gradients, some
            model(tokens, model.initial_state(batch_size, device=device))  # cells evaluate through their step)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return seen


def wrong_layer_dtypes(dtypes, precision: str) -> list[str]:
    """The types in ``dtypes`` (torch dtypes or their names) that ``precision`` must never give: a
    layer runs in float32 or in the type asked for, never in the other half type."""
    allowed = {"float32"} | ({str(PRECISIONS[precision]).removeprefix("torch.")} if PRECISIONS[precision] else set())
    names = [str(dtype).removeprefix("torch.") for dtype in dtypes]
    return sorted({name for name in names if name not in allowed})


def without_autocast_cache(device: torch.device):
    """The autocast in force on ``device`` with its cache of cast weights off (a CUDA graph must
    cast the weights itself: a cached copy would be stale at the next replay)."""
    if not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type), cache_enabled=False)


def grad_scaler(precision: str, device: torch.device):
    """A gradient scaler for fp16, else None."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def float32_state(state: list) -> list:
    """The carried state with low-precision tensors made float32 (autocast may hand it back in
    bf16 or fp16), so that a checkpoint holds the same state whatever the precision of the run."""
    low = (torch.bfloat16, torch.float16)
    return [tuple(tensor.float() if tensor.dtype in low else tensor for tensor in layer) for layer in state]
