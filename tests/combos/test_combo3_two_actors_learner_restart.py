"""A user's own env file over the Redis pipeline, as README "Decoupled actor and learner over
Redis" runs it, each side a new process: two `ludic actor`s with their own `--actor-id` and
`--seed` push to one stream while `ludic learner` trains 3 steps and stops, then is started
again with another `--micro-batch-tokens` and, with `--override-lr-schedule`, another `--lr`,
while the actors keep pushing. Every sample both actors pushed is trained exactly once (the
commit ledger holds each id once, none missing), the learner's steps run 1..8 once each, each at
the learning rate of its launch, and `ludic eval --env my_env:make` of the last checkpoint plays
it at its policy version."""

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
    spawn,
)

from ludic.models import tiny_model_dir

MY_ENV = """
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome

class VowelsEnv(SingleAgentEnv):
    system_prompt = "Answer in one short word."

    def env_reset(self, seed=None):
        return "Name an animal.", {}

    def env_step(self, action):
        vowels = sum(action.count(v) for v in "aeiou")
        return StepOutcome(obs="", reward=vowels / max(1, len(action)), terminated=True)

def make():
    return VowelsEnv()
"""
BATCHES, PER_BATCH, BATCH_SIZE = 4, 4, 4  # per actor; samples a batch; samples a step
STEPS = 2 * BATCHES * PER_BATCH // BATCH_SIZE  # every sample of both actors, once
FIRST_LR, SECOND_LR = 1e-2, 2e-2


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_two_actors_own_env_learner_restarted_with_new_flags_train_each_sample_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "my_env.py").write_text(MY_ENV)
    model = str(tiny_model_dir(seed=0))
    with pipeline_servers(tmp_path, model) as servers:
        actors = [
            spawn(
                ludic(
                    *("actor", *servers.flags, "--env", "my_env:make", "--max-steps", "1"),
                    *("--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2"),
                    *("--actor-id", f"a{k}", "--seed", str(k + 1), "--batches", str(BATCHES)),
                    *("--max-backlog", "8", "--metrics-path", f"a{k}.jsonl"),
                ),
                tmp_path / f"a{k}.log",
                LUDIC_SERVER_TOKEN=TOKEN,
            )
            for k in (0, 1)
        ]
        learner = [
            *ludic("learner", *servers.flags, "--model", model, "--out-dir", "learner"),
            *("--batch-size", str(BATCH_SIZE), "--checkpoint-every", "1", "--ledger"),
            *("--max-lag", "None", "--lease-ttl-s", "3"),
        ]
        try:
            first, second = tmp_path / "l1.log", tmp_path / "l2.log"
            launch = [*learner, "--steps", "3", "--lr", str(FIRST_LR)]
            finish(spawn(launch, first, LUDIC_SERVER_TOKEN=TOKEN), first)
            launch = [*learner, "--steps", str(STEPS), "--lr", str(SECOND_LR)]
            launch += ["--override-lr-schedule", "--micro-batch-tokens", "64"]
            finish(spawn(launch, second, LUDIC_SERVER_TOKEN=TOKEN), second)
            for k, actor in enumerate(actors):
                finish(actor, tmp_path / f"a{k}.log")
        finally:
            for actor in actors:
                actor.send_signal(signal.SIGTERM)
                actor.wait(timeout=60)
        trained = ledger_ids(redis.Redis(port=servers.redis_port))

    assert "resumed from step 3" in second.read_text()
    pushed = {f"a{k}:{b}:{i}" for k in (0, 1) for b in range(BATCHES) for i in range(PER_BATCH)}
    assert not [i for i, n in Counter(trained).items() if n > 1]
    assert set(trained) == pushed
    steps = records(tmp_path / "learner" / "metrics.jsonl")
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert [m["lr"] for m in steps] == pytest.approx([FIRST_LR] * 3 + [SECOND_LR] * (STEPS - 3))

    run(
        ludic(
            *("eval", "--env", "my_env:make", "--model", f"learner/checkpoints/step_{STEPS:08d}"),
            *("--num-problems", "2", "--samples-per-problem", "2", "--max-steps", "1"),
            *("--max-tokens", "8", "--out-dir", "eval", "--no-progress"),
        ),
        tmp_path,
    )
    played = agent_steps(tmp_path / "eval" / "rollouts.jsonl")
    assert len(played) == 4 and {s["policy_version"] for s in played} == {STEPS}
