"""Train a model on the Lights env (lights.py) with GRPO or GiGPO, then evaluate it (pass@k),
write a viewer page and a reward curve. The README's "Train your own environment" walks
through it.

    python examples/custom_env/train.py                       # GRPO, a fresh tiny model
    python examples/custom_env/train.py --algorithm gigpo --out-dir ludic_runs/lights_gigpo
    python examples/custom_env/train.py --steps 40 --resume   # continue a run to step 40

Everything here is public API: the env and parser from lights.py, an Agent and a protocol, a
RolloutEngine, a batch source and the wiring helpers of `ludic.recipes`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro
from lights import LightsEnv, lamp_parser  # beside this file: `python train.py` finds it

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.eval import EvalResult, make_eval_requests, run_eval
from ludic.inference import ChatClient, SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.recipes import (
    InferenceArgs,
    InferenceFlags,
    check_run_dir,
    close_client,
    closing_rewards,
    finish,
    load_policy,
    log_samples,
    make_client,
    make_trainer,
    plot_curve,
)
from ludic.recipes.count_checks import check_count_flags
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, make_gigpo, make_grpo
from ludic.viz import write_viewer


@dataclass(frozen=True, kw_only=True, slots=True)
class LightsConfig:
    """Train on Lights, evaluate pass@k, write the viewer page and the reward curve."""

    algorithm: Literal["grpo", "gigpo"] = "grpo"
    """grpo: one advantage per episode; gigpo: plus a step-level one for actions taken from
    the same lamps state (the env's state key)."""
    model: str | None = None
    """Local model directory to start from (default: a fresh tiny model)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """Where training rollouts are generated: in process, or --server-url URL [URL ...]
    (`ludic serve --model DIR --token T` each; weights pushed to all after every step)."""
    steps: int = 30
    """Optimizer steps (the whole run: with --resume, only the steps left are trained)."""
    problems_per_step: int = 4
    """Starting lamp patterns (env seeds) per step."""
    group_size: int = 8
    """Episodes per pattern: the group sharing a baseline."""
    lr: float = 1e-3
    """Learning rate (1e-3 suits the tiny model; ~1e-6 for a real LLM)."""
    max_tokens: int = 6
    """Token limit of one reply."""
    max_turns: int = 6
    """Flips per episode before the protocol truncates it."""
    checkpoint_every: int = 10
    """Save a checkpoint every N steps (and one at the end)."""
    resume: bool = False
    """Continue from the newest checkpoint in --out-dir (a first run starts fresh)."""
    eval_problems: int = 16
    """Lamp patterns to evaluate on (seeds 10_000, 10_001, ...: not trained on)."""
    eval_k: int = 4
    """Episodes per pattern: pass@1 and pass@k are reported."""
    seed: int = 0
    """Seeds the model, the problems and sampling."""
    out_dir: Path = Path("ludic_runs/lights")
    """Where metrics, rollouts, samples, checkpoints, eval records and plots go."""
    progress: bool = True
    """Show a progress bar while training."""


def make_protocol(client: ChatClient, cfg: LightsConfig) -> SingleAgentProtocol:
    agent = Agent(
        client,
        context=LatestObservationContext(),  # system prompt + the current lamps: short prompts
        parser=lamp_parser,
        sampling=SamplingConfig(max_tokens=cfg.max_tokens),
    )
    return SingleAgentProtocol(agent, max_steps=cfg.max_turns)


async def train(cfg: LightsConfig) -> tuple[list[dict[str, float]], Path]:
    """Train with cfg.algorithm; returns the metrics of each step and the final checkpoint."""
    check_count_flags(  # --steps 0 saved a step-0 checkpoint that refused the next run
        ("--steps", cfg.steps, "optimizer steps, e.g. 30"),
        ("--problems-per-step", cfg.problems_per_step, "lamp patterns per step, e.g. 4"),
        ("--group-size", cfg.group_size, "episodes per pattern, e.g. 8"),
    )
    # As `ludic train`: without --resume, an out_dir holding an earlier run's checkpoints is
    # refused (a new run would overwrite its first steps and leave its later ones to win a
    # later --resume).
    check_run_dir(cfg.out_dir, "latest" if cfg.resume else None)
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed)
    inference = cfg.inference.make(model, tokenizer)  # default: the engine on a model copy
    algorithm = make_gigpo() if cfg.algorithm == "gigpo" else make_grpo()
    rollouts = RolloutEngine(
        env_registry={"lights": LightsEnv},
        protocol_registry={"agent": lambda: make_protocol(inference.client, cfg)},
        jsonl_log=cfg.out_dir / "rollouts.jsonl",
    )
    source = RolloutBatchSource(
        engine=rollouts,
        requests_fn=lambda: [
            RolloutRequest(env=ComponentSpec(name="lights"), protocol=ComponentSpec(name="agent"))
            for _ in range(cfg.problems_per_step)
        ],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=cfg.group_size),
        seed_sequencer=SeedSequencer(run_seed=cfg.seed),
    )
    trainer = make_trainer(
        model,
        tokenizer,
        algorithm,
        log_samples(source, cfg.out_dir),  # samples.jsonl, for the viewer's weights
        out=cfg.out_dir,
        lr=cfg.lr,
        seed=cfg.seed,
        publisher=inference.publisher,  # new weights go to the engine after every step
        checkpoint_every=cfg.checkpoint_every,
    )
    try:
        if cfg.resume:
            trainer.resume(missing_ok=True)  # newest checkpoint in out_dir, if there is one
        if trainer.step >= cfg.steps:  # say so: evaluating an untouched model is no surprise
            print(
                f"nothing to train: the checkpoint is at step {trainer.step} and --steps is "
                f"{cfg.steps}; raise --steps to train further (evaluating step {trainer.step})"
            )
        history = await trainer.train(max(0, cfg.steps - trainer.step), progress=cfg.progress)
        return history, finish(trainer)
    finally:
        await inference.aclose()


async def evaluate(model_dir: Path, cfg: LightsConfig) -> EvalResult:
    """pass@1 and pass@k of the checkpoint on lamp patterns it was not trained on."""
    client = make_client(model=str(model_dir))  # the checkpoint, in process
    try:
        engine = RolloutEngine(
            env_registry={"lights": LightsEnv},
            protocol_registry={"agent": lambda: make_protocol(client, cfg)},
        )
        requests = make_eval_requests(
            env=ComponentSpec(name="lights"),
            protocol=ComponentSpec(name="agent"),
            num_problems=cfg.eval_problems,
            samples_per_problem=cfg.eval_k,
            seed=10_000,
        )
        return await run_eval(engine, requests, out_dir=cfg.out_dir / "eval")
    finally:
        await close_client(client)


def main(cfg: LightsConfig) -> dict[str, float]:
    history, checkpoint = asyncio.run(train(cfg))
    if history:  # a step whose every episode failed logs reward 0.0: no reward, left out
        rewards, _, _ = closing_rewards(history, checkpoint)
        print(f"{cfg.algorithm}: mean episode reward {rewards}")  # as `ludic train` says it
    result = asyncio.run(evaluate(checkpoint / "model", cfg))
    k = cfg.eval_k
    # pass@k is reported with several episodes per pattern; with one, pass@1 is the success rate
    metrics = {
        key: result.metrics.get(key, result.metrics["success_rate"])
        for key in ("success_rate", "pass@1", f"pass@{k}")
    }
    print(f"eval: pass@1 {metrics['pass@1']:.0%}, pass@{k} {metrics[f'pass@{k}']:.0%}")
    page = write_viewer(
        cfg.out_dir / "rollouts.jsonl",
        cfg.out_dir / "rollouts.html",
        samples=cfg.out_dir / "samples.jsonl",
        tokenizer=str(checkpoint / "model"),
        max_episodes=64,
    )
    curve = plot_curve(
        cfg.out_dir / "metrics.jsonl", cfg.out_dir / "reward_curve.png", "batch/mean_reward"
    )
    print(f"model: {checkpoint / 'model'}\nviewer: {page}\nreward curve: {curve}")
    return metrics


if __name__ == "__main__":
    try:
        main(tyro.cli(LightsConfig))
    except FileExistsError as refused:  # the --out-dir refusal names the problem and the fix
        raise SystemExit(f"train.py: error: {refused}") from None
