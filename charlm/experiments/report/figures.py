"""The figures of `charlm report`, as PNG files of a fixed size.

Drawn with matplotlib's object interface (``matplotlib.figure.Figure``, rendered by Agg), never
pyplot: no display is needed and no global backend is switched. A figure's size in pixels is its
size in inches (below) times ``DPI``; the PNG carries no software version or time, so the same
data give the same bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import matplotlib.style
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from charlm.files import atomic_write

DPI = 100
CURVES_SIZE = (10.0, 3.5)  # inches, per corpus (one row of two panels each)
CONVERGENCE_SIZE = (6.0, 4.0)
EFFICIENCY_SIZE = (5.0, 4.0)  # per corpus, side by side
HEATMAP_SIZE = (8.0, 2.5)  # per heat map, stacked
MAX_HEATMAPS = 4  # more runs than this: one heat map per cell
STYLE = {"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "image.cmap": "viridis"}
ABOVE_THE_RANGE = "validation above the range (on its edge)"  # progress.png's legend for its triangles


@dataclasses.dataclass(frozen=True)
class Curve:
    """One run's validation bpc by epoch and by cumulative training seconds."""

    label: str
    colour: str
    epochs: list[int]
    bpc: list[float]
    seconds: list[float]


@dataclasses.dataclass(frozen=True)
class Progress:
    """One run's training bpc (a line) and validation bpc (dots) by tokens and training seconds."""

    label: str
    colour: str
    trained: list  # reading.Point
    validated: list


@dataclasses.dataclass(frozen=True)
class Line:
    """Test bpc (mean, standard deviation) of one cell against the training fraction."""

    label: str
    colour: str
    fractions: list[float]
    bpc: list[float]
    std: list[float]


@dataclasses.dataclass(frozen=True)
class HeatMap:
    """Gradient norms: one row per layer, one column per logged step."""

    title: str
    layers: list[str]
    steps: list[int]
    values: list[list[float]]


def _styled(draw):
    """Draw under matplotlib's default style plus ``STYLE``, whatever the user's matplotlibrc says."""

    @functools.wraps(draw)
    def styled(*arguments) -> None:
        with matplotlib.style.context(["default", STYLE]):
            draw(*arguments)

    return styled


def cell_colours(cells: list[str]) -> dict[str, str]:
    """A colour per cell, the same in every figure of a report."""
    palette = colormaps["tab10"].colors + colormaps["tab20"].colors[1::2]  # then tab10's lighter shades
    return {cell: _hex(palette[index % len(palette)]) for index, cell in enumerate(cells)}


@_styled
def learning_curves(panels: dict[str, list[Curve]], path: Path) -> None:
    """Validation bpc against epochs (left) and training time (right), a row per corpus."""
    figure = _figure(CURVES_SIZE[0], CURVES_SIZE[1] * len(panels))
    axes = figure.subplots(len(panels), 2, squeeze=False)
    longest = max(second for curves in panels.values() for curve in curves for second in curve.seconds)
    unit, scale = ("hours", 3600) if longest > 7200 else ("minutes", 60) if longest > 600 else ("seconds", 1)
    for (corpus, curves), (by_epoch, by_time) in zip(panels.items(), axes):
        for curve in curves:
            by_epoch.plot(curve.epochs, curve.bpc, marker="o", markersize=3, color=curve.colour, label=curve.label)
            by_time.plot(
                [s / scale for s in curve.seconds],
                curve.bpc,
                marker="o",
                markersize=3,
                color=curve.colour,
                label=curve.label,
            )
        by_epoch.set(title=f"{corpus}: validation bpc by epoch", xlabel="epoch", ylabel="validation bpc")
        by_time.set(title=f"{corpus}: validation bpc by training time", xlabel=f"training time ({unit})")
        by_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
        _legend(by_epoch)
    _save(figure, path)


@_styled
def progress_curves(panels: dict[str, tuple[str, list[Progress]]], path: Path) -> None:
    """Per corpus (its device label, its runs): bpc against training tokens (left) and training time
    (right, labelled with the device). Lines: training bpc of the step records; dots: validation bpc."""
    figure = _figure(CURVES_SIZE[0], CURVES_SIZE[1] * len(panels))
    axes = figure.subplots(len(panels), 2, squeeze=False)
    longest = max(
        (point.seconds for _, runs in panels.values() for run in runs for point in run.trained + run.validated),
        default=0.0,
    )
    unit, scale = ("hours", 3600) if longest > 7200 else ("minutes", 60) if longest > 600 else ("seconds", 1)
    for (corpus, (device, runs)), (by_tokens, by_time) in zip(panels.items(), axes):
        for run in runs:
            for panel, x in ((by_tokens, lambda p: p.tokens / 1e6), (by_time, lambda p: p.seconds / scale)):
                panel.plot(
                    [x(p) for p in run.trained],
                    [p.bpc for p in run.trained],
                    color=run.colour,
                    linewidth=1,
                    alpha=0.7,
                    label=run.label,
                )
                panel.plot(
                    [x(p) for p in run.validated],
                    [p.bpc for p in run.validated],
                    color=run.colour,
                    marker="o",
                    markersize=4,
                    linestyle="none",
                )
        limits = _settled_range([p for run in runs for p in run.trained] or [p for run in runs for p in run.validated])
        if limits is not None:
            for panel, x in ((by_tokens, lambda p: p.tokens / 1e6), (by_time, lambda p: p.seconds / scale)):
                panel.set_ylim(*limits)
                for run in runs:  # a validation above the range: a triangle on its upper edge
                    above = [x(p) for p in run.validated if p.bpc > limits[1]]
                    panel.plot(above, [limits[1]] * len(above), color=run.colour, marker="^", linestyle="none")
            if any(p.bpc > limits[1] for run in runs for p in run.validated):
                by_tokens.plot([], [], color="grey", marker="^", linestyle="none", label=ABOVE_THE_RANGE)
        by_tokens.set(
            title=f"{corpus}: bpc by training tokens (lines: training; dots: validation)",
            xlabel="training tokens (millions)",
            ylabel="bpc",
        )
        by_time.set(title=f"{corpus}: bpc by training time", xlabel=f"training time ({unit}) on {device}")
        _legend(by_tokens)
    _save(figure, path)


def _settled_range(points) -> tuple[float, float] | None:
    """The bpc range of the points after the first tenth of the tokens, padded: the first steps (near
    log2 of the vocabulary) would squeeze the rest of the curves into a sliver. Taken from the training
    curves where there are some, so that one validation that blew up does not flatten them."""
    last = max((p.tokens for p in points), default=0)
    settled = [p.bpc for p in points if p.tokens >= last / 10] if last > 0 else []
    if len(settled) < 2 or max(settled) == min(settled):
        return None
    low, high = min(settled), max(settled)
    return low - 0.05 * (high - low), high + 0.1 * (high - low)


@_styled
def convergence_boxes(epochs: dict[str, list[int]], colours: dict[str, str], path: Path) -> None:
    """A box per cell of the epoch of best validation loss (over seeds and corpora)."""
    figure = _figure(*CONVERGENCE_SIZE)
    axes = figure.subplots()
    cells = list(epochs)
    boxes = axes.boxplot([epochs[cell] for cell in cells], patch_artist=True, medianprops={"color": "black"})
    axes.set_xticks(range(1, len(cells) + 1), cells)
    for position, (box, cell) in enumerate(zip(boxes["boxes"], cells), start=1):
        box.set(facecolor=colours[cell], alpha=0.6)
        axes.plot([position] * len(epochs[cell]), epochs[cell], "o", color="black", markersize=3, alpha=0.5)
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set(title="Epochs to the best validation loss", xlabel="cell", ylabel="best epoch")
    _save(figure, path)


@_styled
def efficiency_lines(panels: dict[str, list[Line]], path: Path) -> None:
    """Test bpc against the fraction of the training split, a line per cell, a panel per corpus."""
    figure = _figure(EFFICIENCY_SIZE[0] * len(panels), EFFICIENCY_SIZE[1])
    for axes, (corpus, lines) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels.items()):
        for line in lines:
            axes.errorbar(
                line.fractions,
                line.bpc,
                yerr=line.std,
                marker="o",
                markersize=4,
                capsize=3,
                color=line.colour,
                label=line.label,
            )
        axes.set(title=f"{corpus}: statistical efficiency", xlabel="fraction of the training split", ylabel="test bpc")
        axes.set_xlim(0, 1.05)  # every fraction there is, however few were measured
        _legend(axes)
    _save(figure, path)


@_styled
def gradient_heatmaps(maps: list[HeatMap], path: Path) -> None:
    """Per-layer gradient norms over the logged steps, on a logarithmic colour scale; one map per run."""
    figure = _figure(HEATMAP_SIZE[0], HEATMAP_SIZE[1] * len(maps))
    for axes, heat in zip(figure.subplots(len(maps), 1, squeeze=False)[:, 0], maps):
        positive = [value for row in heat.values for value in row if math.isfinite(value) and value > 0]
        low, high = (min(positive), max(positive)) if positive else (1e-3, 1.0)
        values = [[value if math.isfinite(value) and value > 0 else math.nan for value in row] for row in heat.values]
        half = (heat.steps[-1] - heat.steps[0]) / max(len(heat.steps) - 1, 1) / 2 or 0.5
        image = axes.imshow(
            values,
            aspect="auto",
            interpolation="nearest",
            norm=LogNorm(low, max(high, low * 1.0001)),
            extent=(heat.steps[0] - half, heat.steps[-1] + half, len(heat.layers) - 0.5, -0.5),
        )
        axes.set_yticks(range(len(heat.layers)), heat.layers)
        axes.grid(False)
        axes.set(title=heat.title, xlabel="step")
        figure.colorbar(image, ax=axes, label="gradient norm")
    _save(figure, path)


@dataclasses.dataclass(frozen=True)
class Marker:
    """Samples to a threshold at one depth: the mean over the seeds that reached it (``reached``), or
    where none did, the samples they trained (drawn hollow, "not reached")."""

    layers: int
    samples: float
    reached: bool
    seeds_reached: int
    seeds: int


THRESHOLD_SIZE = (4.5, 4.0)  # per panel


@_styled
def threshold_panels(panels: dict[str, dict[str, list[Marker]]], path: Path) -> None:
    """The Grid LSTM paper's Figure 5: samples to exceed each threshold against depth, a marker style
    per network, a panel per threshold; hollow markers: not reached within the samples shown."""
    figure = _figure(THRESHOLD_SIZE[0] * len(panels), THRESHOLD_SIZE[1])
    networks = sorted({network for panel in panels.values() for network in panel})
    colours = cell_colours(networks)
    shapes = dict(zip(networks, "osD^v<>ph*"))
    for axes, (threshold, panel) in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels.items()):
        for network, markers in panel.items():
            colour, shape = colours[network], shapes.get(network, "o")
            done = [m for m in markers if m.reached]
            axes.plot(
                [m.layers for m in done],
                [m.samples for m in done],
                shape + "-",
                color=colour,
                label=network,
                markersize=6,
            )
            missed = [m for m in markers if not m.reached]
            axes.plot(
                [m.layers for m in missed],
                [m.samples for m in missed],
                shape,
                color=colour,
                markerfacecolor="none",
                markersize=8,
                label=f"{network} (not reached)" if missed else None,
            )
        axes.set(title=f"accuracy > {float(threshold):.0%}", xlabel="layers", ylabel="training samples")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        _legend(axes)
    _save(figure, path)


def _figure(width: float, height: float):
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _legend(axes) -> None:
    """A legend with each label once (several runs of a cell share its colour and label)."""
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        axes.legend(unique.values(), unique.keys(), fontsize=8)


def sensible_limits(axes) -> None:
    """Widen an axis whose data is one value (one epoch, one run), which matplotlib would draw as a
    sliver around it (ticks at 49.6 … 50.4), to half the value on each side (at least 1). An axis
    whose limits the figure set itself (the fractions of the training data: 0 to 1) is left alone."""
    for values, set_limits, automatic in (
        (lambda line: line.get_xdata(), axes.set_xlim, axes.get_autoscalex_on()),
        (lambda line: line.get_ydata(), axes.set_ylim, axes.get_autoscaley_on()),
    ):
        data = [float(value) for line in axes.get_lines() for value in values(line) if math.isfinite(float(value))]
        if automatic and data and max(data) == min(data):
            pad = max(abs(data[0]) * 0.5, 1.0)
            set_limits(data[0] - pad, data[0] + pad)


def _save(figure, path: Path) -> None:
    for axes in figure.axes:
        if axes.get_lines() and not axes.images:
            sensible_limits(axes)
    atomic_write(path, lambda temporary: figure.savefig(temporary, format="png", dpi=DPI, metadata={"Software": None}))


def _hex(rgb) -> str:
    return "#" + "".join(f"{round(channel * 255):02x}" for channel in rgb[:3])
