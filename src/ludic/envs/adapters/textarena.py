"""TextArena games as Ludic envs: `TextArenaEnv("TicTacToe-v0")`, or `--env textarena:ID`.

TextArena's loop runs unchanged: `ta.make(ID)` with the id's own wrappers (so `-train` and
`-raw` variants mean what they mean in TextArena), TextArena's turn order
(`state.current_player_id`), its format rules (an invalid move gets TextArena's error message
and, within its error allowance, another try) and its end-of-game rewards from `env.close()`.
Seats `player_0`, `player_1`, ... are either LLM seats (a Ludic agent each; several of them:
self-play with `MultiAgentProtocol`) or played inside the env by `opponent`, a TextArena agent
(any `str -> str` callable, e.g. `ta.agents.OpenRouterAgent`). The observation is TextArena's
own string, which with the default wrappers is the whole game so far: use a latest-observation
context (`--context latest`), as TextArena's agents see one observation per call. The reply is
passed as it is (TextArena finds `[move]` in it itself). It deliberately ships no strong
opponent: `"random"` picks one of the moves the game lists, a baseline for smoke runs.
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from numbers import Integral
from typing import Any

from ludic.envs.adapters._common import own_keywords, require
from ludic.envs.arg_types import EnvArgumentTypeError
from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.registry import EnvSpec
from ludic.parsers import identity_parser
from ludic.types import Info, StepOutcome

Opponent = Callable[[str], str]
_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")
_MAX_KEY_CHARS = 4096


def _ta() -> Any:
    return require("textarena", extra="textarena")


def seat_name(player_id: int) -> str:
    return f"player_{player_id}"


def random_move_opponent(seed: int | None = None) -> Opponent:
    """A TextArena-style agent that replies with a random `[move]` from the last line of the
    observation that lists bracketed moves ("Available Moves: '[0]', '[4]'"), else `[pass]`."""
    rng = random.Random(seed)

    def act(observation: str) -> str:
        for line in reversed(observation.splitlines()):
            moves = _BRACKETED.findall(line)
            if moves and ("move" in line.lower() or "action" in line.lower()):
                return str(rng.choice(moves))
        return "[pass]"

    return act


class TextArenaEnv(LudicEnv):
    """One TextArena game. `llm_seats` (default: player 0 only) are the Ludic seats; the others
    are played by `opponent` ("random", or a TextArena agent / `str -> str` callable, one for
    all or a `{player_id: agent}` mapping). `num_players` None tries 2, then 1.

    `reset(seed)` passes the seed to TextArena's reset. After each step, every LLM seat gets
    an outcome: the seat to move next gets its TextArena observation; the others a line saying
    whose turn it is. At the end each LLM seat gets its TextArena reward, `terminated=True`,
    and `info` with TextArena's `game_info` for it (`reason`, `invalid_move`, ...).
    """

    system_prompt: str | None = None

    def __init__(
        self,
        env_id: str,
        *,
        num_players: int | None = None,
        llm_seats: Sequence[int] = (0,),
        opponent: str | Opponent | Mapping[int, Opponent] = "random",
        opponent_seed: int | None = None,
        system_prompt: str | None = None,
        **make_kwargs: Any,
    ) -> None:
        ta = _ta()
        self.env_id = env_id
        _check_id(ta, env_id)
        _check_make_kwargs(ta, env_id, make_kwargs, own_keywords(type(self), TextArenaEnv))
        self._make = lambda: ta.make(env_id, **make_kwargs)
        _check_seat_types(num_players, llm_seats)
        self.num_players = num_players or _probe_players(self._make)
        self.llm_seats = tuple(sorted({int(p) for p in llm_seats}))  # numpy ints, a range
        if not self.llm_seats or any(not 0 <= p < self.num_players for p in self.llm_seats):
            raise ValueError(
                f"llm_seats {tuple(llm_seats)} must name players in 0..{self.num_players - 1} "
                f"of {env_id} ({self.num_players} players)"
            )
        self.opponents = self._opponents(opponent, opponent_seed)
        self.system_prompt = system_prompt or ta.agents.basic_agents.STANDARD_GAME_PROMPT
        self.game: Any = None
        self.done = False

    @property
    def agent_ids(self) -> Sequence[str]:
        return tuple(seat_name(p) for p in self.llm_seats)

    @property
    def active_agents(self) -> Sequence[str]:
        if self.game is None or self.done:
            return ()
        return (seat_name(self.game.state.current_player_id),)

    def reset(self, seed: int | None = None) -> ResetResult:
        self.game = self._make()
        self.game.reset(num_players=self.num_players, seed=seed)
        self.done = False
        self._play_opponents()
        if self.done:
            raise RuntimeError(f"{self.env_id} ended before any LLM seat moved")
        mover, obs = self._observe_mover()
        return {
            seat: (obs if seat == mover else self._waiting_text(), {"player_id": int(seat[7:])})
            for seat in self.agent_ids
        }

    def step(self, actions: Mapping[str, str]) -> StepResult:
        if self.game is None or self.done:
            raise RuntimeError(
                f"TextArenaEnv({self.env_id}).step called before reset or after the end"
            )
        (mover,) = self.active_agents
        if mover not in actions:
            raise KeyError(
                f"TextArenaEnv.step needs an action for {mover!r}, got {sorted(actions)}"
            )
        self.done, step_info = self.game.step(action=actions[mover])
        self._play_opponents()
        if self.done:
            return self._final_outcomes()
        next_mover, obs = self._observe_mover()
        info = _jsonable(step_info) if step_info else {}
        return {
            seat: StepOutcome(obs=obs if seat == next_mover else self._waiting_text(), info=info)
            for seat in self.agent_ids
        }

    def state_key(self, agent_id: str) -> Hashable | None:
        """TextArena's `game_state` (a board, a hand) as canonical JSON with the player to move,
        when it is JSON-able and small; else None (GiGPO then hashes the observation)."""
        if self.game is None:
            return None
        state = self.game.state
        try:
            text = json.dumps(state.game_state, sort_keys=True)
        except (TypeError, ValueError):
            return None
        if len(text) > _MAX_KEY_CHARS:
            return None
        return f"{text}|to_move={state.current_player_id}"

    def close(self) -> None:
        self.game = None

    def _play_opponents(self) -> None:
        while not self.done and self.game.state.current_player_id not in self.llm_seats:
            player, observation = self.game.get_observation()
            action = self.opponents[player](_as_text(observation))
            self.done, _ = self.game.step(action=action)

    def _observe_mover(self) -> tuple[str, str]:
        player, observation = self.game.get_observation()
        return seat_name(player), _as_text(observation)

    def _waiting_text(self) -> str:
        return f"Waiting for Player {self.game.state.current_player_id} to move."

    def _final_outcomes(self) -> StepResult:
        rewards, game_info = self.game.close()
        rewards = rewards or {}
        outcomes: StepResult = {}
        for player in self.llm_seats:
            info: Info = _jsonable(game_info.get(player, {})) if game_info else {}
            reward = float(rewards.get(player, 0.0))
            reason = info.get("reason", "")
            outcomes[seat_name(player)] = StepOutcome(
                obs=f"The game is over. {reason} Your reward: {reward:g}.".replace("  ", " "),
                reward=reward,
                terminated=True,
                info={**info, "textarena_rewards": {str(k): v for k, v in rewards.items()}},
            )
        return outcomes

    def _opponents(
        self, opponent: str | Opponent | Mapping[int, Opponent], seed: int | None
    ) -> dict[int, Opponent]:
        others = [p for p in range(self.num_players) if p not in self.llm_seats]
        if isinstance(opponent, Mapping):
            missing = [p for p in others if p not in opponent]
            if missing:
                raise ValueError(f"opponent mapping has no agent for player(s) {missing}")
            return {p: opponent[p] for p in others}
        if opponent == "random":
            return {p: random_move_opponent(None if seed is None else seed + p) for p in others}
        if isinstance(opponent, str) or not callable(opponent):
            raise ValueError(
                f"opponent must be 'random', a TextArena agent (str -> str) or a mapping of "
                f"them, got {opponent!r}"
            )
        return dict.fromkeys(others, opponent)


def _check_id(ta: Any, env_id: str) -> None:
    if env_id not in ta.envs.registration.ENV_REGISTRY:
        raise ValueError(
            f"TextArena has no env {env_id!r}; e.g. TicTacToe-v0, TicTacToe-v0-train, "
            "GuessTheNumber-v0 (list them with textarena.pprint_registry_detailed())"
        )


def _check_make_kwargs(
    ta: Any, env_id: str, make_kwargs: Mapping[str, Any], ludic_keywords: Sequence[str]
) -> None:
    """Refuse keywords neither TextArenaEnv (`ludic_keywords`) nor the game's class takes
    (--env-kwargs), naming both lists, before `ta.make` fails with a TypeError from inside
    TextArena."""
    if not make_kwargs:
        return
    entry_point = ta.envs.registration.ENV_REGISTRY[env_id].entry_point
    if not isinstance(entry_point, str):  # a callable: what it takes is its own business
        return
    module, _, name = entry_point.partition(":")
    params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(k for k in make_kwargs if k not in params)
    if unknown:
        game = ", ".join(n for n in params if n != "self") or "no keywords"
        raise ValueError(
            f"TextArena env {env_id!r} takes no keyword {', '.join(unknown)} (--env-kwargs); "
            f"its game takes {game}, and Ludic's TextArenaEnv {', '.join(ludic_keywords)}"
        )


def _check_seat_types(num_players: object, llm_seats: object) -> None:
    """Refuse a `num_players` that is not an int, or `llm_seats` that are not a list of ints
    (`"0"`, `[0.5]`, `0`; a range or numpy ints are ints), naming the keyword and the fix; the game's seats are player numbers,
    and a str or float compared with them failed later as "'<=' not supported ..." or never
    matched the current player."""
    if num_players is not None and (
        isinstance(num_players, bool) or not isinstance(num_players, int) or num_players < 1
    ):
        raise EnvArgumentTypeError(
            f"TextArenaEnv: num_players must be an int >= 1 or None (the game's own count), "
            f"got {num_players!r} ({type(num_players).__name__})"
        )
    seats = (
        llm_seats if isinstance(llm_seats, Sequence) and not isinstance(llm_seats, str) else None
    )
    if seats is None or any(isinstance(p, bool) or not isinstance(p, Integral) for p in seats):
        raise EnvArgumentTypeError(
            f"TextArenaEnv: llm_seats must be a list of player numbers (ints), e.g. [0] or "
            f"[0, 1], got {llm_seats!r} ({type(llm_seats).__name__})"
        )


def _probe_players(make: Callable[[], Any]) -> int:
    """The player count TextArena accepts: 2 if the game resets with 2, else 1."""
    for n in (2, 1):
        try:
            make().reset(num_players=n, seed=0)
        except (AssertionError, ValueError):
            continue
        return n
    raise ValueError("the TextArena game resets with neither 2 nor 1 players; pass num_players=")


def _as_text(observation: Any) -> str:
    """TextArena's observation: a string with its wrappers, or (sender, message, type) tuples
    with a `-raw` id, written as `[sender] message` lines."""
    if isinstance(observation, str):
        return observation.strip("\n")
    lines = []
    for item in observation or ():
        sender, message = item[0], item[1]
        name = "GAME" if sender == -1 else f"Player {sender}"
        lines.append(f"[{name}] {message}")
    return "\n".join(lines)


def _jsonable(value: Mapping[Any, Any]) -> Info:
    return json.loads(json.dumps({str(k): v for k, v in value.items()}, default=str))


def env_spec(env_id: str) -> EnvSpec:
    """The registry entry for `textarena:ENV_ID`: the raw reply is the action (the identity
    parser, declared so the CLI does not suggest declaring one)."""
    _check_id(_ta(), env_id)
    return EnvSpec(
        name=f"textarena:{env_id}",
        factory=lambda **kwargs: TextArenaEnv(env_id, **kwargs),
        parser=identity_parser,
        description=f"TextArena game {env_id}",
    )
