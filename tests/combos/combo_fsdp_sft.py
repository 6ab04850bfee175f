"""`combo_fsdp_sft.py DATA OUT STEPS`: SFT of the tiny model on the rollouts in DATA up to step
STEPS, a checkpoint every step under OUT, continuing from OUT's newest checkpoint when there is
one: the README's "Multi-process training (FSDP2)" program, run as one process or under
torchrun (2 gloo ranks). For tests/combos/test_combo_fsdp_resume_one_rank.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from ludic.models import load_model, tiny_model_dir
from ludic.recipes import finish, make_trainer
from ludic.training import OfflineBatchSource, make_sft


def main() -> None:
    data, out, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    model, tokenizer = load_model(str(tiny_model_dir(seed=0)))
    algorithm = make_sft()
    source = OfflineBatchSource(
        paths=data, credit_assigner=algorithm.credit_assigner, batch_size=4, seed=0
    )
    trainer = make_trainer(
        model, tokenizer, algorithm, source, out=out, lr=1e-2, seed=0, checkpoint_every=1
    )
    start = trainer.resume(missing_ok=True)
    asyncio.run(trainer.train(steps - trainer.step, progress=False))
    checkpoint = finish(trainer)
    if trainer.runtime.is_main:
        print(f"world size {trainer.runtime.world_size}; resumed at step {start}; {checkpoint}")


if __name__ == "__main__":
    main()
