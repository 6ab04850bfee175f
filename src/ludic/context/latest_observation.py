"""LatestObservationContext: a Markov prompt of the system prompt and the latest observation.

For fully observed tasks (board games, most grid worlds) the latest observation already holds
the whole state, so earlier turns only make prompts longer. This strategy deliberately forgets
them: the prompt is the system prompt, the latest env observation and the current turn (its
tool loop), plus, after a parse error, only the latest failed reply and its feedback. Prompts
stay short however long the episode runs. The full history stays in `.messages`. It does not
summarise what it forgets, so it is the wrong choice for partially observed tasks, where the
past carries information the observation lacks.
"""

from __future__ import annotations

from ludic.context.base import ContextStrategy
from ludic.types import Info, Message


class LatestObservationContext(ContextStrategy):
    """Show the system prompt, the latest env observation and what followed it (see module).

    A parse-failure feedback step (`info["synthetic"]` or `info["parse_error"]`, set by the
    protocols) is not a new observation: the prompt keeps the observation, shows the failed
    reply with its feedback (earlier failures are dropped) and the agent tries again. Prompts
    are not append-only across turns: each dropped turn is marked as a rewrite, so in episode
    mode each turn becomes its own snapshot sample.
    """

    def __init__(self, system_prompt: str | None = None) -> None:
        super().__init__(system_prompt)
        self._obs: int | None = None  # index of the latest observation in the history
        self._tail = 0  # first message after the observation that the prompt shows
        self._turn_start = 0  # first message of the current turn

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._obs = None
        self._tail = self._turn_start = len(self._messages)

    def on_env_reset(self, obs: str, info: Info) -> None:
        self._new_observation(obs)

    def on_after_step(self, next_obs: str | None, info: Info) -> None:
        if next_obs is None:
            return
        if info.get("synthetic") or info.get("parse_error"):
            if self._tail != self._turn_start:  # an earlier failed reply leaves the prompt
                self.mark_rewrite()
            self._tail = self._turn_start  # show only the latest failed turn and its feedback
            self._messages.append({"role": "user", "content": next_obs})
            self._turn_start = len(self._messages)
        else:
            self._new_observation(next_obs)

    def on_before_act(self) -> list[Message]:
        prompt = [dict(m) for m in self._messages[:1] if m.get("role") == "system"]
        if self._obs is not None:
            prompt.append(dict(self._messages[self._obs]))
        return prompt + [dict(m) for m in self._messages[self._tail :]]

    def _new_observation(self, obs: str) -> None:
        if self._obs is not None:  # the previous observation and its turn leave the prompt
            self.mark_rewrite()
        self._messages.append({"role": "user", "content": obs})
        self._obs = len(self._messages) - 1
        self._tail = self._turn_start = len(self._messages)
