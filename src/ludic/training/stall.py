"""Why a training step was skipped, and the guard that stops a run which cannot progress.

A step is skipped when its batch holds nothing to train on (every sample stale, every episode
failed, filters dropped everything, an empty batch, no action token left) or when its loss or
gradient is not finite. `SkipTracker` raises `TrainingStalledError` after `max_skipped_steps`
skipped steps in a row, naming the cause and what to do. It does not decide what is skipped:
the Trainer does, and hands each skipped step's batch and metrics to `skip_cause`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ludic.errors import Refusal
from ludic.training.batching.types import SAWBatch
from ludic.training.config import TrainerConfig

SkipKind = Literal["stale", "failed", "filtered", "empty", "no_action_tokens", "nonfinite"]

_KNOB = (
    "TrainerConfig.max_skipped_steps={limit} skipped steps in a row stop a run; None never stops"
)
_ADVICE: dict[SkipKind, str] = {
    "stale": "is the inference server serving the trainer's weights? The restored weights must "
    "be published after a restart (Trainer.resume does it when the Trainer has a publisher, "
    "`ludic train --resume` and `ludic learner` do too); check that every publish reaches the "
    "server, or raise max_lag",
    "failed": "fix the env, agent or inference error (each rollout's meta['error'] holds it; so "
    "does the rollout log)",
    "filtered": "loosen the sample filters (e.g. drop_truncated, drop_incomplete_completions) or "
    "raise max_tokens / max_steps so that episodes finish",
    "empty": "check the batch source: its requests_fn, or the actors feeding the pipeline",
    "no_action_tokens": "raise max_seq_len, or check that the samples' action masks mark the "
    "completions",
    "nonfinite": "lower lr or max_grad_norm, check rewards and advantages for nan or huge "
    "values and the behaviour logprobs the server returns (with dtype='bfloat16', try float32)",
}


class TrainingStalledError(Refusal, RuntimeError):
    """Too many steps in a row trained nothing; the message names the cause and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SkipCause:
    """Why one step trained nothing: a kind (for counting) and a sentence with the numbers."""

    kind: SkipKind
    text: str

    @property
    def advice(self) -> str:
        return _ADVICE[self.kind]


def skip_cause(
    batch: SAWBatch, metrics: Mapping[str, float], *, policy_version: int, config: TrainerConfig
) -> SkipCause:
    """The cause of a skipped step, from its batch and the Trainer's metrics for it."""
    if metrics.get("skipped_nonfinite"):
        text = (
            f"non-finite loss or gradient (loss {metrics.get('loss', float('nan')):.4g}, "
            f"grad_norm {metrics.get('grad_norm', float('nan')):.4g}); weights left unchanged"
        )
        return SkipCause(kind="nonfinite", text=text)
    if not batch.items:
        return _empty_batch_cause(batch)
    count = len(batch.items)
    stale = int(metrics.get("dropped_stale", 0))
    if stale == count:
        versions = [min(item.policy_versions) for item in batch.items if item.policy_versions]
        text = (
            f"all {count} samples were stale: policy_version {policy_version}, sample versions "
            f"{min(versions)}..{max(versions)}, max_lag {config.max_lag}"
        )
        return SkipCause(kind="stale", text=text)
    no_action = int(metrics.get("dropped_no_action_tokens", 0))
    capped = (
        "" if config.max_seq_len is None else f" after capping at max_seq_len {config.max_seq_len}"
    )
    text = (
        f"no sample had a trainable token: {count} samples in, {stale} stale "
        f"(max_lag {config.max_lag}), {no_action} without an action token{capped}"
    )
    return SkipCause(kind="no_action_tokens", text=text)


def _empty_batch_cause(batch: SAWBatch) -> SkipCause:
    rollouts = batch.rollouts
    failed = [r for r in rollouts if r.failed]
    if rollouts and len(failed) == len(rollouts):
        meta = failed[0].meta
        text = (
            f"every episode failed ({len(failed)} of {len(rollouts)} rollouts; first error: "
            f"{meta.get('error_type', 'error')}: {meta.get('error')})"
        )
        return SkipCause(kind="failed", text=text)
    filtered = int(batch.stats.get("num_filtered_out", 0))
    if filtered:
        return SkipCause(
            kind="filtered", text=f"the batch source's filters dropped all {filtered} samples"
        )
    detail = f" ({len(rollouts)} rollouts, {len(failed)} failed)" if rollouts else ""
    return SkipCause(kind="empty", text=f"the batch source returned no samples{detail}")


class SkipTracker:
    """Counts skipped steps in a row; `record` raises `TrainingStalledError` at `limit`."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.kinds: Counter[str] = Counter()
        self.first_step: int | None = None

    @property
    def in_a_row(self) -> int:
        return sum(self.kinds.values())

    def record(self, step: int, cause: SkipCause | None) -> None:
        """Note step `step`'s outcome (None: it trained)."""
        if cause is None:
            self.kinds.clear()
            self.first_step = None
            return
        if self.first_step is None:
            self.first_step = step
        self.kinds[cause.kind] += 1
        if self.limit is not None and self.in_a_row >= self.limit:
            counts = ", ".join(f"{kind} x{n}" for kind, n in self.kinds.most_common())
            raise TrainingStalledError(
                f"training stalled: {self.in_a_row} steps in a row (steps {self.first_step}.."
                f"{step}) trained nothing ({counts}). Step {step}: {cause.text}. What to do: "
                f"{cause.advice}. ({_KNOB.format(limit=self.limit)}.)"
            )


def was_skipped(metrics: Mapping[str, float]) -> bool:
    """Whether a step's metrics (what `Trainer.train_step` returns) say it trained nothing."""
    return bool(metrics.get("skipped_empty") or metrics.get("skipped_nonfinite"))


class NoSignalWatch:
    """Warns when steps in a row train but change no weight: every sample's advantage is 0
    (each group's episodes got the same reward), so the loss and its gradient are exactly 0.
    The run goes on (later groups may differ), but it says so, naming the likely cause, after
    `first` such steps in a row and every `every` steps of the streak after that."""

    def __init__(self, first: int = 3, every: int = 25) -> None:
        self.first, self.every = first, every
        self.streak, self.since = 0, 0

    def record(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """Note step `step`'s metrics; the warning to log now, if any."""
        trained = not was_skipped(metrics) and metrics.get("num_samples", 0) > 0
        if not (trained and metrics.get("grad_norm") == 0.0):
            self.streak = 0
            return None
        self.streak += 1
        if self.streak == 1:
            self.since = step
        due = self.streak - self.first
        if due < 0 or due % self.every:
            return None
        if metrics.get("loss/rollout_is/weight_mean") == 0.0:
            return (
                f"steps {self.since}..{step} changed no weight: the rollout correction gave "
                "every action token weight 0 (loss/rollout_is/weight_mean 0: each was rejected "
                "as too far from the behaviour policy, see loss/rollout_is/*_frac and "
                "mismatch/*). Widen RejectOutside's band, or find why the trainer's logprobs "
                "differ from the sampler's (stale weights, another sampling transform)"
            )
        reward = metrics.get("reward_mean", float("nan"))
        parse = metrics.get("parse_error_rate")
        parse_text = "" if parse is None else f", parse error rate {parse:.2f}"
        return (
            f"steps {self.since}..{step} changed no weight: every sample's advantage is 0, as "
            f"the episodes of each group got the same reward (mean reward per sample {reward:+.3f}"
            f"{parse_text}). Nothing is learned until rewards differ within a group: start "
            "from a model that sometimes succeeds (`ludic sft`, or the quickstart's SFT model), "
            "use larger groups (--group-size; GRPORequestStrategy.group_size in Python), "
            "sample more diversely (--temperature; SamplingConfig.temperature), or give the env "
            "graded rewards"
        )
