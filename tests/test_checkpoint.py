"""The typed checkpoint: round trips, charlm 0.1's format 1, damaged files, and never running code
named in a file (a user cell is imported only when the caller names it or trusts the file)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import charlm
from charlm.checkpoint import Checkpoint
from charlm.errors import CharlmError
from charlm.training.trainer import Trainer
from helpers import assert_one_line_error, cli, prepare_tiny_corpus, records
from helpers import readme_cell_source

SMALL = dict(hidden_size=16, batch_size=8, bptt=16, eval_batch_size=4, lr=3e-3)


# --- helpers ---------------------------------------------------------------------------------------


def format_1_payload(checkpoint: Checkpoint) -> dict:
    """The same state in charlm 0.1's layout: a bare dict, no scheduler state, no provenance, a
    config without the settings added since (tensorboard), a Progress without best_test_bpc, and
    an optimizer whose lr was set by hand at each epoch start (no scheduler's initial_lr)."""
    state, config = checkpoint.training, checkpoint.train_config
    progress = {key: value for key, value in state.progress.items() if key != "best_test_bpc"}
    epoch = progress["epoch"]
    lr_in_use = config.lr * config.lr_decay ** max(epoch - (progress["window"] == 0), 0)
    optimizer = {
        "state": state.optimizer["state"],
        "param_groups": [
            {**{k: v for k, v in group.items() if k != "initial_lr"}, "lr": lr_in_use}
            for group in state.optimizer["param_groups"]
        ],
    }
    old_config = config.to_dict()
    del old_config["tensorboard"]
    payload = {
        "format": "charlm-checkpoint",
        "format_version": 1,
        "charlm_version": "0.1.0",
        "model": checkpoint.weights,
        "optimizer": optimizer,
        "scheduler": {"lr": config.lr * config.lr_decay**epoch, "lr_decay": config.lr_decay, "epoch": epoch},
        "rng": {"torch": state.rng["torch"]},
        "progress": progress,
        "hidden": state.hidden,
        "config": old_config,
        "model_config": checkpoint.model_config.to_dict(),
        "tokenizer": checkpoint.tokenizer,
        "corpus": {"name": config.corpus, "unit": "char", "vocab_size": checkpoint.model_config.vocab_size},
    }
    if "test_bpc" in checkpoint.scores:
        payload.update(test_bpc=checkpoint.scores["test_bpc"], valid_bpc=checkpoint.scores["valid_bpc"])
    return payload


def logits_of(model, text: str) -> torch.Tensor:
    ids = torch.tensor([model.tokenizer.encode(text)])
    with torch.no_grad():
        logits, _ = model.network(ids, model.network.initial_state(1))
    return logits


def epoch_records(run: Path) -> list[dict]:
    rows = records(run)
    return [row for row in rows if row["event"] == "epoch"]


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """A small LRU after two full epochs, and the same run stopped one window into epoch 3
    (mid-epoch: carried hidden state in last.pt)."""
    root = tmp_path_factory.mktemp("checkpoint-runs")
    data_dir = root / "data"
    prepare_tiny_corpus(data_dir, characters=8_000)
    end = root / "epoch-end"
    charlm.train(
        charlm.TrainConfig(corpus="tiny", cell="lru", epochs=2, data_dir=str(data_dir), run_dir=str(end), **SMALL)
    )
    middle = root / "mid-epoch"
    shutil.copytree(end, middle)
    Trainer.resume(middle, epochs=3, max_minutes=1e-7).fit()
    assert Checkpoint.load(middle / "last.pt").training.progress["window"] > 0
    return {"epoch-end": end, "mid-epoch": middle}


# --- round trips -----------------------------------------------------------------------------------


def test_training_checkpoint_round_trips(trained_run, tmp_path):
    original = Checkpoint.load(trained_run / "best.pt")
    assert original.kind == "training" and original.path == trained_run / "best.pt"
    assert set(original.scores) == {"valid_bpc", "test_bpc", "test_loss", "epoch"}
    assert original.provenance["corpus"] == "tiny"
    copy = original.save(tmp_path / "copy.pt")

    raw = torch.load(copy, weights_only=True)  # plain tensors and containers only
    assert raw["format"] == "charlm-checkpoint" and raw["format_version"] == 2 and raw["kind"] == "training"

    loaded = Checkpoint.load(copy)
    assert loaded.path == copy
    assert loaded.model_config == original.model_config
    assert loaded.train_config == original.train_config
    assert loaded.tokenizer == original.tokenizer
    assert (loaded.kind, loaded.scores, loaded.provenance) == (original.kind, original.scores, original.provenance)
    assert loaded.charlm_version == charlm.__version__
    assert loaded.weights.keys() == original.weights.keys()
    assert all(torch.equal(loaded.weights[name], original.weights[name]) for name in original.weights)
    assert loaded.training.progress == original.training.progress
    assert loaded.training.scheduler == original.training.scheduler
    assert torch.equal(loaded.training.rng["torch"], original.training.rng["torch"])
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


def test_adapted_and_export_kinds_keep_their_fields(trained_run, tmp_path):
    original = Checkpoint.load(trained_run)
    adapted = dataclasses.replace(
        original,
        kind="adapted",
        training=None,
        dynamic={"method": "sgd", "lr": 0.01},
        scores={"dynamic_bpc": 3.5},
        provenance={"note": "ü", "threads": 1},
    )
    loaded = Checkpoint.load(adapted.save(tmp_path / "adapted.pt"))
    assert (loaded.kind, loaded.training, loaded.dynamic) == ("adapted", None, {"method": "sgd", "lr": 0.01})
    assert (loaded.scores, loaded.provenance) == ({"dynamic_bpc": 3.5}, {"note": "ü", "threads": 1})

    exported = Checkpoint.load(original.exported().save(tmp_path / "export.pt"))
    assert (exported.kind, exported.training) == ("export", None)
    assert exported.scores == original.scores and exported.provenance == original.provenance


def test_run_directory_resolves_to_best_or_last(trained_run):
    assert Checkpoint.load(trained_run).path == trained_run / "best.pt"
    assert Checkpoint.load(trained_run, prefer="last").path == trained_run / "last.pt"
    assert charlm.load(trained_run, prefer="last").checkpoint.path == trained_run / "last.pt"


# --- format 1 (charlm 0.1) -------------------------------------------------------------------------


def test_format_1_best_loads_with_identical_logits(trained_run, tmp_path):
    best = Checkpoint.load(trained_run / "best.pt")
    old = tmp_path / "old-best.pt"
    optimizer = Checkpoint.load(trained_run / "last.pt").training.optimizer  # a 0.1 best.pt held one; ours keep none
    torch.save(
        format_1_payload(dataclasses.replace(best, training=dataclasses.replace(best.training, optimizer=optimizer))),
        old,
    )

    converted = Checkpoint.load(old)
    assert converted.kind == "training" and converted.charlm_version == "0.1.0"
    assert converted.scores == {"valid_bpc": best.scores["valid_bpc"], "test_bpc": best.scores["test_bpc"]}
    assert converted.train_config == dataclasses.replace(best.train_config, tensorboard=False)
    assert converted.training.scheduler is None and converted.provenance == {}

    text = "The quick brown fox jumps over the lazy dog."
    assert torch.equal(logits_of(charlm.load(old), text), logits_of(charlm.load(trained_run), text))

    shutil.copy(trained_run / "best.pt", tmp_path / "new-best.pt")  # outside the run: eval records nothing
    new_eval = cli("eval", tmp_path / "new-best.pt", check_code=0)
    old_eval = cli("eval", old, check_code=0)
    bpc_line = [line for line in new_eval.stdout.splitlines() if line.startswith("bpc")]
    assert bpc_line and bpc_line == [line for line in old_eval.stdout.splitlines() if line.startswith("bpc")]


@pytest.mark.parametrize("where", ["epoch-end", "mid-epoch"])
def test_format_1_last_resumes_like_format_2(small_runs, tmp_path, where):
    """A 0.1 last.pt (no scheduler state) resumes with lr · decay^epoch and ends with exactly the
    weights that resuming the same state from a format-2 file gives."""
    source = small_runs[where]
    finals = {}
    for layout in ("format 1", "format 2"):
        run = tmp_path / layout.replace(" ", "")
        shutil.copytree(source, run)
        if layout == "format 1":
            torch.save(format_1_payload(Checkpoint.load(run / "last.pt")), run / "last.pt")
            assert Checkpoint.load(run / "last.pt").training.scheduler is None
        trainer = Trainer.resume(run, epochs=3)
        summary = trainer.fit()
        config = trainer.config
        assert summary["epochs"] == 3
        assert trainer.lr == pytest.approx(config.lr * config.lr_decay**3, rel=1e-12)
        last_epoch = epoch_records(run)[-1]
        assert last_epoch["epoch"] == 3 and not last_epoch["partial"]
        assert last_epoch["lr"] == pytest.approx(config.lr * config.lr_decay**2, rel=1e-12)
        finals[layout] = Checkpoint.load(run / "last.pt").weights
    assert all(torch.equal(finals["format 1"][name], finals["format 2"][name]) for name in finals["format 2"])


# --- files that are not checkpoints ----------------------------------------------------------------


class Booby:
    """Unpickling this touches a file: a checkpoint loader must never unpickle arbitrary objects."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_future_format_version_is_named(trained_run, tmp_path):
    payload = Checkpoint.load(trained_run).to_payload()
    payload.update(format_version=99, charlm_version="9.0")
    future = tmp_path / "future.pt"
    torch.save(payload, future)
    assert_one_line_error(cli("eval", future), "format 99", "charlm 9.0", "reads formats 1, 2")
    with pytest.raises(CharlmError, match="format 99"):
        charlm.load(future)


def _missing_weights(payload):
    del payload["weights"]


def _missing_everything(payload):
    for key in list(payload):
        if key not in ("format", "format_version"):
            del payload[key]


def _bad_model_config(payload):
    payload["model_config"]["hidden_size"] = "wide"


def _unknown_setting(payload):
    payload["train_config"]["warp_drive"] = True


def _unknown_kind(payload):
    payload["kind"] = "mystery"


def _wrong_shapes(payload):
    payload["model_config"]["hidden_size"] += 1


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (_missing_weights, "damaged charlm checkpoint"),
        (_missing_everything, "damaged charlm checkpoint"),
        (_bad_model_config, "cannot read (hidden_size must be an integer"),
        (_unknown_setting, "cannot read (unknown TrainConfig setting: 'warp_drive')"),
        (_unknown_kind, "unknown kind 'mystery'"),
        (_wrong_shapes, "has shape [92, 32], the model it describes needs [92, 33]"),
    ],
)
def test_damaged_checkpoint_is_one_line_error(trained_run, tmp_path, damage, fragment):
    payload = Checkpoint.load(trained_run).to_payload()
    damage(payload)
    path = tmp_path / "damaged.pt"
    torch.save(payload, path)
    assert_one_line_error(cli("eval", path), fragment)


def test_files_that_are_not_checkpoints(trained_run, tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("just some notes\n", encoding="utf-8")
    assert_one_line_error(cli("eval", text), str(text), "not a readable charlm checkpoint")

    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    assert_one_line_error(cli("sample", other), "not a charlm checkpoint")

    marker = tmp_path / "unpickled"
    hostile = tmp_path / "hostile.pt"
    torch.save({"format": "charlm-checkpoint", "format_version": 2, "payload": Booby(marker)}, hostile)
    for command in ("eval", "sample", "export"):
        args = (command, hostile) + ((tmp_path / "out.pt",) if command == "export" else ())
        assert_one_line_error(cli(*args), "not a readable charlm checkpoint")
    with pytest.raises(CharlmError, match="not a readable"):
        charlm.load(hostile)
    assert not marker.exists()

    data = (trained_run / "best.pt").read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    assert_one_line_error(cli("eval", truncated), "not a readable charlm checkpoint")

    assert_one_line_error(cli("eval", tmp_path / "absent.pt"), "no such checkpoint or run directory")
    assert_one_line_error(cli("eval", tmp_path), "holds no checkpoint")


# --- loading never runs code named in a file -------------------------------------------------------


@pytest.fixture
def forget_modules():
    """Drop the test modules from sys.modules afterwards (and before: another test may have them)."""
    names = ("evilmod", "mycells")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    yield
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


@pytest.fixture
def evil(tmp_path, monkeypatch, forget_modules, trained_run):
    """evilmod.py on sys.path writes a marker when imported; a checkpoint and a run name its cell."""
    marker = tmp_path / "evilmod-was-imported"
    (tmp_path / "evilmod.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = Checkpoint.load(trained_run / "best.pt")
    checkpoint = dataclasses.replace(
        checkpoint, model_config=dataclasses.replace(checkpoint.model_config, cell="evilmod:Nope")
    )
    path = checkpoint.save(tmp_path / "evil.pt")
    return marker, path


def test_checkpoint_naming_a_module_is_refused_everywhere(evil, tmp_path):
    marker, path = evil
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat.", encoding="utf-8")
    for args in (
        ("eval", path),
        ("sample", path, "--length", "5"),
        ("score", path, text),
        ("export", path, tmp_path / "export.pt"),
    ):
        assert_one_line_error(cli(*args), "'evilmod'", "--trust-code")
        assert not marker.exists(), f"charlm {args[0]} imported the module"
    for call in (
        lambda: charlm.load(path),
        lambda: charlm.load(path, cells=["othermod:Nope"]),
        lambda: Checkpoint.load(path).build_model(),
    ):
        with pytest.raises(CharlmError, match="'evilmod'.*--trust-code"):
            call()
    assert not marker.exists() and "evilmod" not in sys.modules
    assert not (tmp_path / "export.pt").exists()

    # the gate is the only thing in the way: trusting the file does import it
    assert_one_line_error(cli("eval", path, "--trust-code"), "has no class 'Nope'")
    assert marker.exists()


def test_resuming_a_run_that_names_a_module_is_refused(evil, small_runs, tmp_path):
    marker, _ = evil
    run = tmp_path / "run"
    shutil.copytree(small_runs["epoch-end"], run)
    last = Checkpoint.load(run / "last.pt")
    dataclasses.replace(last, model_config=dataclasses.replace(last.model_config, cell="evilmod:Nope")).save(
        run / "last.pt"
    )
    recorded = json.loads((run / "config.json").read_text(encoding="utf-8"))
    recorded["model"]["cell"] = (
        "evilmod:Nope"  # the whole run names it (else: a checkpoint of another run, refused as such)
    )
    (run / "config.json").write_text(json.dumps(recorded), encoding="utf-8")
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "3"), "'evilmod'", "--trust-code")
    with pytest.raises(CharlmError, match="'evilmod'"):
        Trainer.resume(run, epochs=3)
    assert not marker.exists()


def test_config_file_naming_a_module_is_refused(evil, tiny_corpus, tmp_path):
    marker, _ = evil
    config = tmp_path / "cfg.json"
    run = tmp_path / "run"
    config.write_text(
        json.dumps({"cell": "evilmod:Nope", "corpus": "tiny", "data_dir": str(tiny_corpus), "run_dir": str(run)}),
        encoding="utf-8",
    )
    assert_one_line_error(cli("train", "--config", config), "'evilmod'", "--trust-code")
    assert not marker.exists() and not run.exists()


def test_user_cell_loads_when_named_or_trusted(tmp_path, monkeypatch, forget_modules):
    (tmp_path / "mycells.py").write_text(readme_cell_source(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    data_dir = tmp_path / "data"
    prepare_tiny_corpus(data_dir, characters=6_000)
    run = tmp_path / "run"
    charlm.train(
        charlm.TrainConfig(
            corpus="tiny",
            cell="mycells:LeakyTanh",
            cell_options={"leak": 0.3},
            epochs=1,
            data_dir=str(data_dir),
            run_dir=str(run),
            **SMALL,
        )
    )
    leaky = importlib.import_module("mycells").LeakyTanh

    with pytest.raises(CharlmError, match="'mycells'.*--trust-code"):
        charlm.load(run)
    assert_one_line_error(cli("sample", run, "--length", "5"), "'mycells'", "--trust-code")

    text = "The cat sat on the mat."
    reference = None
    for options in ({"cells": [leaky]}, {"cells": ["mycells:LeakyTanh"]}, {"trust_code": True}):
        model = charlm.load(run, **options)
        assert any(isinstance(module, leaky) for module in model.network.modules())
        assert model.network.layers[0].config.leak == 0.3
        logits = logits_of(model, text)
        reference = logits if reference is None else reference
        assert torch.equal(logits, reference)

    result = cli("sample", run, "--cell", "mycells:LeakyTanh", "--length", "20", "--seed", "1", check_code=0)
    assert len(result.stdout) == 1 + 20 + 1  # the default prime (a line break), 20 symbols, a newline
    assert result.stdout == cli("sample", run, "--trust-code", "--length", "20", "--seed", "1", check_code=0).stdout

    # resuming names the cell the same way
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "2"), "'mycells'", "--trust-code")
    cli("train", "--resume", run, "--epochs", "2", "--cell", "mycells:LeakyTanh", check_code=0)
    assert Checkpoint.load(run, prefer="last").training.progress["epoch"] == 2
    assert_one_line_error(cli("train", "--resume", run, "--epochs", "3", "--cell", "othercells:LeakyTanh"), "'mycells'")
