"""The `python` code-interpreter tool: its schema, direct calls (output, errors, limits), the
report format, and a ReAct episode that tests its code with the tool before answering."""

from __future__ import annotations

import json

import pytest

from ludic.agents import ReActAgent, tool_from_callable
from ludic.agents.code_tool import format_sandbox_result, make_python_tool
from ludic.envs.code_env import CodeTestEnv, load_code_problems
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.sandbox import SandboxLimits, SandboxPool, SandboxResult

LIMITS = SandboxLimits(wall_time_s=1.5, cpu_time_s=10, max_output_bytes=1000)


def test_schema_comes_from_the_typed_callable() -> None:
    tool = tool_from_callable(make_python_tool(SandboxPool()))
    assert tool.name == "python"
    assert tool.description.startswith("Run a Python 3 program in a sandbox")
    params = tool.parameters
    assert params["required"] == ["code"]
    assert params["properties"]["code"]["type"] == "string"
    assert "program source" in params["properties"]["code"]["description"]


async def test_output_is_reported() -> None:
    python = make_python_tool(SandboxPool(limits=LIMITS))
    assert await python("print(2 + 2)") == "exit status: 0\nstdout:\n4"


async def test_errors_are_reported_with_stderr() -> None:
    python = make_python_tool(SandboxPool(limits=LIMITS))
    report = await python("print('before')\nraise ValueError('boom')")
    lines = report.split("\n")
    assert lines[:3] == ["exit status: 1", "stdout:", "before"]
    assert lines[3] == "stderr:" and lines[-1] == "ValueError: boom"


async def test_limits_are_named() -> None:
    python = make_python_tool(SandboxPool(), limits=LIMITS)
    report = await python("while True:\n    pass")
    assert report.startswith("killed by signal 9\nlimit hit: wall time (1.5 s)")
    assert report.endswith("stdout:\n(empty)")
    flood = await python("print('x' * 5000)")
    assert "limit hit: output size (1000 bytes)" in flood


def test_the_process_and_file_size_caps_are_named() -> None:
    """The sandbox reports these two caps as limit kinds too; the tool names them (it used to
    fail on them with a KeyError, and the model lost the run's output)."""
    forked = SandboxResult(
        stdout="",
        stderr="BlockingIOError: [Errno 11] Resource temporarily unavailable",
        exit_code=1,
    )
    written = SandboxResult(stdout="", stderr="OSError: [Errno 27] File too large", exit_code=1)
    assert (forked.limit_hit, written.limit_hit) == ("processes", "file_size")
    limits = SandboxLimits(max_processes=4, max_file_bytes=2048)
    report = format_sandbox_result(forked, limits, max_chars=200)
    assert "limit hit: process count (4), a fork or thread was refused" in report
    report = format_sandbox_result(written, limits, max_chars=200)
    assert "limit hit: file size (2048 bytes), a write was refused" in report


def test_a_full_directory_is_not_named_as_the_file_size_cap() -> None:
    """A write into a full tmpfs (ENOSPC) is the same limit kind as a file over
    max_file_bytes; the tool cited max_file_bytes for both, though the scratch directory's
    scratch_bytes is the usual cause. Which tmpfs was full the result cannot tell: both are
    named."""
    full = SandboxResult(
        stdout="", stderr="OSError: [Errno 28] No space left on device: 'out.bin'", exit_code=1
    )
    killed = SandboxResult(stdout="", stderr="", exit_code=None, killed_signal=25)  # SIGXFSZ
    assert full.limit_hit == killed.limit_hit == "file_size"
    limits = SandboxLimits(max_file_bytes=2048, scratch_bytes=8192)
    report = format_sandbox_result(full, limits, max_chars=200)
    assert "limit hit: storage, a write found its directory full" in report
    assert "working directory holds 8192 bytes" in report and "2048 bytes each" in report
    assert "file size" not in report
    report = format_sandbox_result(killed, limits, max_chars=200)
    assert "limit hit: file size (2048 bytes), a write was refused" in report


async def test_a_full_scratch_directory_is_named_in_a_real_run() -> None:
    pool = SandboxPool(limits=SandboxLimits(max_file_bytes=2**20, scratch_bytes=64 * 1024))
    if (await pool.backend()).isolation != "bubblewrap":
        pytest.skip("only bubblewrap caps the scratch directory (scratch_bytes)")
    python = make_python_tool(pool)
    report = await python("for i in range(3):\n    open(f'{i}.bin', 'wb').write(b'x' * 40000)")
    assert "limit hit: storage" in report and "holds 65536 bytes in all" in report


def test_long_output_is_clipped_in_the_middle() -> None:
    result = SandboxResult(stdout="a" * 50 + "b" * 50, stderr="", exit_code=0)
    report = format_sandbox_result(result, LIMITS, max_chars=20)
    assert (
        report == "exit status: 0\nstdout:\n" + "a" * 10 + "\n... [80 chars cut] ...\n" + "b" * 10
    )


def _call(code: str) -> str:
    args = json.dumps({"name": "python", "arguments": {"code": code}})
    return f"<think>Let me test it.</think><tool_call>{args}</tool_call>"


async def test_react_episode_tests_code_with_the_tool_then_answers() -> None:
    solution = "a, b = map(int, input().split())\nprint(a + b)\n"
    probe = "a, b = map(int, '3 4'.split())\nprint(a + b)"
    client = ScriptedClient([_call(probe), f"It prints 7.\n```python\n{solution}```"])
    pool = SandboxPool(limits=LIMITS)
    agent = ReActAgent(client, tools=[make_python_tool(pool)])
    problems = load_code_problems()
    env = CodeTestEnv(problems, pool=pool)
    seed = [p.id for p in problems].index("sum_two")
    (rollout,) = await SingleAgentProtocol(agent).run(env, env_seed=seed)
    tool_step, final = rollout.agent_steps
    assert [tool_step.action_target, final.action_target] == ["internal", "env"]
    (result,) = tool_step.tool_results
    assert result.name == "python" and not result.is_error
    assert result.content == "exit status: 0\nstdout:\n7"
    assert final.prompt_messages[-1] == {
        "role": "tool",
        "tool_call_id": result.tool_call_id,
        "name": "python",
        "content": "exit status: 0\nstdout:\n7",
    }
    (env_step,) = rollout.env_steps
    assert env_step.terminated and env_step.reward == 1.0 and env_step.info["passed"] == 4
