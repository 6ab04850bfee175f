"""ContextStrategy: the agent's memory and how its prompt is built from it.

The strategy keeps the full history (what happened) and decides the prompt (what the model
sees). A strategy whose prompt stops extending the previous one (it deleted, summarised or
rewrote a shown message) calls `mark_rewrite()`: the agent stamps `history_version` on every
step, and the sample builder cuts a snapshot exactly where the version changed. Hooks are
called by the Agent; the strategy never calls the model, parses output or talks to the env.
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic.types import Info, Message, ToolResult

# The AgentStep.info key holding the history version of the step's prompt.
CONTEXT_VERSION_KEY = "context_version"


class ContextStrategy:
    """Base strategy: stores the dialog; subclasses override `on_before_act` to shape prompts.

    Hooks, in the order an episode calls them:
    `reset(system_prompt)` -> `on_env_reset(obs, info)` -> [`on_before_act()` -> model ->
    `on_after_act(message)` -> (`on_tool_results(results)` -> `on_before_act()` ...)] ->
    `on_after_step(next_obs, info)` -> ...

    A subclass that rewrites history (its next prompt no longer starts with the previous
    prompt's messages) must call `mark_rewrite()` when it does; an append-only one never does.
    """

    def __init__(self, system_prompt: str | None = None) -> None:
        self.default_system_prompt = system_prompt
        self._messages: list[Message] = []
        self._history_version = 0

    @property
    def history_version(self) -> int:
        """How many times this episode's prompt view was rewritten rather than appended to.

        Two model calls whose prompts have the same version saw one append-only history, so a
        token mismatch between them is template drift, not an edit."""
        return self._history_version

    def mark_rewrite(self) -> None:
        """Record that the prompt view was rewritten (a snapshot boundary for training)."""
        self._history_version += 1

    @property
    def messages(self) -> list[Message]:
        """The full history (a copy)."""
        return [dict(m) for m in self._messages]

    def reset(self, system_prompt: str | None = None) -> None:
        self._messages = []
        self._history_version = 0
        prompt = system_prompt if system_prompt is not None else self.default_system_prompt
        if prompt:
            self._messages.append({"role": "system", "content": prompt})

    def on_env_reset(self, obs: str, info: Info) -> None:
        self._messages.append({"role": "user", "content": obs})

    def on_before_act(self) -> list[Message]:
        """The prompt for the next model call."""
        return self.messages

    def on_after_act(self, message: Message) -> None:
        self._messages.append(dict(message))

    def on_tool_results(self, results: Sequence[ToolResult]) -> None:
        self._messages.extend(r.to_message() for r in results)

    def on_after_step(self, next_obs: str | None, info: Info) -> None:
        if next_obs is not None:
            self._messages.append({"role": "user", "content": next_obs})
