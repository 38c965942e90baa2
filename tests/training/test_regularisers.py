"""AWD-LSTM's regularisers (charlm.regularisers, AR/TAR in charlm.training.step): each mask where and as
often as it is drawn, none in eval mode, weight drop through the fused LSTM kernel, the activation
penalties' gradients against a hand computation, refusals, and exact resume with all of them on."""

from __future__ import annotations

import copy
import os
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import charlm.cells.lstm
from charlm.config import TrainConfig
from charlm.corpora.streams import TokenStreams
from charlm.errors import ConfigError
from charlm.model import LanguageModel, ModelConfig
from charlm.regularisers import locked_dropout, symbol_dropout
from charlm.runtime.compiling import has_active_dropout
from charlm.runtime.distributed import World
from charlm.training.control import StopRequest, TimeBudget
from charlm.training.step import PlainGradients, TrainingStep, activation_penalty
from charlm.training.trainer import Trainer, TrainingInterrupted
from helpers import assert_one_line_error, assert_same_run_end, cli, tiny_config, tiny_train

VOCAB = 11


def model_of(cell="lstm", layers=1, **rates) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(ModelConfig(cell, VOCAB, 6, layers, **rates)).double()


def tokens(batch=3, steps=7) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, steps), generator=torch.Generator().manual_seed(1))


def forward(model, window, seed=5):
    torch.manual_seed(seed)
    return model(window, model.initial_state(window.shape[0]))[0]


def test_weight_drop_draws_one_mask_per_window_the_same_at_every_step():
    """The training forward equals the eval-mode forward with the recurrent matrix masked once (the
    window's first draw) for every step; and over a window of one step at a time, it does not."""
    model = model_of(weight_drop=0.5)
    window = tokens()
    logits = forward(model.train(), window)
    torch.manual_seed(5)
    masked = F.dropout(model.layers[0].weight_hidden, 0.5, training=True)
    assert (masked == 0).any() and (masked != 0).any()
    expected = torch.func.functional_call(
        model.eval(), {"layers.0.weight_hidden": masked}, (window, model.initial_state(3))
    )[0]
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    unmasked = model(window, model.initial_state(3))[0]
    assert not torch.allclose(logits[:, 1:], unmasked[:, 1:])
    torch.testing.assert_close(logits[:, 0], unmasked[:, 0])  # the first step reads no recurrent matrix


def test_eval_mode_draws_nothing_and_computes_the_unregularised_model():
    rates = dict(weight_drop=0.5, dropout_embed=0.3, dropout_input=0.3, dropout_hidden=0.3, dropout_output=0.3)
    regularised, plain = model_of(layers=2, **rates).eval(), model_of(layers=2).eval()
    plain.load_state_dict(regularised.state_dict())
    window = tokens()
    before = torch.get_rng_state()
    got = regularised(window, regularised.initial_state(3))[0]
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(got, plain(window, plain.initial_state(3))[0])


def test_the_fused_lstm_kernel_gets_the_masked_weight_and_its_gradient_reaches_the_raw_one(monkeypatch):
    """Without the folded input product the CPU runs torch.lstm (oneDNN): it is handed the masked
    matrix, and its logits and the raw matrix's gradient equal the Python loop's, in float64."""
    fused, loop = model_of(layers=2, weight_drop=0.5).train(), model_of(layers=2, weight_drop=0.5).train()
    fused.fold_embedding = False  # the bottom layer takes the fused path too
    handed = []
    original = charlm.cells.lstm.library_rnn

    def spy(kernel, inputs, hidden, weights, training):
        handed.append(weights[1])
        return original(kernel, inputs, hidden, weights, training)

    monkeypatch.setattr(charlm.cells.lstm, "library_rnn", spy)
    window = tokens(steps=9)
    fused_logits = forward(fused, window)
    assert len(handed) == 2  # both layers, through the kernel
    torch.manual_seed(5)
    masks = [F.dropout(layer.weight_hidden, 0.5, training=True) for layer in fused.layers]
    for got, expected in zip(handed, masks):
        assert torch.equal(got, expected)
    monkeypatch.setattr(charlm.cells.lstm.LSTM, "prefers_python_loop", staticmethod(lambda inputs, lookup: True))
    loop_logits = forward(loop, window)
    assert len(handed) == 2  # the loop never called the kernel
    torch.testing.assert_close(fused_logits, loop_logits, rtol=0, atol=1e-12)
    fused_logits.square().sum().backward()
    loop_logits.square().sum().backward()
    for a, b in zip(fused.layers, loop.layers):
        assert a.weight_hidden.grad.abs().sum() > 0
        torch.testing.assert_close(a.weight_hidden.grad, b.weight_hidden.grad, rtol=0, atol=1e-10)


def test_locked_dropout_draws_one_mask_per_stream_for_every_step():
    torch.manual_seed(0)
    dropped = locked_dropout(torch.ones(20, 4, 50), 0.4)
    assert torch.equal(dropped, dropped[:1].expand_as(dropped))  # the same at every step
    assert dropped.unique().tolist() == [0.0, pytest.approx(1 / 0.6)]
    assert not torch.equal(dropped[0, 0], dropped[0, 1])  # a mask per stream


def test_the_softmax_input_is_dropped_by_one_mask_per_stream():
    """The model's output dropout: dropped / undropped top-layer output is constant along time."""
    model = model_of(dropout_output=0.5).train()
    model.keeps_top_output = True
    forward(model, tokens(steps=12))
    top, dropped = model.top_output
    ratio = dropped / top
    assert torch.allclose(ratio, ratio[:1].expand_as(ratio))
    assert set(ratio.round(decimals=6).unique().tolist()) == {0.0, 2.0}


def test_embedding_dropout_zeroes_whole_symbols_and_the_folded_product_reads_the_same_table():
    torch.manual_seed(0)
    table = torch.randn(40, 8, dtype=torch.float64)
    dropped = symbol_dropout(table, 0.25)
    zeroed = (dropped == 0).all(dim=1)
    assert 0 < zeroed.sum() < 40
    torch.testing.assert_close(dropped[~zeroed], table[~zeroed] / 0.75)
    folded, unfolded = model_of(dropout_embed=0.3).train(), model_of(dropout_embed=0.3).train()
    unfolded.fold_embedding = False  # the bottom layer multiplies the embedded window instead
    window = tokens(steps=12)
    torch.testing.assert_close(forward(folded, window), forward(unfolded, window), rtol=0, atol=1e-12)
    assert not torch.allclose(forward(folded, window), forward(folded.eval(), window))


def test_ar_and_tar_gradients_equal_the_hand_computed_ones():
    """∂/∂h of α·mean((m ⊙ h)²) + β·mean((h_t − h_{t−1})²) over h [T, B, d], with a fixed mask m."""
    torch.manual_seed(0)
    top = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.randint(0, 2, (1, 2, 3), dtype=torch.float64) * 2
    alpha, beta = 2.0, 1.0
    (grad,) = torch.autograd.grad(activation_penalty(top, top * mask, alpha, beta), top)
    h = top.detach()
    expected = 2 * alpha * mask**2 * h / h.numel()
    difference = h[1:] - h[:-1]
    temporal = torch.zeros_like(h)
    temporal[1:] += difference
    temporal[:-1] -= difference
    expected += 2 * beta * temporal / difference.numel()
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-14)


def one_step(model, ar, tar):
    """The gradients and the reported loss of one training step of ``model`` (a copy) on a fixed window."""
    model = copy.deepcopy(model)
    step = TrainingStep(
        model,
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        PlainGradients(),
        World(),
        batch_size=3,
        clip=0.0,
        precision="fp32",
        device=torch.device("cpu"),
        ar=ar,
        tar=tar,
    )
    window = next(TokenStreams(np.random.default_rng(0).integers(VOCAB, size=100), 3, 6).windows())
    torch.manual_seed(3)
    result = step(window, model.initial_state(3), StopRequest(), TimeBudget(None))
    return result.loss, {name: p.grad.clone() for name, p in model.named_parameters()}, window


def test_ar_and_tar_are_trained_on_but_not_reported():
    """The step's gradients are the cross entropy's plus the penalty's on the top layer's output;
    its reported loss is the cross entropy alone."""
    model = model_of(layers=2, dropout_output=0.3).float()
    plain_loss, plain, window = one_step(model, 0.0, 0.0)
    loss, penalised, _ = one_step(model, 2.0, 1.0)
    assert loss == plain_loss
    probe = copy.deepcopy(model).train()
    probe.keeps_top_output = True
    torch.manual_seed(3)
    probe(window.inputs, probe.initial_state(3))
    penalty = activation_penalty(*probe.top_output, 2.0, 1.0)
    names, parameters = zip(*probe.named_parameters())
    gradients = torch.autograd.grad(penalty, parameters, allow_unused=True)
    extra = {name: torch.zeros_like(p) if g is None else g for name, p, g in zip(names, parameters, gradients)}
    assert sum(g.abs().sum() for g in extra.values()) > 0
    for name, gradient in penalised.items():
        torch.testing.assert_close(gradient, plain[name] + extra[name], rtol=1e-5, atol=1e-7)


def test_the_compiled_step_is_not_compared_against_eager_where_masks_are_drawn():
    """--compile's first-use check cannot compare a forward whose masks the compiled code draws itself."""
    assert has_active_dropout(model_of(weight_drop=0.5).train())
    assert not has_active_dropout(model_of(weight_drop=0.5).eval())
    assert not has_active_dropout(model_of().train())


def test_weight_drop_is_refused_for_a_cell_without_recurrent_matrices(tiny_corpus, tmp_path):
    run = tmp_path / "run"
    result = cli(*tiny_train(tiny_corpus, run, epochs=1, cell="transformer", hidden_size=8, weight_drop=0.5))
    assert_one_line_error(result, "cell 'transformer' has no recurrent matrices for --weight-drop to mask")
    result = cli(*tiny_train(tiny_corpus, run, epochs=1, dropout=0.2, dropout_hidden=0.2))
    assert_one_line_error(result, "--dropout-hidden and --dropout are exclusive")
    with pytest.raises(ConfigError, match="ar and --cuda-graph are exclusive"):
        TrainConfig(corpus="tiny", ar=2.0, cuda_graph=True).validate()


REGULARISED = dict(
    layers=2,
    hidden_size=12,
    weight_drop=0.5,
    dropout_embed=0.1,
    dropout_input=0.2,
    dropout_hidden=0.2,
    dropout_output=0.1,
    ar=2.0,
    tar=1.0,
    train_fraction=0.2,
    epochs=2,
)


def test_a_regularised_run_stopped_inside_an_epoch_resumes_exactly(tiny_corpus, tmp_path, monkeypatch):
    """A SIGTERM in the middle of the second epoch, then --resume: the same weights, optimizer state and
    schedule as the uninterrupted run, every mask drawn as it would have been."""
    straight = tmp_path / "straight"
    Trainer(tiny_config(tiny_corpus, straight, **REGULARISED)).fit()
    interrupted = tmp_path / "interrupted"
    trainer = Trainer(tiny_config(tiny_corpus, interrupted, **REGULARISED))
    stop_at = len(trainer.train_streams) + 3
    original = TrainingStep._grad_norms

    def signal_during_the_step(self):
        if trainer.progress.step + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(TrainingStep, "_grad_norms", signal_during_the_step)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    monkeypatch.undo()
    Trainer.resume(str(interrupted)).fit()
    assert_same_run_end(straight, interrupted)
