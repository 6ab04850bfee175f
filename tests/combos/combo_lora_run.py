"""`python combo_lora_run.py BASE OUT TOTAL [URL TOKEN]`: a LoRA GRPO run on BASE (a model
directory, given relative as a user would) to TOTAL steps, a checkpoint every step, resuming from
OUT's newest checkpoint when there is one; rollouts on the embedded engine, or on the `ludic
serve` at URL (weights pushed there with TOKEN). For tests/combos/test_combo_lora_serve.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from combo_say_o import SayOEnv

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.inference import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.recipes import finish, load_policy, make_trainer
from ludic.recipes.inference import make_inference
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, add_lora, make_grpo

SAMPLING = SamplingConfig(temperature=1.0, max_tokens=8)


async def main(base: str, out: Path, total: int, url: str | None, token: str | None) -> None:
    model, tokenizer = load_policy(base)
    model = add_lora(model, rank=4, alpha=8)
    inference = make_inference(model, tokenizer, server_url=url, server_token=token)
    algorithm = make_grpo()

    def protocol() -> SingleAgentProtocol:
        agent = Agent(inference.client, context=FullDialog(), reject_incomplete_completions=False)
        return SingleAgentProtocol(agent, max_steps=1)

    rollouts = RolloutEngine(
        env_registry={"say_o": SayOEnv},
        protocol_registry={"agent": protocol},
        jsonl_log=out / "rollouts.jsonl",
    )
    request = RolloutRequest(
        env=ComponentSpec(name="say_o"),
        protocol=ComponentSpec(name="agent"),
        sampling=SAMPLING,
    )
    source = RolloutBatchSource(
        engine=rollouts,
        requests_fn=lambda: [request, request],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=4),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    trainer = make_trainer(
        model,
        tokenizer,
        algorithm,
        source,
        out=out,
        lr=5e-2,
        publisher=inference.publisher,
        checkpoint_every=1,
    )
    if trainer.resume(missing_ok=True) == 0:
        trainer.publish_weights()  # a fresh run: the server starts from these weights
    print(f"resumed at step {trainer.step}", flush=True)
    try:
        await trainer.train(total - trainer.step)
        print(f"final checkpoint: {finish(trainer)}", flush=True)
    finally:
        await inference.aclose()


if __name__ == "__main__":
    url, token = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 4 else (None, None)
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), url, token))
