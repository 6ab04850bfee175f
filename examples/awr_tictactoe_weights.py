"""How `awr_tictactoe.py` weighs tic-tac-toe turns: which games are kept and which turns are
trained, the board features of AWR's learned baselines (V over the board, Q over the board a move
leads to, both up to the board's 8 symmetries), and a report of the weights by kind of move.

Plain functions of rollouts and turns; the flags, the data and the training are the script's.
`awr_tictactoe.py` imports it from beside itself (so does `python examples/awr_tictactoe.py`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypedDict

from ludic.envs.tictactoe_solver import EMPTY, side_to_move
from ludic.recipes.tictactoe import board_from_observation
from ludic.training import AWRCredit
from ludic.training.credit import discounted_returns
from ludic.types import Rollout, Turn

# The 8 symmetries of the board (rotations and reflections) as cell permutations: symmetry[i]
# is the cell whose mark goes to cell i.
_ROTATE = (6, 3, 0, 7, 4, 1, 8, 5, 2)
_REFLECT = (2, 1, 0, 5, 4, 3, 8, 7, 6)


def _symmetries() -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    perm: tuple[int, ...] = tuple(range(9))
    for _ in range(4):
        out += [perm, tuple(perm[j] for j in _REFLECT)]
        perm = tuple(perm[j] for j in _ROTATE)
    return tuple(out)


SYMMETRIES = _symmetries()


def won_or_drew(rollout: Rollout) -> bool:
    steps = rollout.env_steps
    return bool(steps) and steps[-1].info.get("outcome") in ("win", "draw")


def not_penalised(rollout: Rollout, turn: Turn) -> bool:
    """`drop_penalised_turns` on the turn: per-state normalisation counts only trained turns
    (an illegal move shares its board with the retry after it)."""
    return turn.reward >= 0.0


def trained_by(awr_games: Literal["all", "kept"]) -> Callable[[Rollout, Turn], bool]:
    """The turns AWR trains on: not penalised, and with --awr-games kept in a won or drawn
    game (the normalisations average over these only)."""
    if awr_games == "all":
        return not_penalised
    return lambda rollout, turn: not_penalised(rollout, turn) and won_or_drew(rollout)


class Featurizers(TypedDict, total=False):
    """`make_awr`'s keyword arguments that pick the value baseline's features."""

    featurize: Callable[[Turn], list[Any]]
    featurize_action: Callable[[Turn], list[Any]]


def board_featurizers(features: Literal["text", "board"], baseline: str) -> Featurizers:
    """`make_awr`'s featurize (and with --baseline q_value featurize_action, which only Q
    reads) for --features board; none for text."""
    if features == "text":
        return {}
    if baseline == "q_value":
        return {"featurize": board_features, "featurize_action": afterstate_features}
    return {"featurize": board_features}


def canonical(board: str) -> str:
    """The least of the board's 8 symmetric images: one name per position up to symmetry."""
    return min("".join(board[j] for j in perm) for perm in SYMMETRIES)


def cell_features(board: str) -> list[Any]:
    """One id per cell and mark, and the number of empty cells."""
    return [*(("cell", i, c) for i, c in enumerate(board)), ("empty", board.count(EMPTY))]


def board_features(turn: Turn) -> list[Any]:
    """V's features of a turn: the cells of its board, canonical up to symmetry."""
    if not turn.agent_steps:
        return []
    return cell_features(canonical(board_from_observation(turn.observation)))


def afterstate_features(turn: Turn) -> list[Any]:
    """Q's features of a turn: the cells of the board its move leads to (before the
    opponent's reply), canonical up to symmetry; an illegal or unparseable move, which leaves
    the board as it was, gets one id of its own with that board."""
    if not turn.agent_steps or turn.env_step is None:
        return []
    board = board_from_observation(turn.observation)
    info = turn.env_step.info
    move = info.get("move")
    if info.get("illegal_move") or not isinstance(move, int):
        return [("illegal", canonical(board))]
    after = board[: move - 1] + side_to_move(board) + board[move:]
    return cell_features(canonical(after))


def move_weights(
    awr: AWRCredit, rollouts: Sequence[Rollout], *, awr_games: Literal["all", "kept"]
) -> dict[str, dict[str, float]]:
    """Per method, the mean training weight of the optimal, other legal and illegal moves
    (sft: 1 in a won or drawn game, else 0; awr: `awr`'s weight, 0 outside the kept games with
    `awr_games` kept), and "ess": the effective sample size (sum w)^2 / (n sum w^2) of the
    legal moves' weights, n the number of legal moves."""
    weights = awr.assign(rollouts)
    by_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rollout in rollouts:
        kept = 1.0 if won_or_drew(rollout) else 0.0
        awr_factor = kept if awr_games == "kept" else 1.0
        for turn in rollout.turns():
            if turn.env_step is None or not turn.agent_steps:
                continue
            info = turn.env_step.info
            kind = (
                "illegal"
                if info.get("illegal_move")
                else "optimal"
                if info.get("optimal_move")
                else "other"
            )
            by_kind["sft"][kind].append(kept)
            by_kind["awr"][kind].append(awr_factor * weights[(rollout.id, turn.turn_id)])
    report = {
        method: {kind: statistics.mean(ws) for kind, ws in kinds.items()}
        for method, kinds in by_kind.items()
    }
    for method, kinds in by_kind.items():
        legal = kinds["optimal"] + kinds["other"]
        square = math.fsum(w * w for w in legal)
        report[method]["ess"] = math.fsum(legal) ** 2 / (len(legal) * square) if square else 0.0
    return report


def baseline_r2(awr: AWRCredit, rollouts: Sequence[Rollout]) -> float:
    """How much of the returns-to-go G the baseline explains: 1 - sum A^2 / sum (G - mean G)^2
    over every turn (A = G - baseline; for state_action, Q - V instead)."""
    advantages = awr.advantages(rollouts)
    returns = [
        g
        for r in rollouts
        if not r.failed
        for g in discounted_returns([t.reward for t in r.turns()], awr.gamma)
    ]
    mean = statistics.mean(returns)
    total = math.fsum((g - mean) ** 2 for g in returns)
    return 1.0 - math.fsum(a * a for a in advantages.values()) / total if total else 0.0
