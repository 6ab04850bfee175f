"""`python combo_duel_run.py OUT TOTAL`: GRPO self-play on a two-seat game (both seats one
policy, `MultiAgentProtocol`) to TOTAL steps on the batch-invariant embedded engine, a
checkpoint every step, resuming from OUT's newest checkpoint when there is one; then it
evaluates the final policy on 4 fixed games with `run_eval` and prints its metrics as JSON.
For tests/combos/test_combo_selfplay_resume.py."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.eval import make_eval_requests, run_eval
from ludic.inference import SamplingConfig
from ludic.interaction import MultiAgentProtocol
from ludic.recipes import finish, load_policy, make_trainer
from ludic.recipes.inference import make_inference
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, make_grpo
from ludic.types import StepOutcome

SAMPLING = SamplingConfig(temperature=1.0, max_tokens=6)
SEATS = ("first", "second")


class WordDuel(LudicEnv):
    """Two seats answer in turn, two answers each; each answer scores its seat the share of "o"
    in it, and the other seat minus that: every reply is legal and both seats play."""

    inline_sync_calls = True

    def __init__(self) -> None:
        self.turn = 0

    @property
    def agent_ids(self) -> Sequence[str]:
        return SEATS

    @property
    def active_agents(self) -> Sequence[str]:
        return (SEATS[self.turn % 2],)

    def reset(self, seed: int | None = None) -> ResetResult:
        self.turn = 0
        return {"first": ("Say something.", {}), "second": ("Wait.", {})}

    def step(self, actions: Mapping[str, str]) -> StepResult:
        mover, other = SEATS[self.turn % 2], SEATS[1 - self.turn % 2]
        score = actions[mover].count("o") / max(1, len(actions[mover]))
        self.turn += 1
        done = self.turn == 4
        return {
            mover: StepOutcome(obs="Wait.", reward=score, terminated=done),
            other: StepOutcome(obs="Your turn.", reward=-score, terminated=done),
        }


async def main(out: Path, total: int) -> None:
    model, tokenizer = load_policy(None, seed=0)
    inference = make_inference(model, tokenizer, batch_invariant=True)
    algorithm = make_grpo()

    def selfplay() -> MultiAgentProtocol:
        agents = {seat: Agent(inference.client, context=FullDialog()) for seat in SEATS}
        return MultiAgentProtocol(agents, max_steps=4)

    rollouts = RolloutEngine(
        env_registry={"duel": WordDuel},
        protocol_registry={"selfplay": selfplay},
        jsonl_log=out / "rollouts.jsonl",
    )
    request = RolloutRequest(
        env=ComponentSpec(name="duel"), protocol=ComponentSpec(name="selfplay"), sampling=SAMPLING
    )
    source = RolloutBatchSource(
        engine=rollouts,
        requests_fn=lambda: [request, request],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=2),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    trainer = make_trainer(
        *(model, tokenizer, algorithm, source),
        out=out,
        lr=5e-2,
        publisher=inference.publisher,
        checkpoint_every=1,
        batch_invariant=True,
    )
    if trainer.resume(missing_ok=True) == 0:
        trainer.publish_weights()
    print(f"resumed at step {trainer.step}", flush=True)
    try:
        await trainer.train(total - trainer.step)
        finish(trainer)
        requests = make_eval_requests(
            env=ComponentSpec(name="duel"),
            protocol=ComponentSpec(name="selfplay"),
            num_problems=4,
            seed=1000,
            sampling=SAMPLING,
        )
        result = await run_eval(rollouts, requests)
    finally:
        await inference.aclose()
    print("eval " + json.dumps(result.metrics, sort_keys=True), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2])))
