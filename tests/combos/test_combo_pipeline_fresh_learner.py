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
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis
from combo_pipeline import (
    TOKEN,
    finish,
    free_port,
    ledger_ids,
    ludic,
    records,
    spawn,
    start_redis,
    until,
)

from ludic.models import tiny_model_dir
from ludic.pipeline.versions import published_record


def _served_version(url: str) -> int | None:
    try:
        reply = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
    except httpx.TransportError:  # still loading its model
        return None
    return int(reply.json()["policy_version"]) if reply.status_code == 200 else None


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(2400)  # a chain of launches; the shared CI box is slow
def test_a_fresh_learner_after_a_killed_one_never_repeats_a_version(tmp_path: Path) -> None:
    store, port = start_redis(tmp_path)
    serve_port = free_port()
    model = str(tiny_model_dir(seed=0))
    server = spawn(
        ludic("serve", "--model", model, "--port", str(serve_port), "--threads", "1"),
        tmp_path / "serve.log",
    )
    served = f"http://127.0.0.1:{serve_port}"
    urls = ["--redis-url", f"redis://127.0.0.1:{port}/0", "--server-url", served]
    actor = [
        *ludic("actor", *urls, "--env", "combo_say_o:SayOEnv", "--max-steps", "1"),
        *("--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2"),
        *("--actor-id", "a0", "--max-backlog", "16", "--metrics-path", "actor.jsonl"),
    ]
    learner = [
        *ludic("learner", *urls, "--model", model, "--batch-size", "4", "--lr", "1e-2"),
        *("--ledger", "--max-lag", "None", "--lease-ttl-s", "3"),
    ]
    try:
        first = spawn([*learner, "--steps", "1000", "--out-dir", "l1"], tmp_path / "l1.log")
        finish(spawn([*actor, "--batches", "3"], tmp_path / "a1.log"), tmp_path / "a1.log")
        until(lambda: _served_version(served) == 3, "the first learner's third publish")
        first.kill()  # killed waiting for its 4th batch, before any checkpoint
        first.wait()
        killed_at = published_record(f"redis://127.0.0.1:{port}/0", "ludic:samples")
        # the server still serves the dead learner's version 3: these samples carry it
        finish(spawn([*actor, "--batches", "2"], tmp_path / "a2.log"), tmp_path / "a2.log")
        running = spawn([*actor, "--batches", "1000"], tmp_path / "a3.log")
        second_log = tmp_path / "l2.log"
        second = spawn([*learner, "--steps", "5", "--out-dir", "l2"], second_log)
        finish(second, second_log)
        running.send_signal(signal.SIGTERM)
        finish(running, tmp_path / "a3.log", code=143)
        final_version = _served_version(served)
        trained = ledger_ids(redis.Redis(port=port))
    finally:
        for process in (server, store):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

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
    assert "'redelivered': 12" in said  # the killed learner's unacknowledged version-0 samples
    assert not [i for i, n in Counter(trained).items() if n > 1]
    versions = [b["policy_version_max"] for b in records(tmp_path / "actor.jsonl")]
    assert versions == sorted(versions) and versions[-1] >= 4, versions
