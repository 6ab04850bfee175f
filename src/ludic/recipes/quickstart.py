"""`ludic quickstart`: a tiny model learns tic-tac-toe from scratch on one CPU.

Stages: build a random tiny model; evaluate it; let a scripted expert play and keep its wins
and draws (rejection sampling); SFT on them; evaluate; GRPO against the scripted opponent with
the embedded engine serving the policy and fresh weights pushed after every step; evaluate;
print the three evaluations as one table. The engine is batch-invariant, so the seeded table
does not depend on the machine's load or request timing. The whole command holds OUT_DIR's run
lock (`ludic.recipes.run_lock`, the one `ludic train` and `ludic sft` hold): its SFT and RL stages
train under it (they build their trainers here, taking no lock of their own), and a second run
into the directory is refused before anything is built. Every piece is a public component; this file only
wires them. It does not tune anything for you: the budgets are `QuickstartConfig` fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from ludic.distributed import InProcessPublisher
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.sampling import SamplingConfig
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.run_lock import LUDIC_RUN, RUN_LOCK, check_run_lock, run_lock
from ludic.recipes.tictactoe import (
    ENV_NAME,
    PROTOCOL_NAME,
    StageResult,
    drop_penalised_turns,
    eval_command,
    evaluate_stage,
    expert_policy,
    print_results,
    quickstart_env_kwargs,
    rollout_engine,
    task_tokenizer,
)
from ludic.recipes.training import finish, make_trainer, plural
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutRequest,
    SeedSequencer,
    derive_seed,
    write_rollouts_jsonl,
)
from ludic.rollouts.rollout_log import dated_sibling
from ludic.training import OfflineBatchSource, RolloutBatchSource, make_grpo, make_sft
from ludic.types import Rollout

REWARD_KEY = "batch/mean_reward"
TINY_BUDGET = {
    "expert_episodes": 12,
    "sft_steps": 3,
    "sft_batch_size": 8,
    "rl_steps": 2,
    "rl_groups": 2,
    "group_size": 2,
    "eval_episodes": 4,
    "hidden_size": 64,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class QuickstartResult:
    """The three evaluations (before SFT, after SFT, after RL), where the outputs are, and
    the `ludic eval` command that evaluates the final checkpoint the same way."""

    stages: tuple[StageResult, ...]
    out_dir: Path
    metrics_jsonl: Path
    reward_curve_png: Path
    checkpoint_dir: Path
    seconds: float
    stage_seconds: dict[str, float]
    eval_command: tuple[str, ...]
    """`ludic eval` arguments that reproduce the 'after RL' evaluation from the checkpoint."""


def run_quickstart(cfg: QuickstartConfig, *, console: Console | None = None) -> QuickstartResult:
    """Run every stage of the quickstart (see the module docstring) and print the table."""
    console = console or Console()
    if cfg.tiny:
        cfg = replace(cfg, **TINY_BUDGET)  # type: ignore[arg-type]
    if cfg.threads is not None:
        if cfg.threads < 1:  # as ludic train and ludic eval refuse it
            raise ValueError(f"--threads must be >= 1 (or left out), got {cfg.threads}")
        torch.set_num_threads(cfg.threads)
    check_flags(cfg)  # a bad flag is refused before an earlier run's outputs are replaced
    lock = cfg.out_dir / RUN_LOCK
    check_run_lock(lock, what=LUDIC_RUN)  # another live run in OUT_DIR: before anything is built
    with run_lock(  # one lock for every stage: SFT and RL train in sft/ and rl/ under it
        lock, what=LUDIC_RUN, notice=lambda text: console.print(f"run directory: {text}")
    ):
        return asyncio.run(_run(cfg, console))


STAGE_DIRS = ("eval", "expert", "sft", "rl")
"""What a quickstart writes under OUT_DIR besides its summary files (`SUMMARY_FILES`)."""
SUMMARY_FILES = ("results.json", "reward_curve.png")


def _keep_earlier_run(out: Path, console: Console) -> Path | None:
    """A quickstart run starts over: an earlier run's stage directories and summary files in
    OUT_DIR move (under the run lock) to a dated folder beside it, `OUT_DIR.YYYYmmdd-HHMMSS`
    (when that run last wrote), so a rerun keeps it instead of deleting it; left in place, its
    checkpoints would outlive a shorter rerun (`--rl-steps 20` after 40 left the old
    step_00000040 as the newest) and its logs would mix with this run's. Returns that folder."""
    earlier = [out / name for name in (*STAGE_DIRS, *SUMMARY_FILES) if (out / name).exists()]
    if not earlier:
        return None
    kept = dated_sibling(out.resolve(), max(p.stat().st_mtime for p in earlier), keep_suffix=False)
    names = ", ".join(f"{p.name}/" if p.is_dir() else p.name for p in earlier)
    kept.mkdir(parents=True)
    for path in earlier:
        path.rename(kept / path.name)
    console.print(
        f"run directory: kept the earlier quickstart run in {out} ({names}) as {kept}; "
        "delete that folder when you no longer need it",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return kept


async def _run(cfg: QuickstartConfig, console: Console) -> QuickstartResult:
    started = time.perf_counter()
    out = cfg.out_dir
    out.mkdir(parents=True, exist_ok=True)
    _keep_earlier_run(out, console)
    env_kwargs = quickstart_env_kwargs(cfg)  # examples/tictactoe/eval.py plays by these too
    console.rule(f"[bold]ludic quickstart[/bold]: tic-tac-toe vs a {cfg.opponent} opponent")
    model, tokenizer = build_policy(cfg, env_kwargs, console)

    async def evaluate(engine: EmbeddedEngine, stage: str) -> StageResult:
        console.print(f"[bold]evaluate[/bold] {stage}: {cfg.eval_episodes} games")
        return await evaluate_stage(
            engine,
            stage,
            env_kwargs=env_kwargs,
            episodes=cfg.eval_episodes,
            temperature=cfg.eval_temperature,
            max_tokens=cfg.max_tokens,
            out_dir=out / "eval" / stage.replace(" ", "_"),
            progress=cfg.progress,
        )

    timer = _StageTimer()
    # Batch-invariant: the table does not depend on how the CPU's load mixed the requests.
    invariant = EngineConfig(batch_invariant=True)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=invariant) as engine:
        with timer("eval"):
            stages = [await evaluate(engine, "before SFT")]
        with timer("expert data"):
            data = await _expert_data(cfg, tokenizer, env_kwargs, out / "expert", console)
        with timer("SFT"):
            sft_version = await _sft(cfg, model, tokenizer, data, out / "sft", console)
        InProcessPublisher(engine).publish(model, version=sft_version)
        with timer("eval"):
            stages.append(await evaluate(engine, "after SFT"))
        with timer("RL"):
            final = await _grpo(
                cfg, model, tokenizer, engine, env_kwargs, sft_version, out / "rl", console
            )
        with timer("eval"):
            stages.append(await evaluate(engine, "after RL"))

    curve = plot_reward_curve(cfg, out / "rl" / "metrics.jsonl", out / "reward_curve.png")
    seconds = time.perf_counter() - started
    print_results(stages, title=f"Tic-tac-toe vs a {cfg.opponent} opponent", console=console)
    result = QuickstartResult(
        stages=tuple(stages),
        out_dir=out,
        metrics_jsonl=out / "rl" / "metrics.jsonl",
        reward_curve_png=curve,
        checkpoint_dir=out / "rl" / "checkpoints",
        seconds=seconds,
        stage_seconds=dict(timer.seconds),
        eval_command=tuple(
            eval_command(
                env_kwargs,
                final / "model",
                episodes=cfg.eval_episodes,
                temperature=cfg.eval_temperature,
                max_tokens=cfg.max_tokens,
                threads=cfg.threads,
                out_dir=out / "eval" / "again",
            )
        ),
    )
    _write_results(result, cfg)
    split = ", ".join(f"{name} {secs:.0f} s" for name, secs in timer.seconds.items())
    console.print(f"done in {seconds / 60:.1f} min ({split}). Reward curve: [bold]{curve}[/bold]")
    games = out / "eval" / "after_RL" / "rollouts.jsonl"
    view = shlex.join(["ludic", "view", str(games), "--tokenizer", str(final / "model")])
    console.print("look at the games:", view, soft_wrap=True, markup=False)
    console.print(
        "the 'after RL' evaluation again, from the final checkpoint:",
        shlex.join(result.eval_command),
        soft_wrap=True,
    )
    return result


class _StageTimer:
    """Wall-clock seconds per stage name (a name used twice adds up)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed


def plot_reward_curve(cfg: QuickstartConfig, metrics_jsonl: Path, png: Path) -> Path:
    """The RL stage's mean episode reward per GRPO step, titled with what it shows."""
    from ludic.viz import plot_metrics

    episodes = cfg.rl_groups * cfg.group_size
    title = (
        f"GRPO on tic-tac-toe vs a {cfg.opponent} opponent: mean episode reward per step "
        f"({episodes} games a step, seed {cfg.seed})"
    )
    plot_metrics(metrics_jsonl, png, keys=(REWARD_KEY,), smooth=0.6, title=title)
    return png


def build_policy(
    cfg: QuickstartConfig, env_kwargs: dict[str, Any], console: Console
) -> tuple[Any, Any]:
    """A tiny Llama built from scratch, with a tokenizer trained on the game's text
    (`task_tokenizer`) unless `cfg.task_tokenizer` is off (then the general tiny one)."""
    tokenizer = task_tokenizer(env_kwargs, seed=cfg.seed) if cfg.task_tokenizer else None
    model, tokenizer = build_tiny_model(seed=cfg.seed, spec=policy_spec(cfg), tokenizer=tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    console.print(
        f"built a tiny Llama model from scratch: {n_params / 1e6:.2f}M parameters, "
        f"a {len(tokenizer)}-token vocabulary"
    )
    return model, tokenizer


SHARE_FLAGS = ("opponent_epsilon", "expert_epsilon", "expert_taken")
COUNT_FLAGS = (
    "expert_episodes",
    "sft_batch_size",
    "rl_steps",
    "rl_groups",
    "eval_episodes",
    "max_tokens",
)
"""Flags that must be >= 1. --sft-steps 0 runs (GRPO from the untrained model, an ablation);
--rl-steps 0 trained SFT and evaluated, then failed plotting an empty reward curve."""


def check_flags(cfg: QuickstartConfig) -> None:
    """ValueError naming the first flag, as typed, whose value no stage can run with. The
    stages refused these minutes in (after the first evaluation, and after an earlier run's
    stage directories in OUT_DIR were deleted), in their components' words: `epsilon must be
    in [0, 1]` for either --opponent-epsilon or --expert-epsilon; --rl-groups 0 and
    --group-size 1 ran to the end, training on nothing."""
    for name in SHARE_FLAGS:
        value = getattr(cfg, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{_flag(name)} must be in [0, 1] (a probability), got {value}")
    for name in COUNT_FLAGS:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{_flag(name)} must be >= 1, got {getattr(cfg, name)}")
    if cfg.sft_steps < 0:
        raise ValueError(f"--sft-steps must be >= 0 (0: GRPO from scratch), got {cfg.sft_steps}")
    if cfg.group_size < 2:
        raise ValueError(
            f"--group-size must be >= 2, got {cfg.group_size}: GRPO's baseline is the mean of "
            "a game's group, so a group of one has no advantage to learn from"
        )
    for name in ("sft_lr", "rl_lr"):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{_flag(name)} must be a positive number, got {value}")
    if not (math.isfinite(cfg.eval_temperature) and cfg.eval_temperature >= 0):
        raise ValueError(f"--eval-temperature must be >= 0 (0: greedy), got {cfg.eval_temperature}")
    policy_spec(cfg)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def policy_spec(cfg: QuickstartConfig) -> TinyModelSpec:
    """The tiny model `cfg`'s --hidden-size and --num-layers give; ValueError naming the flag as
    typed when the model cannot be built (TinyModelSpec's own words name its fields)."""
    if cfg.num_layers < 1:
        raise ValueError(f"--num-layers must be >= 1, got {cfg.num_layers}")
    heads = TinyModelSpec().num_attention_heads
    width = 2 * heads  # each of the heads an even size: rotary embeddings rotate pairs
    if cfg.hidden_size < width or cfg.hidden_size % width:
        nearest = width * max(1, round(cfg.hidden_size / width))
        raise ValueError(
            f"--hidden-size must be a positive multiple of {width} (the tiny model's {heads} "
            f"attention heads, each of an even size), got {cfg.hidden_size}: e.g. "
            f"--hidden-size {nearest}"
        )
    return TinyModelSpec(
        hidden_size=cfg.hidden_size,
        intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
    )


async def _expert_data(
    cfg: QuickstartConfig,
    tokenizer: Any,
    env_kwargs: dict[str, Any],
    out: Path,
    console: Console,
) -> Path:
    """Rejection sampling: the expert plays, wins and draws are kept as SFT data."""
    console.print(f"[bold]expert data[/bold]: {cfg.expert_episodes} games by a scripted expert")
    client = PolicyClient(expert_policy(cfg.expert_epsilon, taken=cfg.expert_taken), tokenizer)
    engine = rollout_engine(client, max_tokens=cfg.max_tokens, progress=cfg.progress)
    requests = [
        RolloutRequest(
            env=ComponentSpec(name=ENV_NAME, kwargs=env_kwargs),
            protocol=ComponentSpec(name=PROTOCOL_NAME),
        )
        for _ in range(cfg.expert_episodes)
    ]
    seeds = SeedSequencer(run_seed=derive_seed(cfg.seed, "expert"))
    rollouts = await engine.run(seeds.seed_requests(requests, batch_index=0))
    kept = [r for r in rollouts if _won_or_drew(r)]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "all.jsonl").open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(rollouts, f)
    path = out / "kept.jsonl"
    with path.open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(kept, f)
    console.print(f"kept {len(kept)} of {len(rollouts)} expert games (wins and draws): {path}")
    if not kept:
        raise RuntimeError("the expert won or drew no game; raise --expert-episodes")
    return path


def _won_or_drew(rollout: Rollout) -> bool:
    steps = rollout.env_steps
    return bool(steps) and steps[-1].info.get("outcome") in ("win", "draw")


async def _sft(
    cfg: QuickstartConfig, model: Any, tokenizer: Any, data: Path, out: Path, console: Console
) -> int:
    """SFT on the kept expert games; returns the policy version it ends at."""
    console.print(f"[bold]SFT[/bold]: {plural(cfg.sft_steps, 'step')} on the expert's moves")
    algorithm = make_sft()
    source = OfflineBatchSource(
        paths=data,
        credit_assigner=algorithm.credit_assigner,
        batch_size=cfg.sft_batch_size,
        seed=cfg.seed,
        filters=[drop_penalised_turns],  # the expert's deliberate illegal moves
    )
    trainer = make_trainer(
        model, tokenizer, algorithm, source, out=out, lr=cfg.sft_lr, seed=cfg.seed
    )
    await trainer.train(cfg.sft_steps, progress=cfg.progress)
    finish(trainer)
    return trainer.policy_version


async def _grpo(
    cfg: QuickstartConfig,
    model: Any,
    tokenizer: Any,
    engine: EmbeddedEngine,
    env_kwargs: dict[str, Any],
    start_version: int,
    out: Path,
    console: Console,
) -> Path:
    """GRPO against the scripted opponent; weights are pushed to `engine` after every step.
    Returns the final checkpoint."""
    episodes = cfg.rl_groups * cfg.group_size
    console.print(
        f"[bold]GRPO[/bold]: {plural(cfg.rl_steps, 'step')} of {plural(episodes, 'game')} each"
    )
    algorithm = make_grpo()
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens)

    def requests() -> list[RolloutRequest]:
        return [
            RolloutRequest(
                env=ComponentSpec(name=ENV_NAME, kwargs=env_kwargs),
                protocol=ComponentSpec(name=PROTOCOL_NAME),
                sampling=sampling,
            )
            for _ in range(cfg.rl_groups)
        ]

    source = RolloutBatchSource(
        engine=rollout_engine(engine, max_tokens=cfg.max_tokens, jsonl_log=out / "rollouts.jsonl"),
        requests_fn=requests,
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=cfg.group_size),
        seed_sequencer=SeedSequencer(run_seed=derive_seed(cfg.seed, "rl")),
    )
    trainer = make_trainer(
        model,
        tokenizer,
        algorithm,
        source,
        out=out,
        lr=cfg.rl_lr,
        seed=cfg.seed,
        publisher=InProcessPublisher(engine),
        initial_policy_version=start_version,
        checkpoint_every=max(1, cfg.rl_steps // 2),
    )
    await trainer.train(cfg.rl_steps, progress=cfg.progress)
    return finish(trainer)


def _write_results(result: QuickstartResult, cfg: QuickstartConfig) -> None:
    record = {
        "stages": [s.to_dict() for s in result.stages],
        "seconds": result.seconds,
        "stage_seconds": result.stage_seconds,
        "eval_command": shlex.join(result.eval_command),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
    }
    (result.out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
