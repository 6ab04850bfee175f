"""Rollout requests as pure data, the strategies that expand them, and deterministic seeding.

One `RolloutRequest` is one episode: multiplicity (GRPO groups, repeats) comes from a
`RequestStrategy`, never from a count inside the request. Nothing here runs an episode.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from ludic.inference.sampling import SamplingConfig
from ludic.types import JSON, new_id

SEED_BITS = 63
_SEED_MASK = (1 << SEED_BITS) - 1


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from a hash of `parts`: stable across runs, processes and Python versions.

    Distinct `parts` give independent-looking seeds (blake2b), so seeds from different batches,
    positions or streams only collide with probability ~2^-63 per pair.
    """
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentSpec:
    """A registered factory name and the JSON keyword arguments to call it with."""

    name: str
    kwargs: JSON = field(default_factory=dict)

    def to_dict(self) -> JSON:
        return {"name": self.name, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ComponentSpec:
        return cls(name=d["name"], kwargs=dict(d.get("kwargs", {})))


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutRequest:
    """What to run for one episode: which env and protocol, seeds, sampling and metadata.

    `env_seed` picks the problem (`env.reset(seed)`); `sampling_seed`, when set, overrides
    `sampling.seed` for the episode. `sampling` is the episode's default: a field the agent's
    own `sampling` sets wins over it (`ludic.agents.resolve_sampling`: agent > request >
    `SamplingConfig` defaults; the request's seed wins). `group_id` ties requests whose rollouts share a baseline
    (GRPO). `meta` is copied into every rollout's meta (engine keys take precedence).
    """

    env: ComponentSpec
    protocol: ComponentSpec
    env_seed: int | None = None
    sampling_seed: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    group_id: str | None = None
    request_id: str = field(default_factory=new_id)
    meta: JSON = field(default_factory=dict)

    def episode_sampling(self) -> SamplingConfig:
        """The sampling config the episode runs with (`sampling_seed` applied)."""
        if self.sampling_seed is None:
            return self.sampling
        return self.sampling.with_seed(self.sampling_seed)

    def to_dict(self) -> JSON:
        return {
            "env": self.env.to_dict(),
            "protocol": self.protocol.to_dict(),
            "env_seed": self.env_seed,
            "sampling_seed": self.sampling_seed,
            "sampling": self.sampling.to_dict(),
            "group_id": self.group_id,
            "request_id": self.request_id,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RolloutRequest:
        return cls(
            env=ComponentSpec.from_dict(d["env"]),
            protocol=ComponentSpec.from_dict(d["protocol"]),
            env_seed=d.get("env_seed"),
            sampling_seed=d.get("sampling_seed"),
            sampling=SamplingConfig.from_dict(d.get("sampling", {})),
            group_id=d.get("group_id"),
            request_id=d["request_id"],
            meta=dict(d.get("meta", {})),
        )


@runtime_checkable
class RequestStrategy(Protocol):
    """A one-to-many transform of logical requests into the episodes to run."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class IdentityStrategy:
    """Runs each request once, unchanged."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        return list(requests)


@dataclass(frozen=True, kw_only=True, slots=True)
class GRPORequestStrategy:
    """Expands each request into `group_size` episodes of the same problem.

    Members share the env seed and a group id (the request's `group_id`, else its
    `request_id`) and get distinct sampling seeds `derive_seed(base, "grpo", i)`, where `base`
    is the request's `sampling_seed`, else a hash of its `request_id`. A request without an env
    seed gets one derived from the same base, so all members see the same problem. Expansion
    is deterministic given the requests; give requests fresh seeds per batch (`SeedSequencer`)
    so groups never repeat across batches.
    """

    group_size: int

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"GRPORequestStrategy.group_size must be >= 1, got {self.group_size}")

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        ids = [r.request_id for r in requests if r.group_id is None]
        if len(set(ids)) < len(ids):
            repeated = next(rid for rid in ids if ids.count(rid) > 1)
            raise ValueError(
                f"GRPORequestStrategy: request {repeated!r} appears more than once without a "
                "group_id; its copies would share one group (and its baseline) whatever their "
                "seeds: build one RolloutRequest per problem, or give the copies distinct "
                "request_id / group_id values (RolloutBatchSource renames repeats itself)"
            )
        out: list[RolloutRequest] = []
        for request in requests:
            base = request.sampling_seed
            if base is None:
                base = derive_seed("request", request.request_id)
            env_seed = (
                request.env_seed if request.env_seed is not None else derive_seed(base, "env")
            )
            group_id = request.group_id if request.group_id is not None else request.request_id
            for i in range(self.group_size):
                out.append(
                    replace(
                        request,
                        env_seed=env_seed,
                        sampling_seed=derive_seed(base, "grpo", i),
                        group_id=group_id,
                        request_id=f"{request.request_id}:{i}",
                        meta={**request.meta, "group_index": i, "group_size": self.group_size},
                    )
                )
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SeedSequencer:
    """Derives env and sampling seeds from a run seed, a batch index and a position.

    `seed(stream, batch_index, position)` = `derive_seed(run_seed, stream, batch_index,
    position)`: the same run replays the same seeds; different batches never reuse them.
    """

    run_seed: int

    def env_seed(self, batch_index: int, position: int) -> int:
        return derive_seed(self.run_seed, "env", batch_index, position)

    def sampling_seed(self, batch_index: int, position: int) -> int:
        return derive_seed(self.run_seed, "sampling", batch_index, position)

    def seed_requests(
        self, requests: Sequence[RolloutRequest], batch_index: int
    ) -> list[RolloutRequest]:
        """Fill the seeds each request leaves unset (explicit seeds are kept), by position."""
        return [
            replace(
                r,
                env_seed=r.env_seed if r.env_seed is not None else self.env_seed(batch_index, i),
                sampling_seed=(
                    r.sampling_seed
                    if r.sampling_seed is not None
                    else self.sampling_seed(batch_index, i)
                ),
            )
            for i, r in enumerate(requests)
        ]


def distinct_request_ids(requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
    """The requests, each repeat of a request id renamed `<id>@<position>` (kept unique): the
    same request given twice in a batch (`requests_fn=lambda: [problem] * 4`) is that many
    problems, each its own GRPO group (`GRPORequestStrategy.expand` refuses repeats). What
    RolloutBatchSource and PipelineActor do with each batch's requests."""
    seen: set[str] = set()
    out: list[RolloutRequest] = []
    for position, request in enumerate(requests):
        rid = request.request_id
        if rid in seen:
            rid = f"{request.request_id}@{position}"
            while rid in seen:
                rid += "'"
            request = replace(request, request_id=rid)
        seen.add(rid)
        out.append(request)
    return out
