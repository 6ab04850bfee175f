"""What one push of `BroadcastPolicyPublisher` records and is checked against: `PushStats`
(timings, sizes, which servers took it), `PushCheck` (the sender's checksums, casts and probe,
computed while the servers load), the casts each server is expected to hold,
and the FSDP2 full-state gather. Plain data and pure functions; it contacts nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ludic.distributed.checksum import Checksum
from ludic.distributed.manifest import DTYPES

__all__ = ["PushCheck", "PushStats", "expected_casts", "gather_full_state_dict"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PushStats:
    """Timings and sizes of the last push (seconds), and which servers took it."""

    version: int
    num_bytes: int
    num_buckets: int
    transfer_seconds: float
    verify_seconds: float
    held_checksums: dict[str, list[int]] | None = None
    """What the (first) server reported holding after the load (name -> checksum), when it did."""
    held_totals: list[dict[str, list[Any]]] | None = None
    """A fusing server's (vLLM's) report instead: per rank, parameter -> [total, numel, dtype]
    in its own layout (fused, sharded, vocab padded)."""
    servers: tuple[str, ...] = ()
    """The servers that took and verified this push."""
    missed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Servers that did not take it (URL -> why): unreachable, died mid-push, ..."""
    retried: bool = False
    """The push was redone over a fresh group after a server failed during it."""


@dataclass(slots=True)
class PushCheck:
    """What one push is verified against, computed while the servers load."""

    sent: dict[str, Checksum] = dataclasses.field(default_factory=dict)
    sent_cast: dict[torch.dtype, dict[str, Checksum]] = dataclasses.field(default_factory=dict)
    """Checksums of the tensors cast to a server's dtype, taken beside the send."""
    probe_ids: list[int] | None = None
    expected: list[float] | None = None


def expected_casts(
    tensors: Mapping[str, torch.Tensor], served_dtypes: Iterable[str | None]
) -> dict[torch.dtype, set[str]]:
    """The floating tensors the servers are expected to hold in another dtype (the one each
    server's status reports), by that dtype: their cast checksums are taken beside the send. A
    server holding some in yet another dtype has those computed after its reply."""
    casts: dict[torch.dtype, set[str]] = {}
    for served in served_dtypes:
        dtype = DTYPES.get(served or "")
        if dtype is None or not dtype.is_floating_point:
            continue
        names = {n for n, t in tensors.items() if t.is_floating_point() and t.dtype != dtype}
        if names:
            casts.setdefault(dtype, set()).update(names)
    return casts


def gather_full_state_dict(model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
    """The unsharded state dict of an FSDP2 model: a collective that leaves it on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full: dict[str, Any] = get_model_state_dict(model, options=options)
    return {name: value for name, value in full.items() if isinstance(value, torch.Tensor)}
