"""The main job on the embedded default: prepare `pydoc`, train a small LRU briefly, evaluate, sample."""

from __future__ import annotations

from charlm.config import DemoSettings, TrainConfig
from charlm.corpora import prepare_corpus
from charlm.runs import default_run_dir
from charlm.sampling import SamplingOptions, encode_prime, generate, load_model, stream_text, unknown_ids
from charlm.training import Trainer

DEMO_PRIME = "The "


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
    summary = Trainer(config).fit()
    model, tokenizer, _ = load_model(summary["run_dir"], device="auto")
    options = SamplingOptions(length=settings.sample_length, temperature=0.8, seed=settings.seed)
    write(f"sample ({settings.sample_length} characters after the prime, temperature 0.8):\n{DEMO_PRIME}")
    summary["sample"] = DEMO_PRIME + stream_text(tokenizer, generate(model, encode_prime(tokenizer, DEMO_PRIME), options, unknown_ids(tokenizer)), write)
    return summary
