"""Requests as pure data, GRPO expansion and deterministic, non-repeating seeds."""

from __future__ import annotations

import json

import pytest

from ludic.inference.sampling import SamplingConfig
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    IdentityStrategy,
    RequestStrategy,
    RolloutRequest,
    SeedSequencer,
    derive_seed,
)


def request(**kwargs) -> RolloutRequest:
    defaults = dict(
        env=ComponentSpec(name="count", kwargs={"length": 3}),
        protocol=ComponentSpec(name="loop", kwargs={"max_steps": 5}),
    )
    return RolloutRequest(**{**defaults, **kwargs})


def test_request_json_round_trip() -> None:
    r = request(
        env_seed=7,
        sampling_seed=11,
        group_id="g",
        request_id="r1",
        sampling=SamplingConfig(temperature=0.5, stop=("x",), max_tokens=9),
        meta={"difficulty": 2, "tags": ["a"]},
    )
    text = json.dumps(r.to_dict())
    assert RolloutRequest.from_dict(json.loads(text)) == r
    assert not hasattr(r, "num_episodes")


def test_sampling_seed_overrides_the_config_seed() -> None:
    assert request(sampling=SamplingConfig(seed=1)).episode_sampling().seed == 1
    assert request(sampling=SamplingConfig(seed=1), sampling_seed=5).episode_sampling().seed == 5


def test_identity_strategy_keeps_requests() -> None:
    rs = [request(request_id="a"), request(request_id="b")]
    assert IdentityStrategy().expand(rs) == rs
    assert isinstance(IdentityStrategy(), RequestStrategy)


def test_grpo_expansion_shares_env_seed_and_group_with_distinct_sampling_seeds() -> None:
    strategy = GRPORequestStrategy(group_size=4)
    assert isinstance(strategy, RequestStrategy)
    rs = [
        request(env_seed=3, sampling_seed=100, request_id="a"),
        request(env_seed=4, sampling_seed=200, request_id="b"),
    ]
    out = strategy.expand(rs)
    assert len(out) == 8
    for logical, members in (("a", out[:4]), ("b", out[4:])):
        assert {m.group_id for m in members} == {logical}
        assert len({m.env_seed for m in members}) == 1
        assert len({m.sampling_seed for m in members}) == 4
        assert [m.meta["group_index"] for m in members] == [0, 1, 2, 3]
        assert len({m.request_id for m in members}) == 4
    assert out[0].env_seed == 3 and out[4].env_seed == 4
    # Deterministic: the same logical requests expand to the same episodes.
    assert strategy.expand(rs) == out
    # Different logical sampling seeds give disjoint member seeds.
    assert not {m.sampling_seed for m in out[:4]} & {m.sampling_seed for m in out[4:]}


def test_grpo_without_seeds_derives_them_from_the_request_id() -> None:
    out = GRPORequestStrategy(group_size=3).expand([request(request_id="q1")])
    assert out[0].env_seed is not None and len({m.env_seed for m in out}) == 1
    assert out == GRPORequestStrategy(group_size=3).expand([request(request_id="q1")])
    other = GRPORequestStrategy(group_size=3).expand([request(request_id="q2")])
    assert other[0].env_seed != out[0].env_seed


def test_grpo_keeps_an_explicit_group_id_and_rejects_empty_groups() -> None:
    out = GRPORequestStrategy(group_size=2).expand([request(group_id="mine")])
    assert {m.group_id for m in out} == {"mine"}
    with pytest.raises(ValueError, match="group_size"):
        GRPORequestStrategy(group_size=0)


def test_derive_seed_is_stable_and_63_bit() -> None:
    # Pinned value: seeds must not change across Python versions or processes.
    assert derive_seed(0, "env", 0, 0) == 7503306085401639846
    assert derive_seed(1, 2) != derive_seed(12) and derive_seed("1", 2) != derive_seed(1, 2)
    seeds = [derive_seed(i) for i in range(1000)]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 1000


def test_seed_sequencer_is_deterministic_and_never_repeats_across_batches() -> None:
    seq = SeedSequencer(run_seed=42)
    env_seeds = [seq.env_seed(b, p) for b in range(50) for p in range(32)]
    sampling_seeds = [seq.sampling_seed(b, p) for b in range(50) for p in range(32)]
    assert len(set(env_seeds)) == len(env_seeds) == 1600
    assert len(set(sampling_seeds)) == 1600
    assert not set(env_seeds) & set(sampling_seeds)
    assert env_seeds == [
        SeedSequencer(run_seed=42).env_seed(b, p) for b in range(50) for p in range(32)
    ]
    assert SeedSequencer(run_seed=43).env_seed(0, 0) != seq.env_seed(0, 0)


def test_seeded_grpo_batches_never_reuse_a_sampling_seed() -> None:
    seq = SeedSequencer(run_seed=0)
    strategy = GRPORequestStrategy(group_size=8)
    template = [request(request_id=f"q{i}") for i in range(16)]
    seen: list[int] = []
    for batch in range(20):
        for m in strategy.expand(seq.seed_requests(template, batch_index=batch)):
            assert m.sampling_seed is not None
            seen.append(m.sampling_seed)
    assert len(seen) == len(set(seen)) == 20 * 16 * 8


def test_seed_requests_fills_only_missing_seeds() -> None:
    seq = SeedSequencer(run_seed=5)
    fixed, free = seq.seed_requests([request(env_seed=1, sampling_seed=2), request()], 3)
    assert (fixed.env_seed, fixed.sampling_seed) == (1, 2)
    assert (free.env_seed, free.sampling_seed) == (seq.env_seed(3, 1), seq.sampling_seed(3, 1))
