"""A receive given a `Cancel` ends with `ReceiveCancelled` once it is set, while its bytes
have not come (a sender that stalled), instead of at the group's timeout; what it posted is
left to a daemon thread, which ends once the sender sends after all."""

from __future__ import annotations

import threading

import pytest
import torch
from distributed_fakes import run_ranks

from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import (
    BufferPool,
    Cancel,
    Collective,
    ReceiveCancelled,
    receive_buckets,
    receive_into,
    send_buckets,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(60)]
LONG_S = 600.0  # the group's timeout: a receive that waited for it fails the test


class CancelAfterFirstLook(Cancel):
    """Set (with its reason) from the second time a receive looks: one slice has passed with
    no byte, as when the group is replaced while its sender stalls."""

    slice_s = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def is_set(self) -> bool:
        self.looks += 1
        if self.looks == 2:
            self.set("a newer weight-sync group replaced this one")
        return super().is_set()


@pytest.mark.parametrize("into", [False, True], ids=["buffers", "in-place"])
def test_a_cancelled_receive_ends_before_its_bytes_come(into: bool) -> None:
    state = {"w": torch.randn(64), "b": torch.randn(8)}
    manifest = plan_manifest(state, version=1, bucket_bytes=1 << 20)
    targets = {name: torch.zeros_like(t) for name, t in state.items()}
    ended = threading.Event()

    def sender(group: Collective) -> None:
        ended.wait()  # stalls until the receiver gave up, then sends after all
        send_buckets(group, manifest, state, pool=BufferPool("cpu"))

    def receiver(group: Collective) -> str:
        cancel = CancelAfterFirstLook()
        try:
            if into:
                receive_into(group, manifest, targets, pool=BufferPool("cpu"), cancel=cancel)
            else:
                receive_buckets(group, manifest, cancel=cancel)
        except ReceiveCancelled as e:
            return str(e)
        finally:
            ended.set()
        raise AssertionError("the receive was not cancelled")

    _, said = run_ranks([sender, receiver], timeout_s=LONG_S)
    assert said == "a newer weight-sync group replaced this one"
