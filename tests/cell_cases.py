"""Every cell and option variant the cell tests run over, with its per-layer parameter formula.

``params(d, n)`` is the count cells.md gives for one layer with input size d and hidden size n.
``input_size(n)`` is None when the cell accepts any input size, else the one it needs.
"""

import io
from dataclasses import dataclass, field
from typing import Callable

import torch

from charlm.model import LanguageModel, ModelConfig


@dataclass(frozen=True)
class CellCase:
    cell: str
    options: dict = field(default_factory=dict)
    params: Callable[[int, int], int] | None = None
    input_size: Callable[[int], int] | None = None
    overfit_steps: int = 120  # Adam steps the tiny model gets to learn the sentence

    @property
    def id(self) -> str:
        suffix = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.cell}[{suffix}]" if suffix else self.cell


def same(n):
    return n


def scrn_params(d, n, c):
    return d * c + d * n + c * n + n * n


def rhn_params(d, n, depth):
    return 2 * d * n + 2 * depth * n * n + 2 * depth * n


def double(n):
    return 2 * n


def grid_block(n):
    """One Grid LSTM block: two LSTM transforms on [h_time; h_depth], 2·(2n·4n + 4n)."""
    return 16 * n * n + 8 * n


def grid_block_plain_depth(n):
    """An LSTM time transform (8n² + 4n) and a plain depth layer V ∈ R^{n×2n} with bias (2n² + n)."""
    return 10 * n * n + 5 * n


def high_order_params(base_gates, ho_gates, form="factored", m=16, r=4):
    """The base LSTM/GRU count plus the second-order terms of the gates that have them."""

    def params(d, n):
        extra = m * (d + 2 * n) if form == "factored" else n * m + r * n * m
        return base_gates * (d * n + n * n + n) + ho_gates * extra

    return params


def gated_deltanet_params(d, n, heads, e=2, w=4):
    """Gated DeltaNet's layer: 2(1 + e)dn + 2Hd + en² + (2 + e)wn + en/H + 2H."""
    return 2 * (1 + e) * d * n + 2 * heads * d + e * n * n + (2 + e) * w * n + e * n // heads + 2 * heads


def mlstm_params(d, n, heads=4, block=4, width=4):
    """The mLSTM layer: W_up (d → 2m), the convolution, W_q, W_k, W_v (blocks of b), the gates (3m → 2H, with
    bias), the norm's gain, the skip, W_down (m → n); m = 2n."""
    m = 2 * n
    block = block or m
    return 2 * d * m + (width * m + m if width else 0) + 3 * m * block + 6 * heads * m + 2 * heads + 2 * m + m * n


def slstm_params(n, heads, width=4):
    """The sLSTM layer (d = n): W and R block-diagonal (4 gates × H blocks of (n/H)²), b, the norm's gain, the
    convolution."""
    return 8 * n * n // heads + 5 * n + (width * n + n if width else 0)


def mamba_params(d, n, expand=2, states=16, width=4, rank=None, residual=True):
    """A Mamba block: the RMSNorm's gain (residual), W_in (d → 2e), the convolution (k taps and a bias), the x_proj
    (e → R + 2N), W_Δ and b_Δ, A_log (e × N), D, W_out (e → n); e = E·n, R = ⌈n/16⌉."""
    e, r = expand * n, rank or -(-n // 16)
    return (
        (d if residual else 0) + 2 * d * e + width * e + e + e * (r + 2 * states) + r * e + e + e * states + e + e * n
    )


SMALL_SYMMETRIC = {"ho_form": "symmetric", "ho_kernels": 3, "ho_rank": 2}

CASES = [
    CellCase("lstm", {}, lambda d, n: 4 * (d * n + n * n + n)),
    CellCase("lstm", {"peephole": True}, lambda d, n: 4 * (d * n + n * n + n) + 3 * n),
    CellCase("lstm", {"peephole": "full"}, lambda d, n: 4 * (d * n + n * n + n) + 3 * n * n, overfit_steps=200),
    CellCase("gru", {}, lambda d, n: 3 * (d * n + n * n + n)),
    CellCase("gru", {"reset_after": True}, lambda d, n: 3 * (d * n + n * n + n) + n),
    CellCase("rnn", {}, lambda d, n: d * n + n * n + n),
    # rnn activation=sigmoid trains too slowly for the 120-step overfit check: test_cells_baselines.py runs it.
    CellCase("rnn", {"activation": "relu"}, lambda d, n: d * n + n * n + n),
    CellCase("mgu", {}, lambda d, n: 2 * (d * n + n * n + n)),
    CellCase("mi-rnn", {}, lambda d, n: d * n + n * n + 4 * n),
    CellCase("scrn", {}, lambda d, n: scrn_params(d, n, max(1, n // 10))),
    CellCase("scrn", {"context_size": 3}, lambda d, n: scrn_params(d, n, 3)),
    CellCase("scrn", {"context_size": 3, "learnable_alpha": True}, lambda d, n: scrn_params(d, n, 3) + 3),
    CellCase("scrn", {"bias": True}, lambda d, n: scrn_params(d, n, max(1, n // 10)) + n),
    CellCase("rhn", {}, lambda d, n: rhn_params(d, n, 5)),
    CellCase("rhn", {"depth": 2}, lambda d, n: rhn_params(d, n, 2)),
    CellCase("delta-rnn", {}, lambda d, n: d * n + n * n + 5 * n),
    CellCase("delta-rnn", {"inner": "first"}, lambda d, n: d * n + n * n + 2 * n),
    CellCase("delta-rnn", {"outer": "tanh"}, lambda d, n: d * n + n * n + 5 * n),
    # delta-rnn's `dropout` is stochastic in training mode: tests/test_cells_baselines.py covers it.
    CellCase("ps-lru", {}, lambda d, n: 8 * n * n + 4 * n, same),
    CellCase("rg-lru", {}, lambda d, n: 10 * n * n + 5 * n, same),
    CellCase("lru", {}, lambda d, n: 12 * n * n + 6 * n, same),
    CellCase("lru", {"init": "uniform"}, lambda d, n: 12 * n * n + 6 * n, same),
    CellCase("grid-lstm", {}, lambda d, n: grid_block(n), double),
    CellCase("grid-lstm", {"tied": False, "output": "standard"}, lambda d, n: grid_block(n), double),
    CellCase("grid-lstm", {"depth": "tanh"}, lambda d, n: grid_block_plain_depth(n), same),
    CellCase("grid-lstm", {"depth": "identity", "tied": False}, lambda d, n: grid_block_plain_depth(n), same),
    CellCase("ho-lstm", {}, high_order_params(4, 3)),
    CellCase("ho-lstm", {"ho_form": "symmetric"}, high_order_params(4, 3, "symmetric"), same),
    CellCase("ho-lstm", SMALL_SYMMETRIC, high_order_params(4, 3, "symmetric", m=3, r=2), same),
    CellCase("ho-gru", {}, high_order_params(3, 2)),
    CellCase("ho-gru", {"ho_form": "symmetric"}, high_order_params(3, 2, "symmetric"), same),
    CellCase("ho-gru", SMALL_SYMMETRIC, high_order_params(3, 2, "symmetric", m=3, r=2), same),
    CellCase("qrnn", {}, lambda d, n: 3 * (2 * d * n + n)),
    CellCase("qrnn", {"pooling": "f", "scan": "chunked"}, lambda d, n: 2 * (2 * d * n + n)),
    CellCase("qrnn", {"width": 1, "scan": "log"}, lambda d, n: 3 * (d * n + n)),
    # sru projects its skip when d ≠ n (a fourth matrix W′): the cell tests run d = 5, n = 6, the models d = n
    CellCase("sru", {}, lambda d, n: (4 if d != n else 3) * d * n + 4 * n),
    CellCase("sru", {"highway_bias": -2.0}, lambda d, n: 3 * d * n + 4 * n, same),
    CellCase("sru", {"rescale": False}, lambda d, n: (4 if d != n else 3) * d * n + 4 * n),
    CellCase("indrnn", {}, lambda d, n: d * n + 2 * n),
    CellCase("indrnn", {"gamma": 10.0, "horizon": 4}, lambda d, n: d * n + 2 * n),
    # linear-ru: d = n; N complex state units (default n): 2N(d + n) + 3N + n
    CellCase("linear-ru", {}, lambda d, n: 2 * n * (d + n) + 4 * n, same),
    CellCase(
        "linear-ru", {"scan": "doubling", "max_phase": 0.3141592653589793}, lambda d, n: 2 * n * (d + n) + 4 * n, same
    ),
    CellCase("linear-ru", {"scan": "chunked", "state_size": 4}, lambda d, n: 2 * 4 * (d + n) + 3 * 4 + n, same),
    CellCase(
        "linear-ru", {"activation": "identity", "r_min": 0.0, "r_max": 0.99}, lambda d, n: 2 * n * (d + n) + 4 * n, same
    ),
    # hgrn: W_f, W_i, W_g and biases, LayerNorm, W_o and b_o, and the layer's row of Γ
    CellCase("hgrn", {}, lambda d, n: 3 * d * n + n * n + 7 * n),
    CellCase("hgrn", {"lower_bound": False}, lambda d, n: 3 * d * n + n * n + 6 * n),
    CellCase("hgrn", {"scan": "doubling"}, lambda d, n: 3 * d * n + n * n + 7 * n),
    # mingru, minlstm: one affine map of the input per gate/candidate, with bias (nn.Linear); no U
    CellCase("mingru", {}, lambda d, n: 2 * (d * n + n)),
    CellCase("mingru", {"scan": "log"}, lambda d, n: 2 * (d * n + n)),
    CellCase("mingru", {"scan": "chunked"}, lambda d, n: 2 * (d * n + n)),
    CellCase("minlstm", {}, lambda d, n: 3 * (d * n + n)),
    CellCase("minlstm", {"scan": "log"}, lambda d, n: 3 * (d * n + n)),
    CellCase("minlstm", {"scan": "doubling"}, lambda d, n: 3 * (d * n + n)),
    # griffin-rglru: W_in (d→n) and b_in, W_a, W_x and their biases, Λ
    CellCase("griffin-rglru", {}, lambda d, n: d * n + 2 * n * n + 4 * n),
    CellCase("griffin-rglru", {"scan": "log"}, lambda d, n: d * n + 2 * n * n + 4 * n),
    CellCase("griffin-rglru", {"scan": "chunked"}, lambda d, n: d * n + 2 * n * n + 4 * n),
    # transformer: d = n; LN_1, W_qkv, W_o, LN_2 and the MLP (n → 4n → n), all with biases: 12n² + 13n.
    # Heads 1 (the tests' widths 6 and 16 give even head widths); memory ≥ 1, where the window, the step and
    # the carried memory are one function (memory=0 is tested in test_transformer.py).
    CellCase("transformer", {"heads": 1, "memory": 4}, lambda d, n: 12 * n * n + 13 * n, same),
    CellCase("transformer", {"heads": 1, "memory": 1, "mlp_ratio": 2}, lambda d, n: 8 * n * n + 11 * n, same),
    CellCase("transformer", {"heads": 1, "memory": 12}, lambda d, n: 12 * n * n + 13 * n, same),
    CellCase(
        "transformer", {"heads": 1, "memory": 4, "bias": False}, lambda d, n: 12 * n * n + 2 * n, same
    ),  # nanoGPT's
    # mamba: d = n but with residual=false; chunks of the selective scan shorter than the tests' windows of 7 and 10
    CellCase("mamba", {}, lambda d, n: mamba_params(d, n), same),
    CellCase("mamba", {"chunk": 3}, lambda d, n: mamba_params(d, n), same),
    CellCase(
        "mamba",
        {"scan": "auto", "state_size": 3, "dt_rank": 2},
        lambda d, n: mamba_params(d, n, states=3, rank=2),
        same,
    ),
    CellCase(
        "mamba", {"conv_width": 1, "expand": 1, "scan": "chunked"}, lambda d, n: mamba_params(d, n, 1, width=1), same
    ),
    CellCase(
        "mamba",
        {"residual": False, "conv_width": 2, "chunk": 4},
        lambda d, n: mamba_params(d, n, width=2, residual=False),
    ),
    # mlstm: chunks shorter than the tests' windows of 7 and 10 cross chunks and end on a shorter one
    CellCase("mlstm", {}, lambda d, n: mlstm_params(d, n)),
    CellCase("mlstm", {"chunk_size": 3}, lambda d, n: mlstm_params(d, n)),
    CellCase(
        "mlstm",
        {"heads": 2, "qkv_blocksize": 2, "conv_width": 0, "forget_gate": "exp", "chunk_size": 4},
        lambda d, n: mlstm_params(d, n, heads=2, block=2, width=0),
    ),
    CellCase(
        "mlstm",
        {"qkv_blocksize": 0, "conv_width": 1, "chunk_size": 2},
        lambda d, n: mlstm_params(d, n, block=0, width=1),
    ),
    # slstm: d = n; heads that divide the tests' widths 6 and 16
    CellCase("slstm", {"heads": 2}, lambda d, n: slstm_params(n, 2), same),
    CellCase("slstm", {"heads": 1, "conv_width": 0, "forget_gate": "exp"}, lambda d, n: slstm_params(n, 1, 0), same),
    CellCase("slstm", {"heads": 2, "conv_width": 1}, lambda d, n: slstm_params(n, 2, 1), same),
    # gated-deltanet: W_in (q, k: n each; v, output gate: e·n each; w_α, w_β: H each), the convolution over q, k, v
    # (w taps), A_log and dt_bias (H each), the norm's gain (d_v = e·n/H), W_o (e·n → n). Chunks shorter than the
    # tests' windows of 7 and 10, so that the chunked form crosses chunks and pads the last.
    CellCase("gated-deltanet", {"heads": 2, "chunk": 4}, lambda d, n: gated_deltanet_params(d, n, heads=2)),
    CellCase("gated-deltanet", {"heads": 1, "conv": 0, "chunk": 3}, lambda d, n: gated_deltanet_params(d, n, 1, w=0)),
    CellCase(
        "gated-deltanet",
        {"heads": 2, "expand_v": 1, "conv": 1, "chunk": 64},
        lambda d, n: gated_deltanet_params(d, n, 2, e=1, w=1),
        overfit_steps=200,
    ),
]


# --- what the cell tests do to every case ---------------------------------------------------------


def randomise(module, seed: int = 0) -> None:
    """Move every parameter off its initial value so that zero-initialised terms are exercised too."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))


def tiny_model(case: CellCase, vocab_size: int, hidden: int = 16, layers: int = 2) -> LanguageModel:
    config = ModelConfig(
        case.cell, vocab_size=vocab_size, hidden_size=hidden, layers=layers, cell_options=dict(case.options)
    )
    return LanguageModel(config)


def loss_after_overfitting(case: CellCase, steps: int, target: float = 0.0) -> float:
    """The loss (nats) of a tiny model of ``case`` after ``steps`` Adam steps on one short sentence,
    or the first loss below ``target`` within them (a test asking "does it learn the sentence in
    N steps" need not take the steps left once it has)."""
    torch.manual_seed(0)
    text = "the quick brown fox jumps over the lazy dog. "
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text]).unsqueeze(0)
    model = tiny_model(case, len(vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        logits, _ = model(ids[:, :-1], model.initial_state(1))
        loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:])
        if loss.item() < target:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def reloaded(model: LanguageModel) -> LanguageModel:
    """``model`` saved (its weights and settings, weights-only) and built again from what was saved."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "config": model.config.to_dict()}, buffer)
    buffer.seek(0)
    payload = torch.load(buffer, weights_only=True)
    clone = LanguageModel(ModelConfig.from_dict(payload["config"]))
    clone.load_state_dict(payload["model"])
    return clone
