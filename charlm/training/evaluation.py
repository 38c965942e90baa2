"""Scoring during a training: a split with the current weights, shared among torchrun's processes
and timed into the run's wall-clock account, and the test split once with the best-validation
weights (written into best.pt and a ``test`` record)."""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.corpora.store import PreparedCorpus
from charlm.inference.scoring import Score, characters_per_token, score_tokens
from charlm.logs import progress_bar
from charlm.runs.directory import Run
from charlm.runtime.distributed import World
from charlm.runtime.precision import autocast
from charlm.training import reporting
from charlm.training.resume import Progress


@dataclasses.dataclass
class Scorer:
    """Scores the splits of ``corpus`` with ``model`` as ``config`` says, each process of ``world`` its
    share, the time into ``progress``; reports a scoring graph's check into ``run`` and its ``provenance``."""

    model: torch.nn.Module
    corpus: PreparedCorpus
    config: TrainConfig
    device: torch.device
    world: World
    run: Run
    progress: Progress
    provenance: dict
    scoring_graph_reported: bool = False  # the first scoring graph's check, recorded once a session

    def __call__(self, split: str) -> Score:
        """The score of ``split``: validation on its leading ``eval_fraction``, any other split whole."""
        config, world = self.config, self.world
        started = time.monotonic()
        tokens = self.corpus.split(split)
        if split == "valid" and config.eval_fraction < 1.0:
            tokens = tokens[: max(config.eval_batch_size + 1, int(len(tokens) * config.eval_fraction))]
        # the bar counts windows, as many on every rank (TokenStreams' count: streams of ⌈predictions / batch⌉)
        windows = math.ceil(math.ceil((len(tokens) - 1) / config.eval_batch_size) / config.bptt)
        with (
            autocast(config.precision, self.device),
            progress_bar(windows, f"scoring {split}", show=world.is_main) as bar,
        ):
            score = score_tokens(
                self.model,
                tokens,
                batch_size=config.eval_batch_size,
                bptt=config.bptt,
                device=self.device,
                chars_per_token=characters_per_token(self.corpus, split),
                rows=world.share(config.eval_batch_size),
                progress=lambda _: bar.update(),
            )
        score.nats = world.sum([score.nats])[0]  # each process scored its share of the streams
        if score.fast_path is not None and not self.scoring_graph_reported:
            reporting.report_scoring_graph(self.run, self.provenance, score.fast_path)
            self.scoring_graph_reported = True
        self.progress.add_wall(split, time.monotonic() - started)
        return score

    def test_best(self) -> None:
        """Score the test split once, with the best-validation weights (unless every epoch did)."""
        progress, model, run = self.progress, self.model, self.run
        self.world.barrier()  # best.pt is written by rank 0
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
        if self.world.is_main:
            scored = dataclasses.replace(best, scores={**best.scores, "test_bpc": test.bpc, "test_loss": test.loss})
            scored.without_optimizer().save(run.best)  # one written before best.pt kept none loses it here
        run.record("test", epoch=progress.best_epoch, **test.as_dict("test_"))
        run.log(f"test {test.bpc:.4f} bpc with the best-validation weights (epoch {progress.best_epoch})")
