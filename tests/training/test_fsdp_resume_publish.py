"""Resume under FSDP (2 gloo ranks) publishes the restored weights before the first step: every
rank gathers, rank 0 (the only one with a publisher) pushes the checkpoint's exact weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_worker_common import ALGORITHM, batches_for, torchrun, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer, read_checkpoint

pytestmark = pytest.mark.distributed


def test_resume_on_two_ranks_publishes_the_restored_weights(tmp_path: Path) -> None:
    single = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource(batches_for(0, 1)),
        trainer_config(tmp_path / "ckpt"),
    )
    single.run(3, progress=False)  # checkpoint at step 3
    saved = read_checkpoint(tmp_path / "ckpt" / "step_00000003").model_state

    torchrun("dist_worker_resume_publish.py", str(tmp_path), str(tmp_path / "ckpt"))
    results = torch.load(tmp_path / "results.pt", weights_only=False, map_location="cpu")
    assert results["step"] == 3
    assert results["versions"] == [3, 4]  # on resume, then after the step it trained
    published = results["weights"]
    assert published.keys() == saved.keys()
    assert all(torch.equal(published[k], saved[k]) for k in saved)
