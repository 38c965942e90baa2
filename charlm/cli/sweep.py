"""`charlm sweep PLAN`: a grid of training runs from a TOML plan (its format: charlm.experiments.plan)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from charlm.cli.options import directory_flag
from charlm.cli.output import print_table, stdout
from charlm.errors import CharlmError
from charlm.logs import get_logger


def sweep(
    plan: Optional[str] = typer.Argument(
        None, help="A plan: a .toml file, or the name of one shipped with charlm (see --list)."
    ),
    profile: Optional[str] = typer.Option(
        None,
        "--profile",
        help="A profile of the plan, such as small (default: the plan as written: a shipped plan's paper settings, in "
        "sweeps/PLAN-paper; a plan of your own in sweeps/PLAN).",
    ),
    directory: Optional[str] = directory_flag(
        "--dir",
        "The sweep directory (default: sweeps/PLAN-PROFILE; sweeps/PLAN for a plan of your own run as written).",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="List the runs (settings, hidden size, parameters, state, time on this machine) without training.",
    ),
    no_estimate: bool = typer.Option(
        False, "--no-estimate", help="With --dry-run: do not time each model to estimate the runs' time."
    ),
    only: Optional[List[str]] = typer.Option(
        None, "--only", help="Only the runs with KEY=VALUE (repeatable), e.g. --only cell=lru."
    ),
    shard: Optional[str] = typer.Option(
        None,
        "--shard",
        help="Run the I-th of N disjoint shares, written I/N with I from 0 (e.g. 0/4; in a Slurm array "
        "of 4 tasks: $SLURM_ARRAY_TASK_ID/4).",
    ),
    list_plans: bool = typer.Option(False, "--list", help="List the plans shipped with charlm and exit."),
    data_dir: Optional[str] = directory_flag(
        "--data-dir", "Root of prepared corpora (default: $CHARLM_DATA, else ./data)."
    ),
    trust_code: bool = typer.Option(False, "--trust-code", help="Allow the plan's module:Class cells to be imported."),
):
    """Run every point of a plan as its own run directory; re-running skips finished runs and resumes interrupted ones.

    Exit code 0 when every point finished (or diverged, or another process is training it); 1 when a point could not run, its evaluation failed or its run directory is damaged (the last line names them; the reasons are in DIR/sweep.log); 2 for a bad plan or option, found before anything trains.
    """  # noqa: E501  the help shows the docstring's line breaks
    from charlm.experiments.plan import load_plan, shipped_plans
    from charlm.experiments.selection import parse_shard, select
    from charlm.experiments.estimate import estimate_points
    from charlm.experiments.sweep import Sweep

    if list_plans:
        print_table(
            None,
            ["plan", "description"],
            [[name, text] for name, text in shipped_plans().items()],
            wrap=("description",),
        )
        return
    if no_estimate and not dry_run:
        raise CharlmError("--no-estimate goes with --dry-run (a sweep that trains estimates nothing)")
    if plan is None:
        raise CharlmError("give a plan (a .toml file or a shipped plan's name; charlm sweep --list shows them)")
    if "RANK" in os.environ and os.environ.get("WORLD_SIZE", "1") != "1":  # started by torchrun
        raise CharlmError(
            "charlm sweep runs its points in one process: train a point across processes with "
            "`torchrun ... -m charlm train` into the sweep's directory (see docs/multi-gpu.md)"
        )
    loaded = load_plan(plan, profile)
    target = directory or Path("sweeps") / loaded.label
    runner = Sweep(loaded, target, data_dir=data_dir, trust_code=trust_code)
    points = select(loaded.points(), only or [], parse_shard(shard))
    if dry_run:
        runner.check(points)  # the values a prepared corpus judges, as the real run does before it writes
        rows = [runner.describe(point) for point in points]
        estimates = None
        if not no_estimate:
            states = {row["run"]: row["state"] for row in rows}
            estimates = estimate_points(runner, points, states, get_logger().info)
        timed = estimates is not None and bool(estimates.seconds)  # the column only where a run has an estimate
        paper = (
            loaded.paper_parameters if loaded.profile == "paper" else {}
        )  # the column only where a paper gives counts
        profile = "" if loaded.profile is None else f" ({loaded.profile})"
        print_table(
            f"{len(rows)} run(s) of {loaded.name}{profile} in {target}",
            ["run", "corpus", "cell", "layers", "budget", "hidden", "parameters"]
            + (["paper's count"] if paper else [])
            + (["estimate"] if timed else [])
            + ["state"],
            [
                [
                    row["run"],
                    row["corpus"],
                    row["cell"],
                    str(row["layers"]),
                    row["params"] or "-",
                    _or_unknown(row["hidden"]),
                    _or_unknown(row["parameters"], "{:,}"),
                ]
                + ([_paper_count(paper, row)] if paper else [])
                + ([estimates.shown(row["run"])] if timed else [])
                + [row["state"]]
                for row in rows
            ],
            drop_order=("layers", "budget", "paper's count", "hidden"),
        )  # the point's name is in run
        if any(row["vocabulary_assumed"] for row in rows):
            stdout.print("(sizes of corpora not prepared yet use their documented vocabulary sizes)")
        for line in [] if estimates is None else estimates.lines():
            stdout.print(line, soft_wrap=False)
        for warning in runner.warnings(points):
            get_logger().warning(f"warning: {warning}")
        return
    outcomes = runner.run(points)
    counts = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    stdout.print(
        f"sweep {target}: "
        + ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
        + f"; report with `charlm report {target}`"
    )
    unfinished = [outcome for outcome in outcomes if outcome.status in ("failed", "damaged")]
    if unfinished:
        raise SweepIncomplete(unfinished, len(outcomes), runner)


class SweepIncomplete(CharlmError):
    """Some points of a sweep were not run, not evaluated, or are damaged: the others are kept, and
    the exit code is 1 (2 is for bad input, refused before anything trains)."""

    exit_code = 1
    SHOWN = 5  # points named in the line; the others are counted

    def __init__(self, unfinished: list, total: int, runner):
        named = ", ".join(f"{outcome.point} ({outcome.detail})" for outcome in unfinished[: self.SHOWN])
        more = f" and {len(unfinished) - self.SHOWN} more" if len(unfinished) > self.SHOWN else ""
        super().__init__(
            f"{len(unfinished)} of {total} runs did not finish: {named}{more}; why: {runner.log_file} "
            f"(and each run's train.log); fix them and run the same command again to go on"
        )


def _paper_count(paper: dict, row: dict) -> str:
    """The paper's count for a row: by ``corpus/cell``, else by ``cell``."""
    count = paper.get(f"{row['corpus']}/{row['cell']}", paper.get(row["cell"]))
    return "-" if count is None else f"{count:,}"


def _or_unknown(value, form: str = "{}") -> str:
    return "?" if value is None else form.format(value)


def register(app: typer.Typer) -> None:
    app.command()(sweep)
