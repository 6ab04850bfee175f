"""`ludic sft` -> the Redis pipeline on its checkpoint -> `ludic eval` of the learner's, each a
new process in one working directory, as README "Decoupled actor and learner over Redis" runs
it with MODEL_DIR the SFT checkpoint's model folder for both `ludic serve` (at `--policy-version
0`, as README "Inference" says for RL after `ludic sft`) and `ludic learner`: the learner trains
its steps once each, on samples none of which is trained twice or sampled ahead of its policy,
and publishes each step to the server; `ludic eval` loads the learner's last checkpoint and
plays it at its policy version."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis
from combo2_processes import finish, free_port, ludic, records, run, serve, start, stop

REPO = Path(__file__).resolve().parents[2]
TOKEN = "combo2-token"
SFT_MODEL = "sft/checkpoints/step_00000002/model"
STEPS = 3


def _redis(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    port = free_port()
    (tmp_path / "redis").mkdir()
    store = start(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1"),
            *("--dir", str(tmp_path / "redis"), "--appendonly", "yes"),
            *("--appendfsync", "always", "--save", ""),
        ],
        tmp_path,
    )
    return store, port


def _ledger_ids(client: redis.Redis) -> list[str]:
    ids = [i for _, f in client.xrange("ludic:samples:ledger") for i in json.loads(f[b"ids"])]
    return [i for i in ids if i.split(":", 1)[0] not in ("duplicate", "invalid", "trimmed")]


@pytest.mark.slow
@pytest.mark.redis
def test_sft_checkpoint_trained_over_redis_then_evaluated(tmp_path: Path) -> None:
    expert = [sys.executable, str(REPO / "examples" / "rejection_sampling.py")]
    run([*expert, "--expert", "--problems", "8", "--out", "data/expert.jsonl"], tmp_path)
    sft = run(
        ludic(
            *("sft", "--data", "data/expert.jsonl", "--steps", "2", "--batch-size", "8"),
            *("--out-dir", "sft", "--no-progress"),
        ),
        tmp_path,
    )
    assert SFT_MODEL in sft

    store, port = _redis(tmp_path)
    # At version 0, the learner's first (README "Inference": RL after `ludic sft`), not the
    # SFT checkpoint's saved one, so the actor's samples before the first push are not ahead.
    serve_log = tmp_path / "serve.log"
    server, url = serve(tmp_path / SFT_MODEL, tmp_path, serve_log, TOKEN, "--policy-version", "0")
    urls = ("--redis-url", f"redis://127.0.0.1:{port}/0", "--server-url", url)
    env = {"LUDIC_SERVER_TOKEN": TOKEN}
    try:
        actor = start(
            ludic(
                *("actor", *urls, "--env", "tictactoe", "--max-steps", "3", "--max-tokens", "8"),
                *("--problems-per-batch", "2", "--group-size", "2", "--actor-id", "a0"),
                *("--max-backlog", "16", "--batches", "1000", "--metrics-path", "actor.jsonl"),
            ),
            tmp_path,
            **env,
        )
        try:
            learned = run(
                ludic(
                    *("learner", *urls, "--model", SFT_MODEL, "--steps", str(STEPS)),
                    *("--batch-size", "4", "--lr", "1e-3", "--max-lag", "4"),
                    *("--checkpoint-every", "1", "--ledger", "--out-dir", "learner"),
                ),
                tmp_path,
                **env,
            )
        finally:
            actor.send_signal(signal.SIGTERM)
        actor_out = finish(actor, code=143)
        served = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
        trained = _ledger_ids(redis.Redis(port=port))
    finally:
        stop(server)
        stop(store)

    assert served.json()["policy_version"] == STEPS, (served.text, learned, actor_out)
    steps = records(tmp_path / "learner" / "metrics.jsonl")
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1)), learned
    assert sum(m.get("policy_lag/ahead", 0) for m in steps) == 0, learned
    assert "newer than this learner's" not in learned
    assert trained and not [i for i, n in Counter(trained).items() if n > 1]
    batches = records(tmp_path / "actor.jsonl")
    versions = [b["policy_version_max"] for b in batches]
    assert versions == sorted(versions), versions

    checkpoint = f"learner/checkpoints/step_{STEPS:08d}"
    run(
        ludic(
            *("eval", "--env", "tictactoe", "--model", checkpoint, "--num-problems", "2"),
            *("--max-steps", "3", "--max-tokens", "8", "--out-dir", "eval", "--no-progress"),
        ),
        tmp_path,
    )
    played = records(tmp_path / "eval" / "rollouts.jsonl")
    assert len(played) == 2
    assert {
        step["policy_version"] for r in played for step in r["steps"] if step["kind"] == "agent"
    } == {STEPS}
