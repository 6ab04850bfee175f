"""A replaced trainer's push that fails late (after another trainer's join replaced its
group) leaves the newer trainer alone: its group, its tenure and its state stay, and it
pushes on without a rejoin. Before, the failure forgot whatever group was held."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch
from distributed_fakes import ReceiverTrainer
from fastapi import FastAPI

from ludic.distributed.manifest import plan_manifest
from ludic.inference.http.weight_outcomes import WeightSyncError
from ludic.inference.http.weight_routes import install_weight_sync_routes

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class SlowFailingEngine:
    """Loads whole states; the load of version 1 waits for `fail` and then fails."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        self.fail = threading.Event()

    def update_weights(self, state: Any, *, version: int | None = None, strict: bool = True) -> int:
        if version == 1:
            self.fail.wait()
            raise RuntimeError("the engine could not load version 1")
        self.model.load_state_dict(dict(state), strict=strict)
        return version if version is not None else -1


def test_a_replaced_groups_late_failure_leaves_the_newer_group_alone() -> None:
    engine = SlowFailingEngine()
    receiver = install_weight_sync_routes(FastAPI(), engine, "token")
    state = {n: t.detach().clone() for n, t in engine.model.state_dict().items()}
    old = ReceiverTrainer(receiver, "old-trainer")
    manifest = plan_manifest(state, version=1, bucket_bytes=256)
    receiver.start(manifest, group=old.id)
    old.send(manifest, state)
    failures: list[BaseException] = []

    def finish() -> None:
        try:
            receiver.finish(group=old.id)
        except WeightSyncError as e:
            failures.append(e)

    finishing = threading.Thread(target=finish, daemon=True)
    finishing.start()
    deadline = time.monotonic() + 30
    while receiver.status()["in_progress"]:  # until /finish took the push and waits on it
        assert time.monotonic() < deadline, "/finish never took the push"
        time.sleep(0.01)

    new = ReceiverTrainer(receiver, "new-trainer")  # replaces the old group while its load runs
    engine.fail.set()  # the old push fails now, with the newer group held
    finishing.join(30)
    assert len(failures) == 1 and "could not load version 1" in str(failures[0])

    status = receiver.status()
    assert status["group"] == new.id, status  # its link too (joined, or finishing its join)
    assert status["connected"] or status["joining"], status
    assert status["last_error"] is None, status  # the old group's failure is not its state
    nudged = {n: t + 1.0 for n, t in state.items()}
    manifest = plan_manifest(nudged, version=2, bucket_bytes=256)
    receiver.start(manifest, group=new.id)  # no rejoin
    new.send(manifest, nudged)
    assert receiver.finish(group=new.id).policy_version == 2
    assert all(torch.equal(engine.model.state_dict()[n], t) for n, t in nudged.items())
