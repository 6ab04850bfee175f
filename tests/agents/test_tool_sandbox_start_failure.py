"""A sandbox that never starts (`SandboxStartError`: bwrap could not create its namespaces,
a host failure) fails the episode that called the `python` tool, naming the tool and bwrap's
message, and the batch goes on; it used to reach the model as "Error: SandboxStartError: ..."
in its conversation, so a host failure became training signal. What the model's program did
(an exception, a limit) stays a tool result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ludic.agents import ReActAgent, make_python_tool
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.sandbox import SandboxLimits, SandboxPool, SandboxResult, SandboxStartError
from ludic.types import Info, StepOutcome

BWRAP_SAID = "bwrap: Creating new namespace failed: No space left on device"


class StandInBackend:
    """A sandbox backend that runs nothing: it fails to start (as bwrap does when the host is
    out of namespaces) or reports the program's own exception."""

    isolation = "stand-in"
    python = "python3"

    def __init__(self, *, starts: bool) -> None:
        self.starts = starts

    async def probe(self) -> str | None:
        return None

    async def run(
        self,
        argv: Sequence[str],
        *,
        files: Mapping[str, bytes] | None = None,
        stdin: bytes = b"",
        limits: SandboxLimits,
    ) -> SandboxResult:
        if not self.starts:
            raise SandboxStartError(f"the sandbox did not start: saying: {BWRAP_SAID}")
        return SandboxResult(stdout="", stderr="ZeroDivisionError: division by zero", exit_code=1)


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "compute 1/0 with the tool, then answer", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


PYTHON_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(1/0)"}}</tool_call>'


def protocol(starts: bool) -> SingleAgentProtocol:
    pool = SandboxPool(backend=StandInBackend(starts=starts))
    agent = ReActAgent(
        ScriptedClient([PYTHON_CALL, "Answer: it fails"]), tools=[make_python_tool(pool)]
    )
    return SingleAgentProtocol(agent, max_steps=1)


async def test_a_sandbox_that_never_started_fails_the_episode_and_the_batch_goes_on() -> None:
    engine = RolloutEngine(
        env_registry={"one": OneStepEnv},
        protocol_registry={"p": protocol},
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="one"),
            protocol=ComponentSpec(name="p", kwargs={"starts": starts}),
        )
        for starts in (True, False)
    ]
    ran, host_failed = await engine.run(requests)
    assert host_failed.failed and host_failed.meta["error_type"] == "SandboxStartError"
    assert host_failed.meta["error"].startswith("tool 'python': the sandbox did not start")
    assert BWRAP_SAID in host_failed.meta["error"]
    assert not ran.failed
    (result,) = ran.agent_steps[0].tool_results
    assert not result.is_error and "ZeroDivisionError" in result.content
