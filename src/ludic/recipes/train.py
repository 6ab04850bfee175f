"""`ludic train`: online RL on one env, with inference in process or on a server.

Each step plays `problems_per_step x group_size` episodes with the current policy (served by
`EmbeddedEngine` from a copy of the model, or by the OpenAI-compatible server `--server-url`
names), assigns credit with the chosen preset, takes one optimizer step and pushes the new
weights to inference (`InProcessPublisher` or `BroadcastPolicyPublisher`, verified).
`--resume` continues a run from its checkpoint: the restored weights are pushed before the
first rollout and the seeds go on where they stopped, so a resumed run equals an
uninterrupted one. Every training sample is written to `samples.jsonl` for
`ludic view --samples`. Single-seat envs only (multi-agent self-play:
`examples/tictactoe/selfplay.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from ludic.agents import Agent
from ludic.context import ContextStrategy, FullDialog, LatestObservationContext
from ludic.eval.command import resolve_env_factory, resolve_parser
from ludic.inference.client import ChatClient
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import Parser, identity_parser
from ludic.recipes import algorithms
from ludic.recipes.algorithms import PRESETS
from ludic.recipes.configs import (
    RESUME_LATEST,
    Algorithm,
    TrainConfig,
    parse_env_kwargs,
    sampling_from_flags,
)
from ludic.recipes.training import (
    SAMPLES_FILE,
    check_lr_schedule,
    finish,
    load_policy,
    log_samples,
    make_inference,
    make_trainer,
    plot_curve,
)
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RLAlgorithm, RolloutBatchSource, Trainer
from ludic.training.lr_resume import LRScheduleMismatchError
from ludic.training.stall import was_skipped

__all__ = ["PRESETS", "TrainResult", "make_algorithm", "rollout_sampling", "train_command"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainResult:
    """Where the run's outputs are, and the mean episode reward of its first and last step."""

    checkpoint: Path
    metrics_jsonl: Path
    samples_jsonl: Path
    reward_curve_png: Path
    first_reward: float
    last_reward: float
    steps: int


def make_algorithm(name: Algorithm, cfg: TrainConfig) -> RLAlgorithm:
    """The preset `name` from the shared registry (`ludic.recipes.algorithms.PRESETS`), with
    `cfg`'s generation budget and GiGPO knobs."""
    return algorithms.make_algorithm(name, max_tokens=cfg.max_tokens, gigpo=cfg.gigpo)


def train_command(cfg: TrainConfig, *, console: Console | None = None) -> TrainResult:
    """Train `cfg.model` (default: a fresh tiny model) on `cfg.env`; see `TrainConfig`."""
    console = console or Console()
    env_factory = resolve_env_factory(cfg.env)
    env_kwargs = parse_env_kwargs(cfg.env_kwargs)
    _check_single_seat(env_factory, env_kwargs, cfg.env)
    schedule_steps = schedule_steps_of(cfg)
    check_lr_schedule(cfg.lr_schedule, cfg.warmup_steps, schedule_steps, cfg.min_lr_ratio)
    parser = resolve_parser(cfg.parser, env_factory, env_kwargs)
    console.print(f"parser: {_parser_name(parser)} (--parser {cfg.parser})")
    if cfg.parser == "auto" and parser is identity_parser:
        console.print(
            "[yellow]note[/yellow]: the env declares no parser, so the whole reply is the "
            "action; declare one on the env class (`parser = xml_tag_parser('move')`) or "
            "pass --parser"
        )
    rollout_sampling(cfg)  # a bad --temperature / --top-p fails before the model loads
    algorithm = make_algorithm(cfg.algorithm, cfg)
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    history, checkpoint = asyncio.run(
        _train(cfg, env_factory, env_kwargs, parser, algorithm, model, tokenizer, console)
    )
    return _report(cfg, history, checkpoint, console)


async def _train(
    cfg: TrainConfig,
    env_factory: Callable[..., Any],
    env_kwargs: dict[str, Any],
    parser: Parser,
    algorithm: RLAlgorithm,
    model: Any,
    tokenizer: Any,
    console: Console,
) -> tuple[list[dict[str, float]], Path]:
    # Built inside this event loop: a server's HTTP client is bound to it.
    inference = make_inference(
        model,
        tokenizer,
        server_url=cfg.server_url,
        server_token=cfg.server_token,
        served_model=cfg.served_model,
        device=cfg.device,
        batch_invariant=cfg.batch_invariant,
        server_ranks=cfg.server_ranks,
    )
    try:
        sampling = rollout_sampling(cfg)
        rollouts = RolloutEngine(
            env_registry={"env": env_factory},
            protocol_registry={"agent": lambda: _protocol(cfg, inference.client, parser)},
            concurrency=cfg.concurrency,
            jsonl_log=cfg.out_dir / "rollouts.jsonl",
        )
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [
                RolloutRequest(
                    env=ComponentSpec(name="env", kwargs=env_kwargs),
                    protocol=ComponentSpec(name="agent"),
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
            log_samples(source, cfg.out_dir),
            out=cfg.out_dir,
            lr=cfg.lr,
            lr_schedule=cfg.lr_schedule,
            warmup_steps=cfg.warmup_steps,
            schedule_steps=schedule_steps_of(cfg),
            min_lr_ratio=cfg.min_lr_ratio,
            seed=cfg.seed,
            publisher=inference.publisher,
            checkpoint_every=cfg.checkpoint_every,
            micro_batch_tokens=cfg.micro_batch_tokens,
            device=cfg.device,
            batch_invariant=cfg.batch_invariant,
        )
        if cfg.resume is not None:
            _resume(trainer, cfg, console)
        console.print(
            f"{algorithm.name} on {cfg.env}: {cfg.steps - trainer.step} steps of "
            f"{cfg.problems_per_step} x {cfg.group_size} episodes"
        )
        history = await trainer.train(cfg.steps - trainer.step, progress=cfg.progress)
        return history, finish(trainer)
    finally:
        await inference.aclose()


def schedule_steps_of(cfg: TrainConfig) -> int:
    """Optimizer steps the LR decay spans: --schedule-steps, or --steps when it is left out."""
    return cfg.steps if cfg.schedule_steps is None else cfg.schedule_steps


def rollout_sampling(cfg: TrainConfig) -> SamplingConfig:
    """The rollouts' sampling (--temperature, --top-p, --max-tokens); it travels with every
    sample, so the trainer recomputes logprobs under the same transform. A value out of range
    raises ValueError naming the flags."""
    return sampling_from_flags(cfg.temperature, cfg.top_p, cfg.max_tokens)


def _protocol(cfg: TrainConfig, client: ChatClient, parser: Parser) -> SingleAgentProtocol:
    context: ContextStrategy = (
        LatestObservationContext() if cfg.context == "latest" else FullDialog()
    )
    agent = Agent(
        client,
        context=context,
        parser=parser,
        sampling=rollout_sampling(cfg),
        system_prompt=cfg.system_prompt,
        reject_incomplete_completions=cfg.reject_incomplete,
    )
    return SingleAgentProtocol(agent, max_steps=cfg.max_steps)


def _parser_name(parser: Parser) -> str:
    return getattr(parser, "__qualname__", None) or type(parser).__name__


def _resume(trainer: Trainer, cfg: TrainConfig, console: Console) -> None:
    """Restore the checkpoint `cfg.resume` names (publishing its weights into the engine)."""
    path = None if cfg.resume == RESUME_LATEST else Path(cfg.resume or "")
    try:
        trainer.resume(path, override_lr_schedule=cfg.override_lr_schedule)
    except FileNotFoundError as e:
        trainer.close()
        raise FileNotFoundError(f"--resume: {e}; run without --resume to start a new run") from e
    except LRScheduleMismatchError as e:
        trainer.close()
        raise ValueError(_lr_mismatch_message(e, cfg)) from e
    if trainer.step >= cfg.steps:
        trainer.close()
        raise ValueError(
            f"--resume: the checkpoint is at step {trainer.step} and --steps is {cfg.steps}, so "
            "nothing is left to train; raise --steps to train further"
        )
    if cfg.override_lr_schedule:
        console.print(
            "[bold yellow]warning[/bold yellow]: --override-lr-schedule: this launch's "
            f"--lr {cfg.lr} --lr-schedule {cfg.lr_schedule} --warmup-steps {cfg.warmup_steps} "
            f"--schedule-steps {schedule_steps_of(cfg)} --min-lr-ratio {cfg.min_lr_ratio} "
            f"win over the checkpoint's from step {trainer.step} on"
        )
    console.print(
        f"resumed at step {trainer.step} (policy version {trainer.policy_version}), "
        "its weights now served by the engine"
    )


_FLAGS = {
    "lr": "--lr",
    "lr_schedule": "--lr-schedule",
    "warmup_steps": "--warmup-steps",
    "total_steps": "--schedule-steps",
    "min_lr_ratio": "--min-lr-ratio",
}


def _lr_mismatch_message(error: LRScheduleMismatchError, cfg: TrainConfig) -> str:
    """Name each changed flag, the checkpoint's value and how to go on either way."""
    parts = []
    for field, (old, new) in error.changes.items():
        flag = _FLAGS[field]
        if field == "total_steps" and cfg.schedule_steps is None:
            flag = "--schedule-steps (default: --steps)"
        parts.append(f"{flag} is {new}, the checkpoint's is {old}")
    keep = " ".join(
        f"{_FLAGS[f]} {old}" for f, (old, _) in error.changes.items() if old is not None
    )
    stretch = ""
    if "total_steps" in error.changes:
        stretch = (
            " (a longer decay climbs back up from where the checkpoint's ended; with the "
            "checkpoint's --schedule-steps the LR stays at its floor past it)"
        )
    return (
        f"--resume: the LR settings differ from the checkpoint's: {'; '.join(parts)}. "
        f"Pass {keep} to continue its schedule, or add --override-lr-schedule to apply "
        f"this launch's from the checkpoint's step on{stretch}"
    )


def _report(
    cfg: TrainConfig, history: list[dict[str, float]], checkpoint: Path, console: Console
) -> TrainResult:
    if not history:
        raise RuntimeError("training ran no step")
    metrics = cfg.out_dir / "metrics.jsonl"
    samples = cfg.out_dir / SAMPLES_FILE
    curve = plot_curve(metrics, cfg.out_dir / "reward_curve.png", "batch/mean_reward")
    first, last = history[0]["batch/mean_reward"], history[-1]["batch/mean_reward"]
    console.print(
        f"done: mean episode reward {first:+.3f} (first step) -> {last:+.3f} (last step). "
        f"Model: [bold]{checkpoint / 'model'}[/bold]; curve: {curve}\n"
        f"browse the episodes with: ludic view {cfg.out_dir / 'rollouts.jsonl'} --samples "
        f"{samples} --tokenizer {checkpoint / 'model'}"
    )
    skipped = sum(1 for m in history if was_skipped(m))
    if skipped:
        console.print(
            f"[bold yellow]{skipped} of {len(history)} steps trained nothing[/bold yellow] "
            "(each named its cause above: 'step N skipped: ...')"
            + ("; the model is the one this run started from" if skipped == len(history) else "")
        )
    return TrainResult(
        checkpoint=checkpoint,
        metrics_jsonl=metrics,
        samples_jsonl=samples,
        reward_curve_png=curve,
        first_reward=float(first),
        last_reward=float(last),
        steps=len(history),
    )


def _check_single_seat(factory: Callable[..., Any], kwargs: dict[str, Any], name: str) -> None:
    env = factory(**kwargs)
    try:
        seats = list(env.agent_ids)
    finally:
        env.close()
    if len(seats) != 1:
        raise ValueError(
            f"env {name!r} has {len(seats)} seats {seats}; `ludic train` trains one agent. For "
            "multi-agent self-play see examples/tictactoe/selfplay.py (MultiAgentProtocol)"
        )
