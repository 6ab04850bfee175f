"""`run_actor` and `run_learner`: the two pipeline processes, assembled from public components.

An actor = env + agent + ChatClient (the served policy) + `PipelineActor`; the learner =
model + `Trainer` over a `PipelineBatchSource`, publishing with `BroadcastPolicyPublisher`.
Under torchrun each learner rank reads its own share of the stream. With checkpoints (the
default) samples are acked once the checkpoint that holds them is saved; without, after each
step. The learner's run after its flag checks is `learner_run`. Heavy imports happen when a
command runs. It starts no server and no Redis.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ludic.errors import Refusal
from ludic.inference.http.server_wait import wait_for_servers
from ludic.pipeline.actor import ActorBatchStats, PipelineActor
from ludic.pipeline.config import ActorConfig, Algorithm, LearnerConfig
from ludic.pipeline.credit_check import credit_record
from ludic.pipeline.flag_checks import (
    check_actor_counts,
    check_learner_counts,
    check_learner_model,
    check_learner_model_path,
    refusals_need_torch,
)
from ludic.pipeline.learner_run import _credit_checked_source as _credit_checked_source
from ludic.pipeline.learner_run import _publisher as _publisher
from ludic.pipeline.learner_run import _resume_learner as _resume_learner
from ludic.pipeline.learner_run import _trainer as _trainer
from ludic.pipeline.learner_run import learn
from ludic.pipeline.learner_settings import (
    check_learner_resume,
    refuse_fresh_run_over_checkpoints,
)
from ludic.pipeline.run_check import check_run_id, run_id_for
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_url import check_reachable
from ludic.recipes.algorithms import GiGPOOptions, check_split_over_turns
from ludic.recipes.inference import (  # shared with `ludic eval` and `ludic train`
    engine_settings,
    server_push_token,
)

if TYPE_CHECKING:
    from ludic.eval.env_spec import EnvFactory
    from ludic.inference import SamplingConfig
    from ludic.parsers import Parser
    from ludic.recipes.configs import ContextChoice
    from ludic.types import JSON

logger = logging.getLogger(__name__)


def make_algorithm(
    name: Algorithm,
    *,
    max_tokens: int | None = None,
    gigpo: GiGPOOptions | None = None,
    split_over_turns: bool = False,
) -> Any:
    """The `RLAlgorithm` preset called `name`, from the registry `ludic train` uses too."""
    from ludic.recipes.algorithms import make_algorithm as make_preset

    return make_preset(name, max_tokens=max_tokens, gigpo=gigpo, split_over_turns=split_over_turns)


def actor_algorithm(cfg: ActorConfig) -> Any:
    """The preset whose credit the actor assigns, with its --max-tokens, --gigpo.* and
    --split-over-turns."""
    return make_algorithm(
        cfg.algorithm,
        max_tokens=cfg.max_tokens,
        gigpo=cfg.gigpo,
        split_over_turns=cfg.split_over_turns,
    )


def actor_credit_record(cfg: ActorConfig) -> JSON:
    """What the actor stamps on each sample for the learner's `CreditCheck`."""
    return credit_record(
        cfg.algorithm, cfg.gigpo, max_tokens=cfg.max_tokens, split_over_turns=cfg.split_over_turns
    )


LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
"""The pipeline processes' log lines: the colon ends the logger's name, so a line of
`ludic.pipeline.actor` reads apart from its message, which names the actor ('actor 'a0' ...')."""


def configure_logging() -> None:
    """INFO lines with timestamps: the pipeline processes are long-running services."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise


def actor_command(cfg: ActorConfig) -> None:
    """`ludic actor`: `run_actor` with INFO logging."""
    configure_logging()
    run_actor(cfg)


def learner_command(cfg: LearnerConfig) -> None:
    """`ludic learner`: `run_learner` with INFO logging."""
    configure_logging()
    run_learner(cfg)


# -- actor ------------------------------------------------------------------------------


def run_actor(cfg: ActorConfig) -> list[ActorBatchStats]:
    """Generate batches and push their samples until `cfg.batches` (or forever)."""
    from ludic.eval.env_spec import resolve_env_factory, resolve_parser
    from ludic.recipes.configs import parse_env_kwargs
    from ludic.recipes.inference import check_engine_flags

    check_actor_counts(cfg)  # --group-size 0, --problems-per-batch 0, ...: nothing would train
    check_run_id(cfg.run_id)
    sampling = actor_sampling(cfg)  # a bad --temperature / --top-p fails before any work
    check_actor_preset(cfg)  # --group-size 1 or --temperature 0 where the preset cannot learn
    check_gigpo_flags(cfg)  # --gigpo.* with another preset, a bad --gigpo.state-key
    check_split_over_turns(cfg.algorithm, cfg.split_over_turns)  # a preset it cannot split
    check_engine_flags(  # as `ludic train` and `ludic eval` refuse them, before any model loads
        batch_invariant=cfg.batch_invariant,
        prepacked_gemm=cfg.prepacked_gemm,
        server_url=cfg.server_url,
    )
    env_factory = resolve_env_factory(cfg.env)
    env_kwargs = parse_env_kwargs(cfg.env_kwargs)
    # Before the event loop: "auto" may build the env (with the run's kwargs, as `ludic train`
    # does) to read the parser and context its class declares, and close it, possibly async.
    parser = resolve_parser(cfg.parser, env_factory, env_kwargs)
    context = actor_context(cfg, env_factory, env_kwargs)
    check_reachable(cfg.redis_url)  # Redis not started: refused in seconds, before torch loads
    return asyncio.run(_act(cfg, env_factory, env_kwargs, parser, context, sampling))


def check_actor_preset(cfg: ActorConfig) -> None:
    """Refuse, as `ludic train` does, flags with which `--algorithm`'s preset cannot learn:
    `--group-size 1` with a group baseline (every advantage 0), `--temperature 0` with a group
    baseline or a ratio loss (`ludic.recipes.train_checks`). Other flags skip it: the preset
    and the checks import torch, which the actor's Redis check must not wait for."""
    if cfg.group_size != 1 and cfg.temperature != 0:  # neither check can refuse them
        return
    from ludic.recipes.train_checks import check_greedy, check_group_size

    algorithm = actor_algorithm(cfg)
    check_group_size(cfg, algorithm)
    check_greedy(cfg, algorithm)


def check_gigpo_flags(cfg: ActorConfig) -> None:
    """Refuse, as `ludic train` does and before any work, `--gigpo.*` flags with another
    preset than gigpo (ignored otherwise), and with gigpo a `--gigpo.state-key` that cannot
    be imported or called with one turn: both were found only once Redis answered and the
    policy had loaded."""
    from ludic.recipes.algorithms import check_gigpo_options

    check_gigpo_options(cfg.algorithm, cfg.gigpo)
    # only a 'module:function' key can fail; "env" would import torch (ludic.training.credit)
    # before the Redis check, which must refuse a stopped Redis in seconds
    if cfg.algorithm == "gigpo" and cfg.gigpo.state_key not in ("env", "observation"):
        cfg.gigpo.anchor_key()


def actor_context(
    cfg: ActorConfig, env_factory: EnvFactory, env_kwargs: dict[str, Any]
) -> ContextChoice:
    """What --context resolves to (auto: the env's `suggested_context`, else full), logged with
    its reason as `ludic train` and `ludic eval` print it."""
    from ludic.recipes.configs import context_line, context_of, one_seat_env

    # built once whatever --context, as `ludic eval` does: bad --env-kwargs, a factory that
    # returns no env or a multi-seat env fail here, not in every episode
    auto = cfg.context == "auto"  # an explicit --context overrides what the env declares
    suggested = one_seat_env(env_factory, env_kwargs, cfg.env, command="actor", auto=auto)
    logger.info(context_line(cfg, suggested))
    return context_of(cfg, suggested)


def actor_sampling(cfg: ActorConfig) -> SamplingConfig:
    """The rollouts' sampling (--temperature, --top-p, --max-tokens); a value out of range
    raises ValueError naming the flags, as `ludic train` does."""
    from ludic.recipes.configs import sampling_from_flags

    return sampling_from_flags(cfg.temperature, cfg.top_p, cfg.max_tokens)


async def _act(
    cfg: ActorConfig,
    env_factory: EnvFactory,
    env_kwargs: dict[str, Any],
    parser: Parser,
    context: ContextChoice,
    sampling: SamplingConfig,
) -> list[ActorBatchStats]:
    from ludic.agents import Agent
    from ludic.context import FullDialog, LatestObservationContext
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts import (
        ComponentSpec,
        GRPORequestStrategy,
        RolloutEngine,
        RolloutRequest,
        SeedSequencer,
    )

    stream = SampleStream(cfg.redis_url, stream=cfg.stream, max_len=cfg.max_stream_len)
    try:  # Redis first: a wrong --redis-url fails in seconds, before a model loads
        await stream.ensure_group()
        if cfg.server_url:  # one started just before may still be loading its model
            await wait_for_actor_servers(cfg)
        served = await _served_name(cfg) if cfg.server_url else None
        client = await _actor_client(cfg, served)
    except BaseException:
        await stream.aclose()
        raise

    def protocol() -> SingleAgentProtocol:
        memory = LatestObservationContext() if context == "latest" else FullDialog()
        agent = Agent(client, context=memory, parser=parser, system_prompt=cfg.system_prompt)
        return SingleAgentProtocol(agent, max_steps=cfg.max_steps)

    def requests() -> list[RolloutRequest]:
        env = ComponentSpec(name=cfg.env, kwargs=env_kwargs)
        return [
            RolloutRequest(env=env, protocol=ComponentSpec(name="single"), sampling=sampling)
            for _ in range(cfg.problems_per_batch)
        ]

    run_id, run_id_origin = _stamped_run_id(cfg, actor_run_id(cfg, env_kwargs, served_model=served))
    actor = PipelineActor(
        engine=RolloutEngine(
            env_registry={cfg.env: env_factory},  # records name the env as --env does
            protocol_registry={"single": protocol},
            concurrency=cfg.concurrency,
            episode_timeout_s=cfg.episode_timeout_s,
        ),
        stream=stream,
        requests_fn=requests,
        credit_assigner=actor_algorithm(cfg).credit_assigner,
        strategy=GRPORequestStrategy(group_size=cfg.group_size),
        seed_sequencer=SeedSequencer(run_seed=cfg.seed),
        max_backlog=cfg.max_backlog,
        actor_id=cfg.actor_id,
        # the learner checks it
        credit_record=actor_credit_record(cfg),
        # the learner dead-letters another run's samples
        run_id=run_id,
        run_id_origin=run_id_origin,
        check_stream_run=cfg.run_id is None,  # a run named on purpose: its learner is told too
    )
    try:
        history: list[ActorBatchStats] = []
        while cfg.batches is None or len(history) < cfg.batches:
            stats = await actor.step()
            history.append(stats)
            logger.info(batch_line(cfg, stats))
            if cfg.metrics_path is not None:
                with Path(cfg.metrics_path).open("a") as f:
                    f.write(json.dumps(stats.to_dict()) + "\n")
            await wait_after_failed_batch(cfg, stats)
        if history and all(stats.every_episode_failed for stats in history):
            raise NothingPushedError(
                f"actor {cfg.actor_id!r}: every episode of all {len(history)} batch(es) failed, "
                "so no sample reached the stream; the first error and its traceback are logged "
                "above (each batch's first error too). Fix the cause and run again"
            )
        pushed = sum(stats.num_samples for stats in history)
        logger.info(
            "actor %r done: %d batches, %d samples pushed", cfg.actor_id, len(history), pushed
        )
        return history
    finally:
        await stream.aclose()
        await _close(client)


class NothingPushedError(Refusal, RuntimeError):
    """Every episode of every batch of an actor run with `--batches N` failed: as `ludic train`
    ends with NothingTrainedError, the command exits 1 instead of reporting `done`."""


def actor_run_id(
    cfg: ActorConfig, env_kwargs: dict[str, Any], *, served_model: str | None = None
) -> str:
    """The run id `ludic actor` stamps on its samples: a hash of the flags that give them their
    meaning (the episode, the credit, the sampling, the model), not of the ones that may differ
    between the actors of one run (--actor-id, --seed, --server-url, --concurrency, ...). Every
    actor started with the run's flags, and a restarted one, stamps the same id; an actor started
    with other flags is another run, whose samples the learner dead-letters. The model is the
    one sampled, not the flag as spelled: `served_model`, the name the servers were asked for
    (`--served-model`, else the one the first server lists), or the embedded engine's model
    directory, resolved (`--model`, else the tiny model's), so an actor leaving --served-model
    out and one naming the served model are one run, and an embedded actor (whose weights never
    change) is never the run of a served one."""
    return run_id_for(
        {
            "env": cfg.env,
            "env_kwargs": env_kwargs,
            "parser": cfg.parser,
            "context": cfg.context,
            "system_prompt": cfg.system_prompt,
            "max_steps": cfg.max_steps,
            "credit": actor_credit_record(cfg),
            "group_size": cfg.group_size,
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "model": _sampled_model(cfg, served_model),
        }
    )


def _stamped_run_id(cfg: ActorConfig, flags_run: str) -> tuple[str, str]:
    """The run id the actor stamps (--run-id, else its flags' `flags_run`) and where it comes
    from, as the actor's line says it: only a flags' run id is the same for every actor started
    with the run's flags."""
    if cfg.run_id is None:
        return (
            flags_run,
            "its flags' run id: the same for every actor started with this run's flags",
        )
    if cfg.run_id == flags_run:
        return flags_run, "--run-id, which is also its flags' run id"
    return cfg.run_id, (
        f"--run-id, in place of its flags' run id {flags_run}: its samples are trained as run "
        f"{cfg.run_id}'s, as are those of every actor given --run-id {cfg.run_id}"
    )


async def wait_for_actor_servers(
    cfg: ActorConfig, wait: Callable[..., Awaitable[None]] = wait_for_servers
) -> None:
    """Wait up to --server-wait-s for every --server-url server to listen (none: the embedded
    engine); past it the error names the server and both flags (a server slower to start
    needs a longer wait)."""
    from ludic.recipes.inference import server_urls

    if not cfg.server_url:
        return
    await wait(
        server_urls(cfg.server_url),
        within_s=cfg.server_wait_s,
        wait_setting="--server-wait-s",
    )


async def wait_after_failed_batch(
    cfg: ActorConfig,
    stats: ActorBatchStats,
    wait: Callable[..., Awaitable[None]] = wait_for_servers,
) -> None:
    """After a batch whose every episode failed, wait for the servers to listen again (up to
    --server-wait-s, then the actor stops naming the URL), as at startup: a server restarted
    mid-run (a crash, a new `ludic serve`) failed every batch while it loaded its model, each
    in seconds once the client's retries ran out, burning the seed sequence. A server that
    listens (episodes failing for another reason) passes at once."""
    if stats.every_episode_failed:
        await wait_for_actor_servers(cfg, wait)


def batch_line(cfg: ActorConfig, stats: ActorBatchStats) -> str:
    """One log line per batch: what it pushed, and why it pushed nothing if so. A batch whose
    every episode failed has no mean reward (its stats hold 0.0, a reward no episode earned),
    and a batch without samples no policy version."""
    all_failed = stats.every_episode_failed
    reward = "unknown" if all_failed else f"{stats.mean_reward:+.3f}"
    line = (
        f"actor {cfg.actor_id!r} batch {stats.batch_index}: {stats.num_samples} samples from "
        f"{stats.num_rollouts} episodes ({stats.num_failed} failed), mean episode "
        f"reward {reward}, {_versions(stats)}, generated in {stats.generate_seconds:.1f}s after "
        f"{stats.backpressure_seconds:.1f}s waiting for the learner"
    )
    if stats.num_samples == 0 and all_failed:
        line += "; every episode failed, so nothing reached the stream (first error logged above)"
    elif stats.num_samples == 0:
        line += "; no sample reached the stream (no episode produced a training turn)"
    return line


def _versions(stats: ActorBatchStats) -> str:
    """The policy versions of a batch's samples: 'policy versions 3..5', 'policy version 4', or
    'no policy version (no sample)'."""
    low, high = stats.policy_version_min, stats.policy_version_max
    if low is None or high is None:
        return "no policy version (no sample)"
    return f"policy version {low}" if low == high else f"policy versions {low}..{high}"


def _sampled_model(cfg: ActorConfig, served_model: str | None) -> str:
    """What `actor_run_id` hashes for the model: the served name, or the embedded model's
    resolved directory."""
    if cfg.server_url:
        return f"served:{served_model or cfg.served_model}"
    from ludic.models import tiny_model_dir

    return f"embedded:{Path(cfg.model or tiny_model_dir()).expanduser().resolve()}"


async def _served_name(cfg: ActorConfig) -> str:
    """--served-model, else the first server's one model; refused where a server's /v1/models
    does not list it (each episode sent there would fail with a 404). Asked once the servers
    listen (`wait_for_servers` in `_act`), so one still loading is not refused."""
    from ludic.recipes.inference import served_model_for, server_urls

    urls = server_urls(cfg.server_url)
    return await asyncio.to_thread(  # and a --max-tokens past its context: every episode a 400
        lambda: served_model_for(urls, cfg.served_model, cfg.api_key, max_tokens=cfg.max_tokens)
    )


async def _actor_client(cfg: ActorConfig, served_model: str | None = None) -> Any:
    """The embedded engine, or a client of the servers (several: a ServerPool spreading the
    episodes) for `served_model` (None: `_served_name` asks them)."""
    if not cfg.server_url:
        return _embedded_engine(cfg)
    from ludic.recipes.inference import make_client, server_urls

    name = served_model or await _served_name(cfg)
    return make_client(server_urls(cfg.server_url), served_model=name, api_key=cfg.api_key)


def _embedded_engine(cfg: ActorConfig) -> Any:
    """The embedded engine on --model with --batch-invariant / --prepacked-gemm, named in the
    log with the settings the engine actually holds."""
    from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
    from ludic.models import tiny_model_dir

    config = EngineConfig(batch_invariant=cfg.batch_invariant, prepacked_gemm=cfg.prepacked_gemm)
    model_dir = cfg.model or tiny_model_dir()
    engine = EmbeddedEngine.from_pretrained(
        model_dir, dtype="float32", config=config, policy_version=cfg.policy_version
    )
    logger.info(
        "engine: embedded on %s (%s); no learner publishes to it, so its weights never change "
        "(for debugging the pipeline; pass --server-url to sample the learner's policy)",
        model_dir,
        engine_settings(engine.config),
    )
    return engine


async def _close(client: Any) -> None:
    if hasattr(client, "aclose"):
        await client.aclose()
    elif hasattr(client, "close"):
        client.close()


# -- learner ----------------------------------------------------------------------------


def run_learner(cfg: LearnerConfig) -> list[dict[str, float]]:
    """Train `cfg.steps` steps on samples from the stream; returns each step's metrics."""
    check_learner_counts(cfg)  # --steps 0, --lr 0, dr_grpo without --max-tokens: before Redis
    check_run_id(cfg.run_id)
    check_learner_model_path(cfg)  # --model /nonexistent: refused before torch loads
    if cfg.server_url:  # no --token (nor $LUDIC_SERVER_TOKEN): refused before any wait or load
        server_push_token(cfg.token, flag="--token")
    if not refusals_need_torch(cfg):  # Redis not started: refused in seconds, not after torch
        check_reachable(cfg.redis_url)
    check_learner_model(cfg)  # a --model that is no model directory
    check_learner_resume(cfg)  # other --algorithm, --lr (unless overridden), --model: refused
    refuse_fresh_run_over_checkpoints(cfg)  # --no-resume over an earlier run's checkpoints
    return asyncio.run(learn(cfg))
