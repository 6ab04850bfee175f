"""The configs of the `ludic quickstart`, `ludic train` and `ludic sft` commands.

One frozen dataclass per command; field docstrings are the command's `--help` (tyro). This
module imports nothing heavy, so building the CLI stays fast; the recipes that run a config
live beside it (`quickstart.py`, `train.py`, `sft.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

from tyro.constructors import PrimitiveConstructorSpec

from ludic.recipes.algorithms import Algorithm, GiGPOOptions
from ludic.recipes.rollout_correction_flags import RolloutCorrectionOptions

if TYPE_CHECKING:
    from ludic.inference.sampling import SamplingConfig

Opponent = Literal["random", "minimax", "mixed"]
IllegalMove = Literal["retry", "end"]
ContextKind = Literal["auto", "full", "latest"]
OfflineAlgorithm = Literal["sft", "awr"]

RESUME_LATEST = "latest"
"""`TrainConfig.resume` value for the run's own checkpoints (what a bare `--resume` gives)."""

DEFAULT_MICRO_BATCH_TOKENS = 8192
"""Default token budget of one forward/backward for `ludic train` and `ludic sft` (and
`ludic learner`): a tictactoe batch (32 episodes x 10 turns of ~440 tokens) in one pass took
16 GB and more; in 8,192-token micro-batches that accumulate it takes about 1 GB, and the
gradients equal one big batch's up to float rounding."""

ContextChoice = Literal["full", "latest"]
"""What --context resolves to (`context_of`)."""


class HasContext(Protocol):
    """A command config with a --context flag (`TrainConfig`, `ludic eval`'s `EvalConfig`)."""

    @property
    def context(self) -> ContextKind: ...


def context_of(cfg: HasContext, suggested: str | None) -> ContextChoice:
    """What --context resolves to: full or latest as given; auto takes the env's
    `suggested_context` (`suggested`), else full."""
    if cfg.context != "auto":
        return cfg.context
    return "latest" if suggested == "latest" else "full"


def context_line(cfg: HasContext, suggested: str | None) -> str:
    """The line `ludic train` and `ludic eval` print: the context and why it was chosen."""
    why = ""
    if cfg.context == "auto":
        why = ": the env's suggested_context" if suggested else ": the env suggests none"
    return f"context: {context_of(cfg, suggested)} (--context {cfg.context}{why})"


def suggested_context(env: object, name: str) -> str | None:
    """The env's `suggested_context` ("full", "latest" or None when it declares none); any
    other value raises ValueError naming the env and the flag that overrides it."""
    suggested = getattr(env, "suggested_context", None)
    if suggested not in (None, "full", "latest"):
        raise ValueError(
            f"env {name!r} declares suggested_context = {suggested!r}; it must be 'full' or "
            "'latest' (or pass --context full / --context latest)"
        )
    return suggested


def one_seat_env(
    factory: Any, kwargs: dict[str, Any], name: str, *, command: str, auto: bool = True
) -> str | None:
    """Build one env (`with_env`: its kwargs checked, that it is an env), check that it has one
    seat, as `ludic train`, `eval` and `actor` drive one agent, and return its
    `suggested_context` when `auto` (else None). A multi-seat env is refused naming its seats
    and where self-play lives: every episode would fail in SingleAgentProtocol."""
    from ludic.eval.env_spec import with_env

    seats, suggested = with_env(
        factory,
        kwargs,
        lambda env: (list(env.agent_ids), suggested_context(env, name) if auto else None),
    )
    if len(seats) != 1:
        raise ValueError(
            f"env {name!r} has {len(seats)} seats {seats}; `ludic {command}` drives one agent. "
            "For multi-agent self-play see examples/tictactoe/selfplay.py (MultiAgentProtocol "
            "with the Python API)"
        )
    return suggested


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """The JSON object `--env-kwargs` holds (of `ludic train`, `ludic eval`, `ludic actor`);
    anything else raises ValueError naming the flag."""
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--env-kwargs must be a JSON object, got {text!r} ({e})") from e
    if not isinstance(kwargs, dict):
        raise ValueError(f"--env-kwargs must be a JSON object, got {text!r}")
    return kwargs


def sampling_from_flags(temperature: float, top_p: float, max_tokens: int) -> SamplingConfig:
    """The episodes' sampling from `--temperature`, `--top-p` and `--max-tokens` (of `ludic
    train`, `ludic eval`, `ludic actor`); a value out of range raises ValueError naming its
    flag (`--max-tokens must be in [1, ...], got 0`)."""
    from ludic.inference.sampling import SamplingConfig

    try:
        return SamplingConfig(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    except ValueError as e:
        message = str(e)
        for name in ("temperature", "top_p", "max_tokens"):
            if message.startswith(f"{name} "):
                raise ValueError(f"--{name.replace('_', '-')}{message[len(name) :]}") from e
        raise ValueError(f"--temperature / --top-p / --max-tokens: {e}") from e


def _resume_from_args(args: list[str]) -> str:
    if len(args) > 1:
        raise ValueError(f"--resume takes at most one directory, got {args}")
    return args[0] if args else RESUME_LATEST


_RESUME_ARG = PrimitiveConstructorSpec(
    nargs="*",
    metavar="[DIR]",
    instance_from_str=_resume_from_args,
    is_instance=lambda value: value is None or isinstance(value, str),
    str_from_instance=lambda value: ["None"] if value is None else [value],
)


@dataclass(frozen=True, kw_only=True, slots=True)
class QuickstartConfig:
    """Train a tiny model to play tic-tac-toe from scratch on the CPU: expert data by rejection
    sampling, SFT cold start, then GRPO; evaluates before SFT, after SFT and after RL."""

    out_dir: Path = Path("ludic_runs/quickstart")
    """Where data, metrics, checkpoints, eval records and the reward curve are written."""
    seed: int = 0
    """Seeds the model init, data, training and evaluation."""
    opponent: Opponent = "random"
    """Scripted opponent: random, minimax (perfect play) or mixed (random with probability
    --opponent-epsilon, else minimax)."""
    opponent_epsilon: float = 0.5
    """Random-move probability of the mixed opponent."""
    illegal_move: IllegalMove = "retry"
    """What an illegal move does: retry (a -1 penalty, then move again) or end (the game is
    lost with -1)."""
    observation: Literal["compact", "full"] = "compact"
    """What the model reads each turn: compact (the board, empty cells as their numbers, and
    the mark to play) or full (the env's explanatory text with the list of legal moves)."""
    task_tokenizer: bool = True
    """Train the tokenizer on the game's own text (shorter sequences, `<move>` one token);
    off: the general tiny tokenizer."""
    expert_episodes: int = 1000
    """Episodes the scripted expert plays; its wins and draws become the SFT data."""
    expert_epsilon: float = 0.0
    """Probability that the expert plays a random legal move instead of a minimax move."""
    expert_taken: float = 0.0
    """Probability that the expert names an occupied cell, so its games show how to recover
    from a rejected move; those illegal turns are left out of SFT."""
    sft_steps: int = 300
    """SFT optimizer steps."""
    sft_batch_size: int = 64
    """Samples (turns) per SFT step."""
    sft_lr: float = 3e-3
    """SFT learning rate."""
    rl_steps: int = 40
    """GRPO optimizer steps."""
    rl_groups: int = 8
    """Games (opponent seeds) per GRPO step."""
    group_size: int = 8
    """Episodes per game: the GRPO group sharing one baseline."""
    rl_lr: float = 2e-4
    """GRPO learning rate."""
    eval_episodes: int = 128
    """Evaluation games per stage (the same opponent seeds at every stage)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluated policy (0: greedy)."""
    max_tokens: int = 10
    """Token limit of one reply; a longer reply is an incomplete, unparseable move."""
    hidden_size: int = 128
    """Width of the tiny Llama model built from scratch."""
    num_layers: int = 2
    """Layers of the tiny model."""
    threads: int | None = 1
    """torch CPU threads (None: torch's choice, one per core). One is fastest for a model this
    small, and on a busy machine several threads spin waiting for each other; the seeded table
    holds for a given thread count."""
    tiny: bool = False
    """A very small budget (a few episodes and steps) for smoke tests; overrides the budgets."""
    progress: bool = True
    """Show progress bars."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Online RL (GRPO by default) on a built-in or user env, with the embedded engine serving
    the policy in process (or an OpenAI-compatible server with --server-url) and fresh weights
    pushed to it after every step."""

    env: str = "tictactoe"
    """Built-in env name (see `ludic.envs.BUILTIN_ENVS`) or a `module:factory` import string;
    the current directory is importable, so `--env my_env:make_env` finds ./my_env.py."""
    env_kwargs: str = "{}"
    """JSON object of keyword arguments for the env factory."""
    model: str | None = None
    """Local Hugging Face model directory to start from (a checkpoint's `model/` works);
    default: a tiny model built locally."""
    parser: str = "auto"
    """Action parser: auto (the `parser` attribute of the env factory or env class, e.g.
    `parser = xml_tag_parser("move")` in the class body; identity when there is none),
    identity, boxed, xml:TAG or `module:function`."""
    reject_incomplete: bool = False
    """Make a reply cut off at --max-tokens a parse failure (penalty -1) that the parser never
    sees; off: the parser reads it like any other reply. Counted in batch/num_incomplete."""
    system_prompt: str | None = None
    """System prompt (default: the env's suggestion)."""
    context: ContextKind = "auto"
    """Agent memory: full (the whole dialog), latest (system prompt + latest observation), or
    auto: what the env declares (`suggested_context = "latest"` on its class, as tictactoe
    does: each of its observations shows the whole board), else full."""
    algorithm: Algorithm = "grpo"
    """Algorithm preset (credit assignment + loss); see `ludic.recipes.algorithms.PRESETS`."""
    gigpo: GiGPOOptions = field(default_factory=GiGPOOptions)
    """GiGPO's knobs (only with --algorithm gigpo)."""
    split_over_turns: bool = False
    """Give each turn sample of a k-turn episode its advantage / k, so every episode weighs
    once in the loss whatever its turn count (off: an episode that retried after parse
    failures pushes its advantage once per turn). GRPO-family presets (grpo, dr_grpo, gspo,
    cispo, gmpo, reinforce_baseline)."""
    rollout_correction: RolloutCorrectionOptions = field(default_factory=RolloutCorrectionOptions)
    """Rollout importance-sampling correction of the loss (truncated IS, rejection), any
    preset; off unless a cap or bound is given."""
    steps: int = 50
    """Optimizer steps."""
    problems_per_step: int = 4
    """Distinct problems (env seeds) per step."""
    group_size: int = 8
    """Episodes per problem (the group sharing a baseline)."""
    lr: float = 1e-4
    """Learning rate (the peak, after any warmup)."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Learning rate after warmup: constant, or a cosine or linear decay to --min-lr-ratio x
    --lr over --schedule-steps (`ludic.training.schedule`)."""
    warmup_steps: int = 0
    """Linear warmup of the learning rate over this many optimizer steps."""
    min_lr_ratio: float = 0.0
    """Floor of the decayed learning rate, as a fraction of --lr (cosine and linear)."""
    schedule_steps: int | None = None
    """Optimizer steps the decay spans (default: --steps). When you stop early to --resume
    later with a larger --steps, give the whole run's length so both parts follow one curve."""
    override_lr_schedule: bool = False
    """On --resume, apply this launch's --lr / --lr-schedule / --warmup-steps /
    --schedule-steps / --min-lr-ratio from the checkpoint's step on. Without it, a value that
    differs from the one the checkpoint recorded is refused (it would otherwise be ignored,
    or stretch a finished decay back up)."""
    max_steps: int = 10
    """Env steps per episode before truncation."""
    max_tokens: int = 128
    """Token limit per model call."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    top_p: float = 1.0
    """Nucleus (top-p) sampling of the rollouts, in (0, 1] (1: off). The trainer recomputes
    logprobs on the same truncated support, so the on-policy ratio stays 1."""
    micro_batch_tokens: int | None = DEFAULT_MICRO_BATCH_TOKENS
    """Token budget of one forward/backward (padding counts): a larger batch runs in several
    micro-batches whose gradients accumulate (equal to one pass up to float rounding), so
    memory stays bounded. None: the whole batch in one pass (memory grows with the batch)."""
    concurrency: int = 32
    """Episodes in flight at once. The engine batches concurrent requests, and a batched forward
    rounds differently with the batch's make-up (which depends on timing), so behaviour logprobs
    vary in their last bits from run to run; 1 or --batch-invariant makes a run (and a resumed
    one) bit-reproducible, at the cost of speed."""
    episode_timeout_s: float | None = 600.0
    """Wall-clock limit per episode (None: no limit): an env or tool that hangs fails its
    episode, logged naming this flag, instead of stalling the run without a word."""
    batch_invariant: bool = False
    """Run the embedded engine batch-invariant (EngineConfig(batch_invariant=True)): a seeded run
    gives the same weights whatever the machine's load and --concurrency's batching, on the same
    machine and build. Llama-family models only; not with --server-url."""
    prepacked_gemm: bool = False
    """Run the engine's GEMMs on weight copies packed once per weight version
    (EngineConfig(prepacked_gemm=True); with --local-server, `ludic serve --prepacked-gemm`):
    1.1x-1.6x faster decode on CPU; behaviour logprobs then differ from the trainer's
    recomputation by float noise (~1e-5..1e-4), which the ratio losses see. Float32 on CPU;
    not with --batch-invariant or --server-url."""
    checkpoint_every: int | None = None
    """Save a checkpoint every N steps (a final one is always saved)."""
    keep_checkpoints: int | None = 2
    """Checkpoints kept under OUT_DIR/checkpoints: the newest K complete ones (the one just
    saved always stays); None keeps every one."""
    server_url: tuple[str, ...] | None = None
    """Generate rollouts on these OpenAI-compatible servers (`ludic serve`, vLLM with Ludic's
    extension) instead of in process; weights are pushed to all of them after every step.
    Several (`--server-url A B C`): episodes spread over them, each kept on one server. One
    that does not listen yet (started just before, loading its model) is waited for, up to 5
    minutes, as `ludic actor` waits."""
    server_token: str | None = None
    """Bearer token of the servers' control endpoints (`ludic serve --token ...`); default:
    the LUDIC_SERVER_TOKEN environment variable."""
    api_key: str | None = None
    """Bearer token of the servers' inference endpoints (/v1/*), if they need one (vLLM
    --api-key), as `ludic actor` and `ludic eval` send it; the weight push sends the control
    token (--server-token) only. Only with --server-url."""
    served_model: str | None = None
    """Model name to send to the servers (default: the one model the first lists at
    /v1/models); a name a server's /v1/models does not list is refused before any episode."""
    server_ranks: int = 1
    """Weight-receiving ranks of each server: its tensor-parallel size for vLLM (1 for
    `ludic serve`)."""
    local_server: bool = False
    """Generate in a `ludic serve` child process on this machine (started on the initial
    weights, stopped when the run ends) while this process trains: the next batch is drawn
    during the optimizer step, so samples are one policy version old (--max-lag 1 by
    default). Weights are pushed and verified after every step. Not with --server-url or
    --batch-invariant."""
    local_server_threads: int = 1
    """torch threads of the --local-server process (the trainer's are --threads)."""
    max_lag: int | None = None
    """Train only on samples at most this many policy versions older than the trainer's
    (older ones are dropped). Default: 0 (on-policy), 1 with --local-server, which needs
    at least 1."""
    resume: Annotated[str | None, _RESUME_ARG] = None
    """Continue a run (give it the same flags): bare `--resume` takes the newest complete
    checkpoint under OUT_DIR/checkpoints, `--resume DIR` a checkpoint directory or one step_*
    checkpoint in it. The restored weights are served before the first rollout; --steps counts
    the whole run, so only the steps left are trained. None: a new run."""
    seed: int = 0
    """Seeds training, env seeds and sampling (a --resume with another --seed is refused: the
    batches after it would differ from the run's)."""
    device: str = "cpu"
    """Training device (the embedded engine shares the model's device)."""
    threads: int | None = None
    """torch CPU (intra-op) threads of this process: the trainer and the embedded engine
    (None: torch's choice, one per core). A --local-server child takes --local-server-threads;
    a --server-url server its own (`ludic serve --threads N`). A seeded batch-invariant run
    repeats for a given thread count."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Autocast dtype of the training forward pass (`TrainerConfig.dtype`): bfloat16 is the
    usual choice on a GPU. Weights and optimizer state stay float32, and the embedded engine
    samples in float32, so the trainer's recomputed logprobs differ from the behaviour ones by
    bfloat16 rounding (`loss/mismatch/*` in metrics.jsonl)."""
    out_dir: Path = Path("ludic_runs/train")
    """Where metrics.jsonl, rollouts.jsonl, samples.jsonl (what `ludic view --samples` reads),
    checkpoints and the reward curve are written."""
    progress: bool = True
    """Show a progress bar."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SFTConfig:
    """Supervised fine-tuning (offline RL with weight 1) on rollouts stored as JSONL, e.g. the
    output of rejection sampling."""

    data: Path
    """Rollouts JSONL (a RolloutEngine log or `write_rollouts_jsonl` output)."""
    model: str | None = None
    """Local Hugging Face model directory to fine-tune; default: a tiny model built locally."""
    steps: int = 100
    """Optimizer steps (fewer if --epochs runs out first)."""
    epochs: int | None = None
    """Stop after this many passes over the data (None: only --steps limits)."""
    batch_size: int = 32
    """Samples (turns) per step."""
    lr: float = 1e-4
    """Learning rate."""
    min_reward: float | None = None
    """Keep only episodes whose total reward is at least this (rejection at load time)."""
    algorithm: OfflineAlgorithm = "sft"
    """sft: every kept turn weighs 1. awr: advantage-weighted regression, each turn weighs
    min(exp(A / beta), max weight) with A its episode's return minus a baseline, so a JSONL of
    all episodes (not only the good ones) can be used."""
    awr_beta: float = 1.0
    """AWR temperature beta (smaller: sharper preference for high-advantage turns)."""
    awr_max_weight: float = 20.0
    """AWR weight cap."""
    awr_baseline: Literal["group", "mean", "state", "state_action", "value", "q_value"] = "group"
    """AWR baseline: group (mean return of the episode's group: same group id, else same first
    observation), mean (mean return-to-go over the whole file), state (mean return-to-go of
    the other turns from the same state, by the env's state key, shrunk toward the file's
    mean), which tells good from bad moves inside one episode, or state_action (A = Q(s, a) -
    V(s), both the mean return-to-go of every visit of the pair and of the state: needs
    repeated states, and averages out lucky games) or value (return-to-go minus a tiny MLP's
    value of the observation, fitted on the other --awr-value-folds folds of episodes: a
    baseline for states seen once) or q_value (A = Q(s, a) - V(s), two such MLPs, Q over the
    observation and the action, fitted the same way)."""
    awr_value_folds: int = 5
    """With --awr-baseline value or q_value: cross-fitting folds (each episode's value is
    fitted on the others)."""
    awr_state_prior: float = 1.0
    """With --awr-baseline state or state_action: pseudo-visits of the parent mean (the file's
    mean for a state's value, the state's value for a move's) in each estimate."""
    awr_state_normalize: bool = False
    """Divide each AWR weight by the mean weight of its state's turns (every state keeps its
    share of the data; only the choice among moves is reweighted)."""
    awr_normalize_mean: bool = False
    """Divide the AWR weights by their mean over the trained turns (mean weight 1, as SFT).
    With --min-reward the weights come from every episode, and only the kept ones train."""
    awr_min_weight: float = 0.0
    """Floor of the AWR weights, applied last (0: none), so no turn leaves the loss."""
    retokenize: bool = False
    """Rebuild token ids from the messages with the model's chat template (for rollouts from
    a backend that returned no ids, or from another tokenizer)."""
    micro_batch_tokens: int | None = DEFAULT_MICRO_BATCH_TOKENS
    """Token budget of one forward/backward (padding counts): a larger batch runs in several
    micro-batches whose gradients accumulate (equal to one pass up to float rounding), so
    memory stays bounded. None: the whole batch in one pass (memory grows with the batch)."""
    checkpoint_every: int | None = None
    """Save a checkpoint every N steps (a final one is always saved), for --resume."""
    keep_checkpoints: int | None = 2
    """Checkpoints kept under OUT_DIR/checkpoints: the newest K complete ones (the one just
    saved always stays); None keeps every one."""
    resume: Annotated[str | None, _RESUME_ARG] = None
    """Continue a run (give it the same flags): bare `--resume` takes the newest complete
    checkpoint under OUT_DIR/checkpoints, `--resume DIR` a checkpoint directory or one step_*
    checkpoint in it. Weights, optimizer, RNG and the data position (epoch and shuffled order)
    are restored; --steps counts the whole run, so only the steps left are trained. A change
    of --data, --algorithm and its --awr-* flags, --batch-size, --seed, --min-reward,
    --retokenize or --lr is refused. None: a new run."""
    seed: int = 0
    """Seeds shuffling and training."""
    device: str = "cpu"
    """Training device."""
    out_dir: Path = Path("ludic_runs/sft")
    """Where metrics.jsonl, checkpoints and the loss curve are written."""
    progress: bool = True
    """Show a progress bar."""
