"""Tic-tac-toe pieces shared by the quickstart and the examples: the agent harness, a scripted
expert, evaluation of one training stage, and the results table.

The harness is a plain `Agent` with `LatestObservationContext` (the board is fully observed)
and the env's `<move>N</move>` parser, run by `SingleAgentProtocol`. The expert reads the board
from the observation text and plays minimax with some random moves. Nothing here trains.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ludic.agents import Agent
from ludic.context.latest_observation import LatestObservationContext
from ludic.envs import TicTacToeEnv, minimax_move, random_move
from ludic.envs.tictactoe_solver import EMPTY, side_to_move
from ludic.eval import EvalResult, make_eval_requests, run_eval
from ludic.inference.client import ChatClient
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.recipes.configs import QuickstartConfig
from ludic.rollouts import ComponentSpec, RolloutEngine, SAWItem
from ludic.types import JSON, Message

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ENV_NAME = "tictactoe"
PROTOCOL_NAME = "agent"
MOVE_PARSER = xml_tag_parser("move")
MOVE_TOKENS = ("<move>", "</move>")
# X moves at most 5 times; the rest leaves room for retries after unparseable or illegal moves.
MAX_EPISODE_STEPS = 12
# The observation already says how to reply, so no system prompt: shorter prompts.
SYSTEM_PROMPT = ""
EVAL_SEED = 1_000_000


def quickstart_env_kwargs(cfg: QuickstartConfig | None = None) -> dict[str, Any]:
    """The `TicTacToeEnv` kwargs of a quickstart run with `cfg` (default: `ludic quickstart`'s
    defaults): its opponent, the mixed opponent's epsilon, its illegal-move rule and its
    observation text, so that other programs evaluate its checkpoints by the same rules."""
    cfg = cfg or QuickstartConfig()
    return {
        "opponent": cfg.opponent,
        "epsilon": cfg.opponent_epsilon,
        "illegal_move": cfg.illegal_move,
        "observation": cfg.observation,
    }


def task_corpus(env_kwargs: Mapping[str, Any], *, games: int = 300, seed: int = 0) -> str:
    """The text the quickstart's model reads and writes, for training its tokenizer: chat-rendered
    observations of `games` games of `TicTacToeEnv(**env_kwargs)` played at random (one move in
    ten an occupied cell, so the illegal-move text appears too) and `<move>N</move>` replies."""
    rng = random.Random(seed)
    lines: list[str] = []
    for game in range(games):
        env = TicTacToeEnv(**env_kwargs)
        obs, _ = env.env_reset(seed=seed * 1_000_003 + game)
        while True:
            taken = [i + 1 for i, c in enumerate(env.board) if c != EMPTY]
            move = (
                rng.choice(taken) if taken and rng.random() < 0.1 else random_move(env.board, rng)
            )
            lines.append(f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n")
            lines.append(f"<move>{move}</move><|im_end|>\n")
            step = env.env_step(str(move))
            obs = step.obs
            if step.terminated or step.truncated:
                lines.append(obs)
                break
    return "\n".join(lines)


def task_tokenizer(
    env_kwargs: Mapping[str, Any], *, vocab_size: int = 512, seed: int = 0
) -> PreTrainedTokenizerBase:
    """A ChatML BPE tokenizer trained on `task_corpus(env_kwargs)` only, with `<move>` and
    `</move>` as single tokens: a reply is 4 tokens (`<move>`, the cell, `</move>`, end of
    turn) and a prompt about half as many as with the general tiny tokenizer."""
    from ludic.models import train_tiny_tokenizer

    corpus = task_corpus(env_kwargs, seed=seed)
    return train_tiny_tokenizer(vocab_size, corpus=corpus, extra_tokens=MOVE_TOKENS)


def board_from_observation(text: str) -> str:
    """The board ("X.O......", row by row) drawn in a TicTacToeEnv observation (the last one,
    if the text holds several). Raises ValueError when no 3x3 board is found."""
    rows = [line for line in text.splitlines() if line.count("|") == 2]
    if len(rows) < 3:
        raise ValueError(f"no tic-tac-toe board in this observation: {text[:200]!r}")
    cells = [cell.strip() for row in rows[-3:] for cell in row.split("|")]
    if len(cells) != 9:
        raise ValueError(f"cannot read 9 cells from the board in {text[:200]!r}")
    return "".join(c if c in ("X", "O") else EMPTY for c in cells)


def expert_policy(
    epsilon: float, *, taken: float = 0.0
) -> Callable[[Sequence[Message], random.Random], str]:
    """A scripted player for `PolicyClient`: a random legal move with probability `epsilon`,
    else a minimax move (ties broken at random), written as `<move>N</move>`. With probability
    `taken` it names an occupied cell instead (when there is one), so that its games also show
    the env's "Illegal move ... Try again" text and the good move that follows it; leave those
    penalised turns out of training (`drop_penalised_turns`)."""
    for name, p in (("epsilon", epsilon), ("taken", taken)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")

    def policy(messages: Sequence[Message], rng: random.Random) -> str:
        latest = next(m for m in reversed(messages) if m.get("role") == "user")
        board = board_from_observation(str(latest.get("content") or ""))
        occupied = [i + 1 for i, c in enumerate(board) if c != EMPTY]
        if taken > 0.0 and occupied and rng.random() < taken:  # no draw when off: same games
            move = rng.choice(occupied)
        elif rng.random() < epsilon:
            move = random_move(board, rng)
        else:
            move = minimax_move(board, side_to_move(board), rng)
        return f"<move>{move}</move>"

    return policy


def drop_penalised_turns(item: SAWItem) -> bool:
    """A `SampleFilter` keeping turns whose own reward is not negative: in won or drawn games,
    this leaves out exactly the illegal moves (each costs a penalty) and keeps the rest."""
    return float(item.meta.get("reward", 0.0)) >= 0.0


def protocol_factory(client: ChatClient, *, max_tokens: int = 10) -> Callable[[], Any]:
    """A factory of fresh `SingleAgentProtocol`s around one agent on `client`."""

    def make() -> SingleAgentProtocol:
        agent = Agent(
            client,
            context=LatestObservationContext(),
            parser=MOVE_PARSER,
            sampling=SamplingConfig(max_tokens=max_tokens),
            system_prompt=SYSTEM_PROMPT,
            reject_incomplete_completions=True,  # a move must fit in max_tokens
        )
        return SingleAgentProtocol(agent, max_steps=MAX_EPISODE_STEPS)

    return make


def rollout_engine(
    client: ChatClient,
    *,
    max_tokens: int = 10,
    concurrency: int = 64,
    jsonl_log: Path | None = None,
    progress: bool = False,
) -> RolloutEngine:
    """A RolloutEngine playing TicTacToeEnv with the agent harness on `client`."""
    return RolloutEngine(
        env_registry={ENV_NAME: TicTacToeEnv},
        protocol_registry={PROTOCOL_NAME: protocol_factory(client, max_tokens=max_tokens)},
        concurrency=concurrency,
        jsonl_log=jsonl_log,
        progress=progress,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class StageResult:
    """One evaluation. `win`, `draw`, `loss` are shares of games (a game forfeited by an illegal
    move, or cut off without finishing, is a loss); `illegal` is the share of moves that were
    illegal or unparseable; `mean_reward` is the mean episode reward, format penalties included."""

    stage: str
    episodes: int
    win: float
    draw: float
    loss: float
    illegal: float
    mean_reward: float

    def to_dict(self) -> JSON:
        return asdict(self)


def stage_result(stage: str, result: EvalResult) -> StageResult:
    """Summarise `run_eval` output: outcome rates from its metrics, illegal moves from its
    per-turn records (a parse failure or an env step flagged `illegal_move`)."""
    metrics = result.metrics
    rate = lambda label: float(metrics.get(f"outcome/{label}", 0.0))  # noqa: E731
    moves = [s for s in result.steps if s.action is not None or s.parse_error]
    illegal = sum(1 for s in moves if s.parse_error or s.info.get("illegal_move"))
    win, draw = rate("win"), rate("draw")
    return StageResult(
        stage=stage,
        episodes=int(metrics.get("episodes", 0)),
        win=win,
        draw=draw,
        loss=max(0.0, 1.0 - win - draw),
        illegal=illegal / len(moves) if moves else 0.0,
        mean_reward=float(metrics.get("reward/mean", 0.0)),
    )


async def evaluate_stage(
    client: ChatClient,
    stage: str,
    *,
    env_kwargs: Mapping[str, Any],
    episodes: int,
    temperature: float,
    max_tokens: int = 10,
    out_dir: Path | None = None,
    progress: bool = False,
) -> StageResult:
    """Play `episodes` games (opponent seeds EVAL_SEED, EVAL_SEED + 1, ...) and summarise."""
    requests = make_eval_requests(
        env=ComponentSpec(name=ENV_NAME, kwargs=dict(env_kwargs)),
        protocol=ComponentSpec(name=PROTOCOL_NAME),
        num_problems=episodes,
        seed=EVAL_SEED,
        sampling=SamplingConfig(temperature=temperature, max_tokens=max_tokens),
        meta={"stage": stage},
    )
    engine = rollout_engine(client, max_tokens=max_tokens)
    result = await run_eval(engine, requests, progress=progress, out_dir=out_dir)
    return stage_result(stage, result)


def eval_command(
    env_kwargs: Mapping[str, Any],
    model_dir: Path | str,
    *,
    episodes: int,
    temperature: float,
    max_tokens: int = 10,
    threads: int | None = None,
    out_dir: Path | str | None = None,
) -> list[str]:
    """The `ludic eval` command line that evaluates `model_dir` as `evaluate_stage` does on a
    batch-invariant engine (the quickstart's): the same env, harness (latest observation only,
    the env's `<move>` parser, no system prompt, cut-off replies rejected, MAX_EPISODE_STEPS),
    games (opponent seeds from EVAL_SEED), sampling and torch threads, so it reproduces a
    stage's numbers from a saved checkpoint. With `out_dir` it writes there, replacing an
    earlier run of itself (`--overwrite`), so the line can be run again."""
    args = ["ludic", "eval", "--env", ENV_NAME, "--env-kwargs", json.dumps(dict(env_kwargs))]
    args += ["--model", str(model_dir), "--system-prompt", SYSTEM_PROMPT, "--context", "latest"]
    args += ["--reject-incomplete", "--max-tokens", str(max_tokens)]
    args += ["--max-steps", str(MAX_EPISODE_STEPS), "--num-problems", str(episodes)]
    args += ["--seed", str(EVAL_SEED), "--temperature", str(temperature), "--batch-invariant"]
    args += [] if threads is None else ["--threads", str(threads)]
    return args + ([] if out_dir is None else ["--out-dir", str(out_dir), "--overwrite"])


def results_table(results: Sequence[StageResult], *, title: str = "Tic-tac-toe") -> Table:
    """One row per stage: win / draw / loss (of games), illegal (of moves), mean reward."""
    table = Table(title=title, header_style="bold cyan")
    table.add_column("stage")
    for name in ("win", "draw", "loss", "illegal moves", "mean reward"):
        table.add_column(name, justify="right")
    for r in results:
        outcomes = whole_percents([r.win, r.draw, r.loss])
        rates = [f"{p}%" for p in outcomes] + [f"{r.illegal:.0%}"]
        table.add_row(r.stage, *rates, f"{r.mean_reward:+.2f}")
    return table


def whole_percents(shares: Sequence[float]) -> list[int]:
    """`shares` (of one whole, such as win / draw / loss) as whole percents that add up to 100,
    by largest remainder: rounded each on its own, 1/3 + 1/3 + 1/3 reads 33 + 33 + 33 and
    0.335 + 0.335 + 0.33 reads 34 + 34 + 33 = 101. Shares that are not of one whole are rounded
    each on its own."""
    exact = [100 * s for s in shares]
    if abs(sum(exact) - 100) > 1e-6:
        return [round(e) for e in exact]
    floors = [int(e + 1e-9) for e in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: floors[i] - exact[i])
    for i in by_remainder[: 100 - sum(floors)]:
        floors[i] += 1
    return floors


def print_results(
    results: Sequence[StageResult], *, title: str = "Tic-tac-toe", console: Console | None = None
) -> None:
    (console or Console()).print(results_table(results, title=title))
