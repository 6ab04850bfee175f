"""ReActAgent: [think -> tool]* -> act, as a ToolAgent with a ReAct instruction.

The tool loop itself is ToolAgent's; this adds the prompt that teaches the format, listing the
tools with their schemas. It deliberately does not add a scratchpad format of its own.
"""

from __future__ import annotations

import json
from typing import Any

from ludic.agents.tool_agent import ToolAgent

# The call form is the one the Hermes/Qwen chat templates render a tool call in (the JSON on
# its own line between the tags), so the next prompt re-renders the call exactly as written
# and a tool loop stays one training sequence (tests/agents/test_tool_call_form.py).
REACT_INSTRUCTIONS = """\
You can use tools. Think step by step inside <think>...</think>. To call a tool, write the call
on its own lines, exactly in this form, and stop:
<tool_call>
{{"name": "<tool name>", "arguments": {{"<argument>": <value>}}}}
</tool_call>
You will get the result and can continue. When you are done, give your final answer without a
tool call.
Available tools:
{tools}"""


class ReActAgent(ToolAgent):
    """A ToolAgent whose system prompt explains the ReAct loop and lists its tools."""

    def __init__(self, *args: Any, react_instructions: str = REACT_INSTRUCTIONS, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.react_instructions = react_instructions

    def episode_system_prompt(self, env_prompt: str | None) -> str | None:
        base = super().episode_system_prompt(env_prompt)
        tools = "\n".join(json.dumps(s["function"]) for s in self.tool_schemas())
        react = self.react_instructions.format(tools=tools)
        return f"{base}\n\n{react}" if base else react
