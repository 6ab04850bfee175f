"""The data plane: bucket broadcasts over a two-rank gloo group deliver every tensor exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from distributed_fakes import run_ranks

import ludic.distributed.checksum as checksum_module
from ludic.distributed.checksum import ROW, LandedChecksums, RunningChecksums, checksums
from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import (
    BufferPool,
    Collective,
    adjacent_view,
    open_group,
    receive_buckets,
    receive_into,
    send_buckets,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(60)]


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    state = {f"layer{i}.weight": torch.randn(16, 8, generator=g) for i in range(6)}
    state["embed"] = torch.randn(100, 8, generator=g)  # 3200 bytes: travels alone, in place
    state["norm"] = torch.randn(8, generator=g).to(torch.bfloat16)
    state["mask"] = torch.tensor([True, False, True])
    state["count"] = torch.arange(5)
    return state


@pytest.mark.parametrize("piece_bytes", [0, 64])
@pytest.mark.parametrize("bucket_bytes", [1, 700, 1 << 20])
def test_every_tensor_arrives_bit_exact(bucket_bytes: int, piece_bytes: int) -> None:
    state = _state()
    manifest = plan_manifest(state, version=1, bucket_bytes=bucket_bytes, piece_bytes=piece_bytes)

    def send(group: Collective) -> None:
        send_buckets(group, manifest, state, pool=BufferPool("cpu"))

    def receive(group: Collective) -> dict[str, torch.Tensor]:
        return receive_buckets(group, manifest, pool=BufferPool("cpu"))

    _, received = run_ranks([send, receive])
    assert list(received) == list(state)
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


@pytest.mark.parametrize("piece_bytes", [0, 40])
def test_many_packed_buckets_reuse_buffers_without_corruption(piece_bytes: int) -> None:
    # 40 small tensors in 2-tensor buckets: the two packing buffers are reused 20 times, so a
    # buffer overwritten while still on the wire would corrupt some tensor (in pieces too).
    g = torch.Generator().manual_seed(2)
    state = {f"t{i}": torch.randn(32, generator=g) for i in range(40)}
    manifest = plan_manifest(state, version=0, bucket_bytes=2 * 32 * 4, piece_bytes=piece_bytes)
    assert len(manifest.buckets) == 20

    _, received = run_ranks(
        [
            lambda group: send_buckets(group, manifest, state, pool=BufferPool("cpu")),
            lambda group: receive_buckets(group, manifest, pool=BufferPool("cpu")),
        ]
    )
    for name, tensor in state.items():
        assert torch.equal(received[name], tensor), name


def test_one_broadcast_reaches_several_server_ranks() -> None:
    # A tensor-parallel server joins with one rank per shard (world size 1 + TP).
    state = _state()
    manifest = plan_manifest(state, version=0, bucket_bytes=700)

    def receive(group: Collective) -> dict[str, torch.Tensor]:
        return receive_buckets(group, manifest, pool=BufferPool("cpu"))

    _, *receivers = run_ranks(
        [
            lambda group: send_buckets(group, manifest, state, pool=BufferPool("cpu")),
            receive,
            receive,
        ]
    )
    for received in receivers:
        assert all(torch.equal(received[n], t) for n, t in state.items())


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend 'mpi'"):
        open_group(None, rank=0, world_size=2, backend="mpi", timeout_s=1)  # type: ignore[arg-type]


def test_receive_into_lands_lone_tensors_in_the_targets_own_memory() -> None:
    state = _state()
    manifest = plan_manifest(state, version=0, bucket_bytes=1 << 20, alone_bytes=1000)
    targets = {name: torch.zeros_like(t) for name, t in state.items()}
    targets["norm"] = torch.zeros(8)  # a float32 target for a bfloat16 tensor: copied, cast
    pointers = {name: t.data_ptr() for name, t in targets.items()}
    pool = BufferPool("cpu")
    run_ranks(
        [
            lambda group: send_buckets(group, manifest, state, pool=BufferPool("cpu")),
            lambda group: receive_into(group, manifest, targets, pool=pool),
        ]
    )
    for name, tensor in state.items():
        assert torch.equal(targets[name], tensor.to(targets[name].dtype)), name
        assert targets[name].data_ptr() == pointers[name]
    # Through a buffer: the six 512-byte layers (packed, 3072 bytes) and "norm" (16 bytes of
    # bfloat16 for a float32 target). "embed", "mask" and "count" landed in place.
    assert pool.nbytes == 6 * 16 * 8 * 4 + 8 * 2


def test_buffers_are_reused_across_pushes() -> None:
    state = _state()
    manifest = plan_manifest(state, version=0, bucket_bytes=700)
    send_pool, receive_pool = BufferPool("cpu"), BufferPool("cpu")
    sizes = []
    for round_ in range(2):
        pushed = {name: t + round_ if t.is_floating_point() else t for name, t in state.items()}
        _, received = run_ranks(
            [
                lambda group, pushed=pushed: send_buckets(group, manifest, pushed, pool=send_pool),
                lambda group: receive_buckets(group, manifest, pool=receive_pool),
            ]
        )
        assert all(torch.equal(received[n], t) for n, t in pushed.items())
        sizes.append((send_pool.nbytes, receive_pool.nbytes))
    assert sizes[0] == sizes[1]  # the second push allocated nothing new


def test_adjacent_view_spans_tensors_back_to_back_in_one_storage() -> None:
    flat = torch.arange(10.0)
    a, b, c = flat[0:4].view(2, 2), flat[4:7], flat[7:10]
    view = adjacent_view([a, b, c])
    assert view is not None and view.data_ptr() == flat.data_ptr() and view.shape == (10,)
    assert adjacent_view([b, c]) is not None and adjacent_view([b]) is not None
    assert adjacent_view([a, c]) is None  # a gap
    assert adjacent_view([b, a]) is None  # out of order
    assert adjacent_view([torch.zeros(4), torch.zeros(3)]) is None  # separate allocations
    assert adjacent_view([flat.view(2, 5).t()]) is None  # not contiguous


def test_tensors_back_to_back_travel_without_packing_and_land_without_copies() -> None:
    state = {f"layer{i}.weight": torch.randn(16, 8) for i in range(6)}
    manifest = plan_manifest(state, version=0, bucket_bytes=1 << 20)
    assert len(manifest.buckets) == 1  # all six packed into one bucket
    sent = torch.cat([t.reshape(-1) for t in state.values()])  # the sender's params: one buffer
    sender = dict(zip(state, sent.split([t.numel() for t in state.values()]), strict=True))
    sender = {name: t.view(state[name].shape) for name, t in sender.items()}
    received_flat = torch.zeros_like(sent)
    targets = dict(
        zip(state, received_flat.split([t.numel() for t in state.values()]), strict=True)
    )
    targets = {name: t.view(state[name].shape) for name, t in targets.items()}
    send_pool, receive_pool = BufferPool("cpu"), BufferPool("cpu")
    run_ranks(
        [
            lambda group: send_buckets(group, manifest, sender, pool=send_pool),
            lambda group: receive_into(group, manifest, targets, pool=receive_pool),
        ]
    )
    assert torch.equal(received_flat, sent)
    assert send_pool.nbytes == 0 and receive_pool.nbytes == 0  # no packing, no staging


class _Pending:
    def __init__(self, events: list[str], size: int) -> None:
        self.events, self.size, self.done = events, size, False

    def wait(self) -> None:
        if not self.done:
            self.events.append(f"sent {self.size}")
            self.done = True


class _RecordingGroup:
    """A one-rank stand-in for the group: records each broadcast as it is queued and as its
    completion is waited for."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def broadcast(self, tensor: torch.Tensor, root: int) -> _Pending:
        self.events.append(f"queued {len(tensor)}")
        return _Pending(self.events, len(tensor))


def test_progress_is_told_per_piece_once_it_is_sent_with_later_pieces_queued() -> None:
    state = {"a": torch.arange(10.0), "b": torch.full((3,), 2.0)}
    # One tensor per bucket; "a" (40 bytes) goes in pieces of 16 bytes: 4 + 4 + 2 elements.
    manifest = plan_manifest(state, version=1, bucket_bytes=1, piece_bytes=16)
    events: list[str] = []

    def beside(progress: list[tuple[str, torch.Tensor, int]]) -> None:
        events.extend(f"read {name}[:{upto}]" for name, _, upto in progress)

    send_buckets(
        _RecordingGroup(events),
        manifest,
        state,
        pool=BufferPool("cpu"),
        max_in_flight=2,
        on_sent=beside,
    )
    assert events == [
        "queued 4",
        "queued 4",
        "queued 2",
        "sent 4",  # at most two in flight: the first piece is waited for...
        "read a[:4]",  # ...and read at once, while the next two are on the wire
        "queued 3",
        "sent 4",
        "read a[:8]",
        "sent 2",
        "read a[:10]",
        "sent 3",
        "read b[:3]",
    ]


@pytest.mark.parametrize("piece_bytes", [0, 48, 4096])
def test_checksums_taken_piece_by_piece_on_both_sides_equal_the_whole_ones(
    piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(3)
    state = {
        "embed": torch.randn(3 * ROW + 17, generator=g),  # pieces end mid-row
        **{f"small{i}": torch.randn(40, generator=g) for i in range(6)},  # packed
        "half": torch.randn(ROW + 3, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0),
    }
    manifest = plan_manifest(
        state, version=0, bucket_bytes=1024, alone_bytes=512, piece_bytes=piece_bytes
    )
    targets = {name: torch.zeros_like(t) for name, t in state.items()}
    sender, receiver = RunningChecksums(find_nonfinite=True), LandedChecksums()

    def sent(progress: list[tuple[str, torch.Tensor, int]]) -> None:
        for name, tensor, upto in progress:
            sender.advance(name, tensor, upto)

    def landed(progress: list[tuple[str, torch.Tensor, int]]) -> None:
        for name, tensor, upto in progress:
            assert torch.equal(tensor.reshape(-1)[:upto], state[name].reshape(-1)[:upto])
            receiver.advance(name, tensor, upto)

    run_ranks(
        [
            lambda group: send_buckets(
                group, manifest, state, pool=BufferPool("cpu"), on_sent=sent
            ),
            lambda group: receive_into(
                group, manifest, targets, pool=BufferPool("cpu"), on_landed=landed
            ),
        ]
    )
    assert sender.finish() == (checksums(state), [])
    expected = checksums(state)
    again: list[str] = []  # what `held` reads again after the load, not as it landed

    def counting(tensors: Any, **kwargs: Any) -> Any:
        again.extend(tensors)
        return checksums(tensors, **kwargs)

    monkeypatch.setattr(checksum_module, "checksums", counting)
    assert receiver.held(targets) == expected
    assert again == []  # every tensor was checksummed piece by piece as it landed
