"""Tiny envs for protocol tests: a step-counting single-agent env, a tape env for termination
rules, a two-seat turn-based coin game and a simultaneous rock-paper-scissors round (each of
the last three also as a one-reply env, `parse_failure_ends_episode`). They count `step` calls
so tests can check that parse failures never reach the env."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ludic.envs.base import LudicEnv, ResetResult, StepResult
from ludic.envs.single_agent import SingleAgentEnv
from ludic.types import Info, StepOutcome


class CountingEnv(SingleAgentEnv):
    """Observation "state t". Ends after `length` steps by termination (or `truncate`);
    `length=None` never ends. Reward 1 for the action "good". `fail_on_step` raises."""

    system_prompt = "You play the counting game."

    def __init__(
        self, *, length: int | None = 2, truncate: bool = False, fail_on_step: bool = False
    ) -> None:
        self.length = length
        self.truncate = truncate
        self.fail_on_step = fail_on_step
        self.t = 0
        self.actions: list[str] = []
        self.closed = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.t = 0
        return f"state 0 (seed {seed})", {"seed": seed}

    def env_step(self, action: str) -> StepOutcome:
        if self.fail_on_step:
            raise RuntimeError("the env broke")
        self.actions.append(action)
        self.t += 1
        done = self.length is not None and self.t >= self.length
        return StepOutcome(
            obs=f"state {self.t}",
            reward=1.0 if action == "good" else 0.0,
            terminated=done and not self.truncate,
            truncated=done and self.truncate,
            info={"t": self.t},
        )

    def env_state_key(self) -> int:
        return self.t

    def close(self) -> None:
        self.closed += 1


class TapeEnv(SingleAgentEnv):
    """Reward 1 per action; step `critical_at` reports a critical error; step `end_at` ends the
    episode (truncated if `truncate`); remembers the actions it saw."""

    def __init__(
        self, *, critical_at: int | None = None, end_at: int | None = None, truncate: bool = False
    ) -> None:
        self.critical_at, self.end_at, self.truncate = critical_at, end_at, truncate
        self.seen: list[str] = []

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.seen = []
        return "start", {}

    def env_step(self, action: str) -> StepOutcome:
        self.seen.append(action)
        t = len(self.seen)
        info: Info = {"critical_error": "disk on fire"} if t == self.critical_at else {}
        end = t == self.end_at
        return StepOutcome(
            obs=f"obs {t}",
            reward=1.0,
            terminated=end and not self.truncate,
            truncated=end and self.truncate,
            info=info,
        )

    def env_state_key(self) -> int:
        return len(self.seen)


class OneReplyTapeEnv(TapeEnv):
    """A TapeEnv that takes one reply per episode: a parse failure ends it."""

    parse_failure_ends_episode = True


class CoinDuelEnv(LudicEnv):
    """Two seats take turns removing 1 or 2 coins from a pile; whoever takes the last coin
    wins (+1), the other loses (-1). Each step reports to both seats. Sync reset and step."""

    def __init__(self, coins: int = 3) -> None:
        self.start = coins
        self.coins = coins
        self.turn = 0
        self.steps: list[dict[str, str]] = []
        self.closed = 0

    @property
    def agent_ids(self) -> Sequence[str]:
        return ("first", "second")

    @property
    def active_agents(self) -> Sequence[str]:
        return (self.agent_ids[self.turn],)

    def reset(self, seed: int | None = None) -> ResetResult:
        self.coins, self.turn = self.start, 0
        return {
            "first": (f"{self.coins} coins. Your move.", {}),
            "second": (f"{self.coins} coins. Wait.", {}),
        }

    def step(self, actions: Mapping[str, str]) -> StepResult:
        self.steps.append(dict(actions))
        mover = self.agent_ids[self.turn]
        other = self.agent_ids[1 - self.turn]
        take = 2 if actions[mover].strip() == "2" else 1
        self.coins = max(self.coins - take, 0)
        if self.coins == 0:
            return {
                mover: StepOutcome(obs="You took the last coin.", reward=1.0, terminated=True),
                other: StepOutcome(
                    obs="Opponent took the last coin.", reward=-1.0, terminated=True
                ),
            }
        self.turn = 1 - self.turn
        return {
            mover: StepOutcome(obs=f"You took {take}; {self.coins} left. Wait."),
            other: StepOutcome(obs=f"Opponent took {take}; {self.coins} left. Your move."),
        }

    def state_key(self, agent_id: str) -> tuple[int, int]:
        return (self.coins, self.turn)

    def close(self) -> None:
        self.closed += 1


BEATS = {"rock": "scissors", "scissors": "paper", "paper": "rock"}


class RockPaperScissorsEnv(LudicEnv):
    """Both seats move at once (async step); one round; winner +1, loser -1, draw 0."""

    def __init__(self) -> None:
        self.steps: list[dict[str, str]] = []

    @property
    def agent_ids(self) -> Sequence[str]:
        return ("a", "b")

    @property
    def active_agents(self) -> Sequence[str]:
        return self.agent_ids

    async def reset(self, seed: int | None = None) -> ResetResult:
        return {aid: ("Rock, paper or scissors?", {}) for aid in self.agent_ids}

    async def step(self, actions: Mapping[str, str]) -> StepResult:
        self.steps.append(dict(actions))
        a, b = actions["a"], actions["b"]
        score = 0.0 if a == b else (1.0 if BEATS.get(a) == b else -1.0)
        return {
            "a": StepOutcome(obs=f"they played {b}", reward=score, terminated=True),
            "b": StepOutcome(obs=f"they played {a}", reward=-score, terminated=True),
        }


class OneReplyCoinDuelEnv(CoinDuelEnv):
    """The coin game, but a reply that fails to parse ends the episode."""

    parse_failure_ends_episode = True


class OneReplyRockPaperScissorsEnv(RockPaperScissorsEnv):
    """The round, but a reply that fails to parse is that seat's answer: the episode ends."""

    parse_failure_ends_episode = True
