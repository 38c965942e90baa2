"""`--wandb`: refused up front without the extra; offline, every record's numbers reach the W&B run,
named after the run directory, with the run's config; a resumed run logs into the same W&B run."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from charlm.runs.wandb_sink import project_name
from helpers import assert_one_line_error, cli, records


def wandb_records(path) -> list:
    """The protobuf records of a ``.wandb`` file (a LevelDB-style log: a 7-byte header, then 32 KiB
    blocks of chunks, each a CRC, a length, a type: full 1, first 2, middle 3, last 4)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, found = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack_from("<HB", data, position + 4)
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def logged_rows(wandb_file) -> list[dict]:
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in wandb_records(wandb_file)
        if record.WhichOneof("record_type") == "history"
    ]


def test_without_wandb_the_run_is_refused_before_it_starts(sink_train, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    run = tmp_path / "run"
    assert_one_line_error(cli(*sink_train(run, epochs=1, wandb=True)), "--wandb", "-e '.[wandb]'")
    assert not run.exists()


def test_project_is_the_option_then_the_environment_then_charlm(monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    assert project_name(None) == "charlm"
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert project_name(None) == "from-env" and project_name("given") == "given"


@pytest.mark.slow  # W&B starts its service process for each session: about 15 s here
def test_offline_wandb_run_holds_every_record_and_resumes_the_same_run(sink_train, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    run = tmp_path / "my-run"
    cli(*sink_train(run, epochs=1, wandb=True, wandb_project="tests"), check_code=0)
    run_id = json.loads((run / "wandb.json").read_text(encoding="utf-8"))["id"]
    assert json.loads((run / "wandb.json").read_text(encoding="utf-8"))["project"] == "tests"
    first = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(first) == 1, list((tmp_path / "wandb").iterdir())

    found = wandb_records(first[0])
    described = next(record.run for record in found if record.WhichOneof("record_type") == "run")
    assert described.display_name == "my-run" and described.project == "tests" and described.run_id == run_id
    config = {item.key: json.loads(item.value_json) for item in described.config.update}
    assert config["train"]["cell"] == "lru" and config["train"]["hidden"] == 16 and config["model"]["hidden_size"] == 16

    rows = logged_rows(first[0])
    steps = records(run, "step")
    logged_steps = [row for row in rows if "step/bpc" in row]
    assert [row["step"] for row in logged_steps] == [record["step"] for record in steps]
    assert [row["step/bpc"] for row in logged_steps] == pytest.approx([record["bpc"] for record in steps], rel=1e-9)
    epoch = records(run, "epoch")[0]
    logged_epoch = next(row for row in rows if "epoch/valid_bpc" in row)
    assert logged_epoch["epoch/valid_bpc"] == pytest.approx(epoch["valid_bpc"], rel=1e-9)
    assert logged_epoch["step"] == epoch["step"] and logged_epoch["epoch/grad_norm/layer0"] == pytest.approx(
        epoch["grad_norm"]["layer0"], rel=1e-9
    )
    assert any("start/parameters" in row for row in rows) and any("test/test_bpc" in row for row in rows)

    cli("train", "--resume", run, "--epochs", "2", "--wandb", check_code=0)
    sessions = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(sessions) == 2  # a second session of the same W&B run
    second = next(path for path in sessions if path != first[0])
    resumed = next(record.run for record in wandb_records(second) if record.WhichOneof("record_type") == "run")
    assert resumed.run_id == run_id and resumed.project == "tests"  # the stored project, not WANDB_PROJECT's default
    second_epoch = records(run, "epoch")[1]
    assert any(
        row.get("epoch/valid_bpc") == pytest.approx(second_epoch["valid_bpc"], rel=1e-9) for row in logged_rows(second)
    )


def test_a_wandb_run_that_cannot_start_is_one_line_before_any_training(sink_train, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def refuse(**settings):
        assert settings["name"] == "run" and settings["resume"] == "allow" and settings["project"] == "charlm"
        raise wandb.errors.UsageError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")

    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    run = tmp_path / "run"
    result = cli(*sink_train(run, epochs=1, wandb=True))
    assert_one_line_error(result, "--wandb: cannot start the W&B run (api_key not configured", "WANDB_MODE=offline")
    assert records(run, "step") == [] and not (run / "last.pt").exists()
