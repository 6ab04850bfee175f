"""FSDP2 on 2 gloo ranks (torchrun): when one rank's shard of the weights turns nan, every rank
raises the same `NonFiniteWeightsError` at the publish, before the gather, and none hangs
waiting in a collective (the one holding the publisher used to raise alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_worker_common import torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
NORM = "model.norm.weight"


def test_a_nan_in_one_ranks_shard_stops_every_rank(tmp_path: Path) -> None:
    torchrun("dist_worker_nonfinite.py", str(tmp_path), timeout_s=240)  # a hang fails here
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        raised = result["raised"]
        assert raised is not None, f"rank {rank} did not raise NonFiniteWeightsError"
        assert raised["names"] == [NORM]  # found on rank 1, named on both
        assert raised["step"] == 2  # the first step after the nan: nothing trained past it
        assert "refused to send policy version 2: 1 tensor(s)" in raised["message"]
        assert "stopped at step 2" in raised["message"]
    assert ranks[0]["raised"]["message"] == ranks[1]["raised"]["message"]
    assert ranks[0]["loads"] == [1]  # version 1 went out; the diverged version 2 never did
