"""The model's one-symbol step as a file that runs without charlm: TorchScript or ONNX.

The exported function is :meth:`charlm.model.LanguageModel.step` of the eval-mode model, with the
recurrent state as a flat list of tensors instead of a tuple per layer:

    (tokens [batch] int64, state_0 [batch, w_0], ..., state_k [batch, w_k])
        -> (logits [batch, vocabulary], new state_0, ..., new state_k)

The state tensors are named ``layer{L}_state{I}``: layer L's I-th tensor (an LSTM has h, c; an
Elman RNN has h). The outputs are ``logits`` and ``layer{L}_state{I}_out``. Every state starts at
zeros (what ``initial_state`` gives). Before a file is kept, it is run on a few steps that carry
their state, side by side with charlm's own step; :func:`write_step` refuses a file whose logits or
state differ by more than ``TOLERANCE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from charlm.errors import CharlmError
from charlm.files import atomic_write, atomic_write_text, is_write_failure
from charlm.inference.export_formats import STEP_FORMATS, check_available, description_path
from charlm.model import LanguageModel

TOLERANCE = 1e-5
CHECK_STEPS = 5
CHECK_BATCH = 3  # not the batch the step is traced at, so a batch size baked in would show
TRACE_BATCH = 2
ONNX_OPSET = 17

Runner = Callable[[Tensor, list[Tensor]], tuple[Tensor, list[Tensor]]]


@dataclasses.dataclass(frozen=True)
class StateLayout:
    """The flat list of state tensors: per layer how many, and each one's name and width."""

    counts: tuple[int, ...]  # tensors per layer
    names: tuple[str, ...]
    widths: tuple[int, ...]

    @classmethod
    def of(cls, model: LanguageModel) -> "StateLayout":
        counts, names, widths = [], [], []
        for layer_index, layer_state in enumerate(model.initial_state(1, device=torch.device("cpu"))):
            counts.append(len(layer_state))
            for index, tensor in enumerate(layer_state):
                if tensor.dim() != 2:
                    raise CharlmError(
                        f"cannot export cell {model.config.cell!r}: its state tensor {index} of layer "
                        f"{layer_index} is not [batch, width] but has shape {list(tensor.shape)}"
                    )
                names.append(f"layer{layer_index}_state{index}")
                widths.append(tensor.shape[1])
        return cls(tuple(counts), tuple(names), tuple(widths))

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(f"{name}_out" for name in self.names)

    def flatten(self, state: list) -> list[Tensor]:
        return [tensor for layer_state in state for tensor in layer_state]

    def nest(self, flat) -> list[tuple[Tensor, ...]]:
        state, start = [], 0
        for count in self.counts:
            state.append(tuple(flat[start : start + count]))
            start += count
        return state


class FlatStep(nn.Module):
    """``model.step`` with the state as separate tensor arguments and results (what is exported)."""

    def __init__(self, model: LanguageModel, layout: StateLayout):
        super().__init__()
        self.model = model
        self.layout = layout

    def forward(self, tokens: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        logits, new_state = self.model.step(tokens, self.layout.nest(list(state)))
        return (logits, *self.layout.flatten(new_state))


def write_step(model: LanguageModel, path: Path, format: str) -> float:
    """Write the step of ``model`` (on the CPU, in eval mode) to ``path`` as ``format`` ("torchscript"
    or "onnx"), run it beside ``model.step`` and return the largest difference; raises (and leaves
    the file to the caller to delete) when it exceeds ``TOLERANCE``."""
    check_available(format)
    if format not in STEP_FORMATS:
        raise CharlmError(f"the step is written as {' or '.join(STEP_FORMATS)}, not {format}")
    model = model.eval()
    layout = StateLayout.of(model)
    step = FlatStep(model, layout).eval()
    example = example_inputs(model, layout, TRACE_BATCH, seed=1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit and the TorchScript-based ONNX exporter say they are deprecated
        try:
            if format == "torchscript":
                traced = torch.jit.trace(step, example, check_trace=False)
                with open(path, "wb") as file:  # given a path, its C++ writer aborts the process on a full disk
                    torch.jit.save(traced, file)
            else:
                write_onnx(step, example, layout, path)
        except CharlmError:
            raise
        except Exception as error:  # an operation the tracer or the exporter cannot take
            if is_write_failure(error):
                raise  # a full disk or a file-size limit: atomic_write says so, naming the file meant
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CharlmError(f"cannot export cell {model.config.cell!r} to {format}: {first}") from None
    difference = max_difference(model, layout, runner(format, path, layout))
    if not difference <= TOLERANCE:
        raise CharlmError(
            f"the exported {format} step differs from charlm's by {difference:.2e} (more than "
            f"{TOLERANCE:g}): not written"
        )
    return difference


def write_onnx(step: FlatStep, example: tuple, layout: StateLayout, path: Path) -> None:
    """The TorchScript-based exporter (``dynamo=False``): it needs onnx alone, where the default
    exporter also needs onnxscript; the batch dimension of every input and output is dynamic."""
    inputs, outputs = ["tokens", *layout.names], ["logits", *layout.output_names]
    with output_silenced():  # its C++ log prints the whole graph to stdout when an operation cannot be exported
        torch.onnx.export(
            step,
            example,
            str(path),
            dynamo=False,
            opset_version=ONNX_OPSET,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in inputs + outputs},
        )


@contextlib.contextmanager
def output_silenced():
    """File descriptor 1 to /dev/null for the block (what C++ code writes there included)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def runner(format: str, path: Path, layout: StateLayout) -> Runner:
    """A function (tokens, flat state) -> (logits, flat state) that runs the written file."""
    if format == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.jit.load is deprecated"
            loaded = torch.jit.load(str(path), map_location="cpu")

        def run_torchscript(tokens, state):
            logits, *new_state = loaded(tokens, *state)
            return logits, new_state

        return run_torchscript
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run_onnx(tokens, state):
        feeds = {"tokens": tokens.numpy(), **{name: tensor.numpy() for name, tensor in zip(layout.names, state)}}
        logits, *new_state = session.run(None, feeds)
        return torch.from_numpy(logits), [torch.from_numpy(tensor) for tensor in new_state]

    return run_onnx


def example_inputs(model: LanguageModel, layout: StateLayout, batch: int, seed: int) -> tuple[Tensor, ...]:
    """Tokens drawn from the vocabulary and a state drawn from |N(0, 0.5²)| (not zeros, so that every
    state input is seen to matter; not negative, as a normaliser that sums positive terms, sLSTM's n,
    never is: near zero from both sides it would cancel, and float rounding with it), in the model's dtype."""
    generator = torch.Generator().manual_seed(seed)
    dtype = model.head.weight.dtype
    tokens = torch.randint(model.config.vocab_size, (batch,), generator=generator)
    state = [0.5 * torch.randn(batch, width, generator=generator, dtype=dtype).abs() for width in layout.widths]
    return (tokens, *state)


@torch.no_grad()
def max_difference(
    model: LanguageModel, layout: StateLayout, run: Runner, steps: int = CHECK_STEPS, batch: int = CHECK_BATCH
) -> float:
    """The largest absolute difference between ``run`` and ``model.step`` over ``steps`` steps, each
    fed its own state from the step before, in the logits and in every state tensor."""
    tokens, *start = example_inputs(model, layout, batch, seed=2)
    generator = torch.Generator().manual_seed(3)
    ours, theirs, largest = layout.nest(start), list(start), 0.0
    for _ in range(steps):
        expected_logits, ours = model.step(tokens, ours)
        logits, theirs = run(tokens, theirs)
        pairs = [(expected_logits, logits), *zip(layout.flatten(ours), theirs)]
        for expected, got in pairs:
            if expected.shape != got.shape:
                raise CharlmError(
                    f"the exported step gives shape {list(got.shape)} where charlm's gives "
                    f"{list(expected.shape)}: not written"
                )
            largest = max(largest, (expected.double() - got.double()).abs().max().item())
        tokens = torch.randint(model.config.vocab_size, (batch,), generator=generator)
    return largest


def description(model, format: str, file_name: str) -> dict:
    """What the JSON beside an exported step says, for a user without charlm: the files, the
    inputs and outputs, the state, the vocabulary and how text is normalised before encoding.
    ``model`` is a :class:`charlm.api.Model`."""
    network = model.network
    layout = StateLayout.of(network)
    tokenizer = {key: value for key, value in model.tokenizer.plain_state().items() if key != "vocab"}
    unit = model.unit
    vocabulary = set(model.vocabulary)
    return {
        "format": format,
        "file": file_name,
        "charlm_version": model.checkpoint.charlm_version,
        "model": network.config.to_dict(),
        "inputs": ["tokens", *layout.names],
        "outputs": ["logits", *layout.output_names],
        "tokens": {"dtype": "int64", "shape": ["batch"], "meaning": "index into vocabulary"},
        "logits": {
            "dtype": "float32",
            "shape": ["batch", network.config.vocab_size],
            "meaning": "unnormalised log-probabilities of the next token (softmax gives probabilities)",
        },
        "state": [
            {"name": name, "output": out, "dtype": "float32", "shape": ["batch", width], "initial": "zeros"}
            for name, out, width in zip(layout.names, layout.output_names, layout.widths)
        ],
        "unit": unit,
        "tokenizer": tokenizer,
        "vocabulary": list(model.vocabulary),
        "normalisation": {
            "strip_leading_bom": unit != "byte" and "\ufeff" not in vocabulary,
            "newlines_to_lf": unit != "byte" and "\r" not in vocabulary,
            "space_symbol": tokenizer.get("space_symbol"),
            "encoding": ENCODINGS.get(tokenizer.get("kind"), "sentencepiece pieces (see sentencepiece_model)"),
        },
    }


ENCODINGS = {
    "char": "one token per character: its index in vocabulary (after replacing ' ' by space_symbol when set)",
    "byte": "one token per UTF-8 byte b: the index of chr(b) in vocabulary",
    "word": "whitespace-separated words; every line break is the token <eos>",
    "vowel-linked": "the Delta-RNN paper's vowel-linked pieces of each word, then </w>; a line ends with <eos>",
}


def write_description(model, format: str, path: Path) -> list[Path]:
    """Write ``PATH.json`` (:func:`description`) beside the exported ``path``, and for a sentencepiece
    vocabulary its model as ``PATH.spm.model``; returns the files written."""
    info = description(model, format, path.name)
    written = []
    if model.tokenizer.model is not None:
        pieces = path.with_name(path.name + ".spm.model")
        atomic_write(pieces, lambda temporary: temporary.write_bytes(model.tokenizer.model))
        info["sentencepiece_model"] = pieces.name
        written.append(pieces)
    sidecar = description_path(path)
    atomic_write_text(sidecar, json.dumps(info, indent=2, ensure_ascii=False) + "\n")
    return [sidecar, *written]
