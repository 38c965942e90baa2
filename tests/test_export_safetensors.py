"""`charlm export --format safetensors`: a file any safetensors reader loads without charlm (the
example in docs/evaluation.md, run where charlm cannot be imported), which every command that takes
a checkpoint reads to the numbers of the run's best.pt; tied layers stored once, a sentencepiece
vocabulary carried; a file that is not charlm's, or is damaged, is one line."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

import charlm
from charlm.checkpoint import Checkpoint
from charlm.corpora.subword import train_subword_tokenizer
from charlm.model import LanguageModel
from helpers import REPO, assert_one_line_error, cli, pydoc_text

safetensors_torch = pytest.importorskip("safetensors.torch")

TEXT = "Return the value of the named attribute of object."
SAFETENSORS_START = b"{"  # after the 8-byte length of the header


def stdout_field(result, name: str) -> str:
    [line] = [line for line in result.stdout.splitlines() if line.split()[:1] == [name]]
    return line.split(None, 1)[1]


def logits_of(model, text: str) -> torch.Tensor:
    ids = torch.tensor([model.tokenizer.encode(text)])
    with torch.no_grad():
        return model.network(ids, model.network.initial_state(1))[0]


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    """The trained run's export, written by `charlm export RUN model.safetensors` (no --format:
    the name says it), and a copy of its best.pt beside it."""
    folder = tmp_path_factory.mktemp("safetensors")
    output = folder / "model.safetensors"
    result = cli("export", trained_run, output, check_code=0)
    shutil.copy(trained_run / "best.pt", folder / "best.pt")
    return output, folder / "best.pt", result


def test_the_export_is_a_safetensors_file_of_the_runs_weights_and_settings(exported, trained_run):
    output, best, result = exported
    size, full = output.stat().st_size, best.stat().st_size
    assert result.stdout.splitlines()[0] == (
        f"exported        {output} (safetensors, {size:,} bytes; {trained_run / 'best.pt'} is {full:,} bytes, "
        f"{size / full:.0%} of it)"
    )
    assert output.read_bytes()[8:9] == SAFETENSORS_START
    original, read = Checkpoint.load(best), Checkpoint.load(output)
    assert (read.kind, read.training, read.path) == ("export", None, output)
    for part in ("model_config", "train_config", "tokenizer", "scores", "provenance", "dynamic", "charlm_version"):
        assert getattr(read, part) == getattr(original, part), part
    assert read.weights.keys() == original.weights.keys()
    assert all(torch.equal(read.weights[name], original.weights[name]) for name in original.weights)


def test_a_header_whose_length_starts_as_a_pickle_does_is_read_as_safetensors(exported, tmp_path):
    """The first byte of a safetensors file is its header length's lowest: 0x80 begins a pickle too."""
    with safetensors_torch.safe_open(exported[0], framework="pt") as file:
        metadata, tensors = file.metadata(), {name: file.get_tensor(name) for name in file.keys()}
    data = next(
        data
        for pad in range(256)
        if (data := safetensors_torch.save(tensors, {**metadata, "padding": "x" * pad}))[0] == 0x80
    )
    (tmp_path / "model.pt").write_bytes(data)
    assert Checkpoint.load(tmp_path / "model.pt").weights.keys() == Checkpoint.load(exported[1]).weights.keys()


def test_every_command_gives_the_numbers_of_best_pt(exported, tmp_path):
    output, best, _ = exported
    ours, theirs = charlm.load(output, device="cpu"), charlm.load(best, device="cpu")
    assert torch.equal(logits_of(ours, TEXT), logits_of(theirs, TEXT))
    assert ours.sample("The ", 60, seed=4) == theirs.sample("The ", 60, seed=4)
    assert ours.score(TEXT).nats == theirs.score(TEXT).nats

    text, files = tmp_path / "text.txt", (output, best)
    text.write_text(TEXT, encoding="utf-8")
    for command in (["sample", "--prime", "The ", "--length", "40", "--seed", "3"], ["score", text]):
        printed = [
            cli(command[0], path, *command[1:], check_code=0).stdout.replace(str(path), "FILE") for path in files
        ]
        assert printed[0] == printed[1]
    assert stdout_field(cli("eval", output, check_code=0), "bpc") == stdout_field(
        cli("eval", best, check_code=0), "bpc"
    )
    # it exports again, to either format
    cli("export", output, tmp_path / "again.pt", check_code=0)
    assert torch.equal(logits_of(charlm.load(tmp_path / "again.pt", device="cpu"), TEXT), logits_of(theirs, TEXT))


def test_serve_serves_it_under_its_name(exported, monkeypatch):
    uvicorn = pytest.importorskip("uvicorn", reason="needs the serve extra")
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: served.append(server.config))
    output = exported[0]
    result = cli("serve", output, "--port", "0", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    [config] = served
    assert list(config.app.app.state.models) == ["model"]


def docs_example() -> str:
    """The Python example of docs/evaluation.md that reads the safetensors file."""
    page = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    [example] = [block for block in re.findall(r"```python\n(.*?)```", page, re.S) if "safe_open" in block]
    return example


def test_the_docs_example_reads_it_where_charlm_cannot_be_imported(exported, tmp_path):
    shutil.copy(exported[0], tmp_path / "model.safetensors")
    script = (
        'import sys\nsys.modules["charlm"] = None  # `import charlm` raises ImportError\n'
        + docs_example()
        + 'import torch\ntorch.save({"weights": weights, "config": config, "vocabulary": vocabulary}, "read.pt")\n'
    )
    subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, check=True, timeout=120)
    read = torch.load(tmp_path / "read.pt", weights_only=True)
    original = Checkpoint.load(exported[1])
    assert read["config"] == original.model_config.to_dict()
    assert read["vocabulary"] == original.tokenizer["vocab"]
    assert read["weights"].keys() == original.weights.keys()
    assert all(torch.equal(read["weights"][name], original.weights[name]) for name in original.weights)
    # what safetensors' own loader puts into the model the settings describe
    network = LanguageModel(original.model_config)
    network.load_state_dict(safetensors_torch.load_file(tmp_path / "model.safetensors"))


def rebuilt(trained_run, **changes) -> Checkpoint:
    """The trained run's checkpoint with ``changes``, and the weights of a new model of its settings."""
    original = Checkpoint.load(trained_run / "best.pt")
    model_config = dataclasses.replace(original.model_config, **changes)
    torch.manual_seed(0)
    return dataclasses.replace(original, model_config=model_config, weights=LanguageModel(model_config).state_dict())


def test_tied_layers_are_stored_once_and_read_back_tied(trained_run, tmp_path):
    rebuilt(trained_run, layers=2, tie_layers=True).save(tmp_path / "tied.pt")
    output = tmp_path / "tied.safetensors"
    cli("export", tmp_path / "tied.pt", output, "--format", "safetensors", check_code=0)
    with safetensors_torch.safe_open(output, framework="pt") as file:
        stored, shared = set(file.keys()), json.loads(file.metadata()["charlm.shared"])
    assert shared == {
        f"layers.1.{name}": f"layers.0.{name}"
        for name in ("gate_bias", "gate_weight", "projection_bias", "projection_weight")
    }
    assert stored.isdisjoint(shared)
    ours, theirs = charlm.load(output, device="cpu"), charlm.load(tmp_path / "tied.pt", device="cpu")
    assert ours.network.layers[0] is ours.network.layers[1]
    assert torch.equal(logits_of(ours, TEXT), logits_of(theirs, TEXT))


def test_a_sentencepiece_vocabulary_travels_with_it(trained_run, tmp_path):
    tokenizer = train_subword_tokenizer(pydoc_text(20_000), "bpe", 120)
    checkpoint = rebuilt(trained_run, vocab_size=tokenizer.vocab_size)
    checkpoint = dataclasses.replace(checkpoint, tokenizer=tokenizer.to_state())
    checkpoint.save(tmp_path / "subword.pt")
    cli("export", tmp_path / "subword.pt", tmp_path / "subword.safetensors", check_code=0)
    ours, theirs = charlm.load(tmp_path / "subword.safetensors", device="cpu"), charlm.load(tmp_path / "subword.pt")
    assert ours.tokenizer.model == theirs.tokenizer.model == tokenizer.model
    assert ours.tokenizer.encode(TEXT) == tokenizer.encode(TEXT)
    assert ours.score(TEXT).nats == theirs.score(TEXT).nats


def with_metadata(source, target, **changes):
    """``source`` written again to ``target`` with its metadata changed (None removes a key)."""
    with safetensors_torch.safe_open(source, framework="pt") as file:
        metadata = {**file.metadata(), **changes}
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    safetensors_torch.save_file(tensors, target, {key: value for key, value in metadata.items() if value is not None})
    return target


def test_files_that_are_not_charlms_or_damaged_are_one_line(exported, tmp_path):
    output = exported[0]
    foreign = tmp_path / "foreign.safetensors"
    safetensors_torch.save_file({"weight": torch.zeros(2, 2)}, foreign, {"format": "pt"})
    assert_one_line_error(
        cli("sample", foreign),
        f"{foreign} is a safetensors file without charlm's settings (no charlm.format in its metadata): charlm reads "
        "the ones `charlm export --format safetensors` writes",
    )
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(output.read_bytes()[:-100])
    assert_one_line_error(cli("eval", cut), f"{cut} is not a readable safetensors file: ")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a model")
    assert_one_line_error(cli("score", garbage, garbage), f"{garbage} is not a readable safetensors file: ")
    broken = with_metadata(output, tmp_path / "broken.safetensors", **{"charlm.model_config": "{cell"})
    assert_one_line_error(
        cli("sample", broken), f"{broken} is a damaged charlm safetensors file: its charlm.model_config"
    )
    unshared = with_metadata(output, tmp_path / "unshared.safetensors", **{"charlm.shared": '{"a": "b"}'})
    assert_one_line_error(cli("sample", unshared), "its charlm.shared gives 'a' the tensor 'b'")
    missing = with_metadata(output, tmp_path / "missing.safetensors", **{"charlm.tokenizer": None})
    assert_one_line_error(cli("sample", missing), f"{missing} is a damaged charlm checkpoint: its tokenizer is")


def test_without_the_package_export_and_reading_say_how_to_install_it(exported, trained_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    hint = (
        "install the extra from charlm's clone: python3 -m pip install -e '.[safetensors]' "
        "(or: pip install safetensors)"
    )
    result = cli("export", trained_run, tmp_path / "model.safetensors")
    assert result.stderr == f"charlm: error: --format safetensors needs the safetensors package: {hint}\n"
    assert not (tmp_path / "model.safetensors").exists()
    result = cli("sample", exported[0])
    assert result.stderr == f"charlm: error: reading {exported[0]} needs the safetensors package: {hint}\n"
