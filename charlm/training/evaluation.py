"""Scoring during a training: a split with the current weights, shared among torchrun's processes
and timed into the run's wall-clock account, and the test split once with the best-validation
weights (written into best.pt and a ``test`` record)."""

from __future__ import annotations

import dataclasses
import math
import time

from charlm.checkpoint import Checkpoint
from charlm.inference.scoring import Score, characters_per_token, score_tokens
from charlm.logs import progress_bar
from charlm.runtime.precision import autocast
from charlm.training import reporting


class Scorer:
    """Scores the splits of ``trainer``'s corpus with ``trainer``'s model, as its config says."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.scoring_graph_reported = False  # the first scoring graph's check, recorded once a session

    def __call__(self, split: str) -> Score:
        """The score of ``split``: validation on its leading ``eval_fraction``, any other split whole."""
        trainer, config = self.trainer, self.trainer.config
        started = time.monotonic()
        tokens = trainer.corpus.split(split)
        if split == "valid" and config.eval_fraction < 1.0:
            tokens = tokens[: max(config.eval_batch_size + 1, int(len(tokens) * config.eval_fraction))]
        # the bar counts windows, as many on every rank (TokenStreams' count: streams of ⌈predictions / batch⌉)
        windows = math.ceil(math.ceil((len(tokens) - 1) / config.eval_batch_size) / config.bptt)
        with (
            autocast(config.precision, trainer.device),
            progress_bar(windows, f"scoring {split}", show=trainer.world.is_main) as bar,
        ):
            score = score_tokens(
                trainer.model,
                tokens,
                batch_size=config.eval_batch_size,
                bptt=config.bptt,
                device=trainer.device,
                chars_per_token=characters_per_token(trainer.corpus, split),
                rows=trainer.world.share(config.eval_batch_size),
                progress=lambda _: bar.update(),
            )
        score.nats = trainer.world.sum([score.nats])[0]  # each process scored its share of the streams
        if score.fast_path is not None and not self.scoring_graph_reported:
            reporting.report_scoring_graph(trainer.run, trainer.provenance, score.fast_path)
            self.scoring_graph_reported = True
        trainer.progress.add_wall(split, time.monotonic() - started)
        return score

    def test_best(self, run) -> None:
        """Score the test split once, with the best-validation weights (unless every epoch did)."""
        trainer = self.trainer
        progress, model = trainer.progress, trainer.model
        trainer.world.barrier()  # best.pt is written by rank 0
        if progress.best_test_bpc is not None or not run.best.exists():
            return
        best = Checkpoint.load(run.best)
        current = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        model.load_state_dict(best.weights)
        try:
            test = self("test")
        finally:
            model.load_state_dict(current)
        progress.best_test_bpc = test.bpc
        if trainer.world.is_main:
            scored = dataclasses.replace(best, scores={**best.scores, "test_bpc": test.bpc, "test_loss": test.loss})
            scored.without_optimizer().save(run.best)  # one written before best.pt kept none loses it here
        run.record("test", epoch=progress.best_epoch, **test.as_dict("test_"))
        run.log(f"test {test.bpc:.4f} bpc with the best-validation weights (epoch {progress.best_epoch})")
