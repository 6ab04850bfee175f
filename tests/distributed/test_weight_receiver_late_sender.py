"""A trainer replaced mid-push that goes on sending writes nothing the server serves or
reuses: c10d cannot withdraw the receives the cancelled push posted, so the bytes still land,
but (received in place) in the old storage of the live tensors, which the receiver moved to
fresh storage before generation resumed, or (received into buffers) in a buffer pool the
receiver dropped with the group. Here the newer trainer's push lands first, then the old
trainer's leftovers: the served model keeps the newer weights, bit for bit, and the
receiver's buffers keep the newer push's bytes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from distributed_fakes import ReceiverTrainer
from fastapi import FastAPI

from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import Collective, Work
from ludic.inference.http import weight_receiver
from ludic.inference.http.weight_routes import install_weight_sync_routes

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]
TIMEOUT_S = 30.0


class Engine:
    """A served model: loads whole states, or (`in_place`) runs a fill between steps."""

    def __init__(self, in_place: bool) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
        if in_place:
            self.update_weights_in_place = self._in_place

    def update_weights(self, state: Any, *, version: int | None = None, strict: bool = True) -> int:
        self.model.load_state_dict(dict(state), strict=strict)
        return version if version is not None else -1

    def _in_place(self, fill: Callable[[torch.nn.Module], None], *, version: int | None) -> int:
        with torch.no_grad():
            fill(self.model)
        return version if version is not None else -1


class Recording:
    """A group that keeps the works of the broadcasts posted on it."""

    def __init__(self, group: Collective, works: list[Work]) -> None:
        self.group, self.works = group, works

    def broadcast(self, tensor: torch.Tensor, root: int) -> Work:
        work = self.group.broadcast(tensor, root)
        self.works.append(work)
        return work


@pytest.fixture()
def posted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Work]]:
    """The works of every receive the receiver posts (to wait until late bytes landed)."""
    works: list[Work] = []
    for name in ("receive_into", "receive_buckets"):
        real = getattr(weight_receiver, name)

        def recording(group: Collective, *args: Any, _real: Any = real, **kw: Any) -> Any:
            return _real(Recording(group, works), *args, **kw)

        monkeypatch.setattr(weight_receiver, name, recording)
    yield works


def _state(engine: Engine, value: float) -> dict[str, torch.Tensor]:
    return {n: torch.full_like(t, value) for n, t in engine.model.state_dict().items()}


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "buffers"])
def test_a_replaced_trainers_late_bytes_never_reach_the_served_model(
    in_place: bool, posted: list[Work]
) -> None:
    engine = Engine(in_place)
    receiver = install_weight_sync_routes(FastAPI(), engine, "token")
    old_state, new_state = _state(engine, 7.0), _state(engine, -3.0)
    # One bucket of a single tensor, one of three packed: both land in place once arranged.
    manifest = plan_manifest(old_state, version=1, bucket_bytes=32 * 32 * 4)
    assert sorted(len(b) for b in manifest.bucket_entries()) == [1, 3]

    old = ReceiverTrainer(receiver, "old-trainer")
    receiver.start(manifest, group=old.id)  # its trainer stalls: no byte comes yet
    old_push = receiver._push
    assert old_push is not None

    new = ReceiverTrainer(
        receiver, "new-trainer"
    )  # replaces the old group: its receive is cancelled
    with pytest.raises(weight_receiver.ReceiveCancelled):
        old_push.result(timeout=TIMEOUT_S)
    old_works = posted[:]  # posted before it looked at its cancel
    assert len(old_works) == len(manifest.buckets)
    new_manifest = plan_manifest(new_state, version=2, bucket_bytes=32 * 32 * 4)
    receiver.start(new_manifest, group=new.id)
    new.send(new_manifest, new_state)
    assert receiver.finish(group=new.id).policy_version == 2
    served = {n: t.clone() for n, t in engine.model.state_dict().items()}
    assert all(torch.equal(served[n], new_state[n]) for n in new_state)
    buffers = [b.clone() for b in receiver._pool._buffers.values()]

    old.send(manifest, old_state)  # the old trainer goes on sending after all
    for work in old_works:  # its bytes have landed wherever its receives were posted
        work.wait()
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, new_state[name]), f"{name} took the replaced trainer's bytes"
    now = list(receiver._pool._buffers.values())
    assert len(now) == len(buffers)
    assert all(torch.equal(a, b) for a, b in zip(buffers, now, strict=True)), (
        "a buffer the next push reuses took the replaced trainer's bytes"
    )
