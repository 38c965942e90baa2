"""``charlm check``: a self-test of this machine's fast paths against the plain code; no corpus needed.

Each row compares two ways of computing the same thing on the device and says how far apart they
are against a tolerance that fits the arithmetic:

- **environment**: versions, the device really current, TensorFloat-32 as charlm set it;
- **each cell in float64**: the training window (forward and gradients), the evaluation path and
  the sampling step against the cell's ``step`` equations run one step at a time;
- **each cell's layer types** under every precision the device runs: float32 or the type asked
  for, never the other half type (bf16 run as fp16 was a defect of the fused cells);
- **CUDA graphs** (a GPU only) of scoring, sampling and training against eager over several windows
  with the state carried, after each graph's own first-use check;
- **compiled steps** (``--compile``) against eager over several windows, a recompilation an error;
- **synchronisations** (a GPU only) a training step makes with the CPU, counted;
- **DistributedDataParallel** against one process (two GPUs or more; not yet written: skipped).

On the CPU the CUDA-only rows say ``skipped: no CUDA device``. The test suite runs this on the CPU.
"""

from __future__ import annotations

import dataclasses
import platform
import warnings

import torch

from charlm.cells import CELLS, parse_cell_options
from charlm.model import LanguageModel, ModelConfig, detach_state
from charlm.runtime.fast_path_check import TOLERANCES, largest_difference, probe_loss, tolerance_for
from charlm.runtime.precision import PRECISIONS, layer_output_dtypes, set_tf32, tf32_in_use, wrong_layer_dtypes

NO_CUDA = "skipped: no CUDA device"
BLOCK_CELLS = {"lstm", "mingru"}  # checked in blocks too: a fused kernel and a scan
# checked with the softmax tied to an embedding narrower than the top layer (a projection between), no head bias
TIED_CELLS = {"lstm"}
TIED = {"tie_weights": True, "embed_size": 4, "head_bias": False}
VOCAB, HIDDEN, LAYERS, BATCH, STEPS = 7, 6, 2, 3, 5  # small enough for a minute on a GPU for every cell


@dataclasses.dataclass
class CheckRow:
    check: str
    result: str  # "pass", "fail", "info" or "skipped: why"
    figure: str = ""
    tolerance: str = ""

    @property
    def failed(self) -> bool:
        return self.result == "fail"


def judged(check: str, difference: float, tolerance: float, unit: str = "") -> CheckRow:
    """A comparison as a row: pass when ``difference`` is within ``tolerance``."""
    figure = "NaN or shape differs" if difference == float("inf") else f"{difference:.2g}{unit}"
    return CheckRow(check, "pass" if difference <= tolerance else "fail", figure, f"{tolerance:g}")


def failed_with(check: str, error: BaseException) -> CheckRow:
    message = " ".join(str(error).split())[:120]
    return CheckRow(check, "fail", f"{type(error).__name__}: {message}")


def precisions_on(device: torch.device) -> list[str]:
    """The precisions this device runs: fp32, bf16 (CPU, or a GPU that has it), fp16 (a GPU)."""
    found = ["fp32"]
    if device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_bf16_supported()):
        found.append("bf16")
    if device.type == "cuda":
        found.append("fp16")
    return found


def run_checks(
    device: torch.device, cells: list[str], precisions: list[str] | None = None, compile: bool = False, progress=None
) -> list[CheckRow]:
    """Every row for ``cells`` on ``device`` (see the module docstring)."""
    set_tf32(False)  # charlm's default: fp32 is float32 in its loops and in cuDNN
    rows = environment_rows(device)
    for cell in cells:
        if progress:
            progress(cell)
        rows.append(
            _guarded(
                f"{cell}: window, evaluation and sampling paths vs step (float64)",
                lambda: paths_against_step(cell, device),
            )
        )
        for precision in precisions or precisions_on(device):
            rows.append(
                _guarded(f"{cell}: layer output types, {precision}", lambda: layer_types(cell, precision, device))
            )
        for name, check in (
            ("scoring graph vs eager, 6 windows", scoring_graph_against_eager),
            ("sampling graph vs eager, 12 symbols", sampling_graph_against_eager),
            ("training graph vs eager, 3 windows", training_graph_against_eager),
        ):
            title = f"{cell}: {name}"
            rows.append(
                CheckRow(title, NO_CUDA) if device.type != "cuda" else _guarded(title, lambda: check(cell, device))
            )
        if compile:
            rows.append(
                _guarded(f"{cell}: compiled step vs eager, 3 windows", lambda: compiled_against_eager(cell, device))
            )
    for cell in BLOCK_CELLS & set(cells):
        rows.append(
            _guarded(
                f"{cell} in blocks (--wiring block): window, evaluation and sampling paths vs step (float64)",
                lambda: paths_against_step(cell, device, wiring="block"),
            )
        )
    for cell in TIED_CELLS & set(cells):
        tied = f"{cell} tied to its embedding (--tie-weights, a projection, --no-head-bias)"
        rows.append(
            _guarded(
                f"{tied}: window, evaluation and sampling paths vs step (float64)",
                lambda: paths_against_step(cell, device, **TIED),
            )
        )
        title = f"{tied}: training graph vs eager, 3 windows"
        rows.append(
            CheckRow(title, NO_CUDA)
            if device.type != "cuda"
            else _guarded(title, lambda: training_graph_against_eager(cell, device, **TIED))
        )
    if device.type == "cuda":
        rows.append(_guarded("synchronisations in one training step", lambda: synchronisations(device)))
    else:
        rows.append(CheckRow("synchronisations in one training step", NO_CUDA))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    rows.append(
        CheckRow(
            "DistributedDataParallel step vs one process",
            "skipped: not yet written (tests/runtime/test_distributed.py checks it on the CPU)"
            if gpus >= 2
            else "skipped: fewer than two CUDA devices",
        )
    )
    return rows


def _guarded(title: str, check) -> CheckRow:
    try:
        row = check()
    except Exception as error:  # a check that raises has failed; the others still run
        return failed_with(title, error)
    return dataclasses.replace(row, check=title)


# --- environment ---------------------------------------------------------------------------------------
def environment_rows(device: torch.device) -> list[CheckRow]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    versions = (
        f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}"
    )
    rows = [CheckRow("versions", "info", versions)]
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        current = torch.cuda.current_device()
        rows.append(
            CheckRow(
                "the device is the current CUDA device",
                "pass" if current == index else "fail",
                f"current cuda:{current}, asked cuda:{index} ({torch.cuda.get_device_name(index)})",
            )
        )
    else:
        rows.append(CheckRow("the device is the current CUDA device", NO_CUDA, str(device)))
    tf32 = tf32_in_use()
    rows.append(
        CheckRow(
            "TensorFloat-32 off (--tf32 not given)",
            "pass" if not any(tf32.values()) else "fail",
            f"matmul {tf32['matmul']}, cuDNN {tf32['cudnn']}",
        )
    )
    return rows


# --- each cell --------------------------------------------------------------------------------------------
def small_model(cell: str, device: torch.device, dtype=torch.float32, seed: int = 0, **settings) -> LanguageModel:
    """A small model of ``cell`` (with ``settings`` of ``ModelConfig``: wiring, tying) with weights spread
    wider than their initialisation (gates away from their resting values, so a wrong term shows)."""
    torch.manual_seed(seed)
    cell_class = CELLS.get(cell)
    multiple = cell_class.hidden_size_multiple(parse_cell_options(cell_class, {}))
    hidden = -(-HIDDEN // multiple) * multiple  # the smallest size the cell is built at from HIDDEN up
    model = LanguageModel(ModelConfig(cell, vocab_size=VOCAB, hidden_size=hidden, layers=LAYERS, **settings))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model.to(device=device, dtype=dtype)


def random_state(model: LanguageModel, batch: int, device, dtype) -> list:
    return [
        tuple(0.5 * torch.randn(t.shape, device=device, dtype=dtype) for t in layer)
        for layer in model.initial_state(batch, device=device)
    ]


def paths_against_step(cell: str, device: torch.device, **settings) -> CheckRow:
    """The window's logits, new state and gradients, the evaluation path's logits and the sampling
    step's logits, against ``model.step`` one step at a time, all in float64."""
    dtype = torch.float64
    model = small_model(cell, device, dtype, **settings)
    tokens = torch.randint(VOCAB, (BATCH, STEPS), device=device)  # more positions than symbols: the folded path
    state = random_state(model, BATCH, device, dtype)
    logits, new_state = model(tokens, state)
    reference, reference_state = [], state
    for t in range(STEPS):
        step_logits, reference_state = model.step(tokens[:, t], reference_state)
        reference.append(step_logits)
    reference = torch.stack(reference, dim=1)
    flat = lambda s: [tensor for layer in s for tensor in layer]  # noqa: E731
    differences = [largest_difference([logits, *flat(new_state)], [reference, *flat(reference_state)])]
    parameters = list(model.parameters())
    fast = torch.autograd.grad(probe_loss(logits), parameters, allow_unused=True)
    slow = torch.autograd.grad(probe_loss(reference), parameters, allow_unused=True)
    differences.append(largest_difference(fast, slow))
    with torch.inference_mode():
        evaluated, _ = model(tokens, state)
        sampling = model.for_sampling()
        sampled, sampled_state = [], state
        for t in range(STEPS):
            step_logits, sampled_state = sampling.step(tokens[:, t], sampled_state)
            sampled.append(step_logits)
        differences.append(largest_difference([evaluated, torch.stack(sampled, dim=1)], [reference, reference]))
    return judged("", max(differences), TOLERANCES[torch.float64])


def layer_types(cell: str, precision: str, device: torch.device) -> CheckRow:
    model = small_model(cell, device)
    dtypes = layer_output_dtypes(model, precision, device)
    names = sorted({str(dtype).removeprefix("torch.") for dtype in dtypes})
    wrong = wrong_layer_dtypes(dtypes, precision)
    wanted = str(PRECISIONS[precision] or torch.float32).removeprefix("torch.")
    return CheckRow(
        "", "fail" if wrong else "pass", ", ".join(names), "float32" if wanted == "float32" else f"float32 or {wanted}"
    )


# --- CUDA graphs (a GPU) -----------------------------------------------------------------------------------
def scoring_graph_against_eager(cell: str, device: torch.device, windows: int = 6) -> CheckRow:
    """A scoring graph captured and checked on the first window, then replayed for the others with
    the state carried, against the model called window by window."""
    from charlm.runtime.cuda_graphs import GraphedCall

    model = small_model(cell, device).eval()
    tokens = torch.randint(VOCAB, (windows, BATCH, STEPS), device=device)
    worst = 0.0
    with torch.inference_mode():
        state = model.initial_state(BATCH, device=device)
        graphed = GraphedCall(model, tokens[0], state, path="scoring graph")
        eager_state, graph_state = state, state
        for window in tokens:
            eager_logits, eager_state = model(window, eager_state)
            graph_logits, graph_state = graphed(window, graph_state)
            flat = lambda s: [tensor for layer in s for tensor in layer]  # noqa: E731
            worst = max(
                worst, largest_difference([graph_logits, *flat(graph_state)], [eager_logits, *flat(eager_state)])
            )
            graph_state = [tuple(tensor.clone() for tensor in layer) for layer in graph_state]
    return judged("", worst, tolerance_for(device))


def sampling_graph_against_eager(cell: str, device: torch.device, symbols: int = 12) -> CheckRow:
    from charlm.runtime.cuda_graphs import GraphedStep

    model = small_model(cell, device).eval()
    worst = 0.0
    with torch.inference_mode():
        sampling = model.for_sampling()
        state = model.initial_state(1, device=device)
        graphed = GraphedStep(sampling, state)
        eager_state, graph_state = state, state
        for token in torch.randint(VOCAB, (symbols, 1), device=device):
            eager_logits, eager_state = sampling.step(token, eager_state)
            graph_logits, graph_state = graphed(token, graph_state)
            worst = max(worst, largest_difference([graph_logits], [eager_logits]))
            graph_state = [tuple(tensor.clone() for tensor in layer) for layer in graph_state]
    return judged("", worst, tolerance_for(device))


def training_graph_against_eager(cell: str, device: torch.device, windows: int = 3, **settings) -> CheckRow:
    """The training window's graphs (forward and backward) against eager on the same weights, state
    carried, logits and gradients compared at every window."""
    from charlm.runtime.training_graphs import GraphedWindow

    model = small_model(cell, device, **settings).train()
    graphed = GraphedWindow(model, device, window_shape=(BATCH, STEPS))
    parameters = list(model.parameters())
    state = model.initial_state(BATCH, device=device)
    worst = 0.0
    for window in torch.randint(VOCAB, (windows, BATCH, STEPS), device=device):
        eager_logits, eager_state = model(window, state)
        eager = torch.autograd.grad(probe_loss(eager_logits), parameters, allow_unused=True)
        eager_logits, eager_state = eager_logits.detach(), detach_state(eager_state)  # no eager graph alive at capture
        graph_logits, graph_state = graphed(window, state)
        if not graphed.active:
            raise RuntimeError(graphed.failure)
        replayed = torch.autograd.grad(probe_loss(graph_logits), parameters, allow_unused=True)
        worst = max(worst, largest_difference([graph_logits, *replayed], [eager_logits, *eager]))
        state = [tuple(tensor.clone() for tensor in layer) for layer in eager_state]
    return judged("", worst, tolerance_for(device))


# --- compiled steps -----------------------------------------------------------------------------------------
def compiled_against_eager(cell: str, device: torch.device, windows: int = 3) -> CheckRow:
    """``torch.compile`` of the training forward against eager, logits and gradients, windows of one
    shape; a recompilation after the first window is an error."""
    import torch._dynamo

    from charlm.runtime.compiling import BACKEND

    model = small_model(cell, device).train()
    compiled = torch.compile(model, backend=BACKEND, dynamic=False)
    parameters = list(model.parameters())
    state = model.initial_state(BATCH, device=device)
    worst = 0.0
    torch._dynamo.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for window in torch.randint(VOCAB, (windows, BATCH, STEPS), device=device):
            eager_logits, eager_state = model(window, state)
            eager = torch.autograd.grad(probe_loss(eager_logits), parameters, allow_unused=True)
            compiled_logits, _ = compiled(window, state)
            fast = torch.autograd.grad(probe_loss(compiled_logits), parameters, allow_unused=True)
            worst = max(worst, largest_difference([compiled_logits, *fast], [eager_logits, *eager]))
            state = [tuple(tensor.detach().clone() for tensor in layer) for layer in eager_state]
    return judged("", worst, tolerance_for(device))


# --- synchronisations (a GPU) ---------------------------------------------------------------------------------
def synchronisations(device: torch.device) -> CheckRow:
    """How many times one training step (charlm's own ``TrainingStep``: the window's copy to the
    device, forward, loss, backward, gradient norms, clipping, Adam) waits for the GPU, counted by
    torch's synchronisation debug mode. It should be one: the loss and the norms read back together."""
    import numpy as np

    from charlm.corpora.streams import TokenStreams
    from charlm.runtime.distributed import World
    from charlm.training.control import StopRequest, TimeBudget
    from charlm.training.step import PlainGradients, TrainingStep

    model = small_model("lstm", device).train()
    optimizer = torch.optim.Adam(model.parameters())
    training = TrainingStep(
        model, model, optimizer, PlainGradients(), World(), batch_size=BATCH, clip=5.0, precision="fp32", device=device
    )
    streams = TokenStreams(np.random.default_rng(0).integers(VOCAB, size=BATCH * STEPS * 4), BATCH, STEPS)
    windows = streams.windows(device=device)

    def step():
        return training(next(windows), model.initial_state(BATCH, device=device), StopRequest(), TimeBudget(None))

    step()  # warm-up
    torch.cuda.synchronize(device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    count = sum("synchroniz" in str(warning.message) for warning in caught)
    return CheckRow("", "info", f"{count} a step (1 expected: the loss and the gradient norms read back together)")
