"""`charlm bench`: throughput of cells as a ratio against PyTorch's fused LSTM in the same run."""

from __future__ import annotations

import dataclasses
import json
import sys

import typer

from charlm.cli.options import settings_options
from charlm.cli.output import print_table
from charlm.config_tools import BenchmarkConfig


@settings_options(BenchmarkConfig)
def bench(given: dict = None):
    """Measure training, evaluation and sampling throughput (characters per second)."""
    import torch

    from charlm.tools.benchmark import benchmark_cells, disturbances, machine_load
    from charlm.tools.benchmark_memory import check_benchmark_fits
    from charlm.cells import CELLS
    from charlm.settings import validate
    from charlm.runtime.distributed import launched_by_torchrun
    from charlm.runtime.devices import resolve_device
    from charlm.sizing import parse_budget
    from charlm.errors import ConfigError
    from charlm.logs import get_logger
    from charlm.runtime.precision import check_precision, set_tf32, tf32_in_use
    from charlm.training.setup import check_cuda_graph

    config = BenchmarkConfig(**given)
    validate(config)
    names = (
        CELLS.names() if config.cells == "all" else [name.strip() for name in config.cells.split(",") if name.strip()]
    )
    if not names:  # as `charlm check --cells ""`: an empty list would time the fused baseline alone
        raise ConfigError(BenchmarkConfig, "cells", "names no cell")
    for name in names:
        CELLS.get(name)
    parse_budget(config.params)
    config = dataclasses.replace(config, device=str(resolve_device(config.device)))
    check_precision(config.precision, torch.device(config.device))
    set_tf32(config.tf32)
    check_cuda_graph(config.cuda_graph, torch.device(config.device))
    if config.cuda_graph and config.compile:
        raise ConfigError(BenchmarkConfig, "cuda_graph", "and --compile are exclusive: give one, not both")
    check_benchmark_fits(names, config, torch.device(config.device))  # before any model is allocated
    if launched_by_torchrun():
        _bench_scaling(names, config)
        return
    load_before = machine_load()
    results = benchmark_cells(names, config, progress=None if config.json else _progress)
    machine = {
        "device": config.device,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_before": load_before,
        "load_after": machine_load(),
        "tf32": tf32_in_use(),
    }
    baseline = results[0]
    disturbed = disturbances(results, load_before)
    if disturbed:
        get_logger().warning(f"warning: these figures may not be trustworthy: {'; '.join(disturbed)}")
    if config.json:
        report = {
            "settings": dataclasses.asdict(config),
            "machine": machine,
            "trustworthy": not disturbed,
            "disturbances": disturbed,
            "results": [result.to_dict(baseline) for result in results],
        }
        print(json.dumps(report, indent=2))
        return
    rows = []
    for result in results:
        values = result.to_dict(baseline)
        rows.append(
            [
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
                "-" if not result.loop_train_ratio.runs else f"{values['train_over_own_loop']:.2f}",
                "-" if not result.loop_eval_ratio.runs else f"{values['eval_over_own_loop']:.2f}",
            ]
            + (
                [f"{result.compile_seconds:.1f}" if result.compile_seconds is not None else "-"]
                if config.compile
                else []
            )
            + (
                [f"{result.capture_seconds:.1f}" if result.capture_seconds is not None else "-"]
                if config.cuda_graph
                else []
            )
        )
    load = "unknown" if load_before is None else f"{load_before:.2f} → {machine['load_after']:.2f}"
    title = (
        f"Throughput on {config.device} ({machine['threads']} thread{'s' if machine['threads'] != 1 else ''}, "
        f"load {load}), batch {config.batch_size} × "
        f"bptt {config.bptt}, ~{config.params} parameters, {config.layers} layer(s), {config.precision}"
        f"{', cells compiled' if config.compile else ''}{', cells on CUDA graphs' if config.cuda_graph else ''}, "
        f"median of {config.repeat} interleaved rounds"
    )
    if baseline.precision != config.precision:
        title += (
            f"; the fused baseline in {baseline.precision} (torch.nn.LSTM has no {config.precision} kernel on this "
            f"{config.device})"
        )
    print_table(
        title,
        [
            "model",
            "n",
            "params",
            "MFLOP/char",
            "train chars/s",
            "× fused",
            "× fused/FLOP",
            "eval chars/s",
            "× fused",
            "eval/train",
            "sample chars/s",
            "train × own loop",
            "eval × own loop",
        ]
        + (["compile s"] if config.compile else [])
        + (["capture s"] if config.cuda_graph else []),
        rows,
        drop_order=(
            "eval × own loop",
            "train × own loop",
            "eval/train",
            "× fused/FLOP",
            "MFLOP/char",
            "n",
            "sample chars/s",
            "params",
            "compile s",
            "capture s",
        ),
    )  # the model and its train and eval throughput stay


def _bench_scaling(names: list[str], config: BenchmarkConfig) -> None:
    """Under torchrun: training throughput on one process against all of them."""
    import torch

    from charlm.tools.benchmark_scaling import benchmark_scaling
    from charlm.runtime.distributed import device_for_rank, world_from_environment

    device = torch.device(config.device)
    world = world_from_environment(device)
    config = dataclasses.replace(config, device=str(device_for_rank(device, world)))
    try:
        results = benchmark_scaling(names, config, world, progress=None if config.json else _progress)
    except BaseException:
        world.leave(together=False)
        raise
    world.leave()
    if not world.is_main:
        return
    if config.json:
        print(
            json.dumps(
                {
                    "settings": dataclasses.asdict(config),
                    "processes": world.size,
                    "threads_per_process": torch.get_num_threads(),
                    "results": [result.to_dict() for result in results],
                },
                indent=2,
            )
        )
        return
    rows = [
        [
            result.name,
            f"{result.parameters:,}",
            f"{result.single.median:,.0f}",
            f"{result.together.median:,.0f} ±{result.together.relative_spread:.0%}",
            f"{result.together.median / result.single.median:.2f}",
            f"{result.efficiency:.0%}",
            f"{result.step_seconds.median * 1000:,.0f}",
            f"{result.allreduce_bytes / 2**20:.1f}",
        ]
        for result in results
    ]
    title = (
        f"Scaling on {config.device}: {world.size} processes × {torch.get_num_threads()} threads, global batch "
        f"{config.batch_size} × bptt {config.bptt}, ~{config.params} parameters, median of {config.repeat} rounds"
    )
    print_table(
        title,
        [
            "model",
            "params",
            "1 process chars/s",
            f"{world.size} processes chars/s",
            "speed-up",
            "efficiency",
            "step ms",
            "all-reduce MiB/step",
        ],
        rows,
        drop_order=("all-reduce MiB/step", "step ms", "params", "efficiency", "1 process chars/s"),
    )


def _progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def register(app: typer.Typer) -> None:
    app.command()(bench)
