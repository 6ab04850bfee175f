"""`ludic actor`'s sampling flags are refused before any work (no Redis needed), naming the
flag as `ludic train` does."""

from __future__ import annotations

import pytest

from ludic.pipeline.commands import actor_sampling, run_actor
from ludic.pipeline.config import ActorConfig


def test_actor_sampling_takes_the_flags() -> None:
    sampling = actor_sampling(ActorConfig(temperature=0.7, top_p=0.9, max_tokens=5))
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.7, 0.9, 5)


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_a_top_p_out_of_range_names_the_flag(top_p: float) -> None:
    cfg = ActorConfig(redis_url="redis://127.0.0.1:1/0", top_p=top_p, batches=1)
    with pytest.raises(ValueError, match=r"^--top-p must be in \(0, 1\], got "):
        run_actor(cfg)  # fails before Redis is reached


def test_a_restarted_learner_with_another_lr_names_the_flag() -> None:
    """`ludic learner` restarted with another --lr than its checkpoint's is refused (the
    Trainer's mismatch error, told in the learner's flags) instead of silently keeping it."""
    from ludic.pipeline.commands import _resume_learner
    from ludic.pipeline.config import LearnerConfig
    from ludic.training.lr_resume import LRScheduleMismatchError

    class Restarted:
        def resume(self, *, override_lr_schedule: bool = False) -> int:
            raise LRScheduleMismatchError("ckpt/step_00000004", {"lr": (1e-5, 3e-5)})

    with pytest.raises(ValueError, match=r"--lr is 3e-05, the checkpoint's is 1e-05.*--lr 1e-05"):
        _resume_learner(Restarted(), LearnerConfig(lr=3e-5))
