"""Agent parsing: long completions are parsed on a worker thread (so the episode timeout bounds
a slow parser and other episodes keep going), short ones in place; errors stay parse failures."""

from __future__ import annotations

import threading

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.types import ParseResult


def recording_parser(threads: list[int], *, fail: bool = False):
    def parse(text: str) -> ParseResult:
        threads.append(threading.get_ident())
        if fail:
            raise RecursionError("parser blew its stack")
        return ParseResult(action=text[:5])

    return parse


async def act(agent: Agent) -> ParseResult:
    agent.reset()
    agent.on_env_reset("go", {})
    result = (await agent.act(turn_id="t0")).parse_result
    assert result is not None
    return result


async def test_short_replies_parse_in_place_long_ones_on_a_worker_thread() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []
    long_reply = "y" * (Agent.parse_inline_max_chars + 1)
    for reply in ("short", long_reply):
        agent = Agent(ScriptedClient([reply]), parser=recording_parser(threads))
        assert (await act(agent)).action == reply[:5]
    assert threads[0] == loop_thread and threads[1] != loop_thread


async def test_parse_inline_max_chars_zero_always_uses_a_worker_thread() -> None:
    threads: list[int] = []
    agent = Agent(ScriptedClient(["ok"]), parser=recording_parser(threads))
    agent.parse_inline_max_chars = 0
    assert (await act(agent)).action == "ok"
    assert threads[0] != threading.get_ident()


async def test_a_parser_error_on_a_worker_thread_is_a_parse_failure() -> None:
    agent = Agent(ScriptedClient(["z" * 5000]), parser=recording_parser([], fail=True))
    agent.on_env_reset("go", {})
    act_ = await agent.act(turn_id="t0")
    assert act_.action is None
    assert act_.final_step.info["parser_exception"] == "RecursionError: parser blew its stack"
