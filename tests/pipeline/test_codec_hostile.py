"""Hostile stream entries: a header whose fields hold the right values in the wrong types, and
meta the learner reads later (policy versions, behaviour sampling, forced tokens, anything that
is not JSON) refused when decoded, as `PayloadError`, so the learner dead-letters the entry
instead of crashing on it at every restart. Unit checks, then a real redis-server."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline.codec import BODY, HEADER, PayloadError, decode_sample, encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.rollouts.samples import SAWItem

__all__ = ["redis_server"]


def _entry(*, arrays: Any = None, **meta: Any) -> dict[bytes, bytes]:
    """sample(4) (2 action tokens, with logprobs) with its header's arrays or meta changed."""
    fields = encode_sample(sample(4), sample_id="s")
    header = msgpack.unpackb(fields[HEADER])
    header["meta"].update(meta)
    if arrays is not None:
        header["arrays"] = arrays
    return {HEADER: msgpack.packb(header, datetime=False), BODY: fields[BODY]}


FLOAT_SIZES = [["input_ids", "<i4", 16.0], ["action_mask", "|u1", 4.0], ["behavior_logprobs", "<f8", 32.0]]  # fmt: skip
RUN = {"temperature": 0.7, "top_k": -1, "top_p": 1.0}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (_entry(arrays=FLOAT_SIZES), "input_ids must be 4 x <i4"),
        (_entry(policy_versions="abc"), "'policy_versions' must be a list of ints"),
        (_entry(policy_versions=5), "'policy_versions' must be a list of ints"),
        (_entry(policy_versions=[None]), "'policy_versions' must be a list of ints"),
        (_entry(policy_versions=[True]), "'policy_versions' must be a list of ints"),
        (_entry(policy_versions=[-1]), "'policy_versions' must be a list of ints"),
        (_entry(policy_versions=[2**64 - 1]), "'policy_versions' must be a list of ints"),
        (_entry(forced_action_tokens="ab"), "'forced_action_tokens' must be a list of ints"),
        (_entry(forced_action_tokens=[1.5]), "'forced_action_tokens' must be a list of ints"),
        (_entry(behavior_sampling=5), "'behavior_sampling' is malformed"),
        (_entry(behavior_sampling=[{"x": 1}]), "'behavior_sampling' is malformed"),
        (_entry(behavior_sampling=[5]), "'behavior_sampling' is malformed"),
        (_entry(behavior_sampling={**RUN, "top_p": 0}), "'behavior_sampling' is malformed"),
        (_entry(behavior_sampling={**RUN, "temperature": float("inf")}), "finite temperature"),
        (_entry(behavior_sampling={**RUN, "top_k": 2**64 - 1}), "top_k in"),
        (_entry(behavior_sampling=[{**RUN, "tokens": 1}]), "covers 1 action tokens but .* 2"),
        (_entry(behavior_sampling=[{**RUN, "tokens": -3}, {**RUN, "tokens": 5}]), "run of -3"),
        (_entry(x=msgpack.ExtType(5, b"abc")), r"meta\['x'\] \(ExtType\) is not JSON"),
        (_entry(x={"t": msgpack.Timestamp(1, 0)}), r"meta\['x'\]\['t'\] \(Timestamp\)"),
        (_entry(credit={"flags": b"\x00"}), r"meta\['credit'\]\['flags'\] \(bytes\)"),
    ],
)
def test_hostile_header_values_are_payload_errors(fields: dict[bytes, bytes], message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode_sample(fields)


def test_what_the_actor_writes_still_decodes() -> None:
    fields = _entry(
        policy_versions=[0, 3],
        forced_action_tokens=[1],
        behavior_sampling=[{**RUN, "tokens": 1}, {**RUN, "top_k": 5, "tokens": 1}],
        credit={"algorithm": "grpo", "flags": {"x": [1, None, 2.5]}},
    )
    item = decode_sample(fields).item
    assert item.policy_versions == (0, 3) and item.meta["forced_action_tokens"] == [1]
    assert decode_sample(_entry(behavior_sampling=RUN)).item.meta["behavior_sampling"] == RUN


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_the_learner_dead_letters_a_hostile_entry_and_trains_the_rest(
    redis_server: RedisServer,
) -> None:
    """Before: the float sizes raised TypeError out of `next_batch` (the learner's traceback),
    and the entry, left pending, crashed the restarted learner again."""
    stream = SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2)
    await stream.ensure_group()
    await stream.add(encode_sample(sample(4), sample_id="good0"))
    await stream.add(_entry(arrays=FLOAT_SIZES))
    await stream.add(_entry(policy_versions="abc"))
    await stream.add(encode_sample(sample(4), sample_id="good1"))
    source = PipelineBatchSource(
        stream, batch_size=2, block_ms=100, max_lag=4, current_version=lambda: 0
    )
    batch = await source.next_batch()
    assert [item.meta["sample_id"] for item in batch.items] == ["good0", "good1"]
    assert batch.stats["pipeline/invalid"] == 2.0
    errors = [f[b"error"] for _, f in redis_server.client().xrange("s:dead")]
    assert b"input_ids must be 4 x <i4" in errors[0] and b"policy_versions" in errors[1]


def test_encode_names_an_int_msgpack_cannot_pack() -> None:
    """Before: msgpack's OverflowError escaped encode_sample, not the PayloadError it promises."""
    item = SAWItem(input_ids=(1,), action_mask=(1,), weight=1.0, meta={"x": 10**23})
    with pytest.raises(PayloadError, match="sample s: meta is not JSON-like data"):
        encode_sample(item, sample_id="s")
