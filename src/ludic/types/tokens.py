"""Token-level records of one model call: `BehaviorSampling` (the transform that defines
behaviour logprobs) and `TokenTrace` (prompt / completion token ids and their logprobs).
Messages and steps live in the sibling modules; nothing here imports torch.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ludic.types.messages import JSON


@dataclass(frozen=True, kw_only=True, slots=True)
class BehaviorSampling:
    """The sampling transform that defines behaviour logprobs (one definition for every backend).

    The behaviour logprob of a sampled token is its log-probability under the distribution it
    was actually drawn from: softmax(logits / temperature), restricted to the top-k / top-p
    support and renormalised there (top-k first, then top-p on the top-k survivors' renormalised
    probabilities; a token is dropped by top-p when the mass of the tokens ranked above it
    already reaches top_p, so the top token always survives). Temperature 0 (greedy) counts as
    temperature 1 with the same support: greedy rows report the model's own (truncated)
    distribution, which the trainer recomputes the same way; a greedy sample is not a draw
    from it, so do not train ratio losses on greedy rollouts. Tokens forced by the backend
    (`max_think` closing a think block) are drawn from a point mass: they are not policy
    actions and are left out of the loss (see `TokenTrace.forced_positions`).

    The embedded engine's "processed" logprobs mode computes exactly this
    (`ludic.inference.embedded.token_sampling`); vLLM does with `logprobs-mode=processed_logprobs`. The
    trainer recomputes logprobs under the same transform, per sample, so the importance ratio
    of an on-policy sample is exactly 1. `top_k` -1 (or 0) and `top_p` 1 turn the filters off.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and 0 < self.top_p <= 1):
            raise ValueError(
                f"BehaviorSampling: need temperature >= 0 and 0 < top_p <= 1, got "
                f"temperature={self.temperature}, top_p={self.top_p}"
            )
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_k", int(self.top_k) if self.top_k > 0 else -1)
        object.__setattr__(self, "top_p", float(self.top_p))

    @property
    def is_identity(self) -> bool:
        """True when the transform leaves the model's distribution unchanged (temperature 1 or
        greedy, no top-k, no top-p)."""
        return self.temperature in (0.0, 1.0) and self.top_k <= 0 and self.top_p >= 1.0

    def to_dict(self) -> JSON:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BehaviorSampling:
        return cls(
            temperature=float(d.get("temperature", 1.0)),
            top_k=int(d.get("top_k", -1)),
            top_p=float(d.get("top_p", 1.0)),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenTrace:
    """The exact tokens of one model call: what the server saw and what it sampled.

    `completion_logprobs` are the behaviour policy's logprobs of each sampled token (see
    `BehaviorSampling` for the definition); they may be absent (None) for backends that cannot
    return them, but never partially present. `sampling` is the transform they were computed
    under (None: unknown, treated as the identity). `forced_positions` index completion tokens
    the backend forced instead of sampling (max_think); they are not trained on.
    """

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...] | None = None
    sampling: BehaviorSampling | None = None
    forced_positions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("prompt_token_ids", "completion_token_ids", "forced_positions"):
            object.__setattr__(self, name, _integers(name, getattr(self, name)))
        n = len(self.completion_token_ids)
        if any(not 0 <= i < n for i in self.forced_positions):
            raise ValueError(
                f"TokenTrace: forced_positions {list(self.forced_positions)} must index the "
                f"{n} completion tokens"
            )
        if self.completion_logprobs is not None:
            lp = tuple(float(x) for x in self.completion_logprobs)
            object.__setattr__(self, "completion_logprobs", lp)
            if len(lp) != n:
                raise ValueError(
                    f"TokenTrace: {len(lp)} completion logprobs for "
                    f"{n} completion tokens; a backend must return "
                    "one logprob per sampled token (or none at all)"
                )

    def to_dict(self) -> JSON:
        d: JSON = {
            "prompt_token_ids": list(self.prompt_token_ids),
            "completion_token_ids": list(self.completion_token_ids),
            "completion_logprobs": (
                None if self.completion_logprobs is None else list(self.completion_logprobs)
            ),
        }
        if self.sampling is not None:
            d["sampling"] = self.sampling.to_dict()
        if self.forced_positions:
            d["forced_positions"] = list(self.forced_positions)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenTrace:
        lp = d.get("completion_logprobs")
        sampling = d.get("sampling")
        return cls(
            prompt_token_ids=tuple(d["prompt_token_ids"]),
            completion_token_ids=tuple(d["completion_token_ids"]),
            completion_logprobs=None if lp is None else tuple(lp),
            sampling=None if sampling is None else BehaviorSampling.from_dict(sampling),
            forced_positions=tuple(d.get("forced_positions", ())),
        )


def _integers(field: str, values: Any) -> tuple[int, ...]:
    """`values` as a tuple of ints; ValueError naming `field` and the first value that is not an
    integer (3.7, True, "5"), which `int()` would truncate or convert without a word. Integral
    floats (3.0, as some JSON writers give ids) and numpy / torch integer scalars are ints."""
    out = tuple(values)
    if all(type(v) is int for v in out):  # the common case, one cheap pass
        return out
    return tuple(_integer(field, i, v) for i, v in enumerate(out))


def _integer(field: str, index: int, value: Any) -> int:
    if type(value) is int:
        return value
    is_bool = isinstance(value, bool) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")
    if not is_bool:
        try:
            return operator.index(value)  # int subclasses, numpy and torch integer scalars
        except TypeError:
            pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
    raise ValueError(
        f"TokenTrace: {field}[{index}] is {value!r} ({type(value).__name__}), not an integer: "
        "token ids and positions are ints; fix the backend or file that gave it (a float id "
        "is not rounded to one)"
    )
