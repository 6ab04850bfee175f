"""`python combo2_die_mid_save.py STEP ARGS...`: `ludic ARGS...` whose process kills itself
with SIGKILL while it saves checkpoint STEP, once every file of it but the manifest is written
(the scratch directory full, nothing renamed yet), as a machine losing power or the OOM killer
would stop it. For tests/combos/test_combo2_kill_mid_save_resume_eval.py."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ludic.cli import main
from ludic.training.checkpoint import CheckpointManager

_write_manifest = CheckpointManager._write_manifest


def _dying_write_manifest(self: CheckpointManager, tmp: Path, step: int) -> None:
    if step == int(sys.argv[1]):
        print(f"killed while saving step {step} in {tmp.name}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    _write_manifest(self, tmp, step)


if __name__ == "__main__":
    CheckpointManager._write_manifest = _dying_write_manifest  # type: ignore[method-assign]
    main(sys.argv[2:], report_refusals=True)
