"""The sample wire format: exact round trips, and clear refusals of anything malformed."""

from __future__ import annotations

import pickle
from typing import Any

import msgpack
import pytest
from pipeline_fakes import sample

from ludic.pipeline.codec import BODY, HEADER, PayloadError, decode_sample, encode_sample
from ludic.rollouts.samples import SAWItem


@pytest.mark.parametrize("logprobs", [True, False])
def test_round_trip_is_exact_and_adds_the_sample_id(logprobs: bool) -> None:
    item = SAWItem(
        input_ids=(0, 5, 2**31 - 1, 7),
        action_mask=(0, 1, 1, 0),
        weight=-0.123456789012345,
        behavior_logprobs=(0.0, -1e-9, -123.456789012345, 0.0) if logprobs else None,
        meta={"policy_versions": [3, 4], "nested": {"a": [1, None, True]}, "reward": 0.5},
    )
    decoded = decode_sample(encode_sample(item, sample_id="actor:0:1"))
    assert decoded.sample_id == "actor:0:1"
    assert decoded.item.input_ids == item.input_ids
    assert decoded.item.action_mask == item.action_mask
    assert decoded.item.weight == item.weight
    assert decoded.item.behavior_logprobs == item.behavior_logprobs  # float64: bit-exact
    assert decoded.item.meta == {**item.meta, "sample_id": "actor:0:1"}
    assert decoded.item.policy_versions == (3, 4)


def _fields(**header_changes: Any) -> dict[bytes, bytes]:
    fields = encode_sample(sample(4), sample_id="s")
    header = msgpack.unpackb(fields[HEADER])
    header.update(header_changes)
    return {HEADER: msgpack.packb(header), BODY: fields[BODY]}


def _with_body(body: bytes) -> dict[bytes, bytes]:
    return {HEADER: encode_sample(sample(4), sample_id="s")[HEADER], BODY: body}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({HEADER: b"x"}, "needs byte fields"),
        ({HEADER: b"\xc1\xc1", BODY: b""}, "header is not msgpack"),
        ({HEADER: pickle.dumps({"a": 1}), BODY: b""}, "header"),
        ({HEADER: msgpack.packb([1, 2]), BODY: b""}, "header must be a map"),
        (_fields(format=2), "payload format 2"),
        (_fields(sample_id=""), "sample_id must be a string"),
        (_fields(num_tokens=0), "num_tokens must be an int"),
        (_fields(weight=float("nan")), "weight must be a finite number"),
        (_fields(weight="1"), "weight must be a finite number"),
        (_fields(meta=[1]), "meta must be a map"),
        (_fields(arrays=[["input_ids", "<i4", 16]]), "unexpected arrays"),
        (
            _fields(arrays=[["input_ids", "<i8", 32], ["action_mask", "|u1", 4]]),
            "input_ids must be 4 x <i4",
        ),
        (_fields(num_tokens=5), "input_ids must be 5 x <i4"),
        (_with_body(b"\x00" * 3), "too short"),
        (_with_body(encode_sample(sample(4), sample_id="s")[BODY] + b"\x00"), "trailing bytes"),
    ],
)
def test_malformed_entries_are_refused(fields: dict[bytes, bytes], message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode_sample(fields)


def test_bad_values_are_refused() -> None:
    good = encode_sample(sample(4, logprobs=True), sample_id="s")
    body = bytearray(good[BODY])
    body[16] = 2  # first action_mask byte
    with pytest.raises(PayloadError, match="action_mask values must be 0 or 1"):
        decode_sample({HEADER: good[HEADER], BODY: bytes(body)})
    body = bytearray(good[BODY])
    body[0:4] = (-1).to_bytes(4, "little", signed=True)
    with pytest.raises(PayloadError, match="negative token id"):
        decode_sample({HEADER: good[HEADER], BODY: bytes(body)})
    body = bytearray(good[BODY])
    body[20:28] = bytes.fromhex("000000000000f87f")  # float64 nan, little-endian
    with pytest.raises(PayloadError, match="behavior_logprobs must be finite"):
        decode_sample({HEADER: good[HEADER], BODY: bytes(body)})


def test_encode_refuses_what_cannot_travel() -> None:
    with pytest.raises(PayloadError, match="token ids must be in"):
        encode_sample(SAWItem(input_ids=(-1,), action_mask=(1,), weight=1.0), sample_id="s")
    with pytest.raises(PayloadError, match="meta is not JSON-like"):
        bad = SAWItem(input_ids=(1,), action_mask=(1,), weight=1.0, meta={"x": object()})
        encode_sample(bad, sample_id="s")
    with pytest.raises(PayloadError, match="non-empty"):
        encode_sample(sample(2), sample_id="")
