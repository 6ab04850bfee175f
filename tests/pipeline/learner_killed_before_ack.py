"""`python -m learner_killed_before_ack STEP learner ...`: `python -m ludic.pipeline learner ...`
that SIGKILLs itself when it is about to ack the samples of its checkpoint at step STEP, i.e. a
learner killed between saving a checkpoint and acknowledging what it holds (the window that
`ack="checkpoint"` recovers from). For tests/pipeline/test_learner_resave_pending.py."""

from __future__ import annotations

import os
import signal
import sys

from ludic.pipeline import __main__ as pipeline_main
from ludic.pipeline.source import PipelineBatchSource


def main() -> None:
    kill_at = int(sys.argv.pop(1))
    ack_checkpointed = PipelineBatchSource.ack_checkpointed

    async def killed_before_ack(self: PipelineBatchSource) -> int:
        if self._captured_at == kill_at:  # the state of step `kill_at` is saved, not acked
            os.kill(os.getpid(), signal.SIGKILL)
        return await ack_checkpointed(self)

    PipelineBatchSource.ack_checkpointed = killed_before_ack  # type: ignore[method-assign]
    pipeline_main.main()


if __name__ == "__main__":
    main()
