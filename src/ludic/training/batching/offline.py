"""`OfflineBatchSource`: batches of samples from rollouts stored as JSONL (rejection sampling,
demonstrations, an earlier run's log) for SFT and offline RL.

Credit is assigned once over all stored rollouts (so group baselines see whole groups), samples
are built and filtered, then served in seeded-shuffled batches epoch after epoch. The data
position (epoch, offset) is checkpointable, with what it is a position in (the sample count, a
digest of the samples' tokens, the shuffle seed), so a resume over other data, filters or seed is
refused instead of training other samples than the interrupted run would have. It does not
re-tokenize unless given a retokenizer and never generates rollouts.
"""

from __future__ import annotations

import hashlib
import logging
import random
from array import array
from collections.abc import Sequence
from pathlib import Path

from ludic.rollouts import (
    CreditAssigner,
    Retokenizer,
    SampleFilter,
    SampleMode,
    SAWItem,
    SnapshotPolicy,
    build_samples,
    derive_seed,
    iter_rollouts_jsonl,
)
from ludic.rollouts.batch import Broken, build_rollout_samples
from ludic.training.batching.types import BatchSourceExhausted, SAWBatch
from ludic.training.filters import apply_filters
from ludic.types import JSON, Rollout

logger = logging.getLogger(__name__)


class OfflineBatchSource:
    """Serves `batch_size` samples per batch from JSONL rollout files.

    - `shuffle`: a fresh permutation per epoch from `derive_seed(seed, "offline", epoch)`.
    - `num_epochs`: stop (raise `BatchSourceExhausted`) after this many passes; None cycles
      forever. `drop_last`: skip an epoch's final short batch.
    - Failed rollouts are skipped; so is a rollout whose samples cannot be built (an agent step
      without a token trace, say), with one warning naming how many, the first one's file and
      id and why, and credit assigned again without them (as online batches drop them).
      `num_build_failed` counts them. `filters` drop samples after credit assignment.
    - `state_dict()` is the position (epoch, samples served in it) and what identifies the
      data; `load_state_dict` refuses a state saved over other samples or another shuffle.
    """

    def __init__(
        self,
        *,
        paths: str | Path | Sequence[str | Path],
        credit_assigner: CreditAssigner,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        num_epochs: int | None = None,
        drop_last: bool = False,
        filters: Sequence[SampleFilter] = (),
        sample_mode: SampleMode = "turn",
        snapshot_policy: SnapshotPolicy = "share",
        retokenizer: Retokenizer | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        files = [paths] if isinstance(paths, str | Path) else list(paths)
        read = [(Path(p), r) for p in files for r in iter_rollouts_jsonl(p)]
        rollouts = [r for _, r in read]
        ok = [r for r in rollouts if not r.failed]
        built, broken = _build_dropping_broken(
            ok, credit_assigner, sample_mode, snapshot_policy, retokenizer
        )
        if broken:
            _warn_build_failures(broken, read, len(rollouts))
        self.num_build_failed = len(broken)
        self.samples, self.num_filtered_out = apply_filters(built, filters)
        if not self.samples:
            raise ValueError(
                f"OfflineBatchSource: no samples from {[str(f) for f in files]} "
                f"({len(rollouts)} rollouts, {len(rollouts) - len(ok)} failed, "
                f"{_build_failed_line(broken, read)}"
                f"{len(built)} samples built{_filtered_line(built, filters)})"
            )
        if drop_last and batch_size > len(self.samples):
            raise ValueError(
                f"drop_last with batch_size={batch_size} > {len(self.samples)} samples "
                "would never yield a batch"
            )
        self.num_rollouts = len(rollouts)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_epochs = num_epochs
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: list[int] = []
        self._digest: str | None = None

    def _epoch_order(self) -> list[int]:
        if self._order_epoch != self.epoch:
            order = list(range(len(self.samples)))
            if self.shuffle:
                random.Random(derive_seed(self.seed, "offline", self.epoch)).shuffle(order)
            self._order, self._order_epoch = order, self.epoch
        return self._order

    async def next_batch(self) -> SAWBatch:
        if self.exhausted():
            raise BatchSourceExhausted(f"OfflineBatchSource: {self.num_epochs} epochs done")
        remaining = len(self.samples) - self.position
        if remaining <= 0 or (self.drop_last and remaining < self.batch_size):
            self.epoch, self.position = self.epoch + 1, 0
        rows = self._epoch_order()[self.position : self.position + self.batch_size]
        self.position += len(rows)
        items: list[SAWItem] = [self.samples[i] for i in rows]
        return SAWBatch(items=items, stats={"epoch": float(self.epoch)})

    def exhausted(self) -> bool:
        """Whether `num_epochs` are done, so `next_batch` raises `BatchSourceExhausted`."""
        if self.num_epochs is None:
            return False
        remaining = len(self.samples) - self.position
        ends_epoch = remaining <= 0 or (self.drop_last and remaining < self.batch_size)
        return self.epoch + int(ends_epoch) >= self.num_epochs

    def samples_digest(self) -> str:
        """sha256 of the samples' token ids and action masks, in order: what the position
        indexes (weights are left out: a refit value baseline may round them differently)."""
        if self._digest is None:
            h = hashlib.sha256()
            for s in self.samples:
                h.update(array("q", (len(s.input_ids),)).tobytes())
                h.update(array("q", s.input_ids).tobytes())
                h.update(array("b", s.action_mask).tobytes())
            self._digest = h.hexdigest()
        return self._digest

    def state_dict(self) -> JSON:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_samples": len(self.samples),
            "samples_sha256": self.samples_digest(),
            "shuffle_seed": self.seed if self.shuffle else None,
        }

    def load_state_dict(self, state: JSON) -> None:
        """Restore the position; a state that records other samples or another shuffle (a
        changed data file, filter, tokenizer or seed) raises ValueError. States saved before
        these were recorded load unchecked."""
        problems = self._mismatches(state)
        if problems:
            raise ValueError(
                "OfflineBatchSource: the checkpoint's data position belongs to other data: "
                f"{'; '.join(problems)}. Resuming would train other samples than the run it "
                "continues; resume with the same data file, filters, tokenizer and seed, or "
                "start a new run"
            )
        self.epoch = int(state.get("epoch", 0))
        self.position = int(state.get("position", 0))

    def _mismatches(self, state: JSON) -> list[str]:
        problems = []
        if "num_samples" in state and state["num_samples"] != len(self.samples):
            problems.append(
                f"it has {state['num_samples']} samples, this source {len(self.samples)}"
            )
        elif "samples_sha256" in state and state["samples_sha256"] != self.samples_digest():
            problems.append("its samples' tokens differ (another sha256)")
        shuffle_seed = self.seed if self.shuffle else None
        if "shuffle_seed" in state and state["shuffle_seed"] != shuffle_seed:
            problems.append(
                f"it was shuffled with seed {state['shuffle_seed']}, this source with {shuffle_seed}"
            )
        return problems


def _build_dropping_broken(
    rollouts: Sequence[Rollout],
    credit_assigner: CreditAssigner,
    mode: SampleMode,
    snapshot_policy: SnapshotPolicy,
    retokenizer: Retokenizer | None,
) -> tuple[list[SAWItem], Broken]:
    """The samples of `rollouts`, built rollout by rollout, and the rollouts that raised (with
    what). Those are marked failed and credit is assigned again without them, so no group
    baseline counts a rollout that does not train (as `generate_batch` does online)."""
    build_samples([], {}, mode=mode, snapshot_policy=snapshot_policy)  # bad settings raise
    settings = (credit_assigner, mode, snapshot_policy, retokenizer)
    samples, broken = build_rollout_samples(rollouts, *settings)
    if not broken:
        return samples, broken
    kept = [r for r in rollouts if not r.failed]
    # every assigner leaves the failed rollouts in its view out
    return build_rollout_samples(kept, *settings, credit_view=rollouts)[0], broken


def _first_broken(broken: Broken, read: Sequence[tuple[Path, Rollout]]) -> str:
    """'rollout <id> of <file> (ValueError: why)' for the first rollout that did not build."""
    rollout, error = broken[0]
    path = next(p for p, r in read if r is rollout)
    return f"rollout {rollout.id} of {path} ({type(error).__name__}: {error})"


def _warn_build_failures(
    broken: Broken, read: Sequence[tuple[Path, Rollout]], num_rollouts: int
) -> None:
    logger.warning(
        "OfflineBatchSource: %d of %d rollouts could not be built into samples and are left "
        "out (their meta['error'] says why); the first: %s",
        len(broken),
        num_rollouts,
        _first_broken(broken, read),
    )


def _build_failed_line(broken: Broken, read: Sequence[tuple[Path, Rollout]]) -> str:
    """'K could not be built (the first: ...), ' for the no-samples error, or ''."""
    if not broken:
        return ""
    return f"{len(broken)} could not be built (the first: {_first_broken(broken, read)}), "


_FILTER_ADVICE = {
    "drop_parse_errors": "their actions failed the env's parser (meta 'parse_error'; see them "
    "with `ludic view`): store rollouts whose actions parse, or check the parser they were "
    "recorded with",
    "drop_truncated": "their episodes were cut by max_steps, the env or max_seq_len: store "
    "finished episodes, or keep them with drop_truncated(include_seq_len=False)",
    "drop_incomplete_completions": "their completions hit the token limit: store rollouts "
    "generated with a larger max_tokens",
    "drop_stale": "their policy versions are older than max_lag allows: raise max_lag",
}


def _filtered_line(built: Sequence[SAWItem], filters: Sequence[SampleFilter]) -> str:
    """', all N dropped by filters: drop_parse_errors dropped K (why; what to do); ...': each
    filter's own count (a sample two filters reject counts under both), named by the function
    that made it."""
    counts: dict[str, int] = {}
    for f in filters:
        name = _filter_name(f)
        dropped = sum(1 for item in built if not f(item))
        if dropped:
            counts[name] = counts.get(name, 0) + dropped
    if not counts:
        return ""
    parts = [
        f"{name} dropped {n} ({_FILTER_ADVICE.get(name, 'loosen or remove that filter')})"
        for name, n in counts.items()
    ]
    return f", all {len(built)} dropped by filters: " + "; ".join(parts)


def _filter_name(f: SampleFilter) -> str:
    """`drop_parse_errors` for the `keep` closure `drop_parse_errors()` returns (the factories
    in `ludic.training.filters` name theirs so), else the callable's own name."""
    outer, _, inner = getattr(f, "__qualname__", type(f).__name__).rpartition(".<locals>.")
    return outer.rpartition(".")[2] if outer and inner == "keep" else inner
