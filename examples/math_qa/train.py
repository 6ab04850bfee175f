"""GRPO on math word problems: DatasetQAEnv + a numeric verifier + the \\boxed{} parser.

    python examples/math_qa/train.py                                 # the bundled 42-problem sample
    python examples/math_qa/train.py --data gsm8k_train.jsonl        # a local GSM8K-style JSONL
    python examples/math_qa/train.py --hf-dataset openai/gsm8k       # needs `pip install datasets`
    python examples/math_qa/train.py --model Qwen/Qwen2.5-0.5B-Instruct --lr 1e-6 --device cuda

Each problem is one episode: the question is the observation, the reply's last \\boxed{...} is
the answer, and the reward is 1 when it equals the reference number ("#### 42" in GSM8K). GRPO
compares `group_size` answers to the same question. Accuracy on the first `eval_problems`
problems is printed before and after training. A tiny model from scratch will not learn
arithmetic: this example shows the wiring; bring a real model for real learning.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tyro

from ludic.agents import Agent
from ludic.envs import (
    DatasetQAEnv,
    default_prompt_builder,
    default_target_parser,
    load_jsonl_dataset,
    load_math_sample,
    numeric_match,
)
from ludic.envs.registry import MATH_SYSTEM_PROMPT
from ludic.eval import make_eval_requests, run_eval
from ludic.inference import ChatClient, SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import boxed_parser
from ludic.recipes import (
    InferenceArgs,
    InferenceFlags,
    finish,
    load_policy,
    make_trainer,
    refuse_earlier_checkpoints,
)
from ludic.recipes.count_checks import check_count_flags
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, make_grpo


@dataclass(frozen=True, kw_only=True, slots=True)
class MathConfig:
    """GRPO on a math QA dataset with a verifier reward."""

    data: Path | None = None
    """Local JSONL with "question" and "answer" ("... #### 42") per line; default: the bundled
    sample."""
    hf_dataset: str | None = None
    """A Hugging Face dataset name (e.g. openai/gsm8k), loaded with `datasets` if installed."""
    hf_config: str = "main"
    """Dataset config name for --hf-dataset."""
    limit: int | None = None
    """Use only the first N problems."""
    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """Where rollouts are generated: in process, or --server-url URL [URL ...] (weights are
    pushed to every server after each step; needs --server-token)."""
    steps: int = 20
    """Optimizer steps."""
    problems_per_step: int = 4
    """Questions per step."""
    group_size: int = 8
    """Answers per question (the GRPO group)."""
    lr: float = 1e-4
    """Learning rate."""
    max_tokens: int = 128
    """Token limit of an answer."""
    eval_problems: int = 16
    """Problems (the first N) for the greedy accuracy before and after training."""
    seed: int = 0
    """Seeds training and sampling."""
    device: str = "cpu"
    """Training device."""
    out_dir: Path = Path("ludic_runs/math_qa")
    """Where metrics.jsonl and checkpoints go (refused when it holds an earlier run's
    checkpoints: pass another one for a new run)."""


def load_problems(cfg: MathConfig) -> list[dict[str, Any]]:
    if cfg.hf_dataset is not None:
        try:
            import datasets  # type: ignore[import-not-found]
        except ImportError as e:
            raise SystemExit("--hf-dataset needs `pip install datasets`; or pass --data") from e
        split = datasets.load_dataset(cfg.hf_dataset, cfg.hf_config, split="train")
        problems = [dict(row) for row in split]
    elif cfg.data is not None:
        problems = load_jsonl_dataset(cfg.data)
    else:
        problems = load_math_sample()
    problems = problems[: cfg.limit] if cfg.limit is not None else problems
    check_problems(problems, cfg.data or cfg.hf_dataset or "the bundled sample")
    return problems


def check_problems(problems: list[dict[str, Any]], source: object) -> None:
    """Every problem has the question and answer the env reads: a bad row stops the run here,
    named, instead of failing its episodes one by one during training."""
    if not problems:
        raise SystemExit(f"{source}: no problems to train on")
    for index, problem in enumerate(problems):
        try:
            default_prompt_builder(problem)
            default_target_parser(problem)
        except (ValueError, TypeError) as e:
            message = str(e).split("; pass ")[0]  # the DatasetQAEnv hook is not a flag here
            raise SystemExit(
                f"{source}: problem {index + 1} of {len(problems)}: {message}; give every line a "
                '"question" and an "answer" ("... #### 42")'
            ) from e


async def accuracy(rollouts: RolloutEngine, n: int, max_tokens: int) -> float:
    requests = make_eval_requests(
        env=ComponentSpec(name="math"),
        protocol=ComponentSpec(name="answer"),
        num_problems=n,
        seed=0,  # env seeds 0..n-1: the first n problems
        sampling=SamplingConfig(temperature=0.0, max_tokens=max_tokens),
    )
    result = await run_eval(rollouts, requests)
    return result.metrics["success_rate"]


async def train(cfg: MathConfig) -> tuple[float, float]:
    check_count_flags(  # --steps 0 saved a step-0 checkpoint that refused the next run
        ("--steps", cfg.steps, "optimizer steps, e.g. 20"),
        ("--problems-per-step", cfg.problems_per_step, "problems per step, e.g. 4"),
        ("--group-size", cfg.group_size, "samples per problem, e.g. 8"),
    )
    problems = load_problems(cfg)
    # Before the model loads: a second run here would overwrite the first one's checkpoints.
    refuse_earlier_checkpoints(
        cfg.out_dir, fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir})."
    )
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    algorithm = make_grpo()
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens)

    def env() -> DatasetQAEnv:
        return DatasetQAEnv(problems, verifier=numeric_match, system_prompt=MATH_SYSTEM_PROMPT)

    def protocol(client: ChatClient) -> SingleAgentProtocol:
        return SingleAgentProtocol(Agent(client, parser=boxed_parser()), max_steps=1)

    inference = cfg.inference.make(model, tokenizer, device=cfg.device)
    try:
        rollouts = RolloutEngine(
            env_registry={"math": env},
            protocol_registry={"answer": lambda: protocol(inference.client)},
        )
        n_eval = min(cfg.eval_problems, len(problems))
        before = await accuracy(rollouts, n_eval, cfg.max_tokens)
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [
                RolloutRequest(
                    env=ComponentSpec(name="math"),
                    protocol=ComponentSpec(name="answer"),
                    sampling=sampling,
                )
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
            source,
            out=cfg.out_dir,
            lr=cfg.lr,
            seed=cfg.seed,
            publisher=inference.publisher,
            device=cfg.device,
        )
        await trainer.train(cfg.steps)
        finish(trainer)
        after = await accuracy(rollouts, n_eval, cfg.max_tokens)
    finally:
        await inference.aclose()
    print(f"greedy accuracy on {n_eval} problems: {before:.0%} before, {after:.0%} after")
    return before, after


def main(cfg: MathConfig) -> tuple[float, float]:
    return asyncio.run(train(cfg))


if __name__ == "__main__":
    main(tyro.cli(MathConfig))
