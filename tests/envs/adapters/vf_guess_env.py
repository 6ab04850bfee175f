"""A multi-turn verifiers environment package: the env answers each guess with "higher" or
"lower" through `agents.agent.interaction(task)` turns; the reward is 1 for finding the
number, minus 0.1 per extra guess."""

from __future__ import annotations

import re

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        guesses = trace.info.get("guesses", [])
        if self.data.secret not in guesses:
            return 0.0
        return 1.0 - 0.1 * (len(guesses) - 1)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> list[GuessTask]:
        return [
            GuessTask(
                GuessData(
                    prompt="Guess my number from 1 to 8. Reply with the number only.", secret=s
                ),
                self.config.task,
            )
            for s in (3, 6)
        ]


class GuessConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(
        max_turns=6,
        model="some-provider-model",
        client=vf.EvalClientConfig(base_url="http://provider.invalid/v1", api_key_var="NO_KEY"),
    )
    max_guesses: int = 4


class GuessEnv(vf.Env[GuessConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            guesses: list[int] = []
            chat.trace.info["guesses"] = guesses
            while not segment.terminated:
                found = re.search(r"\d+", segment.last_reply)
                guess = int(found.group()) if found else -1
                guesses.append(guess)
                if guess == task.data.secret or len(guesses) >= self.config.max_guesses:
                    break
                segment = await chat.turn("higher" if guess < task.data.secret else "lower")


__all__ = ["GuessEnv", "GuessTaskset"]
