"""The main job on the embedded default: prepare `pydoc`, train a small LRU briefly, evaluate, sample."""

from __future__ import annotations

from charlm.api import load
from charlm.config import DemoSettings, TrainConfig
from charlm.corpora import prepare_corpus
from charlm.runs import default_run_dir
from charlm.training import train


def run_demo(settings: DemoSettings, data_dir=None, run_dir=None, write=print) -> dict:
    """Returns the training summary; writes the sample through ``write`` as it is drawn."""
    prepare_corpus("pydoc", data_dir=data_dir)
    config = TrainConfig(
        corpus="pydoc",
        cell=settings.cell,
        hidden=settings.hidden,
        layers=settings.layers,
        batch_size=settings.batch_size,
        bptt=settings.bptt,
        lr=settings.lr,
        epochs=100,
        patience=100,
        max_minutes=settings.minutes,
        seed=settings.seed,
        data_dir=None if data_dir is None else str(data_dir),
        run_dir=str(run_dir or default_run_dir("pydoc", f"{settings.cell}-demo")),
    )
    summary = train(config)
    model = load(summary["run_dir"])
    write(f"sample ({settings.sample_length} characters after the prime, temperature {settings.temperature:g}):\n{settings.prime}")
    pieces = []
    for piece in model.stream(settings.prime, settings.sample_length, settings.temperature, seed=settings.seed):
        write(piece)
        pieces.append(piece)
    summary["sample"] = settings.prime + "".join(pieces)
    return summary
