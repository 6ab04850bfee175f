"""`ludic sft` -> the Redis pipeline on its checkpoint -> `ludic eval` of the learner's, each a
new process in one working directory, as README "Decoupled actor and learner over Redis" runs
it with MODEL_DIR the SFT checkpoint's model folder for both `ludic serve` (at `--policy-version
0`, as README "Inference" says for RL after `ludic sft`) and `ludic learner`: the learner trains
its steps once each, on samples none of which is trained twice or sampled ahead of its policy,
and publishes each step to the server; `ludic eval` loads the learner's last checkpoint and
plays it at its policy version."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
import redis
from combo_processes import (
    TOKEN,
    agent_steps,
    finish,
    ledger_ids,
    ludic,
    pipeline_servers,
    records,
    run,
    served_version,
    sft_on_expert_games,
    start,
)

SFT_MODEL = "sft/checkpoints/step_00000002/model"
STEPS = 3


@pytest.mark.slow
@pytest.mark.redis
def test_sft_checkpoint_trained_over_redis_then_evaluated(tmp_path: Path) -> None:
    sft = sft_on_expert_games(tmp_path)
    assert SFT_MODEL in sft

    # At version 0, the learner's first (README "Inference": RL after `ludic sft`), not the
    # SFT checkpoint's saved one, so the actor's samples before the first push are not ahead.
    with pipeline_servers(tmp_path, tmp_path / SFT_MODEL, "--policy-version", "0") as servers:
        actor = start(
            ludic(
                *("actor", *servers.flags, "--env", "tictactoe", "--max-steps", "3"),
                *("--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2"),
                *("--actor-id", "a0", "--max-backlog", "16", "--batches", "1000"),
                *("--metrics-path", "actor.jsonl"),
            ),
            tmp_path,
            LUDIC_SERVER_TOKEN=TOKEN,
        )
        try:
            learned = run(
                ludic(
                    *("learner", *servers.flags, "--model", SFT_MODEL, "--steps", str(STEPS)),
                    *("--batch-size", "4", "--lr", "1e-3", "--max-lag", "4"),
                    *("--checkpoint-every", "1", "--ledger", "--out-dir", "learner"),
                ),
                tmp_path,
                LUDIC_SERVER_TOKEN=TOKEN,
            )
        finally:
            actor.send_signal(signal.SIGTERM)
        actor_out = finish(actor, code=143)
        served = served_version(servers.url)
        trained = ledger_ids(redis.Redis(port=servers.redis_port))

    assert served == STEPS, (served, learned, actor_out)
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
    assert len(records(tmp_path / "eval" / "rollouts.jsonl")) == 2
    played = agent_steps(tmp_path / "eval" / "rollouts.jsonl")
    assert {step["policy_version"] for step in played} == {STEPS}
