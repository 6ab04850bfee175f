"""Training samples as plain data: SAWItem (State/Action tokens + Weight) and the seams that
produce their weights. No torch here: tensors are made by `ludic.training.collate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic.types import JSON, BehaviorSampling, Rollout, TokenTrace

TurnKey = tuple[str, str]  # (rollout id, turn id)


@dataclass(frozen=True, kw_only=True, slots=True)
class SAWItem:
    """One training sample: a token sequence, which tokens are actions, and a weight.

    - `input_ids`: the full sequence (prompt and completions) as the model saw it.
    - `action_mask`: 1 for tokens the policy sampled (trained on), 0 for prompt/tool tokens.
    - `behavior_logprobs`: per-token logprobs of the sampling policy, aligned with
      `input_ids` (0.0 where `action_mask` is 0), or None when the backend gave none.
    - `weight`: the scalar credit (advantage) for every action token of this sample.
    - `meta`: rollout_id, turn_id, agent_id, group_id, segment_index, is_snapshot, reward,
      weight_source, policy_versions, terminated, truncated, episode_truncated,
      truncation_reason, finish_reason, parse_error, incomplete_completion, ...
      and, for the trainer's logprob recomputation, `behavior_sampling` (the sampling
      transform of the action tokens, see `sampling_runs`) and `forced_action_tokens`
      (ordinals of action tokens the backend forced; they are not trained on).
    """

    input_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    weight: float
    behavior_logprobs: tuple[float, ...] | None = None
    meta: JSON = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.action_mask) != n:
            raise ValueError(
                f"SAWItem: action_mask has {len(self.action_mask)} entries for {n} tokens"
            )
        if self.behavior_logprobs is not None and len(self.behavior_logprobs) != n:
            raise ValueError(
                f"SAWItem: behavior_logprobs has {len(self.behavior_logprobs)} entries for {n} tokens"
            )

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def policy_versions(self) -> tuple[int, ...]:
        return tuple(self.meta.get("policy_versions", ()))

    def to_dict(self) -> JSON:
        return {
            "input_ids": list(self.input_ids),
            "action_mask": list(self.action_mask),
            "weight": self.weight,
            "behavior_logprobs": (
                None if self.behavior_logprobs is None else list(self.behavior_logprobs)
            ),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SAWItem:
        lp = d.get("behavior_logprobs")
        return cls(
            input_ids=tuple(int(t) for t in d["input_ids"]),
            action_mask=tuple(int(m) for m in d["action_mask"]),
            weight=float(d["weight"]),
            behavior_logprobs=None if lp is None else tuple(float(x) for x in lp),
            meta=dict(d.get("meta", {})),
        )


BEHAVIOR_SAMPLING_KEY = "behavior_sampling"
FORCED_ACTION_TOKENS_KEY = "forced_action_tokens"


def behavior_sampling_meta(traces: Sequence[TokenTrace | None], num_action_tokens: int) -> JSON:
    """Sample meta recording how the action tokens of `traces` (one per model call, in the
    order their completions were stitched) were sampled.

    `behavior_sampling` is one `BehaviorSampling` dict when every call shares it (the common
    case), else a list of runs `{..., "tokens": n}` over the action tokens in order. A call
    without a recorded transform counts as the identity; no key when no call recorded one.
    `forced_action_tokens` lists forced completion tokens by action-token ordinal. Runs and
    forced ordinals need the completions to be exactly the sample's action tokens; when they
    are not (retokenized traces) only a shared transform is kept.
    """
    if all(t is None or t.sampling is None for t in traces):
        return {}
    per_call = [
        (t.sampling if t is not None and t.sampling is not None else BehaviorSampling())
        for t in traces
    ]
    counts = [0 if t is None else len(t.completion_token_ids) for t in traces]
    exact = sum(counts) == num_action_tokens
    meta: JSON = {}
    if all(s == per_call[0] for s in per_call):
        meta[BEHAVIOR_SAMPLING_KEY] = per_call[0].to_dict()
    elif exact:
        runs: list[JSON] = []
        for sampling, n in zip(per_call, counts, strict=True):
            if runs and BehaviorSampling.from_dict(runs[-1]) == sampling:
                runs[-1]["tokens"] += n
            elif n:
                runs.append({**sampling.to_dict(), "tokens": n})
        meta[BEHAVIOR_SAMPLING_KEY] = runs
    forced: list[int] = []
    offset = 0
    for trace, n in zip(traces, counts, strict=True):
        if trace is not None:
            forced.extend(offset + i for i in trace.forced_positions)
        offset += n
    if forced and exact:
        meta[FORCED_ACTION_TOKENS_KEY] = forced
    return meta


def sampling_runs(meta: Mapping[str, Any]) -> list[tuple[BehaviorSampling, int | None]]:
    """The sample's sampling transform as runs `(transform, number of action tokens)` in
    action-token order; `None` tokens means "every remaining action token". Empty when the
    sample recorded none (the identity: temperature 1, no top-k / top-p)."""
    value = meta.get(BEHAVIOR_SAMPLING_KEY)
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [(BehaviorSampling.from_dict(value), None)]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(
            f"sample meta {BEHAVIOR_SAMPLING_KEY!r} must be a dict or a list of runs with "
            f"'tokens', got {value!r}"
        )
    return [(BehaviorSampling.from_dict(run), int(run["tokens"])) for run in value]


@runtime_checkable
class CreditAssigner(Protocol):
    """Turns a batch of rollouts into one scalar weight per turn.

    Returns `{(rollout.id, turn.turn_id): weight}` for every turn (see `Rollout.turns()`) of
    every rollout that is not failed. Groups (GRPO) come from `rollout.meta["group_id"]`.
    """

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]: ...


# A filter keeps a sample when it returns True.
SampleFilter = Callable[[SAWItem], bool]
