"""The wire format of one training sample in Redis: a msgpack header plus raw array bytes.

Entry fields: `h` = msgpack map {format, sample_id, num_tokens, weight, meta, arrays:
[[name, numpy dtype string, nbytes], ...]}, `b` = the arrays' little-endian bytes back to back
(input_ids int32, action_mask uint8, behavior_logprobs float64 when present). Decoding checks
every field, size and value before building a `SAWItem` and raises `PayloadError` naming the
problem, meta included: it must be JSON data, and the keys the learner reads later
(`policy_versions`, `behavior_sampling`, `forced_action_tokens`, `run_id`) well-formed, so that
an entry a foreign or broken writer put on the stream is dead-lettered, never a crash at every
restart of the learner. Nothing is ever unpickled; this module does no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import msgpack
except ImportError as e:  # an optional extra
    raise ImportError("the Redis pipeline needs msgpack: pip install 'ludic[redis]'") from e

from ludic.pipeline.run_check import MAX_RUN_ID, RUN_KEY
from ludic.rollouts.samples import (
    BEHAVIOR_SAMPLING_KEY,
    FORCED_ACTION_TOKENS_KEY,
    SAWItem,
    sampling_runs,
)

FORMAT = 1
HEADER = b"h"
BODY = b"b"
MAX_TOKENS = 1 << 24
_DTYPES = {"input_ids": "<i4", "action_mask": "|u1", "behavior_logprobs": "<f8"}
_HEADER_KEYS = {"format", "sample_id", "num_tokens", "weight", "meta", "arrays"}


class PayloadError(ValueError):
    """A stream entry is not a valid sample payload (the message says what is wrong)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodedSample:
    sample_id: str
    item: SAWItem


def encode_sample(item: SAWItem, *, sample_id: str) -> dict[bytes, bytes]:
    """The Redis stream fields for `item`."""
    if not sample_id:
        raise PayloadError("sample_id must be a non-empty string")
    ids = np.asarray(item.input_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise PayloadError(f"sample {sample_id}: token ids must be in [0, 2**31)")
    arrays: list[tuple[str, np.ndarray[Any, Any]]] = [
        ("input_ids", ids.astype(_DTYPES["input_ids"])),
        ("action_mask", np.asarray(item.action_mask, dtype=_DTYPES["action_mask"])),
    ]
    if item.behavior_logprobs is not None:
        lp = np.asarray(item.behavior_logprobs, dtype=_DTYPES["behavior_logprobs"])
        arrays.append(("behavior_logprobs", lp))
    header = {
        "format": FORMAT,
        "sample_id": sample_id,
        "num_tokens": item.num_tokens,
        "weight": float(item.weight),
        "meta": dict(item.meta),
        "arrays": [[name, a.dtype.str, a.nbytes] for name, a in arrays],
    }
    try:
        packed = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:  # OverflowError: an int past 2**64
        raise PayloadError(f"sample {sample_id}: meta is not JSON-like data ({e})") from e
    return {HEADER: packed, BODY: b"".join(a.tobytes() for _, a in arrays)}


def decode_sample(fields: Mapping[bytes, bytes]) -> DecodedSample:
    """The sample in a stream entry's fields; PayloadError if anything is off."""
    header, body = _parts(fields)
    sample_id, n = header["sample_id"], header["num_tokens"]
    if not isinstance(sample_id, str) or not sample_id or len(sample_id) > 256:
        raise PayloadError("sample_id must be a string of 1-256 characters")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_TOKENS:
        raise PayloadError(f"sample {sample_id}: num_tokens must be an int in [1, {MAX_TOKENS}]")
    weight = header["weight"]
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not math.isfinite(weight):
        raise PayloadError(f"sample {sample_id}: weight must be a finite number, got {weight!r}")
    meta = header["meta"]
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise PayloadError(f"sample {sample_id}: meta must be a map with string keys")
    arrays = _arrays(sample_id, header["arrays"], n, body)
    ids, mask = arrays["input_ids"], arrays["action_mask"]
    if ids.min() < 0:
        raise PayloadError(f"sample {sample_id}: negative token id")
    if mask.max() > 1:
        raise PayloadError(f"sample {sample_id}: action_mask values must be 0 or 1")
    _check_meta(sample_id, meta, int(mask.sum()))
    lp = arrays.get("behavior_logprobs")
    if lp is not None and not np.isfinite(lp).all():
        raise PayloadError(f"sample {sample_id}: behavior_logprobs must be finite")
    item = SAWItem(
        input_ids=tuple(ids.tolist()),
        action_mask=tuple(mask.tolist()),
        weight=float(weight),
        behavior_logprobs=None if lp is None else tuple(lp.tolist()),
        meta={**meta, "sample_id": sample_id},
    )
    return DecodedSample(sample_id=sample_id, item=item)


def _parts(fields: Mapping[bytes, bytes]) -> tuple[dict[str, Any], bytes]:
    raw_header, body = fields.get(HEADER), fields.get(BODY)
    if not isinstance(raw_header, bytes) or not isinstance(body, bytes):
        raise PayloadError(f"entry needs byte fields {HEADER!r} and {BODY!r}, got {sorted(fields)}")
    try:
        header = msgpack.unpackb(raw_header, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise PayloadError(f"header is not msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        keys = sorted(header) if isinstance(header, dict) else type(header).__name__
        raise PayloadError(f"header must be a map with keys {sorted(_HEADER_KEYS)}, got {keys}")
    if header["format"] != FORMAT:
        raise PayloadError(
            f"payload format {header['format']!r}, this learner reads {FORMAT}: run the same "
            "ludic version on actor and learner"
        )
    return header, body


def _check_meta(sample_id: str, meta: dict[str, Any], action_tokens: int) -> None:
    """Refuse meta the learner would crash on later, when the sample is already accepted and a
    restart would read it again: anything but JSON data (a checkpoint records parts of it),
    and malformed values of the keys the learner reads (policy versions for the lag, the
    behaviour sampling runs and forced tokens for the loss)."""
    where = _not_json(meta, "meta")
    if where is not None:
        raise PayloadError(f"sample {sample_id}: {where} is not JSON data (msgpack bin or ext)")
    versions = meta.get("policy_versions", [])
    if not isinstance(versions, list) or not all(_is_count(v) for v in versions):
        raise PayloadError(
            f"sample {sample_id}: meta 'policy_versions' must be a list of ints in [0, 2**63), "
            f"got {versions!r:.200}"
        )
    run = meta.get(RUN_KEY, "-")
    if not isinstance(run, str) or not 0 < len(run) <= MAX_RUN_ID:
        raise PayloadError(
            f"sample {sample_id}: meta {RUN_KEY!r} must be a string of 1-{MAX_RUN_ID} "
            f"characters, got {run!r:.200}"
        )
    forced = meta.get(FORCED_ACTION_TOKENS_KEY, [])
    if not isinstance(forced, list) or not all(_is_count(t) for t in forced):
        raise PayloadError(
            f"sample {sample_id}: meta {FORCED_ACTION_TOKENS_KEY!r} must be a list of ints in "
            f"[0, 2**63), got {forced!r:.200}"
        )
    try:
        runs = sampling_runs(meta)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        raise PayloadError(
            f"sample {sample_id}: meta {BEHAVIOR_SAMPLING_KEY!r} is malformed "
            f"({type(e).__name__}: {e!s:.200})"
        ) from e
    for sampling, tokens in runs:
        if not math.isfinite(sampling.temperature) or not -1 <= sampling.top_k < 2**63:
            raise PayloadError(
                f"sample {sample_id}: meta {BEHAVIOR_SAMPLING_KEY!r} needs a finite temperature "
                f"and top_k in [-1, 2**63), got {sampling}"
            )
        if tokens is not None and tokens < 0:
            raise PayloadError(
                f"sample {sample_id}: meta {BEHAVIOR_SAMPLING_KEY!r} has a run of {tokens} tokens"
            )
    covered = sum(tokens or 0 for _, tokens in runs)
    if runs and runs[-1][1] is not None and covered < action_tokens:
        raise PayloadError(
            f"sample {sample_id}: meta {BEHAVIOR_SAMPLING_KEY!r} covers {covered} action tokens "
            f"but the sample has {action_tokens}"
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _not_json(value: Any, where: str) -> str | None:
    """Where in `value` something is not JSON data (None if nowhere)."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return f"{at} key {key!r:.50}"
                stack.append((inner, f"{at}[{key!r:.50}]"))
        elif isinstance(item, list):
            stack.extend((inner, f"{at}[{i}]") for i, inner in enumerate(item))
        elif not (item is None or isinstance(item, bool | int | float | str)):
            return f"{at} ({type(item).__name__})"
    return None


def _arrays(sample_id: str, specs: Any, n: int, body: bytes) -> dict[str, np.ndarray[Any, Any]]:
    if not isinstance(specs, list):
        raise PayloadError(f"sample {sample_id}: 'arrays' must be a list")
    names = [s[0] if isinstance(s, list) and s else None for s in specs]
    if names not in (
        ["input_ids", "action_mask"],
        ["input_ids", "action_mask", "behavior_logprobs"],
    ):
        raise PayloadError(f"sample {sample_id}: unexpected arrays {names}")
    arrays, offset = {}, 0
    for spec in specs:
        if len(spec) != 3:
            raise PayloadError(
                f"sample {sample_id}: array spec {spec!r} is not [name, dtype, nbytes]"
            )
        name, dtype, nbytes = spec
        expected = np.dtype(_DTYPES[name])
        exact = isinstance(nbytes, int) and not isinstance(nbytes, bool)  # 12.0 == 12, too
        if dtype != expected.str or not exact or nbytes != n * expected.itemsize:
            raise PayloadError(
                f"sample {sample_id}: {name} must be {n} x {expected.str} ({n * expected.itemsize} "
                f"bytes), got {dtype!r} with {nbytes!r} bytes"
            )
        if offset + nbytes > len(body):
            raise PayloadError(f"sample {sample_id}: body is {len(body)} bytes, too short")
        arrays[name] = np.frombuffer(body, dtype=expected, count=n, offset=offset)
        offset += nbytes
    if offset != len(body):
        raise PayloadError(f"sample {sample_id}: body has {len(body) - offset} trailing bytes")
    return arrays
