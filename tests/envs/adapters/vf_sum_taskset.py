"""A single-turn verifiers environment package, as `vf-init` scaffolds one: add two numbers,
answer in `\\boxed{}`; verifiers' own `extract_boxed_answer` parses the reply."""

from __future__ import annotations

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int
    broken: bool = False


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        if self.data.broken:
            raise ValueError("the scorer of this task is broken")
        reply = vf.extract_boxed_answer(trace.last_reply, strict=True)
        return 1.0 if reply.strip() == str(self.data.answer) else 0.0


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4
    broken: bool = False


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        return [
            SumTask(
                SumData(
                    prompt=f"What is {i} + {i + 2}?",
                    system_prompt="Put the final answer in \\boxed{}.",
                    answer=2 * i + 2,
                    broken=self.config.broken,
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]


__all__ = ["SumTaskset"]
