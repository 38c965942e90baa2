"""The training step of ``charlm check --full``, run as its own process
(``python -m charlm.tools.full_check_training ARGUMENTS``): each cell trained briefly on the embedded
corpus, eagerly and (on a GPU) with CUDA graphs, one JSON line per run in ``OUT/training.jsonl``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import charlm
from charlm.corpora import prepare_corpus


def train_each_cell(arguments: dict) -> None:
    """The training step's child: each cell eagerly (and with graphs on a GPU), one JSON line each."""
    out, device = Path(arguments["out"]), arguments["device"]
    data = out / "data"
    prepare_corpus("pydoc", data_dir=data, progress=False)
    modes = ("eager", "cuda graph") if device.startswith("cuda") else ("eager",)
    tokens = arguments["batch_size"] * arguments["bptt"] * arguments["windows"]
    for cell in arguments["cells"]:
        for mode in modes:
            run_dir = out / "runs" / f"{cell}-{mode.replace(' ', '-')}"
            row = {"cell": cell, "mode": mode}
            started = time.monotonic()
            try:
                summary = charlm.train(
                    corpus="pydoc",
                    data_dir=str(data),
                    cell=cell,
                    params=arguments["params"],
                    batch_size=arguments["batch_size"],
                    bptt=arguments["bptt"],
                    max_tokens=tokens,
                    eval_fraction=0.25,
                    log_every=10,
                    device=device,
                    cuda_graph=mode == "cuda graph",
                    run_dir=str(run_dir),
                    save_every="0",
                )
                records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                epoch = [r for r in records if r.get("event") == "epoch"][-1]
                graph = [r for r in records if r.get("event") == "cuda_graph"]
                steps = [r for r in records if r.get("event") == "step"]
                row.update(
                    first_loss=steps[0]["loss"] if steps else None,
                    valid_bpc=summary["best_valid_bpc"],
                    test_bpc=summary["test_bpc_at_best"],
                    chars_per_s=round(epoch["chars_per_second"]),
                    parameters=summary["parameters"],
                    cuda_graph={k: v for k, v in graph[0].items() if k not in ("event", "time", "schema")}
                    if graph
                    else None,
                )
            except Exception as error:  # one cell's failure is a row of the report; the others still run
                row["error"] = f"{type(error).__name__}: {error}"[:400]
            row["seconds"] = round(time.monotonic() - started, 1)
            for checkpoint in run_dir.glob("*.pt"):
                checkpoint.unlink()  # the report needs the records, not the weights
            with open(out / "training.jsonl", "a") as log:
                log.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    train_each_cell(json.loads(sys.argv[1]))
