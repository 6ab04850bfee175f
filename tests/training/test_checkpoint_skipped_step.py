"""A checkpoint due on a skipped step is not written: its weights are the last trained step's,
so `--checkpoint-every 1` made a launch that trained nothing save step 1 with the model it
started from, and a resume from it started past a batch no update came from."""

from __future__ import annotations

from pathlib import Path

from training_fakes import ListSource, item, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo


def _batch(version: int, seed: int) -> list:
    """Three samples generated at policy `version`."""
    return [item(8 + i, versions=[version], seed=seed * 10 + i) for i in range(3)]


def _trainer(ckpt: Path, batches: list[list], *, initial_version: int = 0) -> Trainer:
    config = TrainerConfig(
        lr=1e-3,
        max_lag=0,
        initial_policy_version=initial_version,
        checkpoint=CheckpointConfig(dir=str(ckpt), every_n_steps=1),
    )
    return Trainer(tiny_llama(seed=0), make_grpo(), ListSource(batches), config)


def _steps_saved(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.glob("step_*"))


def test_a_source_whose_every_batch_is_dropped_writes_no_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    trainer = _trainer(ckpt, [_batch(0, seed=1)], initial_version=5)  # every sample stale
    history = trainer.run(2, progress=False)
    assert [m.get("skipped_empty") for m in history] == [1.0, 1.0]
    assert _steps_saved(ckpt) == []
    assert trainer.checkpointed_step is None


def test_a_resume_continues_from_the_last_trained_step(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # step 1 trains (version 0), step 2's samples are stale (version 0 at policy 1)
    batches = [_batch(0, seed=1), _batch(0, seed=2), _batch(1, seed=3)]
    first = _trainer(ckpt, batches)
    history = first.run(2, progress=False)
    assert "skipped_empty" not in history[0] and history[1].get("skipped_empty") == 1.0
    assert _steps_saved(ckpt) == ["step_00000001"]
    assert first.checkpointed_step == 1 and first.step == 2

    resumed = _trainer(ckpt, batches)
    assert resumed.resume() == 1
    assert resumed.policy_version == 1 and resumed.checkpointed_step == 1
    assert resumed.batch_source.position == 1  # type: ignore[attr-defined]
    # step 2 rereads the stale batch (skipped again), step 3 trains on the fresh one
    history = resumed.run(2, progress=False)
    assert [m.get("skipped_empty") for m in history] == [1.0, None]
    assert _steps_saved(ckpt) == ["step_00000001", "step_00000003"]
    assert resumed.checkpointed_step == 3 and resumed.policy_version == 2
