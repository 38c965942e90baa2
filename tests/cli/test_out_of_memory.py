"""Memory that runs out while a command runs (what the training estimate before a run cannot foresee:
scoring, dynamic evaluation, a GPU's library workspaces) is one line and exit code 1, from any command,
and an ``OutOfMemory`` (a ``CharlmError``) from ``charlm.train`` and ``charlm.load``: not a traceback,
not the internal error's exit code 70. Its advice names what the command that ran can make smaller."""

from __future__ import annotations

import pytest
import torch

import charlm
import charlm.api
import charlm.api_scoring
from charlm.errors import OutOfMemory, out_of_memory
from charlm.model import LanguageModel
from helpers import assert_one_line_error, cli, tiny_config, tiny_train

CPU = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
    "allocate 1073741824000 bytes. Error code 12 (Cannot allocate memory)"
)
CUDA = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.2 GiB is free."
)
ADVICE = "use a smaller --batch-size (or --hidden, --bptt)"  # train's
EVAL_ADVICE = "use a smaller --batch-size (or --bptt, --dyn-stat-batch-size)"
SAMPLE_ADVICE = "the model does not fit: use another --device (or a smaller --beam)"
DEFAULT_ADVICE = "free memory, or use a machine with more"


def _raising(error):
    def fail(*args, **kwargs):
        raise error

    return fail


def test_what_counts_as_running_out_of_memory_and_how_it_reads():
    assert str(out_of_memory(RuntimeError(CPU), ADVICE)) == (
        f"out of memory on cpu (an allocation of 1,000.0 GiB failed): {ADVICE}"
    )
    assert str(out_of_memory(torch.OutOfMemoryError(CUDA))) == (
        f"out of memory on cuda (an allocation of 2.00 GiB failed): {DEFAULT_ADVICE}"
    )
    assert str(out_of_memory(MemoryError())) == f"out of memory on cpu: {DEFAULT_ADVICE}"  # numpy, Python itself
    assert out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None  # a bug stays one
    assert out_of_memory(ValueError("out of memory")) is None
    assert OutOfMemory.exit_code == 1


@pytest.mark.parametrize("error", [RuntimeError(CPU), torch.OutOfMemoryError(CUDA)], ids=["allocator", "torch"])
def test_eval_that_runs_out_of_memory_is_one_line_with_exit_code_1(trained_run, monkeypatch, error):
    monkeypatch.delenv("CHARLM_DEBUG", raising=False)
    monkeypatch.setattr(charlm.api_scoring, "score_split", _raising(error))
    result = cli("eval", trained_run)
    assert_one_line_error(result, "charlm: error: out of memory on ", EVAL_ADVICE, code=1)
    assert "internal error" not in result.stderr


def test_the_advice_names_options_of_the_command_that_ran(trained_run, monkeypatch):
    """`sample` has no --batch-size: a model too large for the device is told to use another one."""
    monkeypatch.setattr(charlm.api, "generate", _raising(RuntimeError(CPU)))
    result = cli("sample", trained_run, "--prime", "The", "--seed", "1")
    assert result.stderr.splitlines()[-1] == (
        f"charlm: error: out of memory on cpu (an allocation of 1,000.0 GiB failed): {SAMPLE_ADVICE}"
    )
    assert result.returncode == 1 and "--batch-size" not in result.stderr
    monkeypatch.setattr(charlm.api, "Model", _raising(MemoryError()))
    assert_one_line_error(cli("export", trained_run, "model.pt"), f"out of memory on cpu: {DEFAULT_ADVICE}", code=1)


def test_training_that_runs_out_of_memory_is_one_line_with_exit_code_1(tiny_corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(LanguageModel, "forward", _raising(RuntimeError(CPU)))
    result = cli(*tiny_train(tiny_corpus, tmp_path / "run", epochs=1))
    assert_one_line_error(result, "out of memory on cpu (an allocation of 1,000.0 GiB failed)", ADVICE, code=1)


def test_the_python_boundary_raises_one_charlm_error(tiny_corpus, trained_run, tmp_path, monkeypatch):
    monkeypatch.setattr(LanguageModel, "forward", _raising(RuntimeError(CPU)))
    with pytest.raises(OutOfMemory, match=r"^out of memory on cpu \(an allocation of 1,000.0 GiB failed\)") as caught:
        charlm.train(tiny_config(tiny_corpus, tmp_path / "run", epochs=1))
    assert str(caught.value).endswith(": use a smaller batch_size (or hidden_size, bptt)")  # Python's names
    assert isinstance(caught.value, charlm.CharlmError) and isinstance(caught.value.__cause__, RuntimeError)
    monkeypatch.setattr(charlm.api, "Model", _raising(torch.OutOfMemoryError(CUDA)))
    with pytest.raises(OutOfMemory, match=r"^out of memory on cuda .*: load it on another device \(device=\.\.\.\)$"):
        charlm.load(trained_run, device="cpu")
    monkeypatch.setattr(charlm.api, "Model", _raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="^a bug$"):  # anything else passes through unchanged
        charlm.load(trained_run, device="cpu")
