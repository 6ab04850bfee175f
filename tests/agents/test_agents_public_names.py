"""The agents the README names under `ludic.agents` import from there (a user's first try)."""

from __future__ import annotations

import ludic.agents
from ludic.agents.context_editing import ContextEditingAgent as Defined


def test_context_editing_agent_is_public() -> None:
    # README: `ludic.agents` holds Agent, ToolAgent, ReActAgent and context editing, and the
    # snapshot section names `ContextEditingAgent(snapshot_reward=...)`.
    for name in ("Agent", "ToolAgent", "ReActAgent", "ContextEditingAgent"):
        assert name in ludic.agents.__all__, name
    from ludic.agents import ContextEditingAgent

    assert ContextEditingAgent is Defined
