"""How `ludic train` ends: its `TrainResult`, the closing lines (mean episode reward of the first
and last step that had a successful episode, the model, the curve, how to browse the episodes,
the skipped steps) and `NothingTrainedError` when every step was skipped because every episode
failed, naming the first failed episode from this run's rollouts file."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from ludic.errors import Refusal
from ludic.recipes.configs import TrainConfig
from ludic.recipes.training import SAMPLES_FILE, closing_rewards, plot_curve
from ludic.rollouts import iter_rollouts_jsonl
from ludic.rollouts.batch import every_episode_failed
from ludic.training.stall import was_skipped


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """Where the run's outputs are, and the mean episode reward of its first and last step
    that had a successful episode (NaN when no step had one)."""

    checkpoint: Path
    metrics_jsonl: Path
    samples_jsonl: Path
    reward_curve_png: Path
    first_reward: float
    last_reward: float
    steps: int


class NothingTrainedError(Refusal, RuntimeError):
    """Every step of a run was skipped because every episode failed (a run shorter than
    `max_skipped_steps`, which stops with TrainingStalledError instead)."""


def _nothing_trained(cfg: TrainConfig, history: list[dict[str, float]], checkpoint: Path) -> str:
    """Why no step trained, naming this run's first failed episode from its rollouts file, and
    how to run again: the final checkpoint (the unchanged model) is saved by then, so the same
    command in the same --out-dir is refused (it holds checkpoints) or, resumed, has no step
    left."""
    log = cfg.out_dir / "rollouts.jsonl"
    ours = int(sum(m["batch/num_rollouts"] for m in history))
    first = ""
    try:  # this run's episodes are the file's last `ours` records (a resume drops the rest)
        tail = deque(iter_rollouts_jsonl(log), maxlen=ours)
        failed = next(r.meta for r in tail if r.failed)
        first = f" The first: {failed.get('error_type', 'error')}: {failed.get('error')}."
    except (OSError, ValueError, StopIteration):
        pass  # the per-episode lines above still name each error
    if cfg.resume is None:
        again = (
            f"run again with another --out-dir, or delete {cfg.out_dir} first (this run saved "
            f"the unchanged model there as {checkpoint}, and a new run is refused in an "
            "--out-dir that holds checkpoints)"
        )
    else:
        again = (
            f"resume again with a larger --steps (this run saved the unchanged model as "
            f"{checkpoint}, which --resume now takes)"
        )
    return (
        f"no step trained: every episode of all {len(history)} step(s) failed, so the model is "
        f"the one this run started from.{first} Each failed episode's error and traceback are "
        f"in {log} (meta['error'], meta['error_traceback']; ludic view {log}); fix the cause "
        f"and {again}"
    )


def report_run(
    cfg: TrainConfig,
    history: list[dict[str, float]],
    checkpoint: Path,
    console: Console,
    *,
    notes: Sequence[str] = (),
) -> TrainResult:
    if not history:
        raise RuntimeError("training ran no step")
    # Skipped too: the error says the model is unchanged, which only a skipped step ensures (a
    # Trainer's logged counts are one rank's: under torchrun another rank may have trained).
    if all(was_skipped(m) and every_episode_failed(m) for m in history):
        raise NothingTrainedError(_nothing_trained(cfg, history, checkpoint))
    metrics = cfg.out_dir / "metrics.jsonl"
    samples = cfg.out_dir / SAMPLES_FILE
    curve = plot_curve(metrics, cfg.out_dir / "reward_curve.png", "batch/mean_reward")
    rewards, first, last = closing_rewards(history, checkpoint)
    console.print(
        f"done: mean episode reward {rewards}. "
        f"Model: [bold]{checkpoint / 'model'}[/bold]; curve: {curve}\n"
        f"browse the episodes with: ludic view {cfg.out_dir / 'rollouts.jsonl'} --samples "
        f"{samples} --tokenizer {checkpoint / 'model'}"
    )
    skipped = sum(1 for m in history if was_skipped(m))
    if skipped:
        console.print(
            f"[bold yellow]{skipped} of {len(history)} steps trained nothing[/bold yellow] "
            "(each named its cause above: 'step N skipped: ...')"
            + ("; the model is the one this run started from" if skipped == len(history) else "")
        )
    for note in notes:
        console.print(note)
    return TrainResult(
        checkpoint=checkpoint,
        metrics_jsonl=metrics,
        samples_jsonl=samples,
        reward_curve_png=curve,
        first_reward=float(first),
        last_reward=float(last),
        steps=len(history),
    )


__all__ = ["NothingTrainedError", "TrainResult", "report_run"]
