"""A fresh learner started after a killed one on the same stream, each side a `ludic` command in
its own process around a real redis-server and `ludic serve` (README "Decoupled actor and learner
over Redis"): the first learner trains 3 steps on the actor's 3 batches (sampled at version 0),
publishing versions 1..3, and is killed (SIGKILL: no cleanup) before its first checkpoint, while
it waits for samples; the actor, restarted, pushes 2 batches the server still samples at the dead
learner's version 3. A fresh learner (its own --out-dir) then numbers its weights past every
published version (4 on, published once its first sample shows the record is its own run's),
trains the 12 version-0 samples the
killed one never acknowledged (its replay), drops the dead version's 8 loudly (a warning, counted
as pipeline/dead_branch), trains 2 steps of new samples and never repeats a version: its steps
publish 5..9, the server ends at 9, the actors' versions never go back, and no sample is
trained twice."""

from __future__ import annotations

import signal
import subprocess
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
    served_version,
    spawn,
    until,
)

from ludic.models import tiny_model_dir
from ludic.pipeline.versions import published_record


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(2400)  # a chain of launches; the shared CI box is slow
def test_a_fresh_learner_after_a_killed_one_never_repeats_a_version(tmp_path: Path) -> None:
    model = str(tiny_model_dir(seed=0))

    def launch(command: list[str], log: str) -> subprocess.Popen[bytes]:
        return spawn(command, tmp_path / log, LUDIC_SERVER_TOKEN=TOKEN)

    with pipeline_servers(tmp_path, model) as servers:
        actor = say_o_actor(servers, "--max-backlog", "16")
        learner = [
            *ludic("learner", *servers.flags, "--model", model, "--batch-size", "4"),
            *("--lr", "1e-2", "--ledger", "--max-lag", "None", "--lease-ttl-s", "3"),
        ]
        first = launch([*learner, "--steps", "1000", "--out-dir", "l1"], "l1.log")
        finish(launch([*actor, "--batches", "3"], "a1.log"), tmp_path / "a1.log")
        until(lambda: served_version(servers.url) == 3, "the first learner's third publish")
        first.kill()  # killed waiting for its 4th batch, before any checkpoint
        first.wait()
        redis_url = f"redis://127.0.0.1:{servers.redis_port}/0"
        killed_at = published_record(redis_url, "ludic:samples")
        # the server still serves the dead learner's version 3: these samples carry it
        finish(launch([*actor, "--batches", "2"], "a2.log"), tmp_path / "a2.log")
        running = launch([*actor, "--batches", "1000"], "a3.log")
        second_log = tmp_path / "l2.log"
        finish(launch([*learner, "--steps", "5", "--out-dir", "l2"], "l2.log"), second_log)
        running.send_signal(signal.SIGTERM)
        finish(running, tmp_path / "a3.log", code=143)
        final_version = served_version(servers.url)
        trained = ledger_ids(redis.Redis(port=servers.redis_port))

    assert killed_at is not None and killed_at.version == 3 and killed_at.run is not None
    said = second_log.read_text()
    assert "published policy versions up to 3, past the 0 this one starts from" in said
    assert "numbers its weights 4 on" in said
    assert "the record names run" not in said  # decided at its first sample: its own run
    assert "published by a learner killed before this one started, past the version 0" in said
    assert "(its checkpoint's; 0: a fresh learner) and numbers 4 on" in said
    assert "every sample of versions 1..3 are dropped, counted as pipeline/dead_branch" in said
    assert "dropped as a killed learner's (versions past this one's start)" in said
    first_steps = records(tmp_path / "l1" / "metrics.jsonl")
    second_steps = records(tmp_path / "l2" / "metrics.jsonl")
    assert [m["policy_version"] for m in first_steps] == [1, 2, 3]
    assert [m["policy_version"] for m in second_steps] == [5, 6, 7, 8, 9]  # 4: the fork's
    assert final_version == 9
    dead = sum(m.get("batch/pipeline/dead_branch", 0) for m in second_steps)
    assert dead >= 8, second_steps  # the 2 batches sampled at version 3, each dropped
    # the killed learner's unacknowledged version-0 samples, in the closing line's words
    assert "12 redelivered (read but not acknowledged" in said
    assert not [i for i, n in Counter(trained).items() if n > 1]
    versions = [b["policy_version_max"] for b in records(tmp_path / "actor.jsonl")]
    assert versions == sorted(versions) and versions[-1] >= 4, versions
