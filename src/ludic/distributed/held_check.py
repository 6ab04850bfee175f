"""What a server reports holding after a push, compared with what the trainer sent: exact
checksums (the embedded server) or additive totals per rank in the server's own layout (a
fusing, sharding server: vLLM). Pure functions over one server's reply; the publisher turns the
result into a verdict and warnings. It contacts nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ludic.distributed.checksum import (
    Checksum,
    cast_for,
    checksums,
    fold_totals,
    held_name,
    mismatched,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class HeldComparison:
    """`mismatched`: sent tensors the server holds differently; `unverified`: why nothing
    could be compared (None when it was); `unchecked`: sent tensors with no checksum on the
    server, `packed_away` of them held only inside its kernels (the probe is their check)."""

    mismatched: list[str]
    unverified: str | None = None
    unchecked: tuple[str, ...] = ()
    packed_away: tuple[str, ...] = ()


def compare_held(
    reply: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    sent: dict[str, Checksum] | None,
    sent_cast: Mapping[torch.dtype, Mapping[str, Checksum]] | None = None,
) -> HeldComparison:
    """Compare one server's push reply with the sent `tensors` (their checksums: `sent`;
    `sent_cast[dtype]`: checksums of some of them cast to `dtype`, taken beside the send for
    a server expected to hold them in it; any other cast is computed here)."""
    if "checksums" in reply and sent is not None:
        held_dtypes = dict(reply.get("held_dtypes") or {})
        if held_dtypes:  # the server holds some in another dtype: compare the cast
            casts = cast_for(dict(tensors), held_dtypes)
            sent = {**sent, **_cast_checksums(tensors, casts, sent_cast)}
        return HeldComparison(mismatched=mismatched(sent, reply["checksums"]))
    if "held_totals" in reply:  # a server that fuses and shards (vLLM)
        return _compare_folded(reply, tensors, sent, sent_cast)
    return HeldComparison(
        mismatched=[],
        unverified=(
            "the server did not report checksums of the weights it holds, so the load cannot "
            "be verified (upgrade the server, or pass verify=False)"
        ),
    )


def _cast_checksums(
    tensors: Mapping[str, torch.Tensor],
    casts: Mapping[str, torch.dtype],
    ready: Mapping[torch.dtype, Mapping[str, Checksum]] | None,
) -> dict[str, Checksum]:
    """The checksum of each `tensors[name].to(casts[name])`: from `ready` where it was taken,
    else computed now."""
    out: dict[str, Checksum] = {}
    rest: dict[str, torch.dtype] = {}
    for name, dtype in casts.items():
        taken = (ready or {}).get(dtype, {}).get(name)
        if taken is None:
            rest[name] = dtype
        else:
            out[name] = taken
    if rest:
        out.update(checksums({name: tensors[name] for name in rest}, cast_to=rest))
    return out


def _compare_folded(
    reply: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    sent: Mapping[str, Checksum] | None,
    sent_cast: Mapping[torch.dtype, Mapping[str, Checksum]] | None,
) -> HeldComparison:
    held_by_rank: list[dict[str, list[Any]]] = list(reply["held_totals"])
    packed = dict(reply.get("packed_modules_mapping") or {})
    dtypes = {
        name: str(entry[2])
        for held in held_by_rank
        for name, entry in held.items()
        if len(entry) > 2
    }
    casts = {n: dtypes[held_name(n, packed)] for n in tensors if held_name(n, packed) in dtypes}
    cast_to = cast_for(dict(tensors), casts)
    uncast = {n: t for n, t in tensors.items() if n not in cast_to and n not in (sent or {})}
    totals = {
        **(sent or {}),
        **(checksums(uncast) if uncast else {}),
        **_cast_checksums(tensors, cast_to, sent_cast),
    }
    folded = {n: (totals[n][0] & 0xFFFFFFFF, t.numel()) for n, t in tensors.items()}
    held = [{n: [int(e[0]), int(e[1])] for n, e in h.items()} for h in held_by_rank]
    result = fold_totals(folded, held, packed)
    if not result.num_checked:
        return HeldComparison(
            mismatched=[],
            unverified="no tensor the server holds matches a sent name: cannot verify the load",
        )
    opaque = set(reply.get("opaque") or ())
    packed_away = tuple(n for n in result.unverified if held_name(n, packed) in opaque)
    return HeldComparison(
        mismatched=list(result.mismatched),
        unchecked=tuple(result.unverified),
        packed_away=packed_away,
    )
