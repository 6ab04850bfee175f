"""The data plane of a weight push: a standalone two-party process group and bucket broadcasts.

The group is built straight from a TCPStore (gloo on CPU, NCCL on GPU) and never touches the
default process group, so it coexists with FSDP/torchrun. The trainer is rank 0 and hosts the
store; servers are ranks 1.. . Sending overlaps packing bucket k+1 with broadcasting bucket k;
a bucket holding a single tensor is broadcast in place, and can be received in place into a
live model. A bucket larger than the manifest's `piece_bytes` goes as several broadcasts, and
each side is told as each piece is sent or lands (`Progress`), to read it while the next is
on the wire. Buffers are reused across pushes. A receive given a `Cancel` waits in slices
(gloo) and ends with `ReceiveCancelled` once it is set; the broadcasts it posted are left to
finish on a daemon thread holding the group (c10d cannot withdraw them, `abort()` does not
end them on gloo, and freeing a gloo group waits for them). Until they end, a sender that goes
on sending still writes into what they were posted into: the caller must neither serve nor
reuse it (`weight_receiver` drops its pool and moves live targets to fresh storage). This
module does no HTTP.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any, Literal, Protocol, cast

import torch
import torch.distributed as dist

from ludic.distributed.manifest import (
    DTYPES,
    Bucket,
    TensorEntry,
    WeightManifest,
    flatten_into,
    unflatten,
)

Backend = Literal["gloo", "nccl"]


class Work(Protocol):
    def wait(self, timeout: timedelta = ...) -> Any: ...

    def is_completed(self) -> bool: ...


class Collective(Protocol):
    """The one collective weight sync needs (a c10d ProcessGroupGloo / ProcessGroupNCCL)."""

    def broadcast(self, tensor: torch.Tensor, root: int) -> Work: ...


class ReceiveCancelled(RuntimeError):
    """A receive ended by its `Cancel` before its bytes arrived (the message says why)."""


class Cancel:
    """Set from another thread to end a receive in flight (`set(reason)`)."""

    slice_s = 0.25  # how often a cancellable receive looks at it

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = "the receive was cancelled"

    def set(self, reason: str) -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def _wait(work: Work, cancel: Cancel | None) -> None:
    """`work.wait()`; with `cancel`, in slices, raising ReceiveCancelled once it is set."""
    while cancel is not None:
        if cancel.is_set():
            raise ReceiveCancelled(cancel.reason)
        try:
            work.wait(timedelta(seconds=cancel.slice_s))
            return
        except RuntimeError:
            if work.is_completed():  # it failed, not a slice running out: its own error
                raise
    work.wait()


def _left_to_finish(group: Collective, works: list[Work]) -> None:
    """Hold `group` on a daemon thread until `works` (posted, then abandoned) have ended:
    freeing a gloo group blocks until its pending work ends, which must not happen on a
    server's request thread."""

    def drain(held: Collective) -> None:  # `held`: the group, freed when this returns
        for work in works:
            with contextlib.suppress(RuntimeError):  # its sender went away or timed out
                work.wait()

    threading.Thread(target=drain, args=(group,), name="ludic-weights-drain", daemon=True).start()


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


Progress = Callable[[list[tuple[str, torch.Tensor, int]]], object]
"""Told, after each piece of a bucket is sent or has landed, (name, tensor, upto) for each
tensor of that bucket: its first `upto` elements (flat) are final (the same tensor may be
told again with a larger `upto` after a later piece)."""


def _progress(
    entries: list[TensorEntry], of: Mapping[str, torch.Tensor], start: int, end: int
) -> list[tuple[str, torch.Tensor, int]]:
    """(name, tensor, upto) of the entries that elements [start, end) of their bucket reach."""
    return [
        (e.name, of[e.name], min(end - e.offset, e.numel))
        for e in entries
        if e.offset <= end and e.offset + e.numel >= start
    ]


def send_buckets(
    group: Collective,
    manifest: WeightManifest,
    tensors: Mapping[str, torch.Tensor],
    *,
    pool: BufferPool,
    max_in_flight: int = 8,
    on_sent: Progress | None = None,
) -> None:
    """Broadcast every bucket of `manifest` from rank 0, piece by piece (`manifest.pieces`),
    in order; returns when all are sent. `on_sent(progress)` runs as each piece's broadcast
    completes, in order, while the next ones are on the wire (work that overlaps the transfer
    without ever leaving the wire idle and reads each piece just after the transport did,
    e.g. checksums of the tensors sent; it must not write them).

    Tensors must be contiguous, of the manifest's dtypes and on the pool's device. A bucket
    of one tensor, or of tensors lying back to back in one storage, is sent in place; any
    other bucket is packed into one of two pool buffers while the previous one is on the wire.
    Up to `max_in_flight` broadcasts are queued at once (hides the per-collective latency of
    many small tensors).
    """
    in_flight: deque[tuple[Work, list[tuple[str, torch.Tensor, int]]]] = deque()
    queued = retired = 0
    slot_last = [0, 0]  # pieces queued when each pack buffer was last filled and sent

    def retire_through(count: int) -> None:  # wait for the first `count` pieces queued
        nonlocal retired
        while retired < count:
            work, progress = in_flight.popleft()
            work.wait()
            retired += 1
            if on_sent is not None:
                on_sent(progress)

    num_packed = 0
    for bucket, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True):
        slot = None
        flat = adjacent_view([tensors[e.name] for e in entries])
        if flat is not None:  # one tensor, or tensors already back to back: no packing copy
            flat_N = flat
        else:
            slot, num_packed = num_packed % 2, num_packed + 1
            retire_through(slot_last[slot])  # the buffer's last bucket has been sent
            flat_N = pool.get(f"pack{slot}", bucket.nbytes, bucket.dtype)
            flatten_into(flat_N, entries, tensors)
        for start, end in manifest.pieces(bucket):
            work = group.broadcast(flat_N[start:end], 0)
            in_flight.append((work, _progress(entries, tensors, start, end)))
            queued += 1
            retire_through(queued - max_in_flight)
        if slot is not None:
            slot_last[slot] = queued
    retire_through(queued)


def receive_buckets(
    group: Collective,
    manifest: WeightManifest,
    *,
    pool: BufferPool | None = None,
    device: torch.device | str = "cpu",
    cancel: Cancel | None = None,
) -> dict[str, torch.Tensor]:
    """Receive every bucket into `pool` buffers (default: a fresh pool on `device`); returns
    name -> view. The views alias the pool: load them before the next push reuses it.
    `cancel`: see the module docstring (ReceiveCancelled; the pool's buffers may still take
    bytes after: do not reuse it)."""
    pool = pool or BufferPool(device)
    received = []
    for bucket in manifest.buckets:
        flat_N = pool.get(f"bucket{bucket.index}", bucket.nbytes, bucket.dtype)
        received.append((_post(group, manifest, bucket, flat_N), flat_N))
    state: dict[str, torch.Tensor] = {}
    try:
        for (works, flat_N), entries in zip(received, manifest.bucket_entries(), strict=True):
            for work in works:
                _wait(work, cancel)
            state.update(unflatten(flat_N, entries))
    except ReceiveCancelled:
        _left_to_finish(group, [w for works, _ in received for w in works])
        raise
    return state


def _post(
    group: Collective, manifest: WeightManifest, bucket: Bucket, flat_N: torch.Tensor
) -> list[Work]:
    """Post the receive of each piece of `bucket` into its slice of `flat_N`."""
    return [group.broadcast(flat_N[a:b], 0) for a, b in manifest.pieces(bucket)]


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
    posted: deque[tuple[list[Work], torch.Tensor, list[TensorEntry]]] = deque()

    def post(i: int) -> None:
        bucket, entries = buckets[i]
        flat_N = pool.get(f"slot{i % slots}", bucket.nbytes, bucket.dtype)
        posted.append((_post(group, manifest, bucket, flat_N), flat_N, entries))

    for i in range(min(slots, len(buckets))):
        post(i)
    for i in range(len(buckets)):
        works, flat_N, entries = posted.popleft()
        for work in works:
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
    on_landed: Progress | None = None,
    cancel: Cancel | None = None,
) -> None:
    """Receive every bucket straight into `targets` (live tensors, e.g. a model's state dict):
    a bucket whose targets are one tensor, or tensors back to back in one storage (see
    `ludic.inference.weights.pack_parameters_`), of matching dtype and device lands in place;
    the rest via a pool buffer and a copy. Shapes must already have been checked
    (`check_against`). `on_landed(progress)` runs once each piece is in its targets (a bucket
    landing via a copy: once the whole bucket is), while the next ones are still arriving
    (work that overlaps the transfer, e.g. checksums of what landed; it must not write the
    targets). `cancel`: see the module docstring (ReceiveCancelled; the broadcasts left to
    finish still land in the targets if their sender goes on sending)."""
    received = []
    for bucket, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True):
        target = adjacent_view([targets[e.name] for e in entries])
        if target is not None and _receivable_in_place(target, bucket.dtype, pool.device):
            flat_N, copies = target, []
        else:
            flat_N = pool.get(f"bucket{bucket.index}", bucket.nbytes, bucket.dtype)
            copies = entries
        received.append((_post(group, manifest, bucket, flat_N), flat_N, copies))
    try:
        _land(received, manifest, targets, on_landed, cancel)
    except ReceiveCancelled:
        _left_to_finish(group, [w for works, _, _ in received for w in works])
        raise


def _land(
    received: list[tuple[list[Work], torch.Tensor, list[TensorEntry]]],
    manifest: WeightManifest,
    targets: Mapping[str, torch.Tensor],
    on_landed: Progress | None,
    cancel: Cancel | None,
) -> None:
    """Wait for each posted piece of `receive_into` and put what landed in a buffer in place."""
    with torch.no_grad():
        for (works, flat_N, copies), bucket, entries in zip(
            received, manifest.buckets, manifest.bucket_entries(), strict=True
        ):
            for work, (start, end) in zip(works, manifest.pieces(bucket), strict=True):
                _wait(work, cancel)
                if on_landed is not None and not copies:
                    on_landed(_progress(entries, targets, start, end))
            for name, view in unflatten(flat_N, copies).items():
                targets[name].copy_(view)
            if on_landed is not None and copies:
                on_landed(_progress(entries, targets, 0, bucket.numel))


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
