"""A prepared corpus never changes under a run that used it: preparing it again from other inputs keeps
the earlier version under ``.versions``, where the run's commands find it by the fingerprint its
provenance records; where that version is gone, scores are refused and sampling warns. Checks that
need nothing but the settings come before anything is prepared or written."""

import json
import shutil

from charlm.corpora import load_corpus
from charlm.corpora.catalog import CorpusChanged, TrainedOn
from charlm.corpora.store import VERSIONS, remove_abandoned_staging, staging_path
import random

from helpers import assert_one_line_error, cli

SMALL = ("--cell", "lstm", "--hidden", "8", "--epochs", "1", "--batch-size", "4", "--bptt", "16")


def words(seed: int, characters: int = 12_000) -> str:
    """A text of a few words, drawn: every draw has the same vocabulary, in every split."""
    drawn = random.Random(seed)
    return " ".join(drawn.choice(("the", "fox", "jumps", "over", "lazy", "dogs\n")) for _ in range(characters // 4))


def train(tmp_path, *args, run, check_code=0):
    data = ("--data-dir", tmp_path / "data")
    return cli("train", *args, *data, "--run-dir", tmp_path / run, *SMALL, check_code=check_code)


def bpc_of(result) -> str:
    return next(line for line in result.stdout.splitlines() if line.startswith("bpc"))


def fingerprint_of(run_dir, kind="fingerprint") -> str:
    return json.loads((run_dir / "provenance.json").read_text())[f"corpus_{kind}"]


def test_an_edited_text_leaves_the_old_runs_scored_on_what_they_trained_on(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(words(1), encoding="utf-8")
    train(tmp_path, "--text", notes, run="a")
    before = cli("eval", tmp_path / "a", check_code=0)

    notes.write_text(words(2), encoding="utf-8")  # the same characters, another text
    again = train(tmp_path, "--text", notes, run="b")
    assert "changed: prepared it again as corpus 'notes'" in again.stderr
    assert "(the earlier version kept for the runs that used it)" in again.stderr
    kept = tmp_path / "data" / VERSIONS / "notes" / fingerprint_of(tmp_path / "a")
    assert (kept / "meta.json").is_file() and fingerprint_of(tmp_path / "b") != fingerprint_of(tmp_path / "a")

    after = cli("eval", tmp_path / "a", check_code=0)
    assert bpc_of(after) == bpc_of(before)  # the same text, to the last digit
    assert (
        "corpus 'notes' was prepared again since" in after.stderr and "using the version it trained on" in after.stderr
    )
    assert bpc_of(cli("eval", tmp_path / "b", check_code=0)) != bpc_of(before)
    assert [entry.name for entry in (tmp_path / "data").iterdir() if not entry.name.startswith(".")] == ["notes"]

    resumed = cli("train", "--resume", tmp_path / "a", "--epochs", "2", check_code=0)  # on the data it began with
    assert "using the version it trained on" in resumed.stderr
    assert fingerprint_of(tmp_path / "a") == kept.name

    started = train(tmp_path, "--init-from", tmp_path / "a", "--corpus", "notes", run="c")
    assert "trained on an earlier version of corpus 'notes'" in started.stderr
    assert fingerprint_of(tmp_path / "c") == fingerprint_of(tmp_path / "b")

    report = cli("report", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "report", check_code=0)
    assert "warning: the runs on corpus 'notes' trained on 2 versions of it" in report.stderr
    index = (tmp_path / "report" / "index.md").read_text(encoding="utf-8")
    for run in ("a", "b"):  # never averaged or compared as one corpus
        assert f"notes@{fingerprint_of(tmp_path / run, 'content')[:8]}" in index


def test_a_run_whose_corpus_version_is_gone_is_refused_a_score_and_warned_when_sampled(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(words(1), encoding="utf-8")
    train(tmp_path, "--text", notes, run="a")
    notes.write_text(words(2), encoding="utf-8")
    train(tmp_path, "--text", notes, run="b")
    shutil.rmtree(tmp_path / "data" / VERSIONS)
    then, now = fingerprint_of(tmp_path / "a", "content")[:12], fingerprint_of(tmp_path / "b", "content")[:12]

    refused = cli("eval", tmp_path / "a")
    assert_one_line_error(refused, "corpus 'notes'", "is not the version the run trained on", then, now)
    assert refused.stdout == ""
    assert_one_line_error(cli("train", "--resume", tmp_path / "a", "--epochs", "2"), then, now)

    sampled = cli("sample", tmp_path / "a", "--length", "20", "--seed", "1", check_code=0)
    assert len(sampled.stdout) >= 20
    assert "warning: corpus 'notes' was prepared again since" in sampled.stderr
    assert "sampling uses the model's own vocabulary and is unaffected" in sampled.stderr

    text = tmp_path / "text.txt"
    text.write_text(words(3, 500), encoding="utf-8")
    cli("score", tmp_path / "a", text, check_code=0)  # a text of the user's: the corpus is not read
    try:
        load_corpus("notes", tmp_path / "data", trained_on=TrainedOn(None, then + "0" * 52))
    except CorpusChanged as changed:
        assert changed.name == "notes" and changed.now.content.startswith(now)
    else:
        raise AssertionError("a fingerprint no version has was not refused")


def test_prepare_text_over_a_name_keeps_the_version_it_replaces(tmp_path):
    first, second = tmp_path / "one.txt", tmp_path / "two.txt"
    first.write_text(words(1, 6_000), encoding="utf-8")
    second.write_text(words(2, 6_000), encoding="utf-8")
    data = tmp_path / "data"
    cli("prepare", "text", first, "--name", "mine", "--data-dir", data, check_code=0)
    old = load_corpus("mine", data).fingerprint
    cli("prepare", "text", second, "--name", "mine", "--data-dir", data, check_code=0)
    kept = load_corpus("mine", data, trained_on=TrainedOn(old))
    assert kept.is_kept_version and kept.fingerprint == old and kept.name == "mine"
    assert kept.path == data / VERSIONS / "mine" / old
    assert load_corpus("mine", data).fingerprint != old and not load_corpus("mine", data).is_kept_version
    listed = cli("corpora", "--data-dir", data, check_code=0).stdout
    assert VERSIONS not in listed


def test_a_killed_replacement_keeps_the_earlier_version_too(tmp_path):
    data = tmp_path / "data"
    for text in (words(1, 6_000), words(2, 6_000)):
        (tmp_path / "one.txt").write_text(text, encoding="utf-8")
        cli("prepare", "text", tmp_path / "one.txt", "--name", "mine", "--data-dir", data, check_code=0)
    current = load_corpus("mine", data).fingerprint
    old = next((data / VERSIONS / "mine").iterdir())
    previous = staging_path(data, "mine", "previous")
    shutil.move(old, previous)  # as a process killed between its two renames leaves it
    pid = previous.name.split("-")[-2]
    killed = previous.with_name(previous.name.replace(f"-{pid}-", "-999999999-"))
    previous.rename(killed)
    done = remove_abandoned_staging(data)
    assert done == [f"kept {killed.name} as an earlier version"]
    assert (data / VERSIONS / "mine" / old.name / "meta.json").is_file() and not killed.exists()
    assert load_corpus("mine", data).fingerprint == current


def test_settings_are_checked_before_any_text_is_prepared(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text(words(1, 6_000), encoding="utf-8")
    refused = cli("train", "--text", "", "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run")
    assert_one_line_error(refused, "--text")
    refused = cli("train", "--text", "notes.txt", "--lr", "-1", "--data-dir", tmp_path / "data")
    assert_one_line_error(refused, "--lr")
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_a_transformer_memory_no_machine_holds_is_refused_before_the_run_directory(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(words(1), encoding="utf-8")
    args = ("--text", notes, "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run", "--epochs", "1")
    huge = cli("train", *args, "--cell", "transformer", "--hidden", "16", "--cell-opt", "memory=1000000000")
    assert_one_line_error(huge, "for the state carried between windows", "--cell-opt memory")
    assert not (tmp_path / "run").exists()
    cli("train", *args, "--cell", "lstm", "--hidden", "8", "--batch-size", "4", "--bptt", "16", check_code=0)


def test_a_run_directory_that_never_trained_is_reused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(words(1), encoding="utf-8")
    run = tmp_path / "run"
    run.mkdir()
    start = {"event": "start", "time": 1.0, "schema": 2, "parameters": 10}
    interrupted = {"event": "interrupted", "time": 2.0, "schema": 2, "epoch": 1, "window": 0, "step": 0}
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, (start, interrupted))) + "\n")
    (run / "config.json").write_text("{}\n")
    train(tmp_path, "--text", notes, run="run")
    events = [json.loads(line)["event"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events[0] == "start" and "epoch" in events and "interrupted" not in events

    blocked = train(tmp_path, "--text", notes, run="run", check_code=None)  # one that trained is never replaced
    assert_one_line_error(blocked, "already holds a run")


def test_the_same_text_prepared_from_another_path_is_the_same_version(tmp_path):
    """The content digest a run records, unlike the fingerprint, does not change with where the text lay."""
    first, moved = tmp_path / "notes.txt", tmp_path / "moved" / "notes.txt"
    first.write_text(words(1), encoding="utf-8")
    train(tmp_path, "--text", first, run="a")
    before = cli("eval", tmp_path / "a", check_code=0)
    moved.parent.mkdir()
    first.rename(moved)
    shutil.rmtree(tmp_path / "data" / "notes")  # prepared again, from the file where it lies now
    train(tmp_path, "--text", moved, "--corpus", "notes", run="b")
    assert fingerprint_of(tmp_path / "a") != fingerprint_of(tmp_path / "b")
    assert fingerprint_of(tmp_path / "a", "content") == fingerprint_of(tmp_path / "b", "content")
    after = cli("eval", tmp_path / "a", check_code=0)
    assert bpc_of(after) == bpc_of(before) and "warning" not in after.stderr and "version" not in after.stderr


def test_a_run_of_0_3_whose_fingerprint_differs_is_warned_not_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text(words(1), encoding="utf-8")
    train(tmp_path, "--text", notes, run="a")
    provenance = tmp_path / "a" / "provenance.json"
    recorded = json.loads(provenance.read_text())
    del recorded["corpus_content"]  # as charlm 0.3 wrote it
    recorded["corpus_fingerprint"] = "0" * 64
    provenance.write_text(json.dumps(recorded))
    import torch

    for name in ("best.pt", "last.pt"):
        payload = torch.load(tmp_path / "a" / name, weights_only=True)
        payload["provenance"] = recorded
        torch.save(payload, tmp_path / "a" / name)
    warned = cli("eval", tmp_path / "a", check_code=0)
    assert "has another fingerprint than the run records" in warned.stderr
