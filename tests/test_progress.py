"""Progress on stderr (issue 34): one bar helper (``charlm.logs.progress_bar``) for training and for
scoring, drawn only where stderr is a terminal, the figures before the bar so that 80 columns keep
them whole; showing it changes no score."""

from __future__ import annotations

import contextlib
import io
import logging
import sys

import pytest

import charlm
from charlm.corpora.catalog import load_corpus
from charlm.corpora.streams import TokenStreams
from charlm.logs import ProgressBars, progress_bar
from charlm.training.reporting import EpochBar
from charlm.training.trainer import Trainer
from helpers import cli, pydoc_text, records, tiny_config


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def terminal():
    """stderr a terminal, as tqdm sees it, with the charlm logger kept off it (in the test's body:
    pytest's capture puts its own stderr back between a fixture and the test)."""
    logger = logging.getLogger("charlm")
    saved = (sys.stderr, logger.level, list(logger.handlers), logger.propagate)
    logger.handlers, logger.propagate = [logging.NullHandler()], False
    sys.stderr = stream = Terminal()
    try:
        yield stream
    finally:
        sys.stderr, logger.handlers, logger.propagate = saved[0], saved[2], saved[3]
        logger.setLevel(saved[1])


@pytest.mark.parametrize("columns", [79, 80])  # an 80-column terminal gives tqdm 79
@pytest.mark.parametrize(
    "epoch, epochs, done, windows, speed, shown",
    [
        (12, 50, 6000, 7031, 1_234_567, "1.23M"),
        (3, 30, 100, 260, 41_234, "41.2k"),
    ],
)
def test_the_training_bar_keeps_its_figures_whole_at_80_columns(columns, epoch, epochs, done, windows, speed, shown):
    with terminal():
        bar = EpochBar(windows, done, epoch, epochs, show=True)
        try:
            bar.show_step(1.23456, speed, 1.45678)
            line = bar.bar.format_meter(**{**bar.bar.format_dict, "ncols": columns})
        finally:
            bar.close()
    figures = f"epoch {epoch}/{epochs}, train 1.235, valid 1.457, {shown} chars/s"
    assert line.startswith(figures + " |"), line  # first, and whole
    assert len(line) <= columns and f"| {done}/{windows} eta " in line, line  # the counts fit too
    assert len(line[len(figures) + 2 : line.index(f"| {done}/")]) >= 1  # the bar has what is left


def test_no_bar_off_a_terminal_or_where_not_asked(monkeypatch):
    with terminal() as stream:
        with progress_bar(10, "shown") as bar:
            assert not bar.disable
        with progress_bar(10, "another rank", show=False) as bar:  # torchrun's other ranks
            assert bar.disable
    assert "shown" in stream.getvalue() and "another rank" not in stream.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe, a log file, a batch job
    with progress_bar(10, "piped") as bar:
        assert bar.disable


def test_scoring_during_training_shows_progress_on_a_terminal_with_the_same_figures(tiny_corpus, tmp_path, monkeypatch):
    config = dict(epochs=1, train_fraction=0.3, test_every_epoch=True)
    with terminal() as stream:
        Trainer(tiny_config(tiny_corpus, tmp_path / "shown", **config)).fit()
    shown = stream.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    Trainer(tiny_config(tiny_corpus, tmp_path / "piped", **config)).fit()
    piped = sys.stderr.getvalue()  # (the run's path, which it logs, holds this test's name: "scoring")
    assert "scoring valid |" not in piped and "scoring test |" not in piped and " eta " not in piped

    corpus = load_corpus("tiny", str(tiny_corpus))
    for split in ("valid", "test"):  # the bar counts the windows scoring has, whatever the rank
        windows = len(TokenStreams(corpus.split(split), 4, 16, cover_all=True))
        assert f"scoring {split} |" in shown and f"| 0/{windows} eta" in shown
    assert "epoch 1/1" in shown
    for event, field in (("epoch", "valid_bpc"), ("epoch", "test_bpc"), ("test", "test_bpc")):
        assert [r[field] for r in records(tmp_path / "shown", event)] == [
            r[field] for r in records(tmp_path / "piped", event)
        ]


def test_scoring_a_text_shows_its_stages_with_the_same_figures(trained_run, tmp_path):
    model = charlm.load(trained_run, device="cpu")
    text = pydoc_text(3_000)
    for dynamic, label in ((None, "score |"), ("sgd", "score, dynamic sgd |")):
        quiet = model.score(text, dynamic=dynamic)
        with terminal() as stream:
            shown = model.score(text, dynamic=dynamic, progress=ProgressBars())
        assert (shown.nats, shown.tokens, shown.bpc) == (quiet.nats, quiet.tokens, quiet.bpc)
        assert label in stream.getvalue()
    with pytest.raises(charlm.CharlmError, match=r"progress must be an object with stage\(label, total\)"):
        model.score(text, progress=print)

    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    piped = cli("score", trained_run, tmp_path / "text.txt", "--device", "cpu", check_code=0)
    assert "score |" not in piped.stderr and "eta" not in piped.stderr  # off a terminal: no bar
    assert f"bpc             {model.score(text).bpc:.4f}" in piped.stdout
