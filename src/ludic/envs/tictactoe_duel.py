"""TicTacToeDuelEnv: two agents play tic-tac-toe against each other, turn by turn.

Every step returns an outcome for BOTH seats: the mover and the waiting player, who observes
the new board and, at the end, gets its own terminal reward. It deliberately has no scripted
opponent (that is `TicTacToeEnv`) and no retry on illegal moves: an illegal move loses.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from ludic.envs.arg_types import checked_arguments
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.tictactoe import (
    SYSTEM_PROMPT,
    Observation,
    compact_text,
    game_over_text,
    outcome_for,
    parse_cell,
    turn_text,
)
from ludic.envs.tictactoe_solver import (
    EMPTY_BOARD,
    apply_move,
    legal_moves,
    optimal_moves,
    side_to_move,
)
from ludic.types import Info, StepOutcome


class TicTacToeDuelEnv(LudicEnv):
    """Seats `x_id` (moves first) and `o_id`. `active_agents` is the side to move (empty once
    the game is over). Terminal rewards: `win_reward` / `loss_reward` / `draw_reward`; an
    illegal move (occupied cell or any non-cell text) ends the game: the mover gets
    `illegal_reward` (outcome "illegal"), the other seat `win_reward` (outcome "win"). Each
    seat's last info says `success` (it won), whatever parse penalties cost on the way.
    The state key is `"<board>|<side to move>"`, the same for both seats.
    `observation="compact"` shows the board and the side to move, as `TicTacToeEnv`'s does.
    """

    inline_sync_calls = True  # pure and fast: no thread hop (see LudicEnv)

    system_prompt = SYSTEM_PROMPT

    @checked_arguments
    def __init__(
        self,
        *,
        x_id: str = "X",
        o_id: str = "O",
        win_reward: float = 1.0,
        draw_reward: float = 0.0,
        loss_reward: float = -1.0,
        illegal_reward: float = -1.0,
        observation: Observation = "full",
    ) -> None:
        if observation not in ("full", "compact"):
            raise ValueError(f"observation must be 'full' or 'compact', got {observation!r}")
        if not x_id or not o_id or x_id == o_id:
            raise ValueError(f"x_id and o_id must be two different names, got {x_id!r}, {o_id!r}")
        self.seats = {"X": x_id, "O": o_id}
        self.marks = {x_id: "X", o_id: "O"}
        self.rewards = {"win": win_reward, "draw": draw_reward, "loss": loss_reward}
        self.illegal_reward = illegal_reward
        self.observation = observation
        self.board = EMPTY_BOARD
        self.outcomes: dict[str, str] | None = None
        self._started = False

    @property
    def agent_ids(self) -> Sequence[str]:
        return (self.seats["X"], self.seats["O"])

    @property
    def active_agents(self) -> Sequence[str]:
        if not self._started or self.outcomes is not None:
            return ()
        return (self.seats[side_to_move(self.board)],)

    def reset(self, seed: int | None = None) -> ResetResult:
        """A fresh empty board; `seed` is accepted for the protocol but the game has no chance."""
        self.board = EMPTY_BOARD
        self.outcomes = None
        self._started = True
        return {aid: (self._observation(aid), {"mark": m}) for aid, m in self.marks.items()}

    def step(self, actions: Mapping[str, str]) -> StepResult:
        mover = self._check_can_step(actions)
        mark = self.marks[mover]
        waiting = self.seats["O" if mark == "X" else "X"]
        cell = parse_cell(actions[mover])
        if cell is None or cell not in legal_moves(self.board):
            return self._illegal(mover, waiting, actions[mover], cell)
        optimal = cell in optimal_moves(self.board, mark)
        self.board = apply_move(self.board, cell, mark)
        mover_info: Info = {"move": cell, "optimal_move": optimal, "illegal_move": False}
        waiting_info: Info = {"opponent_move": cell}
        result = outcome_for(self.board, mark)
        if result is None:
            return {
                mover: StepOutcome(obs=self._observation(mover), info=mover_info),
                waiting: StepOutcome(
                    obs=self._played(mark, cell) + self._observation(waiting), info=waiting_info
                ),
            }
        other_result = {"win": "loss", "loss": "win", "draw": "draw"}[result]
        self.outcomes = {mover: result, waiting: other_result}
        return {
            mover: self._final(mover, result, mover_info),
            waiting: self._final(waiting, other_result, waiting_info, f"{mark} played {cell}.\n"),
        }

    def current_observation(self, agent_id: str) -> str | None:
        """`agent_id`'s view of the board again (full or compact) while the game is on; shown
        below the feedback after a reply that did not parse."""
        if not self._started or self.outcomes is not None or agent_id not in self.marks:
            return None
        return self._observation(agent_id)

    def state_key(self, agent_id: str) -> Hashable | None:
        to_move = "-" if self.outcomes is not None else side_to_move(self.board)
        return f"{self.board}|{to_move}"

    def _final(self, aid: str, result: str, info: Info, prefix: str = "") -> StepOutcome:
        reward = self.illegal_reward if result == "illegal" else self.rewards[result]
        return StepOutcome(
            obs=prefix + game_over_text(self.board, self.marks[aid], result),
            reward=reward,
            terminated=True,
            info={**info, "outcome": result, "success": result == "win"},
        )

    def _illegal(self, mover: str, waiting: str, action: str, cell: int | None) -> StepResult:
        why = (
            f"cell {cell} is taken"
            if cell is not None
            else f"{str(action)[:40]!r} is not a cell 1-9"
        )
        self.outcomes = {mover: "illegal", waiting: "win"}
        mover_out = self._final(
            mover, "illegal", {"move": cell, "optimal_move": False, "illegal_move": True}
        )
        waiting_out = self._final(waiting, "win", {"opponent_illegal_move": True})
        return {
            mover: StepOutcome(
                obs=f"Illegal move: {why}.\n{mover_out.obs}",
                reward=mover_out.reward,
                terminated=True,
                info=mover_out.info,
            ),
            waiting: StepOutcome(
                obs=f"{mover} ({self.marks[mover]}) made an illegal move.\n{waiting_out.obs}",
                reward=waiting_out.reward,
                terminated=True,
                info=waiting_out.info,
            ),
        }

    def _check_can_step(self, actions: Mapping[str, str]) -> str:
        name = type(self).__name__
        if not self._started:
            raise RuntimeError(f"{name}.step called before reset(); call reset(seed) first")
        if self.outcomes is not None:
            raise RuntimeError(
                f"{name}.step called after the game ended ({self.outcomes}); call reset() "
                "to start a new game"
            )
        mover = self.seats[side_to_move(self.board)]
        if mover not in actions:
            raise KeyError(
                f"{name}.step needs an action for {mover!r}, the side to move; got actions "
                f"for {sorted(actions)}"
            )
        extra = sorted(set(actions) - {mover})
        if extra:
            raise ValueError(
                f"{name}.step got actions for {extra}, who are not to move; only "
                f"{mover!r} acts now (see active_agents)"
            )
        return mover

    def _played(self, mark: str, cell: int) -> str:
        return "" if self.observation == "compact" else f"{mark} played {cell}.\n"

    def _observation(self, aid: str) -> str:
        if self.observation == "compact":  # as TicTacToeEnv's: the board and the side to move
            return compact_text(self.board, side_to_move(self.board))
        return turn_text(self.board, self.marks[aid], side_to_move(self.board))
