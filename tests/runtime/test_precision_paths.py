"""Precision on the GPU path (issue 21): bf16 means bf16 for every cell, TF32 is a choice made
once for charlm's loops and cuDNN alike and recorded, and the benchmark says when its figures
cannot be trusted."""

from __future__ import annotations

import json

import pytest
import torch

from charlm.cells import CELLS
from charlm.cells.elman import Elman
from charlm.cells.gru import GRU, GRUConfig
from charlm.cells.lstm import LSTM
from charlm.model import LanguageModel, ModelConfig
from charlm.runtime.precision import layer_output_dtypes, set_tf32, tf32_in_use, wrong_layer_dtypes
from charlm.tools.benchmark import Spread, Throughput, disturbances
from helpers import cli


def recording_kernel(calls):
    """Stands in for torch.lstm / torch.gru / torch.rnn_tanh: records what it was called under, and
    computes what CUDA's autocast would have made of it (float16 for a cuDNN RNN, whatever the type)."""

    def kernel(inputs, hidden, weights, *flags):
        calls.append(
            {
                "autocast": torch.is_autocast_enabled("cpu"),
                "inputs": inputs.dtype,
                "weights": {weight.dtype for weight in weights},
            }
        )
        low = inputs.dtype if not torch.is_autocast_enabled("cpu") else torch.float16
        steps, batch = inputs.shape[:2]
        outputs = torch.zeros(steps, batch, weights[1].shape[1], dtype=low)
        if isinstance(hidden, tuple):
            return outputs, hidden[0].to(low), hidden[1].to(low)
        return outputs, hidden.to(low)

    return kernel


@pytest.mark.parametrize(
    "make", [lambda: LSTM(5, 4), lambda: GRU(5, 4, GRUConfig(reset_after=True)), lambda: Elman(5, 4)]
)
def test_the_fused_kernels_run_in_bf16_under_bf16(make, monkeypatch):
    """Defect 2: under a bf16 autocast the fused layers are handed bf16 tensors with autocast off, so
    CUDA's cast of cuDNN RNNs to float16 never applies."""
    import charlm.cells.elman
    import charlm.cells.gru
    import charlm.cells.lstm

    calls = []
    kernel = recording_kernel(calls)
    monkeypatch.setattr(charlm.cells.lstm.torch, "lstm", kernel)
    monkeypatch.setattr(charlm.cells.gru.torch, "gru", kernel)
    monkeypatch.setitem(charlm.cells.elman.FUSED_KERNELS, "tanh", kernel)
    cell = make()
    monkeypatch.setattr(type(cell), "prefers_python_loop", staticmethod(lambda inputs, lookup: False))
    inputs = torch.randn(3, 2, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs, state = cell(inputs, cell.initial_state(2))
    assert calls == [{"autocast": False, "inputs": torch.bfloat16, "weights": {torch.bfloat16}}]
    assert outputs.dtype == torch.bfloat16
    calls.clear()
    cell(inputs, cell.initial_state(2))  # fp32: untouched
    assert calls == [{"autocast": False, "inputs": torch.float32, "weights": {torch.float32}}]


def test_the_bf16_fused_lstm_computes_the_lstm_equations():
    torch.manual_seed(0)
    cell = LSTM(5, 4)
    inputs, state = torch.randn(6, 3, 5), cell.initial_state(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused, _ = cell._fused_forward(inputs, state)
    loop = []
    h, c = state
    for x in inputs:
        h, (h, c) = cell.step(x, (h, c))
        loop.append(h)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.float(), torch.stack(loop), atol=3e-2, rtol=0)


def test_every_layer_runs_in_float32_or_the_type_asked_for():
    for name in CELLS.names():
        model = LanguageModel(ModelConfig(name, vocab_size=11, hidden_size=8, layers=2))
        for precision in ("fp32", "bf16"):
            dtypes = layer_output_dtypes(model, precision, torch.device("cpu"))
            assert len(dtypes) >= len(model.layers) and wrong_layer_dtypes(dtypes, precision) == [], (name, precision)
    assert wrong_layer_dtypes([torch.float16, torch.float32], "bf16") == ["float16"]
    assert wrong_layer_dtypes(["bfloat16"], "fp32") == ["bfloat16"]


def test_tf32_is_one_setting_for_both_and_recorded(tiny_corpus, tmp_path):
    from charlm.training.trainer import Trainer
    from helpers import tiny_config

    torch.backends.cudnn.allow_tf32 = True  # torch's default
    try:
        set_tf32(False)
        assert tf32_in_use() == {"matmul": False, "cudnn": False}
        trainer = Trainer(tiny_config(tiny_corpus, tmp_path / "run", epochs=1, tf32=True))
        assert tf32_in_use() == {"matmul": True, "cudnn": True}
        assert trainer.provenance["tf32"] == {"matmul": True, "cudnn": True}
        trainer.run.release()
        assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["tf32"] is True
    finally:
        set_tf32(False)


def throughput(name, train_ratios, dtypes=(), precision="fp32"):
    result = Throughput(name, 8, 100, 1.0, precision)
    result.train_ratio, result.eval_ratio = Spread(list(train_ratios)), Spread([1.0] * len(train_ratios))
    result.layer_dtypes = list(dtypes)
    return result


def test_the_benchmark_says_when_its_figures_are_disturbed():
    steady = [throughput("lstm", [1.0, 1.02, 0.99]), throughput("rhn", [0.9, 0.95, 1.0])]
    assert disturbances(steady, load_before=0.1, cores=2) == []
    shaken = [throughput("lstm", [1.0, 1.0, 1.0]), throughput("rhn", [0.44, 0.9, 1.0])]
    assert disturbances(shaken, load_before=1.3, cores=2) == [
        "the machine was busy before the run (load 1.30 on 2 cores)",
        "rhn's training ratio varied ±31% across rounds",
    ]
    assert disturbances([throughput("lstm", [1.0], ["float16"], "bf16")], None) == [
        "lstm ran layers in float16 under bf16"
    ]


def test_bench_json_carries_the_verdict_the_eval_path_and_the_layer_types():
    result = cli(
        "bench",
        "--cells",
        "gru",
        "--params",
        "20k",
        "--batch-size",
        "4",
        "--bptt",
        "6",
        "--steps",
        "1",
        "--repeat",
        "1",
        "--sample-length",
        "4",
        "--device",
        "cpu",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert isinstance(report["trustworthy"], bool) and report["trustworthy"] == (report["disturbances"] == [])
    assert report["machine"]["tf32"] == {"matmul": False, "cudnn": False}
    (cell,) = report["results"][1:]
    assert cell["eval_path"] == "eager" and cell["layer_dtypes"] == ["float32"]
    assert cell["sample_chars_per_second"]["median"] > 0
