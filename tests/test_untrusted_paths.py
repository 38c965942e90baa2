"""Files are untrusted input: names read from them stay names, a pipe is read as a file is, a damaged
run does not hide the others, and an output that cannot encode a character gets a replacement instead
of a crash."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from pathlib import Path

import pytest

from charlm.errors import CharlmError
from helpers import cli, run_cli

PLAN = 'name = {name}\n[base]\nepochs = 1\nhidden = 8\ncorpus = "tiny"\n[axes]\ncell = ["lru"]\n'


def assert_one_line(result, *fragments: str, code: int = 2) -> None:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("charlm: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- names from files -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ['"../elsewhere"', '["a"]', '"a/b"', '".hidden"', '"-x"'])
def test_a_plan_whose_name_is_not_a_plain_name_is_refused_and_nothing_is_written(
    name, tmp_path, monkeypatch, tiny_corpus
):
    work = tmp_path / "work"
    work.mkdir()
    (work / "plan.toml").write_text(PLAN.format(name=name), encoding="utf-8")
    monkeypatch.chdir(work)
    result = cli("sweep", "plan.toml", "--data-dir", tiny_corpus)
    assert_one_line(result, "plan plan.toml: its name", "is not a plain name")
    assert sorted(os.listdir(tmp_path)) == ["work"] and os.listdir(work) == [
        "plan.toml"
    ]  # no sweeps/, no elsewhere-paper


def test_a_profile_whose_name_climbs_out_is_refused(tmp_path):
    from charlm.experiments.plan import load_plan

    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(name='"fine"') + '[profiles."../up"]\nbase = { epochs = 2 }\n', encoding="utf-8")
    for profile in (None, "../up"):  # the whole file is checked, the profiles not chosen too
        with pytest.raises(CharlmError, match=r"profile '\.\./up' is not a plain name"):
            load_plan(plan, profile)


def test_a_corpus_name_is_never_a_path(tiny_corpus, tmp_path):
    from charlm.corpora import load_corpus
    from charlm.runs.directory import default_run_dir

    nested = tiny_corpus / "nested"  # "../tiny" from here is the real, prepared corpus: refused all the same
    assert load_corpus("tiny", tiny_corpus).name == "tiny"
    with pytest.raises(CharlmError, match=r"'\.\./tiny' is not a corpus name"):
        load_corpus("../tiny", nested)
    for corpus, cell in (("../../x", "lru"), ("tiny", "../../m:C"), ("/etc", "a/b")):
        path = default_run_dir(corpus, cell)
        assert path.parent == Path("runs") and "/" not in path.name and not path.name.startswith(".")


# --- a pipe is read as a file is ------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_score_reads_a_pipe_as_it_reads_a_file(trained_run, tmp_path):
    """``charlm score RUN <(zcat text.gz)`` names a pipe: it is read to its end, like a file."""
    text = "the cat sat on the mat. " * 20
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=lambda: pipe.write_text(text, encoding="utf-8"), daemon=True)
    writer.start()
    from_pipe = cli("score", trained_run, pipe, check_code=0).stdout
    writer.join(10)
    from_file = cli("score", trained_run, tmp_path / "text.txt", check_code=0).stdout
    assert "bpc" in from_pipe and from_pipe.replace(str(pipe), "TEXT") == from_file.replace(
        str(tmp_path / "text.txt"), "TEXT"
    )


# --- a damaged run among good ones ------------------------------------------------------------------


@pytest.fixture
def runs_with_damage(trained_run, tmp_path) -> Path:
    """runs/good (the trained run), runs/bad-config (config.json a list) and runs/bad-record (a string
    where valid_bpc's number belongs, on line 3 of 2+ records)."""
    root = tmp_path / "runs"
    for name in ("good", "bad-config", "bad-record"):
        shutil.copytree(trained_run, root / name, ignore=shutil.ignore_patterns("*.pt"))
    (root / "bad-config" / "config.json").write_text("[1, 2]\n", encoding="utf-8")
    lines = (root / "bad-record" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    first_epoch = next(index for index, line in enumerate(lines) if json.loads(line)["event"] == "epoch")
    lines[first_epoch] = json.dumps({**json.loads(lines[first_epoch]), "valid_bpc": "abc"})
    (root / "bad-record" / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "bad-record" / "line").write_text(str(first_epoch + 1))
    return root


def best_valid_bpc(run: Path) -> float:
    """By hand: the valid_bpc of the last epoch record flagged best."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r for r in records if r["event"] == "epoch" and r.get("best")][-1]["valid_bpc"]


def test_runs_lists_a_damaged_run_with_its_reason_and_the_good_ones(runs_with_damage, trained_run):
    root = runs_with_damage
    result = cli("runs", root, "--json", check_code=0)
    rows = {Path(row["run"]).name: row for row in json.loads(result.stdout)}
    assert set(rows) == {"good", "bad-config", "bad-record"}
    assert rows["good"]["status"] == "finished" and rows["good"]["damage"] is None
    assert rows["good"]["best_valid_bpc"] == best_valid_bpc(trained_run) and rows["good"]["epochs"] == 2
    line = (root / "bad-record" / "line").read_text()
    reasons = {
        "bad-config": f"{root / 'bad-config' / 'config.json'} must hold a JSON object, not a list",
        "bad-record": f"{root / 'bad-record' / 'metrics.jsonl'} line {line}: the epoch record's valid_bpc must be a "
        "number, not 'abc'",
    }
    for name, reason in reasons.items():
        assert rows[name]["status"] == "damaged" and rows[name]["damage"] == reason
        assert rows[name]["best_valid_bpc"] is None and rows[name]["epochs"] is None
        assert f"warning: {root / name} is damaged, its figures are not shown: {reason}" in result.stderr

    table = cli("runs", root, "--plain", check_code=0).stdout.splitlines()
    statuses = {Path(row.split("\t")[0]).name: row.split("\t")[-1] for row in table[1:]}
    assert statuses == {"good": "finished", "bad-config": "damaged", "bad-record": "damaged"}


@pytest.mark.parametrize(
    "text, reason",
    [
        ("[" * 100_000 + "]" * 100_000, "is not valid JSON (its values are nested too deeply)"),
        ('{"train": {"train_fraction": NaN}}', "train.train_fraction must be a number (finite), not nan"),
    ],
)
def test_a_config_json_no_listing_can_show_makes_a_damaged_row(text, reason, trained_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("*.pt"))
    (run / "config.json").write_text(text, encoding="utf-8")
    (row,) = json.loads(cli("runs", run, "--json", check_code=0).stdout)
    assert row["status"] == "damaged" and row["damage"].startswith(str(run / "config.json")) and reason in row["damage"]


def test_runs_json_is_json_whatever_numbers_the_run_files_hold(trained_run, tmp_path):
    """A NaN score (a run that diverged) is null; a provenance.json holding NaN (no run writes one) is
    unreadable, as damaged JSON is: `charlm runs --json` prints JSON that strict readers take."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("*.pt"))
    (run / "provenance.json").write_text('{"command": "charlm train", "pid": NaN}', encoding="utf-8")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    for record in records:
        if record["event"] == "epoch":
            record["valid_bpc"] = math.nan
    (run / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")

    def refuse(constant):
        raise ValueError(f"{constant} in the output")

    (row,) = json.loads(cli("runs", run, "--json", check_code=0).stdout, parse_constant=refuse)
    assert row["best_valid_bpc"] is None and row["provenance"] == {} and row["status"] == "finished"


def test_report_reports_the_good_runs_and_says_which_it_skipped(runs_with_damage):
    root = runs_with_damage
    result = cli("report", root, check_code=0)
    assert (
        "skipped the damaged run bad-config: " in result.stderr
        and "skipped the damaged run bad-record: " in result.stderr
    )
    index = (root / "report" / "index.md").read_text(encoding="utf-8")
    assert "Skipped the damaged run bad-config: " in index and "must hold a JSON object, not a list" in index
    assert "Skipped the damaged run bad-record: " in index and "valid_bpc must be a number" in index
    summary = (root / "report" / "summary.csv").read_text(encoding="utf-8")  # one readable run: its summary
    assert "good" in summary and "bad-" not in summary


def test_report_of_nothing_but_damaged_runs_says_why(runs_with_damage):
    root = runs_with_damage
    shutil.rmtree(root / "good")
    result = cli("report", root)
    assert_one_line(result, "no readable runs under", "bad-config: ", "bad-record: ")


@pytest.mark.skipif(
    not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="FIFOs and /dev/zero are POSIX"
)
def test_a_run_whose_file_is_a_pipe_or_a_device_is_damaged_at_once_and_the_good_run_is_listed(trained_run, tmp_path):
    """A metrics.jsonl that is a named pipe used to hang `charlm runs` and `charlm report`, a config.json
    linked to /dev/zero to exhaust their memory, and `runs --prune` stopped at a run whose records are
    damaged: the files of a run directory are charlm's, regular files or damage. (In subprocesses with a
    timeout: a hang fails the test instead of stopping the suite.)"""
    root = tmp_path / "runs"
    for name in ("good", "piped-records", "endless-config"):
        shutil.copytree(trained_run, root / name, ignore=shutil.ignore_patterns("*.pt"))
    records, config = root / "piped-records" / "metrics.jsonl", root / "endless-config" / "config.json"
    records.unlink()
    os.mkfifo(records)
    config.unlink()
    config.symlink_to("/dev/zero")
    reasons = {
        "piped-records": f"run record file {records} is a named pipe, not a regular file",
        "endless-config": f"run settings file {config} (a link to /dev/zero) is a character device, not a regular file",
    }

    listed = run_cli("runs", root, "--json", timeout=120, check_code=0)
    rows = {Path(row["run"]).name: row for row in json.loads(listed.stdout)}
    assert rows["good"]["status"] == "finished" and rows["good"]["best_valid_bpc"] == best_valid_bpc(trained_run)
    for name, reason in reasons.items():
        assert rows[name]["status"] == "damaged" and rows[name]["damage"] == reason

    reported = run_cli("report", root, timeout=120, check_code=0)
    for name, reason in reasons.items():
        assert f"skipped the damaged run {name}: {reason}" in reported.stderr
    summary = (root / "report" / "summary.csv").read_text(encoding="utf-8")
    assert "good" in summary and "piped-records" not in summary and "endless-config" not in summary

    pruned = run_cli("runs", root, "--prune", "--dry-run", timeout=120, check_code=0)  # no file it prunes is damaged
    assert pruned.stdout == "would free 0B (0 bytes) in 0 of 3 run(s)\n"


def test_a_run_file_larger_than_charlm_writes_is_damage(trained_run, tmp_path):
    from charlm.files import read_own_file

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("*.pt"))
    size = (run / "config.json").stat().st_size
    assert read_own_file(run / "config.json", "run settings file", limit=size) == (run / "config.json").read_bytes()
    with pytest.raises(CharlmError) as caught:
        read_own_file(run / "config.json", "run settings file", limit=size - 1)
    assert str(caught.value) == (
        f"run settings file {run / 'config.json'} is larger than {size - 1:,} bytes, more than charlm ever writes"
    )


# --- an output that cannot encode a character -------------------------------------------------------


def test_sample_on_an_ascii_stdout_replaces_what_it_cannot_encode(trained_run):
    result = run_cli(
        "sample",
        trained_run,
        "--prime",
        "“x”",
        "--length",
        "5",
        "--seed",
        "1",
        env={"PYTHONIOENCODING": "ascii"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("?x?") and "Traceback" not in result.stderr
