"""FSDP2 on 2 gloo ranks (torchrun): an error raised by what only rank 0 holds (its publisher,
the checkpoint it writes, its logger, its part of `eval_fn`), or by rank 1's own code in a
step (its batch source, its loss), stops every rank at the same step: the failed rank raises
its own error (type kept), the other a `RankFailedError` naming it and the cause, and neither
is left waiting in a collective (the launcher's timeout fails the test)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dist_worker_common import ALGORITHM, batches_for, torchrun_exit, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.training import CheckpointConfig, CheckpointManager, Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

# mode: (rank 0's own error class, what rank 1's error says rank 0 was doing, the cause, step)
CASES = {
    "publish": ("WeightPushError", "publishing policy version 2", "409 version conflict", 2),
    "checkpoint": (
        "CheckpointSaveError",
        "saving the checkpoint of step 4",
        "No space left on device",
        4,
    ),
    "logger": ("OSError", "logging step 2", "No space left on device", 2),
    "eval": ("ConnectionError", "evaluating at step 2", "unreachable", 2),
}

# mode: (rank 1's own error class, what rank 0's error says rank 1 was doing, the cause)
ON_RANK_1 = {
    "source": ("ConnectionError", "fetching the batch of step 3", "closed the connection"),
    "loss": ("ValueError", "computing the loss of step 3", "advantages_B holds a nan"),
}


Outcome = tuple[Path, int, str, dict[int, dict[str, Any]]]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Outcome]:
    """`outcome(mode)`: the mode's directory, the launch's exit status and output, and each
    rank's error. One torchrun runs every mode in turn, each with its own Trainer (a launch
    costs more than a mode's steps); a mode whose error did not leave the rank's script, as
    it would have made a script of that mode alone exit non-zero, fails its tests."""
    out = tmp_path_factory.mktemp("rank-failures")
    modes = [*sorted(CASES), *sorted(ON_RANK_1)]
    code, output = torchrun_exit("dist_worker_rank_failure.py", str(out), *modes, timeout_s=300)
    return lambda mode: _outcome(out / mode, code, output)


def _outcome(tmp_path: Path, code: int, output: str) -> Outcome:
    raised = {}
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        started = re.findall(r"rank \d: mode '(\w+)'", output)  # the worker's per-mode line
        assert path.exists(), (
            f"rank {rank} wrote no result (killed, not stopped; modes started, last: "
            f"{started[-1:]}):\n{output[-4000:]}"
        )
        raised[rank] = json.loads(path.read_text())["raised"]
        assert raised[rank] is not None, f"rank {rank} raised nothing:\n{output[-4000:]}"
        escaped = tmp_path / f"rank{rank}.escaped"
        assert escaped.exists(), f"rank {rank}'s error did not leave it:\n{output[-4000:]}"
        assert escaped.read_text() == raised[rank]["type"]
    return tmp_path, code, output, raised


@pytest.mark.parametrize("mode", sorted(CASES))
def test_a_failure_on_rank_0_stops_every_rank_naming_it(
    outcome: Callable[[str], Outcome], mode: str
) -> None:
    own_type, doing, cause, step = CASES[mode]
    _, code, output, raised = outcome(mode)
    assert code != 0, output[-4000:]
    # rank 0 raises its own error, type kept (callers catching WeightPushError still do)
    assert raised[0]["type"] == own_type, raised[0]
    assert cause in raised[0]["message"]
    # rank 1 stops too, saying which rank failed, doing what, and why
    other = raised[1]
    assert other["type"] == "RankFailedError" and "RuntimeError" in other["classes"], other
    assert "rank 0" in other["message"] and doing in other["message"], other["message"]
    assert cause in other["message"] and own_type in other["message"], other["message"]
    assert raised[0]["step"] == raised[1]["step"] == step


@pytest.mark.parametrize("mode", sorted(ON_RANK_1))
def test_a_failure_in_rank_1s_own_step_stops_every_rank_naming_it(
    outcome: Callable[[str], Outcome], mode: str
) -> None:
    own_type, doing, cause = ON_RANK_1[mode]
    _, code, output, raised = outcome(mode)
    assert code != 0, output[-4000:]
    assert raised[1]["type"] == own_type and cause in raised[1]["message"], raised[1]
    other = raised[0]
    assert other["type"] == "RankFailedError", other
    assert "rank 1 failed while " + doing in other["message"], other["message"]
    assert f"{own_type}: " in other["message"] and cause in other["message"], other["message"]
    assert raised[0]["step"] == raised[1]["step"] == 2  # two steps done, the third failed


def test_a_failed_save_on_rank_0_leaves_the_last_good_checkpoint_loadable(
    outcome: Callable[[str], Outcome],
) -> None:
    tmp_path, _, _, raised = outcome("checkpoint")
    assert raised[1]["type"] == "RankFailedError"
    root = tmp_path / "checkpoints"
    manager = CheckpointManager(CheckpointConfig(dir=str(root)))
    assert manager.latest() == manager.path_for(2)
    assert [p.name for p in root.iterdir()] == ["step_00000002"]  # no half-written step 4 left
    # one process resumes from it and trains on
    trainer = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource(batches_for(0, 1)),
        trainer_config(root, every_n_steps=2),
    )
    assert trainer.resume() == 2
    assert trainer.policy_version == 2
    assert len(trainer.run(1, progress=False)) == 1
