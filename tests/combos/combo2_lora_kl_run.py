"""`python combo2_lora_kl_run.py BASE OUT TOTAL`: a LoRA GRPO run with a KL term to a frozen
copy of BASE (a model directory, given relative as a user would), to TOTAL steps with a
checkpoint every step, resuming from OUT's newest checkpoint when there is one (`add_lora` and
the reference built again, as README "Multi-process training" says a LoRA resume needs). One
episode in flight at a time, so a run and its resume sample the same tokens. For
tests/combos/test_combo2_lora_kl_resume_eval.py."""

from __future__ import annotations

import asyncio
import copy
import sys
from pathlib import Path

from combo_say_o import SayOEnv

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.inference import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.recipes import finish, load_policy
from ludic.recipes.inference import make_inference
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import (
    CheckpointConfig,
    JsonlLogger,
    RolloutBatchSource,
    Trainer,
    TrainerConfig,
    add_lora,
    make_grpo,
)

KL_BETA = 0.5


async def main(base: str, out: Path, total: int) -> None:
    model, tokenizer = load_policy(base)
    reference = copy.deepcopy(model)  # before add_lora: it must share no parameter with it
    model = add_lora(model, rank=4, alpha=8)
    inference = make_inference(model, tokenizer)
    algorithm = make_grpo(kl_beta=KL_BETA)

    def protocol() -> SingleAgentProtocol:
        agent = Agent(inference.client, context=FullDialog(), reject_incomplete_completions=False)
        return SingleAgentProtocol(agent, max_steps=1)

    request = RolloutRequest(
        env=ComponentSpec(name="say_o"),
        protocol=ComponentSpec(name="agent"),
        sampling=SamplingConfig(temperature=1.0, max_tokens=8),
    )
    source = RolloutBatchSource(
        engine=RolloutEngine(
            env_registry={"say_o": SayOEnv},
            protocol_registry={"agent": protocol},
            concurrency=1,
            jsonl_log=out / "rollouts.jsonl",
        ),
        requests_fn=lambda: [request, request],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=4),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    config = TrainerConfig(
        lr=5e-2,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        max_lag=0,
        checkpoint=CheckpointConfig(dir=str(out / "checkpoints"), every_n_steps=1, keep_last=4),
    )
    trainer = Trainer(
        model,
        algorithm,
        source,
        config,
        ref_model=reference,
        publisher=inference.publisher,
        logger=JsonlLogger(out / "metrics.jsonl"),
        tokenizer=tokenizer,
    )
    if trainer.resume(missing_ok=True) == 0:
        trainer.publish_weights()
    print(f"resumed at step {trainer.step}", flush=True)
    try:
        await trainer.train(total - trainer.step)
        print(f"final checkpoint: {finish(trainer)}", flush=True)
    finally:
        await inference.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
