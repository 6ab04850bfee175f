"""The configs of the two pipeline processes: `ActorConfig` (`ludic actor`) and `LearnerConfig`
(`ludic learner`). Field docstrings are the commands' `--help` (tyro). Importing this module is
light (no torch, no Redis); `ludic.pipeline.commands` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ludic.recipes.algorithms import Algorithm, GiGPOOptions
from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS, ContextKind

StalePolicy = Literal["drop", "downweight"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ActorConfig:
    """Generate rollouts with the served policy and push training samples to a Redis stream."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the sample stream (unreachable at startup: an error within seconds;
    once reached, an outage is retried for up to ten minutes)."""
    stream: str = "ludic:samples"
    """Stream key (actors and the learner must use the same one)."""
    server_url: tuple[str, ...] | None = None
    """OpenAI-compatible servers serving the policy (`ludic serve`, vLLM), which the learner
    publishes to; several (`--server-url A B C`): episodes spread over them, each kept on one
    server. None: an embedded engine on --model in this process, whose weights never change
    (for debugging the pipeline only)."""
    server_wait_s: float = 300.0
    """How long to wait for the --server-url servers to listen, at startup and after a batch
    whose every episode failed (a server restarted mid-run): a server started just before is
    loading its model (vLLM's CPU build took 211 s on a quiet machine). Past it the actor stops,
    naming the server. At least 1."""
    served_model: str | None = None
    """Model name to request from every server (default: the one model the first server lists
    at /v1/models; one listing several is refused, asking for --served-model). A name a
    server's /v1/models does not list is refused once the servers listen, before any episode."""
    api_key: str | None = None
    """Bearer token for the server's inference endpoints, if it needs one."""
    model: str | None = None
    """Local model directory for the embedded engine (default: a locally built tiny model)."""
    batch_invariant: bool = False
    """Run the embedded engine batch-invariant (`EngineConfig(batch_invariant=True)`): an
    episode's tokens do not depend on the episodes beside it, so a seeded batch repeats exactly
    on the same machine and build. Not with --server-url (serve with `ludic serve
    --batch-invariant` instead)."""
    prepacked_gemm: bool = False
    """Run the embedded engine's GEMMs on packed weight copies (`EngineConfig(prepacked_gemm=
    True)`): faster decode on CPU, behaviour logprobs that differ from the learner's
    recomputation by float noise (~1e-5..1e-4). Not with --batch-invariant or --server-url
    (serve with `ludic serve --prepacked-gemm` instead)."""
    policy_version: int | None = None
    """Without --server-url: the policy version the embedded engine's samples carry (default: a
    training checkpoint's saved version, else 0; pass 0 when the learner starts a new run from
    that checkpoint's weights). With --server-url the server's version is used (`ludic serve
    --policy-version`)."""
    env: str = "tictactoe"
    """Built-in env name (see `ludic.envs.BUILTIN_ENVS`) or a `module:factory` import string."""
    env_kwargs: str = "{}"
    """JSON object of keyword arguments for the env factory."""
    parser: str = "auto"
    """Action parser: auto (the env's own), identity, boxed, xml:TAG or `module:function`."""
    system_prompt: str | None = None
    """System prompt (default: the env's suggestion)."""
    context: ContextKind = "auto"
    """Agent memory: full (the whole dialog), latest (system prompt + latest observation), or
    auto: what the env declares (`suggested_context = "latest"` on its class, as tictactoe
    does), else full; resolved as `ludic train --context` resolves it."""
    algorithm: Algorithm = "grpo"
    """Preset whose credit assignment runs here (the learner must use the same preset)."""
    gigpo: GiGPOOptions = field(default_factory=GiGPOOptions)
    """GiGPO's credit knobs (only with --algorithm gigpo; credit is assigned here)."""
    split_over_turns: bool = False
    """Give each turn sample of a k-turn episode its advantage / k, so every episode weighs
    once in the loss whatever its turn count, as `ludic train --split-over-turns` does (credit
    is assigned here: the learner takes no such flag; each sample records it, and actors of
    one stream must agree). GRPO-family presets (grpo, dr_grpo, gspo, cispo, gmpo,
    reinforce_baseline); others are refused before any work."""
    problems_per_batch: int = 4
    """Distinct problems (env seeds) per batch."""
    group_size: int = 8
    """Episodes per problem (the group sharing a baseline)."""
    max_steps: int = 10
    """Env steps per episode before truncation."""
    max_tokens: int = 128
    """Token limit per model call."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus (top-p) sampling, in (0, 1] (1: off); it travels with each sample, so the
    learner recomputes logprobs on the same truncated support."""
    concurrency: int = 32
    """Episodes in flight at once."""
    episode_timeout_s: float | None = 600.0
    """Wall-clock limit per episode (None: no limit), as `ludic train` and `ludic eval`: an env,
    tool or server that hangs fails its episode, logged, and the batch goes on without it."""
    batches: int | None = None
    """Stop after this many batches (None: run until interrupted)."""
    max_backlog: int = 256
    """The most undelivered samples the stream holds, whatever the number of actors: a batch
    is pushed only where it fits (one larger than this alone, into a drained stream), and
    before generating one an actor waits until a batch as large as its last would fit (bounds
    Redis memory and how stale queued samples get)."""
    max_stream_len: int = 100_000
    """Safety cap on the stream (XADD MAXLEN ~); only reached if backpressure is bypassed."""
    actor_id: str = "actor"
    """Prefix of this actor's sample ids and name of its batch counter in Redis: a restarted
    actor continues its seed sequence, and actors sharing an id split it (never the same seeds
    or ids twice)."""
    seed: int = 0
    """Run seed of env problems and sampling (with the batch index from the counter)."""
    run_id: str | None = None
    """Stamp this run id on the samples instead of the hash of the flags that define the run
    (logged at the first batch): to keep a run going with actor flags changed on purpose, pass
    the id its learner trains. Its learner then trains these samples as the run's."""
    metrics_path: Path | None = None
    """Append one JSON line of stats per batch here."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LearnerConfig:
    """Train on samples from a Redis stream and publish weights to the inference server."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the sample stream (unreachable at startup: an error within seconds;
    once reached, an outage is retried for up to ten minutes)."""
    stream: str = "ludic:samples"
    """Stream key (actors and the learner must use the same one)."""
    group: str = "ludic-learners"
    """Consumer group of the stream."""
    consumer: str = "learner"
    """This learner job's name in the consumer group (rank r reads as `<consumer>-r<r>`); keep
    it across restarts so each rank replays its own samples read after the last checkpoint.
    One live learner per name: a second one is refused (see --lease-ttl-s)."""
    lease_ttl_s: float = 15.0
    """Each rank holds a lease on its consumer name in Redis, renewed every third of this; a
    learner started under a name still leased waits this long (a killed learner's lease
    expires by then) and is otherwise refused, naming the holder."""
    server_url: tuple[str, ...] | None = None
    """Inference servers to publish weights to, all in one broadcast (None: do not publish);
    a server that is down is named each step and rejoins when it is back."""
    server_wait_s: float = 300.0
    """How long to wait at startup, before the model loads, for the --server-url servers to
    listen (one started just before is loading its model); past it the learner stops, naming
    the server. At least 1."""
    server_ranks: int = 1
    """Weight-receiving ranks of each server: its tensor-parallel size for vLLM (1 for
    `ludic serve`)."""
    token: str | None = None
    """Bearer token of the server's control endpoints (default: $LUDIC_SERVER_TOKEN); with
    --server-url, none, or one no server holds (not printable ASCII, surrounding spaces), is
    refused at start, before Redis, the server wait and the model load."""
    model: str | None = None
    """Local model directory to start from; the server must serve the same model
    (default: a locally built tiny model)."""
    algorithm: Algorithm = "grpo"
    """Algorithm preset (its loss runs here; its credit assignment ran on the actors)."""
    max_tokens: int | None = None
    """The actors' generation budget per call; needed only by dr_grpo (its constant
    loss normaliser), and then it must be the actors' --max-tokens (each sample records it:
    another value is refused)."""
    steps: int = 100
    """Optimizer steps (the run ends earlier if --max-wait-s passes without samples)."""
    batch_size: int = 32
    """Samples per optimizer step on each learner rank (torchrun: world size x this in all)."""
    lr: float = 1e-5
    """Learning rate."""
    override_lr_schedule: bool = False
    """On resume, apply this launch's --lr from the checkpoint's step on (as `ludic train
    --override-lr-schedule` does). Without it, an --lr that differs from the one the checkpoint
    recorded is refused."""
    micro_batch_tokens: int | None = DEFAULT_MICRO_BATCH_TOKENS
    """Token budget of one forward/backward (padding counts): a larger batch runs in several
    micro-batches whose gradients accumulate, so memory stays bounded. None: the whole batch
    in one pass."""
    max_lag: int | None = 4
    """Samples more than this many policy versions behind are stale (None: never)."""
    stale: StalePolicy = "drop"
    """What to do with stale samples: drop them, or downweight by stale_decay per extra version."""
    stale_decay: float = 0.5
    """Weight factor per version beyond max_lag when stale=downweight."""
    publish_every: int = 1
    """Publish weights every N optimizer steps."""
    bucket_mb: float = 64.0
    """Size of one weight broadcast."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """Weight broadcast backend: gloo (CPU tensors) or nccl (GPU)."""
    master_addr: str = "127.0.0.1"
    """This machine's address as the server sees it (it hosts the broadcast rendezvous)."""
    verify_atol: float = 1e-3
    """Largest logprob gap between server and trainer accepted after a push."""
    checkpoint_every: int | None = 50
    """Checkpoint every N steps; samples are acked only once a checkpoint holds them, so a
    restarted learner resumes from it and trains exactly the rest, each sample once (None: no
    checkpoints, ack after every step; a restart then starts from the initial weights)."""
    resume: bool = True
    """Resume from the newest checkpoint in out_dir when there is one."""
    max_wait_s: float | None = None
    """Stop when no sample arrives for this long (on every rank; None: wait forever)."""
    ledger: bool = False
    """Record each commit's sample ids in `<stream>:ledger` (audits, exactly-once checks)."""
    seed: int = 0
    """Seeds training."""
    run_id: str | None = None
    """Train only this run's samples and dead-letter every other run's (default: the run of
    the first stamped sample read, or the one the checkpoint records). On resume it replaces
    the checkpoint's run, and the log says so. A new run on a reused --stream given it numbers
    its policy versions from 0, not past the earlier run's."""
    device: str = "cpu"
    """Training device."""
    out_dir: Path = Path("ludic_runs/learner")
    """Where metrics.jsonl and checkpoints are written."""
