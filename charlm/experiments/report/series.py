"""The series a report's figures draw, from the runs read back: validation bpc by epoch and training
time (``curves.png``), bpc by tokens and time with the device (``progress.png``), gradient norms per
layer and step (``gradnorms.png``), and test bpc against the training fraction (``efficiency.png``)."""

from __future__ import annotations

import collections
import math

from charlm.experiments.report import figures
from charlm.experiments.report.compare import Group, efficiency_families, layers_text
from charlm.experiments.report.reading import RunRecord


def learning_curves(records: list[RunRecord], colours: dict[str, str]) -> dict[str, list[figures.Curve]]:
    """Per corpus, each run's validation bpc by epoch and by cumulative training seconds."""
    panels = {}
    for record in [record for record in records if record.fraction == 1.0] or records:
        epochs = [epoch for epoch in record.epochs if _finite(epoch.valid_bpc)]
        if epochs:
            panels.setdefault(record.corpus, []).append(
                figures.Curve(
                    record.cell,
                    colours[record.cell],
                    [epoch.epoch for epoch in epochs],
                    [epoch.valid_bpc for epoch in epochs],
                    [record.seconds(epoch.epoch) for epoch in epochs],
                )
            )
    return dict(sorted(panels.items()))


def progress_panels(records: list[RunRecord], colours: dict[str, str]) -> dict[str, tuple[str, list]]:
    """Per corpus, the devices its runs trained on and each run's points by tokens and seconds; a cell
    at several depths is labelled with its depth."""
    chosen = [record for record in records if record.fraction == 1.0] or records
    panels = {}
    for corpus in sorted({record.corpus for record in chosen}):
        runs = [record for record in chosen if record.corpus == corpus and (record.trained or record.validated)]
        if not runs:
            continue
        depths = collections.defaultdict(set)
        for record in runs:
            depths[record.cell].add(record.layers)
        devices = sorted({record.device or "an unrecorded device" for record in runs})
        panels[corpus] = (
            " / ".join(devices),
            [
                figures.Progress(
                    f"{record.cell} ({layers_text(record.layers)})" if len(depths[record.cell]) > 1 else record.cell,
                    colours[record.cell],
                    list(record.trained),
                    list(record.validated),
                )
                for record in runs
            ],
        )
    return panels


def efficiency_lines(groups: list[Group], colours: dict[str, str]) -> dict[str, list[figures.Line]]:
    """Per corpus, each cell's test bpc (mean and spread over seeds) at each training fraction."""
    panels, families = {}, efficiency_families(groups)
    for (corpus, budget, layers), members in families.items():
        several = sum(1 for key in families if key[0] == corpus) > 1
        for cell in sorted({group.cell for group in members}):
            own = [group for group in members if group.cell == cell and group.bpc is not None]
            if own:
                label = f"{cell} ({budget}, {layers_text(layers)})" if several else cell
                panels.setdefault(corpus, []).append(
                    figures.Line(
                        label,
                        colours[cell],
                        [group.fraction for group in own],
                        [group.bpc.mean for group in own],
                        [group.bpc.std or 0.0 for group in own],
                    )
                )
    return panels


def heat_maps(records: list[RunRecord]) -> list[figures.HeatMap]:
    """A heat map of per-layer gradient norms per run with them; more runs than ``MAX_HEATMAPS``: one
    per cell (its full-data run of the first corpus and seed)."""
    chosen = [record for record in records if record.steps]
    if len(chosen) > figures.MAX_HEATMAPS:
        chosen = [
            min(
                (record for record in chosen if record.cell == cell),
                key=lambda record: (-record.fraction, record.corpus, record.seed or 0, record.name),
            )
            for cell in sorted({record.cell for record in chosen})
        ]
    return [_heat_map(record) for record in chosen]


def _heat_map(record: RunRecord) -> figures.HeatMap:
    steps = sorted({row.step: row for row in record.steps if isinstance(row.step, int)}.items())
    layers = sorted({name for _, row in steps for name in row.grad_norm}, key=_layer_order)
    values = [[row.grad_norm.get(layer, math.nan) for _, row in steps] for layer in layers]
    return figures.HeatMap(
        f"{record.name} ({record.cell}, {record.corpus})", layers, [step for step, _ in steps], values
    )


def _layer_order(name: str) -> tuple:
    if name == "embedding":
        return (0, 0, name)
    if name.startswith("layer") and name[5:].isdigit():
        return (1, int(name[5:]), name)
    return (2 if name == "softmax" else 3, 0, name)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
