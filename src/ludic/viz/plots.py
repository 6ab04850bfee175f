"""PNG plots of a training metrics JSONL (one `{"step": ..., <metric>: ...}` object per line):
one panel per metric family found (reward, loss, KL, clip fraction, entropy, completion length).

matplotlib (Agg backend, no display) is imported only when plotting. It plots what the file
holds; it does not compute new metrics beyond an optional EMA smoothing for display.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import tyro
from rich.console import Console

from ludic._jsonl_errors import undecodable_line
from ludic.rollouts.batch import every_episode_failed

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MetricRecord = Mapping[str, Any]
# (panel title, pattern a metric name must match); a metric goes to the first panel it matches.
PANEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Reward", r"reward"),
    ("Loss", r"(^|[/_])loss($|[/_])"),
    ("KL", r"(^|[/_])kl($|[/_])"),
    ("Clip fraction", r"clip_?frac"),
    ("Entropy", r"entropy"),
    ("Completion length", r"completion_(len|length|tokens)|response_len"),
    ("Policy ratio", r"^ratio_(min|mean|max)$"),
)
_LOSS_DIAGNOSTICS = "loss/"
"""The Trainer logs its loss's diagnostics under this prefix (loss/approx_kl, loss/clip_frac,
loss/ratio_max, loss/mismatch/tokens): a key under it is placed by the rest of its name, so the
KL and clip fraction get their own panels and a token count or a ratio near 1 never shares the
loss's axes; a diagnostic no family names (mismatch/*, rollout_is/*) is plotted when named (`keys=`, `ludic plot --keys`)."""
_NOT_METRICS = frozenset({"step", "time", "timestamp"})
_MEAN_REWARD = "mean_reward"
"""A reward key <prefix>mean_reward is gapped where <prefix>num_failed says every episode failed
(`every_episode_failed`): batch/mean_reward of the Trainer, mean_reward of `ludic actor`."""
LEGEND_NOTES = {
    "batch/mean_reward": "per episode",
    "reward_mean": "per sample",
}
"""What a metric averages over, shown in its legend: the Trainer's two rewards share a panel and
differ by the number of turns (an episode of ten -1 turns: -10 per episode, -1 per sample)."""
_DPI = 100
_OTHER_IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".svg", ".pdf", ".gif", ".webp", ".eps", ".ps", ".tif", ".tiff", ".bmp"}
)
_MARKER_BELOW = 40  # sparse series (e.g. eval every N steps) get point markers
_COLUMN_INCHES = 5.2
_ROW_INCHES = 3.4


@dataclass(frozen=True, kw_only=True, slots=True)
class Panel:
    """One axes: a title and the metric names drawn on it."""

    title: str
    keys: tuple[str, ...]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSONL; a record without "step" gets its line position."""
    records: list[dict[str, Any]] = []
    if not Path(path).is_file():
        inside = (Path(path) / "metrics.jsonl", Path(path) / "rl" / "metrics.jsonl")
        found = next((m for m in inside if m.is_file()), None)
        if Path(path).is_dir() and found is not None:
            raise ValueError(
                f"{path} is a folder, not a metrics file; its metrics are in {found}: "
                f"`ludic plot {found}`"
            )
        raise ValueError(
            f"no metrics file at {path}; `ludic train` writes <--out-dir>/metrics.jsonl (and the "
            "quickstart <out-dir>/rl/metrics.jsonl)"
        )
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                advice = (
                    ": nothing to plot over steps. `ludic plot` draws the metrics.jsonl of "
                    "`ludic train` (<--out-dir>/metrics.jsonl); `ludic eval` prints this summary"
                )
                raise ValueError(
                    undecodable_line(path, lineno, line, e, "metrics record", advice)
                ) from e
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object per line")
            _refuse_other_run_file(record, path, lineno)
            record.setdefault("step", len(records))
            records.append(record)
    return records


def _refuse_other_run_file(record: dict[str, Any], path: str | Path, lineno: int) -> None:
    """Raise ValueError naming the file when `record` is a rollout or a training sample (the
    other JSONL files of a run), not a metrics record."""
    expected = "but a metrics JSONL is expected here (the metrics.jsonl of `ludic train`)"
    if "id" in record and "steps" in record:
        raise ValueError(
            f"{path}:{lineno}: a rollout (as in rollouts.jsonl), {expected}. To browse the "
            f"episodes, view it: `ludic view {path}`"
        )
    if "input_ids" in record and "action_mask" in record:
        raise ValueError(
            f"{path}:{lineno}: a training sample (as in samples.jsonl), {expected}, next to it"
        )


def metric_panels(records: Sequence[MetricRecord], keys: Sequence[str] = ()) -> list[Panel]:
    """Panels for `keys` (one each), or one per metric family present in `records`."""
    present = _numeric_keys(records)
    if keys:
        missing = [k for k in keys if k not in present]
        if missing:
            meant = {k: sorted(p for p in present if p.endswith(f"/{k}")) for k in missing}
            hint = "; ".join(f"{k}: did you mean {' or '.join(m)}?" for k, m in meant.items() if m)
            raise ValueError(
                f"metrics {missing} are not in the file"
                + (f" ({hint})" if hint else "")
                + f"; it has {sorted(present)}"
            )
        return [Panel(title=k, keys=(k,)) for k in keys]
    grouped: dict[str, list[str]] = {title: [] for title, _ in PANEL_FAMILIES}
    for key in sorted(present):
        name = key.removeprefix(_LOSS_DIAGNOSTICS)
        for title, pattern in PANEL_FAMILIES:
            if re.search(pattern, name):
                grouped[title].append(key)
                break
    return [Panel(title=t, keys=tuple(ks)) for t, ks in grouped.items() if ks]


def metrics_figure(
    records: Sequence[MetricRecord],
    panels: Sequence[Panel] | None = None,
    *,
    smooth: float = 0.0,
    title: str | None = None,
) -> Figure:
    """A figure with one axes per panel (up to 3 per row), each metric against step.

    `smooth` in [0, 1) draws an exponential moving average over the raw (faint) curve.
    """
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    panels = list(panels) if panels is not None else metric_panels(records)
    if not panels:
        raise ValueError(
            "no plottable metrics: expected keys such as loss, reward/mean, kl, clip_frac, "
            f"entropy, completion_len; the records have {sorted(_numeric_keys(records))}"
        )
    from matplotlib.figure import Figure  # Figure without pyplot: no global state, no display
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(_COLUMN_INCHES * ncols, _ROW_INCHES * nrows), layout="constrained")
    if title:
        fig.suptitle(title, fontweight="bold")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        for key in panel.keys:
            label = f"{key} ({LEGEND_NOTES[key]})" if key in LEGEND_NOTES else key
            steps, values = _series(records, key)
            marker = "o" if len(steps) < _MARKER_BELOW else None
            if smooth > 0:
                (raw,) = ax.plot(steps, values, alpha=0.25, linewidth=1)
                ax.plot(
                    steps, _ema(values, smooth), color=raw.get_color(), label=label, marker=marker
                )
            else:
                ax.plot(steps, values, label=label, marker=marker, markersize=3)
        ax.set_title(panel.title, fontsize=11, fontweight="bold", loc="left")
        ax.set_xlabel("step")
        # Steps are whole: no 1.25 ticks, nor 0.96 ones for a run one step in (the default
        # min_n_ticks=2 drops the integer rule when the view holds only one integer).
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if len(panel.keys) > 1:
            ax.legend(fontsize=8, frameon=False)
        elif panel.keys[0] != panel.title:
            ax.set_title(panel.keys[0], fontsize=8, color="grey", loc="right")
    for ax in axes[len(panels) :]:
        fig.delaxes(ax)
    return fig


def plot_metrics(
    metrics_jsonl: str | Path,
    out: str | Path,
    *,
    keys: Sequence[str] = (),
    smooth: float = 0.0,
    title: str | None = None,
) -> list[Path]:
    """Write PNGs of a metrics JSONL. `out` ending in .png: one figure with every panel; else
    a directory: metrics.png (every panel) plus one <panel>.png each. Returns the paths.
    `title` heads the figure (default: `default_title`, what is plotted and from which run)."""
    records = read_metrics(metrics_jsonl)
    if not records:
        raise ValueError(
            f"{metrics_jsonl} holds no metrics record yet (a run writes one line per step): "
            "plot it again after the run's first step"
        )
    panels = metric_panels(records, keys)
    title = title or default_title(panels, metrics_jsonl)
    out = Path(out)
    if out.suffix.lower() in _OTHER_IMAGE_SUFFIXES:
        raise ValueError(
            f"{out}: the plots are PNGs; give a .png file for one figure with every panel, or a "
            f"directory for metrics.png plus one PNG per panel (a {out.suffix} name would "
            "become a directory of PNGs)"
        )
    # The title is also the PNG's "Title" text chunk, so tools (and tests) can read it.
    if out.suffix.lower() == ".png":
        out.parent.mkdir(parents=True, exist_ok=True)
        figure = metrics_figure(records, panels, smooth=smooth, title=title)
        figure.savefig(out, dpi=_DPI, metadata={"Title": title})
        return [out]
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "metrics.png"]
    figure = metrics_figure(records, panels, smooth=smooth, title=title)
    figure.savefig(paths[0], dpi=_DPI, metadata={"Title": title})
    for panel in panels:
        path = out / f"{_slug(panel.title)}.png"
        panel_title = default_title([panel], metrics_jsonl)
        figure = metrics_figure(records, [panel], smooth=smooth, title=panel_title)
        figure.savefig(path, dpi=_DPI, metadata={"Title": panel_title})
        paths.append(path)
    return paths


def default_title(panels: Sequence[Panel], metrics_jsonl: str | Path) -> str:
    """What the figure shows and where it comes from, e.g. "batch/mean_reward per training
    step (run: ludic_runs/train)"."""
    what = ", ".join(panel.title for panel in panels)
    run = Path(metrics_jsonl).parent
    if run == Path("."):  # a file in the working directory: name that directory, not "."
        run = Path(Path.cwd().name)
    head = f"{what} per training step (run: "
    width_pt = 0.88 * 72 * _COLUMN_INCHES * min(3, max(1, len(panels)))
    for run_text in _shortened(run):  # a long absolute path ran off a one-panel figure's title
        title = f"{head}{run_text})"
        if _title_width_pt(title) <= width_pt:
            break
    return title


def _shortened(path: Path) -> list[str]:
    """`path`, then ever shorter: its last components after "…/", then its name's end after
    "…" (the last and shortest keeps 4 characters)."""
    parts = path.parts[1:] if path.is_absolute() else path.parts
    texts = [str(path)] + ["…/" + "/".join(parts[i:]) for i in range(1, len(parts))]
    name = path.name or str(path)
    return texts + ["…" + name[-n:] for n in range(len(name) - 1, 3, -1)]


def _title_width_pt(title: str) -> float:
    """The width in points of `title` set as the figure title (bold, the suptitle's size)."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    font = FontProperties(size=rcParams["figure.titlesize"], weight="bold")
    return float(TextPath((0, 0), title, prop=font).get_extents().width)


def _numeric_keys(records: Sequence[MetricRecord]) -> set[str]:
    return {
        k
        for r in records
        for k, v in r.items()
        if k not in _NOT_METRICS and _as_float(v) is not None and math.isfinite(_as_float(v) or 0)
    }


def _series(records: Sequence[MetricRecord], key: str) -> tuple[list[float], list[float]]:
    steps: list[float] = []
    values: list[float] = []
    for r in records:
        value = _as_float(r.get(key))
        step = _as_float(r.get("step"))
        counts = key.removesuffix(_MEAN_REWARD)
        if key.endswith(_MEAN_REWARD) and every_episode_failed(r, prefix=counts):
            value = math.nan  # BatchStats' 0.0 (the actor: null): a gap, not a reward earned
        if value is not None and step is not None:
            steps.append(step)
            values.append(value)
    return steps, values


def _as_float(value: object) -> float | None:
    """Numbers and the strings "nan" / "inf" the JSONL logger writes; None for the rest."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return None


def _ema(values: Sequence[float], alpha: float) -> list[float]:
    out: list[float] = []
    avg: float | None = None
    for v in values:
        if math.isfinite(v):
            avg = v if avg is None else alpha * avg + (1 - alpha) * v
        out.append(avg if avg is not None and math.isfinite(v) else math.nan)  # a gap stays one
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "metric"


@dataclass(frozen=True, kw_only=True, slots=True)
class PlotConfig:
    """Plot a training metrics JSONL as PNG curves against step."""

    metrics: Annotated[Path, tyro.conf.Positional]
    """Metrics JSONL written by the Trainer (one JSON object per step)."""
    out: Path | None = None
    """A .png file, or a directory for metrics.png plus one PNG per panel (default: a
    `plots` directory next to the metrics file)."""
    keys: tuple[str, ...] = ()
    """Plot exactly these metrics, one panel each (default: the known families found)."""
    smooth: float = 0.0
    """EMA smoothing in [0, 1) drawn over the raw curves (0: off)."""
    title: str | None = None
    """Figure title (default: the metrics plotted and the run directory they come from)."""


def plot_command(cfg: PlotConfig, *, console: Console | None = None) -> list[Path]:
    """`ludic plot`: write the PNGs and list them."""
    out = cfg.out or cfg.metrics.parent / "plots"
    paths = plot_metrics(cfg.metrics, out, keys=cfg.keys, smooth=cfg.smooth, title=cfg.title)
    console = console or Console()
    for path in paths:
        console.print(f"wrote [bold]{path}[/bold]")
    return paths
