"""`charlm bench`: throughput of cells as a ratio against PyTorch's fused LSTM in the same run."""

from __future__ import annotations

import dataclasses
import json
import sys

import typer

from charlm.cli.options import settings_options
from charlm.cli.output import print_table
from charlm.config import BenchmarkConfig


@settings_options(BenchmarkConfig)
def bench(given: dict = None):
    """Measure training, evaluation and sampling throughput (characters per second)."""
    import torch

    from charlm.tools.benchmark import benchmark_cells, machine_load
    from charlm.cells import CELLS
    from charlm.config import validate
    from charlm.runtime.distributed import launched_by_torchrun
    from charlm.runtime.devices import resolve_device
    from charlm.model import parse_budget
    from charlm.errors import ConfigError
    from charlm.runtime.precision import check_precision
    from charlm.training.setup import check_cuda_graph

    settings = BenchmarkConfig(**given)
    validate(settings)
    names = CELLS.names() if settings.cells == "all" else [name.strip() for name in settings.cells.split(",") if name.strip()]
    for name in names:
        CELLS.get(name)
    parse_budget(settings.params)
    settings = dataclasses.replace(settings, device=str(resolve_device(settings.device)))
    check_precision(settings.precision, torch.device(settings.device))
    check_cuda_graph(settings.cuda_graph, torch.device(settings.device))
    if settings.cuda_graph and settings.compile:
        raise ConfigError(BenchmarkConfig, "cuda_graph", "and --compile are exclusive: give one, not both")
    if launched_by_torchrun():
        _bench_scaling(names, settings)
        return
    load_before = machine_load()
    results = benchmark_cells(names, settings, progress=None if settings.json else _progress)
    machine = {"device": settings.device, "threads": torch.get_num_threads(), "torch": torch.__version__,
               "load_before": load_before, "load_after": machine_load()}
    baseline = results[0]
    if settings.json:
        report = {"settings": dataclasses.asdict(settings), "machine": machine,
                  "results": [result.to_dict(baseline) for result in results]}
        print(json.dumps(report, indent=2))
        return
    rows = []
    for result in results:
        values = result.to_dict(baseline)
        rows.append([
            result.name,
            str(result.hidden_size),
            f"{result.parameters:,}",
            f"{result.flops_per_char / 1e6:.1f}",
            f"{result.train.median:,.0f} ±{result.train.relative_spread:.0%}",
            f"{values['train_ratio']:.2f}",
            f"{values['train_ratio_flop_normalised']:.2f}",
            f"{result.eval.median:,.0f} ±{result.eval.relative_spread:.0%}",
            f"{values['eval_ratio']:.2f}",
            f"{values['eval_over_train']:.1f}",
            "-" if not result.sample.runs else f"{result.sample.median:,.0f}",
        ] + ([f"{result.compile_seconds:.1f}" if result.compile_seconds is not None else "-"] if settings.compile else [])
          + ([f"{result.capture_seconds:.1f}" if result.capture_seconds is not None else "-"] if settings.cuda_graph else []))
    load = "unknown" if load_before is None else f"{load_before:.2f} → {machine['load_after']:.2f}"
    title = (f"Throughput on {settings.device} ({machine['threads']} thread{'s' if machine['threads'] != 1 else ''}, load {load}), batch {settings.batch_size} × "
             f"bptt {settings.bptt}, ~{settings.params} parameters, {settings.layers} layer(s), {settings.precision}"
             f"{', cells compiled' if settings.compile else ''}{', cells on CUDA graphs' if settings.cuda_graph else ''}, median of {settings.repeat} interleaved rounds")
    if baseline.precision != settings.precision:
        title += f"; the fused baseline in {baseline.precision} (torch.nn.LSTM has no {settings.precision} kernel on this {settings.device})"
    print_table(title, ["model", "n", "params", "MFLOP/char", "train chars/s", "× fused", "× fused/FLOP",
                        "eval chars/s", "× fused", "eval/train", "sample chars/s"] + (["compile s"] if settings.compile else [])
                + (["capture s"] if settings.cuda_graph else []),
                rows)


def _bench_scaling(names: list[str], settings: BenchmarkConfig) -> None:
    """Under torchrun: training throughput on one process against all of them."""
    import torch

    from charlm.tools.benchmark import benchmark_scaling
    from charlm.runtime.distributed import device_for_rank, world_from_environment

    device = torch.device(settings.device)
    world = world_from_environment(device)
    settings = dataclasses.replace(settings, device=str(device_for_rank(device, world)))
    try:
        results = benchmark_scaling(names, settings, world, progress=None if settings.json else _progress)
    except BaseException:
        world.leave(together=False)
        raise
    world.leave()
    if not world.is_main:
        return
    if settings.json:
        print(json.dumps({"settings": dataclasses.asdict(settings), "processes": world.size,
                          "threads_per_process": torch.get_num_threads(),
                          "results": [result.to_dict() for result in results]}, indent=2))
        return
    rows = [[result.name, f"{result.parameters:,}", f"{result.single.median:,.0f}",
             f"{result.together.median:,.0f} ±{result.together.relative_spread:.0%}",
             f"{result.together.median / result.single.median:.2f}", f"{result.efficiency:.0%}",
             f"{result.step_seconds.median * 1000:,.0f}", f"{result.allreduce_bytes / 2**20:.1f}"] for result in results]
    title = (f"Scaling on {settings.device}: {world.size} processes × {torch.get_num_threads()} threads, global batch "
             f"{settings.batch_size} × bptt {settings.bptt}, ~{settings.params} parameters, median of {settings.repeat} rounds")
    print_table(title, ["model", "params", "1 process chars/s", f"{world.size} processes chars/s", "speed-up",
                        "efficiency", "step ms", "all-reduce MiB/step"], rows)


def _progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    app.command()(bench)
