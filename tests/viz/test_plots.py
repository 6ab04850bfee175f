"""Metric plots: one panel per metric family present, PNG files written and non-empty, clear
errors for files without plottable metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ludic.viz import PlotConfig, metrics_figure, plot_command, plot_metrics, read_metrics
from ludic.viz.plots import metric_panels

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def training_records(steps: int = 30) -> list[dict]:
    records = []
    for step in range(1, steps + 1):
        r: dict = {
            "step": step,
            "time": 1000.0 + step,
            "loss": 1.0 / step,
            "reward/mean": math.tanh(step / 10),
            "reward_mean": math.tanh(step / 12),
            "kl": 0.01 * step,
            "clip_frac": 0.1,
            "entropy": 2.0 - step / 30,
            "completion_len": 20 + step,
            "lr": 1e-5,
        }
        if step % 10 == 0:
            r["eval/reward/mean"] = step / 30
        if step == 3:
            r["loss"] = "nan"  # the JSONL logger writes non-finite values as strings
        records.append(r)
    return records


def test_one_panel_per_family_present(tmp_path: Path) -> None:
    records = read_metrics(write_metrics(tmp_path / "m.jsonl", training_records()))
    panels = metric_panels(records)
    assert [p.title for p in panels] == [
        "Reward", "Loss", "KL", "Clip fraction", "Entropy", "Completion length",
    ]  # fmt: skip
    assert panels[0].keys == ("eval/reward/mean", "reward/mean", "reward_mean")
    fig = metrics_figure(records)
    assert len(fig.axes) == 6
    assert [ax.get_title(loc="left") for ax in fig.axes] == [p.title for p in panels]
    reward_lines = fig.axes[0].get_lines()
    assert len(reward_lines) == 3
    eval_line = next(line for line in reward_lines if line.get_label() == "eval/reward/mean")
    assert list(eval_line.get_xdata()) == [10.0, 20.0, 30.0]


def test_only_present_families_and_explicit_keys(tmp_path: Path) -> None:
    records = [{"step": i, "loss": 1.0 / (i + 1), "grad_norm": 0.5} for i in range(5)]
    assert len(metrics_figure(records).axes) == 1
    panels = metric_panels(records, keys=("loss", "grad_norm"))
    assert len(metrics_figure(records, panels, smooth=0.5).axes) == 2
    with pytest.raises(ValueError, match=r"\['nope'\] are not in the file"):
        metric_panels(records, keys=("nope",))
    with pytest.raises(ValueError, match="no plottable metrics"):
        metrics_figure([{"step": 1, "grad_norm": 0.5}])


def small_records() -> list[dict]:
    keep = ("step", "loss", "kl")
    return [{k: v for k, v in r.items() if k in keep} for r in training_records(8)]


def test_the_two_rewards_say_what_they_average_over() -> None:
    # a Trainer logs both; an episode of ten -1 turns is -10 per episode and -1 per sample
    records = [{"step": s, "batch/mean_reward": -10.0, "reward_mean": -1.0} for s in (1, 2)]
    for smooth in (0.0, 0.5):
        (ax,) = metrics_figure(records, smooth=smooth).axes
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["batch/mean_reward (per episode)", "reward_mean (per sample)"]


def test_plot_metrics_writes_pngs(tmp_path: Path) -> None:
    metrics = write_metrics(tmp_path / "metrics.jsonl", small_records())
    paths = plot_metrics(metrics, tmp_path / "plots")
    assert [p.name for p in paths] == ["metrics.png", "loss.png", "kl.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5_000
    single = plot_metrics(metrics, tmp_path / "one.png", keys=("loss",))
    assert single == [tmp_path / "one.png"] and single[0].read_bytes().startswith(PNG)


def test_plot_command_defaults_next_to_the_file(tmp_path: Path) -> None:
    metrics = write_metrics(tmp_path / "metrics.jsonl", small_records())
    paths = plot_command(PlotConfig(metrics=metrics, keys=("kl",), smooth=0.3))
    assert len(paths) == 2
    assert paths[0] == tmp_path / "plots" / "metrics.png" and paths[0].stat().st_size > 0


def test_damaged_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with pytest.raises(ValueError, match=r"m.jsonl:2: not a JSON metrics record"):
        read_metrics(path)


def png_title(path: Path) -> str:
    from PIL import Image

    with Image.open(path) as image:
        return str(image.info.get("Title", ""))


def names_run(title: str, what: str, run: Path) -> bool:
    """`title` is "WHAT (run: RUN)" with the run's path whole, or its end after "…" where the
    whole path would not fit the figure (a long pytest temporary directory)."""
    shown = title.removeprefix(f"{what} (run: ").removesuffix(")")
    return title == f"{what} (run: {shown})" and (
        shown == str(run) or (shown.startswith("…") and str(run).endswith(shown[1:]))
    )


def test_titles_say_what_is_plotted(tmp_path: Path) -> None:
    run = tmp_path / "my_run"
    run.mkdir()
    metrics = write_metrics(run / "metrics.jsonl", small_records())
    (curve,) = plot_metrics(metrics, tmp_path / "curve.png", keys=("loss",))
    assert names_run(png_title(curve), "loss per training step", run)
    (titled,) = plot_metrics(metrics, tmp_path / "t.png", keys=("kl",), title="KL of run 3")
    assert png_title(titled) == "KL of run 3"
    paths = plot_command(PlotConfig(metrics=metrics, title="All metrics"))
    assert png_title(paths[0]) == "All metrics"
    assert names_run(png_title(paths[1]), "Loss per training step", run)
    fig = metrics_figure(small_records(), title="What it shows")
    assert fig.get_suptitle() == "What it shows"


def test_the_trainers_loss_diagnostics_get_their_own_panels() -> None:
    # The Trainer logs its loss's diagnostics as loss/<name>: a KL, a clip fraction, ratios
    # near 1 and a token count used to share the loss's axes (11 lines, two of one colour).
    record = {
        "step": 1,
        "loss": 0.0,
        "loss/approx_kl": 0.01,
        "loss/clip_frac": 0.2,
        "loss/ratio_min": 0.9,
        "loss/ratio_mean": 1.0,
        "loss/ratio_max": 1.1,
        "loss/mismatch/tokens": 1500.0,
        "loss/mismatch/k3": 0.001,
        "reward_mean": -1.0,
    }
    panels = {p.title: p.keys for p in metric_panels([record, {**record, "step": 2}])}
    assert panels == {
        "Reward": ("reward_mean",),
        "Loss": ("loss",),
        "KL": ("loss/approx_kl",),
        "Clip fraction": ("loss/clip_frac",),
        "Policy ratio": ("loss/ratio_max", "loss/ratio_mean", "loss/ratio_min"),
    }
    assert metric_panels([record], keys=("loss/mismatch/tokens",))[0].keys == (
        "loss/mismatch/tokens",
    )
