"""The Redis pipeline as README "Decoupled actor and learner over Redis" runs it, each side a
`ludic` command in its own process around a real redis-server and `ludic serve`: the learner
trains 3 steps with checkpoints and stops; the actor, ahead of it by its backlog, is stopped
with SIGTERM and restarted with the same flags; the learner is started again (resuming its
checkpoint) to step 6, and the actor stopped again. No sample is trained twice (the commit ledger), the restarted actor continues its batch
sequence instead of repeating it, the policy versions it samples at never go back, and the
learner's steps run 1..6 once each."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
import redis
from combo_processes import (
    TOKEN,
    finish,
    ledger_ids,
    ludic,
    pipeline_servers,
    records,
    say_o_actor,
    spawn,
)

from ludic.models import tiny_model_dir


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(2400)  # a chain of launches; the shared CI box is slow
def test_actor_restarted_and_learner_resumed_train_each_sample_once(tmp_path: Path) -> None:
    model = str(tiny_model_dir(seed=0))
    with pipeline_servers(tmp_path, model) as servers:
        actor = say_o_actor(servers, "--max-backlog", "8")
        learner = [
            *ludic("learner", *servers.flags, "--model", model, "--batch-size", "4"),
            *("--lr", "1e-2", "--checkpoint-every", "1", "--out-dir", "learner", "--ledger"),
            *("--max-lag", "None"),
        ]
        for launch in (1, 2):  # the actor runs ahead (its backlog) until it is stopped
            actor_log, learner_log = tmp_path / f"actor{launch}.log", tmp_path / f"l{launch}.log"
            running = spawn([*actor, "--batches", "1000"], actor_log, LUDIC_SERVER_TOKEN=TOKEN)
            training = spawn(
                [*learner, "--steps", str(3 * launch)], learner_log, LUDIC_SERVER_TOKEN=TOKEN
            )
            finish(training, learner_log)
            running.send_signal(signal.SIGTERM)
            finish(running, actor_log, code=143)
        trained = ledger_ids(redis.Redis(port=servers.redis_port))

    assert "resumed from step 3" in (tmp_path / "l2.log").read_text()
    steps = records(tmp_path / "learner" / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    assert len(trained) == 24 and not [i for i, n in Counter(trained).items() if n > 1]
    batches = records(tmp_path / "actor.jsonl")
    indices = [b["batch_index"] for b in batches]
    assert indices == sorted(set(indices)), indices  # the restart went on, repeating none
    versions = [b["policy_version_max"] for b in batches]
    assert versions == sorted(versions) and versions[-1] >= 3, versions
