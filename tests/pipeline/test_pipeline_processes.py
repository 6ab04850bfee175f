"""The pipeline as separate processes on one machine, with a real redis-server: server + actor
+ learner train and publish; a learner killed mid-run and restarted consumes every sample
exactly once (per the commit ledger), also as 2 data-parallel torchrun ranks with either rank
killed; a Redis restart mid-run is survived by both sides."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from pipeline_fakes import (
    SMALL_SPEC,
    RedisServer,
    free_port,
    redis_server,
    spawn,
    start_server,
    until,
)

from ludic.models import tiny_model_dir
from ludic.pipeline.lease import lease_key

pytestmark = [
    pytest.mark.redis,
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.timeout(420),
]
__all__ = ["redis_server"]
SPEC = SMALL_SPEC
TOKEN = "pipeline-token"
ENV = ["--env", "pipeline_fakes:CountOEnv", "--max-steps", "1", "--max-tokens", "8"]


def _actor(redis: RedisServer, out: Path, *, batches: int, extra: list[str]) -> list[str]:
    return [
        "-m", "ludic.pipeline", "actor", "--redis-url", redis.url, *ENV,
        "--problems-per-batch", "2", "--group-size", "2", "--batches", str(batches),
        "--actor-id", "a", "--metrics-path", str(out / "actor.jsonl"), *extra,
    ]  # fmt: skip


def _learner(redis: RedisServer, out: Path, *, extra: list[str]) -> list[str]:
    return [
        "-m", "ludic.pipeline", "learner", "--redis-url", redis.url,
        "--model", str(tiny_model_dir(spec=SPEC)), "--batch-size", "4", "--lr", "1e-2",
        "--ledger", "--out-dir", str(out / "learner"), *extra,
    ]  # fmt: skip


def _wait(process: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"process still running:\n{log.read_text()[-3000:]}") from None
    assert code == 0, f"exit code {code}:\n{log.read_text()[-3000:]}"


def _produced_ids(out: Path) -> list[str]:
    batches = [json.loads(line) for line in (out / "actor.jsonl").read_text().splitlines()]
    return [f"a:{b['batch_index']}:{i}" for b in batches for i in range(b["num_samples"])]


def _sample_ids(redis: RedisServer, consumer: str | None = None) -> list[str]:
    """Ledger entries that are real samples (not duplicate:/invalid:/trimmed: markers), acked
    by `consumer` (None: by any)."""
    raw = redis.client().xrange("ludic:samples:ledger")
    ids = [
        i
        for _, f in raw
        if consumer is None or f[b"consumer"].decode() == consumer
        for i in json.loads(f[b"ids"])
    ]
    return [i for i in ids if i.split(":", 1)[0] not in ("duplicate", "invalid", "trimmed")]


def _start_server(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    args = [
        "-m", "ludic.inference.http.server", "--model", str(tiny_model_dir(spec=SPEC)),
        "--token", TOKEN, "--threads", "1", "--served-model-name", "tiny",
    ]  # fmt: skip
    return start_server(args, log)


def test_server_actor_learner_train_and_publish(redis_server: RedisServer, tmp_path: Path) -> None:
    server, url = _start_server(tmp_path / "server.log")
    try:
        actor = spawn(
            _actor(
                redis_server, tmp_path, batches=4, extra=["--server-url", url, "--max-backlog", "4"]
            ),
            tmp_path / "actor.log",
        )
        learner = spawn(
            _learner(
                redis_server,
                tmp_path,
                extra=["--server-url", url, "--token", TOKEN, "--steps", "4", "--max-lag", "3"],
            ),
            tmp_path / "learner.log",
        )
        _wait(learner, tmp_path / "learner.log")
        _wait(actor, tmp_path / "actor.log")
        version = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
        assert version.json()["policy_version"] == 4  # every step published and verified
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    steps = [json.loads(line) for line in (tmp_path / "learner" / "metrics.jsonl").open()]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all("time/publish_seconds" in m for m in steps)
    model = tmp_path / "learner" / "checkpoints" / "step_00000004" / "model"
    assert "learner done at step 4: " in (tmp_path / "learner.log").read_text()
    assert f"; model: {model}" in (tmp_path / "learner.log").read_text() and model.is_dir()
    batches = [json.loads(line) for line in (tmp_path / "actor.jsonl").open()]
    # with a backlog of one batch, the last batch was sampled after a publish
    assert max(b["policy_version_max"] for b in batches) >= 1
    assert Counter(_sample_ids(redis_server)) == Counter(_produced_ids(tmp_path))


@pytest.mark.parametrize("checkpoint_every", [None, 2])
def test_killed_learner_restarts_and_consumes_each_sample_once(
    redis_server: RedisServer, tmp_path: Path, checkpoint_every: int | None
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=10, extra=model), tmp_path / "actor.log")
    # The lease outlives the restarted process's startup (imports) on any load, so the restart
    # finds it held and waits; once it says so, the test expires the lease (as Redis does one
    # ttl after the SIGKILL) rather than sitting out the ttl.
    extra = ["--max-wait-s", "8", "--max-lag", "None", "--lease-ttl-s", "120"]
    extra += ["--checkpoint-every", str(checkpoint_every)]
    first = spawn(
        _learner(redis_server, tmp_path, extra=["--steps", "1000", *extra]),
        tmp_path / "learner1.log",
    )
    until(lambda: len(_sample_ids(redis_server)) >= 8, "the first learner's commits")
    first.kill()  # SIGKILL: no cleanup, whatever it read and did not commit stays pending
    first.wait()
    (lease,) = redis_server.client().keys(lease_key("ludic:samples", "*", "*"))
    killed_holder = redis_server.client().get(lease)
    assert killed_holder is not None and json.loads(killed_holder)["pid"] == first.pid
    assert redis_server.client().pttl(lease) > 0  # it expires, as a killed holder's lease must
    killed_at = len(_sample_ids(redis_server))
    # The second learner stops at the step that trains the last of the 40 samples (batches of
    # 4): it resumes at its checkpoint's step, or starts at step 0 without checkpoints. Had it
    # to wait out --max-wait-s instead, that idle wait would be most of the test's time; a
    # sample lost or trained twice still leaves the ledger short or long (the asserts below).
    steps = 10 if checkpoint_every else -(-(40 - killed_at) // 4)
    second_log = tmp_path / "learner2.log"
    second = spawn(
        _learner(redis_server, tmp_path, extra=["--steps", str(steps), *extra]), second_log
    )
    until(
        lambda: (
            "for the previous holder's lease" in second_log.read_text() or second.poll() is not None
        ),
        "the restart to find the killed learner's lease",
    )
    # restarted under the killed one's consumer name before its lease expired: it waits the
    # lease out, neither refused (the holder renews nothing) nor taking it early
    assert "waiting up to 120s for the previous holder's lease" in second_log.read_text()
    assert second.poll() is None and redis_server.client().get(lease) == killed_holder
    redis_server.client().delete(lease)  # the killed lease's ttl is over

    def leased_by_second() -> bool:
        value = redis_server.client().get(lease)
        return value is not None and json.loads(value)["pid"] == second.pid

    until(lambda: leased_by_second() or second.poll() is not None, "the restart's lease")
    _wait(actor, tmp_path / "actor.log")
    _wait(second, second_log)
    produced = _produced_ids(tmp_path)
    assert len(produced) == 40 and killed_at < 40
    assert Counter(_sample_ids(redis_server)) == Counter(produced)  # none lost, none twice
    assert redis_server.client().xlen("ludic:samples") == 0


def test_a_second_learner_under_a_live_consumer_name_is_refused(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=6, extra=model), tmp_path / "actor.log")
    _wait(actor, tmp_path / "actor.log")
    # 24 samples in batches of 4, and 7 steps: the first learner waits for a last batch
    extra = ["--steps", "7", "--max-lag", "None", "--checkpoint-every", "2"]
    first = spawn(_learner(redis_server, tmp_path, extra=extra), tmp_path / "learner1.log")
    until(lambda: len(_sample_ids(redis_server)) >= 4, "the first learner's first acks")
    # the README's mistake: the same --redis-url, stream, group and default --consumer
    other = _learner(redis_server, tmp_path / "other", extra=[*extra, "--lease-ttl-s", "2"])
    second = spawn(other, tmp_path / "learner2.log")
    assert second.wait(timeout=120) == 1
    log = (tmp_path / "learner2.log").read_text()
    assert "ludic learner: error: learner consumer 'learner-r0'" in log
    assert f"pid {first.pid}" in log and "--consumer" in log
    assert first.poll() is None  # refused while the first one runs
    actor = spawn(_actor(redis_server, tmp_path, batches=1, extra=model), tmp_path / "actor.log")
    _wait(actor, tmp_path / "actor.log")
    _wait(first, tmp_path / "learner1.log")
    assert len(_produced_ids(tmp_path)) == 28
    assert Counter(_sample_ids(redis_server)) == Counter(_produced_ids(tmp_path))  # each once
    assert set(_sample_ids(redis_server, "learner-r0")) == set(_produced_ids(tmp_path))
    assert not (tmp_path / "other" / "learner" / "metrics.jsonl").exists()  # it trained nothing


def _torchrun_learner(redis: RedisServer, out: Path, extra: list[str], log: Path) -> Any:
    launch = ["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    launch += [f"--master_port={free_port()}", "--monitor-interval=0.2"]
    learner = _learner(redis, out, extra=extra)
    return spawn([*launch, *learner[:1], *learner[1:]], log)


def _rank_pid(launcher: subprocess.Popen[bytes], rank: int) -> int | None:
    """The pid of torchrun's worker with RANK=`rank` (None until it has started)."""
    proc = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    for pid in proc.read_text().split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    return None


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds ranks through /proc")
@pytest.mark.parametrize("killed_rank", [1, 0])
def test_two_learner_ranks_train_each_sample_once_across_a_kill(
    redis_server: RedisServer, tmp_path: Path, killed_rank: int
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=10, extra=model), tmp_path / "actor.log")
    extra = ["--max-wait-s", "8", "--max-lag", "None", "--batch-size", "2"]
    extra += ["--checkpoint-every", "2", "--lease-ttl-s", "5"]
    first = _torchrun_learner(
        redis_server, tmp_path, ["--steps", "1000", *extra], tmp_path / "learner1.log"
    )
    # the checkpoint at step 2 is acked when step 3 starts: 2 steps x 2 ranks x 2 samples
    until(lambda: len(_sample_ids(redis_server)) >= 8, "the first learners' acks")
    pid = _rank_pid(first, killed_rank)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert first.wait(timeout=120) != 0  # torchrun stops the other rank and fails
    killed_at = len(_sample_ids(redis_server))
    # 40 samples, 2 per rank per step: the restarted pair resumes at its checkpoint's step and
    # stops at step 10, the one that trains the last sample (no idle --max-wait-s at the end).
    second = _torchrun_learner(
        redis_server, tmp_path, ["--steps", "10", *extra], tmp_path / "learner2.log"
    )
    _wait(actor, tmp_path / "actor.log")
    _wait(second, tmp_path / "learner2.log")
    produced = _produced_ids(tmp_path)
    assert len(produced) == 40 and killed_at < 40
    assert Counter(_sample_ids(redis_server)) == Counter(produced)  # none lost, none twice
    assert _sample_ids(redis_server, "learner-r0") and _sample_ids(redis_server, "learner-r1")
    assert redis_server.client().xlen("ludic:samples") == 0
    log = (tmp_path / "learner2.log").read_text()
    assert "resumed from step" in log
    # the step and closing lines count both ranks' samples: 2 per rank per step, 40 in all
    # (minus what the checkpoint already held, plus the replayed ones)
    assert ": 4 samples on 2 ranks (policy lag max" in log
    done = log.split("learner done at step 10: ", 1)[1].split("\n", 1)[0]
    found = re.match(r"(\d+) samples read on 2 ranks", done)
    assert found is not None
    trained_after_resume = int(found.group(1))
    resumed_steps = [json.loads(line) for line in (tmp_path / "learner" / "metrics.jsonl").open()]
    resumed_at = int(log.split("resumed from step ", 1)[1].split(" ", 1)[0])
    assert trained_after_resume == 4 * (10 - resumed_at)
    assert resumed_steps[-1]["step"] == 10


def test_both_sides_survive_a_redis_restart(redis_server: RedisServer, tmp_path: Path) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=12, extra=model), tmp_path / "actor.log")
    # 48 samples in batches of 4: the learner stops at step 12, the one that trains the last.
    extra = ["--steps", "12", "--max-wait-s", "10", "--max-lag", "None", "--checkpoint-every", "2"]
    learner = spawn(_learner(redis_server, tmp_path, extra=extra), tmp_path / "learner.log")
    until(lambda: len(_sample_ids(redis_server)) >= 4, "the learner's first commit")
    # Redis stays down until the learner has failed a command and is retrying (it cannot finish
    # without Redis), and the actor too unless it had pushed everything: a fixed outage could
    # fall inside a learner step and go unnoticed (it did under CI load).
    redis_server.stop()
    learner_log, actor_log = tmp_path / "learner.log", tmp_path / "actor.log"
    until(lambda: "retry" in learner_log.read_text(), "the learner retrying while Redis is down")
    until(
        lambda: "retry" in actor_log.read_text() or actor.poll() is not None,
        "the actor retrying while Redis is down",
    )
    redis_server.start()
    _wait(actor, tmp_path / "actor.log")
    _wait(learner, tmp_path / "learner.log")
    produced = _produced_ids(tmp_path)
    assert len(produced) == 48
    assert Counter(_sample_ids(redis_server)) == Counter(produced)
