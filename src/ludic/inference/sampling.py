"""Sampling parameters, resolved once into OpenAI request kwargs plus backend extras.

Deliberately small: only knobs that every backend (embedded engine, vLLM, SGLang) understands
or that map cleanly onto their extra-body fields.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

INT64_MAX = 2**63 - 1
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what a torch.Generator accepts


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingConfig:
    """How to sample one completion. Every field is range-checked here (ValueError naming it), so
    a bad value fails the request that carries it, never a batch it would have joined.

    `max_think` caps the tokens spent inside an open `<think>` block (the backend closes the
    block if it is still open at the cap). `seed` makes sampling reproducible per request.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    max_think: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field out of range (run on construction, and again
        by a backend admitting the request)."""
        _stop_strings(self.stop)
        temperature = _real("temperature", self.temperature)
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(
                f"temperature must be a finite number >= 0 (0: greedy), got {temperature}"
            )
        top_p = _real("top_p", self.top_p)
        if not 0 < top_p <= 1:  # NaN fails too
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        _integer("max_tokens", self.max_tokens, 1, INT64_MAX)
        if _integer("top_k", self.top_k, -1, INT64_MAX) == 0:
            raise ValueError("top_k must be -1 (off) or >= 1, got 0")
        if self.seed is not None:
            _integer("seed", self.seed, SEED_MIN, SEED_MAX)
        if self.max_think is not None:
            _integer("max_think", self.max_think, 1, INT64_MAX, " (or None for no cap)")
        if not isinstance(self.extras, dict):
            raise ValueError(f"extras must be a dict, got {self.extras!r}")

    def with_seed(self, seed: int | None) -> SamplingConfig:
        return replace(self, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingConfig:
        d = dict(d)
        d["stop"] = tuple(d.get("stop", ()))
        return cls(**d)


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value: object, low: int, high: int, note: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= int(value) <= high:
        raise ValueError(f"{name} must be in [{low}, {high}]{note}, got {value}")
    return int(value)


def _stop_strings(stop: object) -> tuple[str, ...]:
    if isinstance(stop, str) or not isinstance(stop, Sequence):
        raise ValueError(f"stop must be a list of strings, got {stop!r}")
    if not all(isinstance(s, str) for s in stop):
        raise ValueError(f"stop must hold strings only, got {list(stop)!r}")
    return tuple(stop)


def resolve_sampling_args(cfg: SamplingConfig) -> dict[str, Any]:
    """OpenAI chat/completions kwargs; non-standard knobs go under `extra_body` (vLLM style)."""
    kwargs: dict[str, Any] = {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_tokens": cfg.max_tokens,
    }
    if cfg.stop:
        kwargs["stop"] = list(cfg.stop)
    if cfg.seed is not None:
        kwargs["seed"] = cfg.seed
    extra: dict[str, Any] = {}
    if cfg.top_k != -1:
        extra["top_k"] = cfg.top_k
    if cfg.max_think is not None:
        extra["max_think"] = cfg.max_think
    extra.update(cfg.extras)
    if extra:
        kwargs["extra_body"] = extra
    return kwargs
