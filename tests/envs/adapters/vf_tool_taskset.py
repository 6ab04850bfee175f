"""A verifiers taskset whose tasks come with a tool server (as `vf-init -T` scaffolds one),
which VerifiersEnv refuses: its text agent cannot answer with tool calls."""

from __future__ import annotations

import verifiers.v1 as vf


class EchoToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "echo"

    @vf.tool
    def echo(self, text: str) -> str:
        """Return the given text unchanged."""
        return text


class EchoTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class EchoTask(vf.Task[vf.TaskData, vf.State, EchoTaskConfig]):
    @classmethod
    def toolsets(cls, config: EchoTaskConfig) -> list[vf.Toolset]:
        return [EchoToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def used(self, trace: vf.Trace) -> float:
        return 0.0


class EchoConfig(vf.TasksetConfig):
    task: EchoTaskConfig = EchoTaskConfig()


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [EchoTask(vf.TaskData(prompt="Echo hi."), self.config.task)]


__all__ = ["EchoTaskset"]
