"""What one push of `BroadcastPolicyPublisher` sends, records and is checked against:
`PushStats` (timings, sizes, which servers took it), `PushCheck` (the sender's checksums, casts
and probe, computed while the servers load), the casts each server is expected to hold, the
tensors as they go on the wire and their manifest (`PlanCache`), and the FSDP2 full-state
gather. Plain data and pure functions; it contacts nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ludic.distributed.checksum import Checksum
from ludic.distributed.manifest import DTYPES, WeightManifest, follows, plan_manifest

__all__ = [
    "PlanCache",
    "PushCheck",
    "PushStats",
    "expected_casts",
    "gather_full_state_dict",
    "wire_tensors",
]


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


def wire_tensors(
    state: Mapping[str, torch.Tensor], wire_dtype: torch.dtype | None, device: Any
) -> dict[str, torch.Tensor]:
    """`state` as it goes on the wire: detached, floating tensors cast to `wire_dtype` (if
    any), contiguous on the group's `device`."""
    tensors = {}
    for name, tensor in state.items():
        t = tensor.detach()
        if wire_dtype is not None and t.is_floating_point():
            t = t.to(wire_dtype)
        tensors[name] = t.to(device).contiguous()
    return tensors


class PlanCache:
    """The push's manifest: the last plan (with the new version) while names, shapes, dtypes,
    which tensors lie back to back (one bucket) and the plan's settings are unchanged, as they
    are from one training step to the next."""

    def __init__(self) -> None:
        self._last: tuple[list[Any], WeightManifest] | None = None

    @property
    def last(self) -> WeightManifest | None:
        """The manifest of the last push planned (its first version), if any."""
        return None if self._last is None else self._last[1]

    def plan(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        *,
        checksums: bool,
        bucket_bytes: int,
        alone_bytes: int,
        piece_bytes: int,
    ) -> WeightManifest:
        signature = [
            checksums,
            piece_bytes,
            *((name, t.shape, t.dtype) for name, t in tensors.items()),
            follows(list(tensors.values())),
        ]
        if self._last is None or self._last[0] != signature:
            plan = plan_manifest(
                tensors,
                version=version,
                bucket_bytes=bucket_bytes,
                alone_bytes=alone_bytes,
                piece_bytes=piece_bytes,
                checksums=checksums,
            )
            self._last = (signature, plan)
        return dataclasses.replace(self._last[1], version=version)
