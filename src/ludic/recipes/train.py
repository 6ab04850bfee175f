"""`ludic train`: online RL on one env, with inference in process or on a server.

Each step plays `problems_per_step x group_size` episodes with the current policy (served by
`EmbeddedEngine` from a copy of the model, or by the OpenAI-compatible server `--server-url`
names, or by a `ludic serve` child process with `--local-server`, which draws the next batch
during the optimizer step), assigns credit with the chosen preset, takes one optimizer step and
pushes the new weights to inference (`InProcessPublisher` or `BroadcastPolicyPublisher`,
verified). When most episodes of a batch end by overflowing the model's context, it says so
once, with the flags that fix it. With `--server-url` (waited for while it loads its model, as
`ludic actor` waits) the starting weights are pushed as policy version 0 before the first
rollout, so step 1 is on-policy whatever the server held (a server of another architecture
refuses the push before any episode; both starts: `ludic.recipes.train_start`).
`--resume` continues a run from its checkpoint: the restored weights are pushed before the
first rollout and the seeds go on where they stopped, so a resumed run equals an
uninterrupted one; a different env, algorithm, group size, sampling or seed is refused before
the model loads (`ludic.recipes.train_checks`, which also refuses counts that cannot train).
Every training sample is written to `samples.jsonl` for `ludic view --samples`, and every
episode of the trained batches to `rollouts.jsonl` (with `--local-server`, the batch drawn
ahead that no step took is dropped from it when the run ends). Single-seat
envs only (multi-agent self-play: `examples/tictactoe/selfplay.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from ludic._resumed_log import BATCH_INDEX, batch_index_of, drop_from
from ludic.agents import Agent
from ludic.context import ContextStrategy, FullDialog, LatestObservationContext
from ludic.eval.env_spec import declared_parser, resolve_env_factory, resolve_parser
from ludic.inference.client import ChatClient
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import Parser, identity_parser, parser_name
from ludic.recipes import algorithms
from ludic.recipes.algorithms import PRESETS
from ludic.recipes.configs import (
    Algorithm,
    ContextChoice,
    TrainConfig,
    context_line,
    context_of,
    one_seat_env,
    parse_env_kwargs,
    sampling_from_flags,
)
from ludic.recipes.context_overflow import ContextOverflowWatch, quiet_repeated_overflow_lines
from ludic.recipes.inference import (
    as_flag,
    check_api_key,
    check_prepacked_gemm,
    server_push_token,
)
from ludic.recipes.run_lock import (
    LUDIC_RUN,
    RUN_LOCK,
    check_run_lock,
    check_single_process,
    run_lock,
)
from ludic.recipes.train_checks import (
    RUN_SETTINGS_KEY,
    check_counts,
    check_greedy,
    check_group_size,
    check_resume_settings,
    resume_resolvers,
    run_settings,
)
from ludic.recipes.train_local_server import local_server, served_version, trainer_max_lag
from ludic.recipes.train_report import NothingTrainedError, TrainResult, report_run
from ludic.recipes.train_start import (  # re-exported: their names stay importable from here
    StartingWeightsRefused,
    _publish_start,
    _resume,
    reach_servers,
    schedule_steps_of,
)
from ludic.recipes.training import (
    check_lr_schedule,
    check_run_dir,
    finish,
    load_policy,
    log_samples,
    make_inference,
    make_trainer,
    plural,
)
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import (
    BatchSource,
    PrefetchBatchSource,
    RLAlgorithm,
    RolloutBatchSource,
)

ROLLOUTS_FILE = "rollouts.jsonl"
"""Every episode of the batches the run trained on, as it finished (`ludic view` reads it)."""

__all__ = [
    "PRESETS",
    "NothingTrainedError",
    "StartingWeightsRefused",
    "TrainResult",
    "context_of",
    "make_algorithm",
    "rollout_sampling",
    "train_command",
]


def make_algorithm(name: Algorithm, cfg: TrainConfig) -> RLAlgorithm:
    """The preset `name` from the shared registry (`ludic.recipes.algorithms.PRESETS`), with
    `cfg`'s generation budget, GiGPO knobs, --split-over-turns and --rollout-correction.*."""
    algorithm = algorithms.make_algorithm(
        name, max_tokens=cfg.max_tokens, gigpo=cfg.gigpo, split_over_turns=cfg.split_over_turns
    )
    return cfg.rollout_correction.apply(algorithm)


def train_command(cfg: TrainConfig, *, console: Console | None = None) -> TrainResult:
    """Train `cfg.model` (default: a fresh tiny model) on `cfg.env`; see `TrainConfig`."""
    console = console or Console()
    check_single_process("`ludic train`")  # under torchrun: refused on every rank, up front
    check_counts(cfg)  # --steps / --problems-per-step / --group-size below 1: nothing trains
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"--threads must be >= 1 (or left out), got {cfg.threads}")
    env_factory = resolve_env_factory(cfg.env)
    env_kwargs = parse_env_kwargs(cfg.env_kwargs)
    suggested = one_seat_env(env_factory, env_kwargs, cfg.env, command="train")
    context = context_of(cfg, suggested)
    check_prepacked_gemm(  # before the model loads, as every flag check here
        cfg.prepacked_gemm,
        batch_invariant=cfg.batch_invariant,
        server_url=cfg.server_url,
        device=cfg.device,
    )
    if cfg.batch_invariant and cfg.dtype != "float32":
        raise ValueError(
            f"--batch-invariant recomputes the engine's logprobs bit for bit, which "
            f"--dtype {cfg.dtype} (autocast) breaks: drop one of the two flags"
        )
    max_lag = trainer_max_lag(cfg)  # a bad --local-server combination fails before loading
    if cfg.server_url:  # no control token, or --batch-invariant: before the load and the wait
        server_push_token(cfg.server_token, batch_invariant=cfg.batch_invariant)
    check_api_key(cfg.api_key, cfg.server_url)  # the embedded engine or --local-server: none
    schedule_steps = schedule_steps_of(cfg)
    check_lr_schedule(cfg.lr_schedule, cfg.warmup_steps, schedule_steps, cfg.min_lr_ratio)
    if cfg.parser == "auto":  # the env's own parser, else the whole reply (identity)
        declared = declared_parser(env_factory, env_kwargs)
        parser = declared or identity_parser
    else:
        declared, parser = None, resolve_parser(cfg.parser)
    rollout_sampling(cfg)  # a bad --temperature / --top-p fails before the model loads
    check_run_lock(cfg.out_dir / RUN_LOCK, what=LUDIC_RUN)  # another live run in OUT_DIR
    check_run_dir(cfg.out_dir, cfg.resume)  # earlier checkpoints without --resume, or behind it
    algorithm = make_algorithm(cfg.algorithm, cfg)
    check_group_size(cfg, algorithm)  # a group baseline over groups of one: every advantage 0
    check_greedy(cfg, algorithm)  # --temperature 0 with a group baseline or a ratio loss
    check_resume_settings(  # --resume with another env, algorithm, group, sampling, seed: refused
        cfg,
        env_kwargs,
        lambda text: console.print(f"[yellow]note[/yellow]: --resume: {text}"),
        resolve=resume_resolvers(cfg, env_factory, env_kwargs, suggested, parser),
    )
    # What the run will do, once every refusal above had its say (a refused run prints one line)
    console.print(f"parser: {parser_name(parser)} (--parser {cfg.parser})")
    if cfg.parser == "auto" and declared is None:
        console.print(
            "[yellow]note[/yellow]: the env declares no parser, so the whole reply is the "
            "action; declare one on the env class (`parser = xml_tag_parser('move')`) or "
            "pass --parser"
        )
    console.print(context_line(cfg, suggested))
    if cfg.prepacked_gemm:
        console.print(
            "engine: prepacked GEMMs (--prepacked-gemm): faster decode; behaviour logprobs "
            "differ from the trainer's by float noise"
        )
    if cfg.threads is not None:  # before the model loads: every thread started later takes it
        torch.set_num_threads(cfg.threads)
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    run = _Run(cfg, env_factory, env_kwargs, parser, context, max_lag, console)
    notes: list[str] = []
    with ExitStack() as stack:
        stack.enter_context(  # one run per OUT_DIR: a second one is refused, naming this one
            run_lock(
                cfg.out_dir / RUN_LOCK,
                what=LUDIC_RUN,
                notice=lambda text: console.print(f"run directory: {text}"),
            )
        )
        server = None
        if cfg.local_server:
            server = stack.enter_context(local_server(cfg, model, tokenizer, console))
        history, checkpoint, watch, version = asyncio.run(
            _train(run, algorithm, model, tokenizer, server)
        )
        if server is not None:
            notes.append(_served_note(served_version(server), version, max_lag))
    if watch.overflowed:
        notes.append(
            f"[bold yellow]{watch.overflowed} of {watch.episodes} episodes ended by overflowing "
            "the model's context[/bold yellow] (see the warning above)"
        )
    return report_run(cfg, history, checkpoint, console, notes=notes)


@dataclass(frozen=True, slots=True)
class _Run:
    """What `_train` needs besides the model: the checked flags and the env's wiring."""

    cfg: TrainConfig
    env_factory: Callable[..., Any]
    env_kwargs: dict[str, Any]
    parser: Parser
    context: ContextChoice
    max_lag: int
    console: Console


async def _train(
    run: _Run, algorithm: RLAlgorithm, model: Any, tokenizer: Any, server: Any
) -> tuple[list[dict[str, float]], Path, ContextOverflowWatch, int]:
    cfg, console = run.cfg, run.console
    if server is None and cfg.server_url:  # one started just before may still be loading
        await reach_servers(cfg, console)
    # Built inside this event loop: a server's HTTP client is bound to it.
    inference = make_inference(
        model,
        tokenizer,
        server_url=(server.url,) if server is not None else cfg.server_url,
        server_token=server.token if server is not None else cfg.server_token,
        api_key=cfg.api_key,
        served_model=cfg.served_model,
        device=cfg.device,
        batch_invariant=cfg.batch_invariant,
        prepacked_gemm=cfg.prepacked_gemm and server is None,  # else the server packs
        server_ranks=cfg.server_ranks,
        max_tokens=cfg.max_tokens,  # refused where a server's context cannot hold it
        spell=as_flag,  # its refusals (--served-model, --api-key) name this command's flags
    )
    prefetch: PrefetchBatchSource | None = None
    first_batch: int | None = None  # the batch index this process draws first
    try:
        rollout_source = _rollout_source(run, algorithm, inference.client)
        source: BatchSource = rollout_source
        if server is not None:  # the next batch is drawn on the server during the step
            source = prefetch = PrefetchBatchSource(rollout_source)
        watch = ContextOverflowWatch(
            source, warn=lambda text: _warn_overflow(console, text), advice=_advice(run)
        )
        trainer = make_trainer(
            model,
            tokenizer,
            algorithm,
            log_samples(watch, cfg.out_dir),
            out=cfg.out_dir,
            lr=cfg.lr,
            lr_schedule=cfg.lr_schedule,
            warmup_steps=cfg.warmup_steps,
            schedule_steps=None if cfg.lr_schedule == "constant" else schedule_steps_of(cfg),
            min_lr_ratio=cfg.min_lr_ratio,
            seed=cfg.seed,
            publisher=inference.publisher,
            max_lag=run.max_lag,
            checkpoint_every=cfg.checkpoint_every,
            keep_checkpoints=cfg.keep_checkpoints,
            micro_batch_tokens=cfg.micro_batch_tokens,
            device=cfg.device,
            dtype=cfg.dtype,
            batch_invariant=cfg.batch_invariant,
        )
        trainer.checkpoint_extra[RUN_SETTINGS_KEY] = run_settings(cfg, run.env_kwargs)
        if cfg.resume is not None:
            _resume(trainer, cfg, console)
        elif server is None and cfg.server_url:
            _publish_start(trainer, cfg, console)
        first_batch = rollout_source.batch_index
        console.print(
            f"{algorithm.name} on {cfg.env}: {plural(cfg.steps - trainer.step, 'step')} of "
            f"{cfg.problems_per_step} x {cfg.group_size} episodes"
        )
        with quiet_repeated_overflow_lines():
            history = await trainer.train(cfg.steps - trainer.step, progress=cfg.progress)
        return history, finish(trainer), watch, trainer.policy_version
    finally:
        if prefetch is not None:  # stop drawing; the client is closed on the loop it drew on
            _close_prefetch(prefetch, inference.client, cfg.out_dir / ROLLOUTS_FILE, first_batch)
            close_publisher = getattr(inference.publisher, "close", None)
            if close_publisher is not None:  # drop the weight-sync group before the server
                close_publisher()
        else:
            await inference.aclose()  # the weight-sync group too


def _close_prefetch(
    prefetch: PrefetchBatchSource, client: ChatClient, rollouts: Path, first_batch: int | None
) -> None:
    """Stop drawing, then drop from `rollouts` the episodes of the batch drawn ahead, which no
    step trained, so the log holds the trained batches only, as without --local-server. Only
    once this process handed out a batch: its first write already dropped what a resume
    discards, and before that the file holds nothing of this process to drop."""
    ahead = prefetch.state_dict().get(BATCH_INDEX)  # the batch in flight or drawn, untaken
    prefetch.close(client)
    if first_batch is not None and isinstance(ahead, int) and ahead > first_batch:
        drop_from(rollouts, ahead, batch_index_of)


def _rollout_source(run: _Run, algorithm: RLAlgorithm, client: ChatClient) -> RolloutBatchSource:
    cfg = run.cfg
    sampling = rollout_sampling(cfg)
    rollouts = RolloutEngine(
        env_registry={cfg.env: run.env_factory},  # records name the env as --env does
        protocol_registry={"agent": lambda: _protocol(cfg, run.context, client, run.parser)},
        concurrency=cfg.concurrency,
        episode_timeout_s=cfg.episode_timeout_s,
        jsonl_log=cfg.out_dir / ROLLOUTS_FILE,
    )
    return RolloutBatchSource(
        engine=rollouts,
        requests_fn=lambda: [
            RolloutRequest(
                env=ComponentSpec(name=cfg.env, kwargs=run.env_kwargs),
                protocol=ComponentSpec(name="agent"),
                sampling=sampling,
            )
            for _ in range(cfg.problems_per_step)
        ],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=cfg.group_size),
        seed_sequencer=SeedSequencer(run_seed=cfg.seed),
    )


def _warn_overflow(console: Console, text: str) -> None:
    console.print(f"[bold red]context overflow[/bold red]: {text}")


def _advice(run: _Run) -> str:
    cfg = run.cfg
    if run.context == "full":
        return (
            "With --context full every prompt holds the whole dialog so far (up to --max-steps "
            f"{cfg.max_steps} turns, each reply up to --max-tokens {cfg.max_tokens} tokens). "
            "Pass --context latest (the system prompt and the latest observation only), a "
            "smaller --max-tokens or fewer --max-steps. Further episode lines of this cause are "
            "not shown; each failed episode's meta['error'] in rollouts.jsonl holds its own."
        )
    return (
        "Even the system prompt and the latest observation overflow it: shorten the env's "
        "observation or system prompt (--system-prompt), lower --max-tokens, or use a model "
        "with a longer context. Further episode lines of this cause are not shown."
    )


def _served_note(served: int | None, trainer_version: int, max_lag: int) -> str:
    if served == trainer_version:
        return (
            f"local server: served policy version {served}, the trainer's; samples trained at "
            f"most {plural(max_lag, 'version')} old"
        )
    return (
        f"[bold red]local server: serves policy version {served}, the trainer is at "
        f"{trainer_version}[/bold red] (the last push did not land; see its log)"
    )


def rollout_sampling(cfg: TrainConfig) -> SamplingConfig:
    """The rollouts' sampling (--temperature, --top-p, --max-tokens); it travels with every
    sample, so the trainer recomputes logprobs under the same transform. A value out of range
    raises ValueError naming the flags."""
    return sampling_from_flags(cfg.temperature, cfg.top_p, cfg.max_tokens)


def _protocol(
    cfg: TrainConfig, kind: ContextChoice, client: ChatClient, parser: Parser
) -> SingleAgentProtocol:
    context: ContextStrategy = LatestObservationContext() if kind == "latest" else FullDialog()
    agent = Agent(
        client,
        context=context,
        parser=parser,
        sampling=rollout_sampling(cfg),
        system_prompt=cfg.system_prompt,
        reject_incomplete_completions=cfg.reject_incomplete,
    )
    return SingleAgentProtocol(agent, max_steps=cfg.max_steps)
