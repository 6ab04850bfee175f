"""Sampling parameters, resolved once into OpenAI request kwargs plus backend extras.

Deliberately small: only knobs that every backend (embedded engine, vLLM, SGLang) understands
or that map cleanly onto their extra-body fields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class SamplingConfig:
    """How to sample one completion.

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
        if self.temperature < 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens <= 0:
            raise ValueError(f"SamplingConfig.max_tokens must be > 0, got {self.max_tokens}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingConfig.top_k must be -1 (off) or >= 1, got {self.top_k}")
        object.__setattr__(self, "stop", tuple(self.stop))

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
