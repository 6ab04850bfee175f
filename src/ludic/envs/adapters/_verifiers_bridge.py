"""The two verifiers plugins `ludic.envs.adapters.verifiers` installs: a harness that runs
the chat loop in-process and a model client whose completions are the Ludic agent's replies.
Imported only when a `VerifiersEnv` is built (it imports verifiers at module level); it holds
no episode logic of its own.

verifiers resolves a harness id by importing a top-level module that exports one `Harness`
subclass in `__all__`, so `register_harness()` makes this module importable as `HARNESS_ID`.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.clients.train import serialize_completion
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.harnesses.null import NullHarness

HARNESS_ID = "ludic_verifiers_chat"
"""The harness id every seat of a `VerifiersEnv` is pinned to."""

ModelCall = Callable[[str | None, list[Any]], Awaitable[str]]
"""`(session_id, messages) -> reply text`: how the client reaches the Ludic agent."""


def register_harness() -> None:
    """Make `HARNESS_ID` importable, so verifiers' harness loader finds `LudicChatHarness`."""
    sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])


class LudicChatHarness(NullHarness):  # type: ignore[misc]
    """The `null` harness's chat loop, run in-process instead of as a uv program: the task's
    system prompt and prompt (on resume: the conversation so far) go to the interception
    endpoint, and the reply ends the segment. No tools: a task with tool servers is refused."""

    async def setup(self, runtime: Any) -> None:
        return None

    async def launch(
        self,
        ctx: Any,
        trace: Any,
        runtime: Any,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: Any,
        tool_interception_url: str | None = None,
    ) -> Any:
        if mcp_urls:
            raise NotImplementedError(
                f"this verifiers task has tool servers {sorted(mcp_urls)}; VerifiersEnv does "
                "not support tool calling"
            )
        system, prompt = self.resolve_prompt(data)
        messages: list[Any] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class LudicBridgeClient(vf.Client):  # type: ignore[misc]
    """A verifiers `Client` that answers each chat-completions call with `model_call`."""

    def __init__(self, model_call: ModelCall) -> None:
        self.model_call = model_call

    async def get_response(
        self,
        dialect: Any,
        body: dict[str, Any],
        sampling: Any,
        session_id: str | None = None,
        turn: Any = None,
        headers: Any = None,
    ) -> Any:
        request = dialect.parse_request(body)
        if request.tools:
            raise NotImplementedError(
                "this verifiers task offers tools; VerifiersEnv does not support tool calling"
            )
        text = await self.model_call(session_id, list(request.messages))
        model = str(body.get("model", ""))
        response = vf.Response(
            id="ludic",
            created=0,
            model=model,
            message=vf.AssistantMessage(content=text),
            finish_reason="stop",
        )
        response.raw = serialize_completion(response, model)
        return response


def client_config() -> Any:
    """The endpoint config of every `VerifiersEnv` run. Never contacted (the bridge client
    answers); a non-default key variable keeps verifiers from reading a Prime config."""
    return vf.EvalClientConfig(base_url="http://ludic.invalid/v1", api_key_var="LUDIC_UNUSED_KEY")


def install_client(vf_env: Any, client: LudicBridgeClient) -> None:
    """Seed the live interception server's client cache (keyed by endpoint config JSON), so
    every call of this run reaches `client` instead of an HTTP provider."""
    vf_env._interception.clients[client_config().model_dump_json()] = client


__all__ = ["LudicChatHarness"]
