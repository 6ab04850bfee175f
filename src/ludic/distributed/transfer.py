"""The data plane of a weight push: a standalone two-party process group and bucket broadcasts.

The group is built straight from a TCPStore (gloo on CPU, NCCL on GPU) and never touches the
default process group, so it coexists with FSDP/torchrun. The trainer is rank 0 and hosts the
store; servers are ranks 1.. . Sending overlaps packing bucket k+1 with broadcasting bucket k;
a bucket holding a single tensor is broadcast in place, and can be received in place into a
live model. Buffers are reused across pushes. This module does no HTTP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Literal, Protocol, cast

import torch
import torch.distributed as dist

from ludic.distributed.manifest import (
    DTYPES,
    TensorEntry,
    WeightManifest,
    flatten_into,
    unflatten,
)

Backend = Literal["gloo", "nccl"]


class Work(Protocol):
    def wait(self) -> Any: ...


class Collective(Protocol):
    """The one collective weight sync needs (a c10d ProcessGroupGloo / ProcessGroupNCCL)."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> Work: ...


def host_store(host: str, port: int, *, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's TCPStore (port 0: pick a free one; read it back from `store.port`)."""
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def join_store(host: str, port: int, *, world_size: int, timeout_s: float) -> dist.TCPStore:
    """A client of rank 0's TCPStore."""
    return dist.TCPStore(
        host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s)
    )


def open_group(
    store: dist.Store, *, rank: int, world_size: int, backend: Backend, timeout_s: float
) -> Collective:
    """Build the group on `store`; blocks until every rank has joined (or the timeout)."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}: use 'gloo' (CPU) or 'nccl' (GPU)")
    timeout = timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore("ludic-weights", store)
    if backend == "gloo":
        return cast(Collective, dist.ProcessGroupGloo(prefixed, rank, world_size, timeout))
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return cast(Collective, dist.ProcessGroupNCCL(prefixed, rank, world_size, options))


class BufferPool:
    """Byte buffers kept from one push to the next, by name: freshly allocated memory is slow
    to fault in (it can cost more than the transfer), so packing and receiving reuse these."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, nbytes: int, dtype: str) -> torch.Tensor:
        """A flat `dtype` view of buffer `key`, at least `nbytes` long (grown when too small)."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < nbytes:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self._buffers[key] = buffer
        return buffer[:nbytes].view(DTYPES[dtype])

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self._buffers.values())


def send_buckets(
    group: Collective,
    manifest: WeightManifest,
    tensors: Mapping[str, torch.Tensor],
    *,
    pool: BufferPool,
    max_in_flight: int = 8,
    while_sending: Callable[[list[TensorEntry]], object] | None = None,
) -> None:
    """Broadcast every bucket of `manifest` from rank 0, in order; returns when all are sent.
    `while_sending(entries)` runs for each bucket once it and the next one are queued (work
    that overlaps the transfer without ever leaving the wire idle, e.g. checksums of the
    tensors sent; it must not write them).

    Tensors must be contiguous, of the manifest's dtypes and on the pool's device. A bucket
    of one tensor, or of tensors lying back to back in one storage, is sent in place; any
    other bucket is packed into one of two pool buffers while the previous one is on the wire.
    Up to `max_in_flight` broadcasts are queued at once (hides the per-collective latency of
    many small tensors).
    """
    slot_work: list[Work | None] = [None, None]
    in_flight: deque[Work] = deque()
    num_packed = 0
    queued: list[TensorEntry] | None = None  # the bucket before this one, not yet overlapped
    for bucket, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True):
        slot = None
        flat = adjacent_view([tensors[e.name] for e in entries])
        if flat is not None:  # one tensor, or tensors already back to back: no packing copy
            flat_N = flat
        else:
            slot, num_packed = num_packed % 2, num_packed + 1
            if (previous := slot_work[slot]) is not None:
                previous.wait()  # the buffer is still being broadcast
            flat_N = pool.get(f"pack{slot}", bucket.nbytes, bucket.dtype)
            flatten_into(flat_N, entries, tensors)
        work = group.broadcast(flat_N, 0)
        if slot is not None:
            slot_work[slot] = work
        in_flight.append(work)
        if while_sending is not None and queued is not None:
            while_sending(queued)
        queued = entries
        while len(in_flight) > max_in_flight:
            in_flight.popleft().wait()
    if while_sending is not None and queued is not None:
        while_sending(queued)
    for work in in_flight:
        work.wait()


def receive_buckets(
    group: Collective,
    manifest: WeightManifest,
    *,
    pool: BufferPool | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Receive every bucket into `pool` buffers (default: a fresh pool on `device`); returns
    name -> view. The views alias the pool: load them before the next push reuses it."""
    pool = pool or BufferPool(device)
    received = []
    for bucket in manifest.buckets:
        flat_N = pool.get(f"bucket{bucket.index}", bucket.nbytes, bucket.dtype)
        received.append((group.broadcast(flat_N, 0), flat_N))
    state: dict[str, torch.Tensor] = {}
    for (work, flat_N), entries in zip(received, manifest.bucket_entries(), strict=True):
        work.wait()
        state.update(unflatten(flat_N, entries))
    return state


def receive_each_bucket(
    group: Collective,
    manifest: WeightManifest,
    *,
    pool: BufferPool,
    slots: int = 2,
) -> Iterator[dict[str, torch.Tensor]]:
    """Receive the buckets of `manifest` one after another, yielding each as name -> view as
    soon as it has arrived, for the caller to load before the next is taken: at most `slots`
    buckets are held at once (two pool buffers, the next bucket arriving while the caller
    loads this one), never the whole model. Each view is valid until the next-but-one bucket
    lands in its buffer: load (copy) it before asking for more. The generator must be run to
    the end (every broadcast must be matched)."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    buckets = list(zip(manifest.buckets, manifest.bucket_entries(), strict=True))
    posted: deque[tuple[Work, torch.Tensor, list[TensorEntry]]] = deque()

    def post(i: int) -> None:
        bucket, entries = buckets[i]
        flat_N = pool.get(f"slot{i % slots}", bucket.nbytes, bucket.dtype)
        posted.append((group.broadcast(flat_N, 0), flat_N, entries))

    for i in range(min(slots, len(buckets))):
        post(i)
    for i in range(len(buckets)):
        work, flat_N, entries = posted.popleft()
        work.wait()
        yield unflatten(flat_N, entries)
        if i + slots < len(buckets):  # this bucket is loaded: its buffer takes the next
            post(i + slots)


def receive_into(
    group: Collective,
    manifest: WeightManifest,
    targets: Mapping[str, torch.Tensor],
    *,
    pool: BufferPool,
    landed: Callable[[list[TensorEntry]], object] | None = None,
) -> None:
    """Receive every bucket straight into `targets` (live tensors, e.g. a model's state dict):
    a bucket whose targets are one tensor, or tensors back to back in one storage (see
    `ludic.inference.weights.pack_parameters_`), of matching dtype and device lands in place;
    the rest via a pool buffer and a copy. Shapes must already have been checked
    (`check_against`). `landed(entries)` runs once each bucket is in its targets, while the
    next ones are still arriving (work that overlaps the transfer, e.g. checksums of what
    landed; it must not write the targets)."""
    received = []
    for bucket, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True):
        target = adjacent_view([targets[e.name] for e in entries])
        if target is not None and _receivable_in_place(target, bucket.dtype, pool.device):
            flat_N, copies = target, []
        else:
            flat_N = pool.get(f"bucket{bucket.index}", bucket.nbytes, bucket.dtype)
            copies = entries
        received.append((group.broadcast(flat_N, 0), flat_N, copies))
    with torch.no_grad():
        for (work, flat_N, copies), entries in zip(
            received, manifest.bucket_entries(), strict=True
        ):
            work.wait()
            for name, view in unflatten(flat_N, copies).items():
                targets[name].copy_(view)
            if landed is not None:
                landed(entries)


def adjacent_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """A flat view spanning `tensors` when they lie back to back, in this order, in one
    storage (contiguous, one dtype and device); else None. One tensor: its flat view."""
    first = tensors[0]
    if not first.is_contiguous():
        return None
    if len(tensors) == 1:
        return first.view(-1)
    storage, end = first.untyped_storage().data_ptr(), first.data_ptr()
    for t in tensors:
        if (
            t.data_ptr() != end
            or not t.is_contiguous()
            or t.dtype != first.dtype
            or t.device != first.device
            or t.untyped_storage().data_ptr() != storage
        ):
            return None
        end += t.numel() * t.element_size()
    numel = sum(t.numel() for t in tensors)
    flat: torch.Tensor = first.new_empty(0)
    return flat.set_(first.untyped_storage(), first.storage_offset(), (numel,), (1,))  # type: ignore[call-overload]


def _receivable_in_place(target: torch.Tensor, dtype: str, device: torch.device) -> bool:
    return (
        target.dtype == DTYPES[dtype]
        and target.is_contiguous()
        and target.device.type == device.type
    )
