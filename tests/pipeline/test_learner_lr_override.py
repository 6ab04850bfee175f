"""`ludic learner --override-lr-schedule`, as `ludic train`'s: a resume with another `--lr` is
refused naming the flag; with it the resumed learner trains at the new rate from the
checkpoint's step on, and its checkpoints record that rate, so the next resume takes it without
the flag. Unit tests of the check, then real `python -m ludic.pipeline learner` processes
against a real redis-server."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
from pipeline_fakes import RedisServer, redis_server, spawn
from test_pipeline_processes import SPEC, _actor, _learner, _produced_ids, _sample_ids, _wait

from ludic.models import tiny_model_dir
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.learner_settings import (
    LEARNER_SETTINGS_KEY,
    check_learner_resume,
    learner_settings,
    resume_refusal,
)
from ludic.training import read_metrics_jsonl
from ludic.training.checkpoint import STATE
from ludic.training.checkpoint_manifest import MANIFEST
from ludic.training.lr_resume import RECORD_KEY

__all__ = ["redis_server"]
BASE = LearnerConfig(out_dir=Path("run"), lr=1e-2)
CHECKPOINT = Path("run/checkpoints/step_00000002")


def test_a_changed_lr_refusal_names_the_override() -> None:
    saved = learner_settings(BASE)
    text = resume_refusal(CHECKPOINT, saved, learner_settings(dataclasses.replace(BASE, lr=5e-2)))
    assert text is not None
    assert "--lr is 0.05, the checkpoint's 0.01" in text
    assert (
        "Pass the checkpoint's flags (--lr 0.01) to continue it, add --override-lr-schedule to "
        "apply this launch's --lr from the checkpoint's step on, or another --out-dir" in text
    )
    # another flag that changed with it: the override is named as covering --lr only
    both = learner_settings(dataclasses.replace(BASE, lr=5e-2, algorithm="cispo"))
    text = resume_refusal(CHECKPOINT, saved, both)
    assert text is not None and "--override-lr-schedule" in text
    assert "(only --lr may change that way)" in text
    # a change that is not --lr says nothing of the override
    text = resume_refusal(CHECKPOINT, saved, learner_settings(dataclasses.replace(BASE, max_lag=2)))
    assert text is not None and "--override-lr-schedule" not in text


def test_the_override_lets_only_lr_change() -> None:
    saved = learner_settings(BASE)
    lr = learner_settings(dataclasses.replace(BASE, lr=5e-2))
    assert resume_refusal(CHECKPOINT, saved, lr, override_lr_schedule=True) is None
    both = learner_settings(dataclasses.replace(BASE, lr=5e-2, algorithm="cispo"))
    text = resume_refusal(CHECKPOINT, saved, both, override_lr_schedule=True)
    assert text is not None
    assert "--algorithm is cispo, the checkpoint's grpo" in text and "--lr is" not in text


def test_check_learner_resume_takes_the_override_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = dataclasses.replace(BASE, out_dir=tmp_path)
    path = tmp_path / "checkpoints" / "step_00000002"
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    extra = {LEARNER_SETTINGS_KEY: learner_settings(cfg)}
    (path / STATE).write_text(json.dumps({"step": 2, "extra": extra}))
    changed = dataclasses.replace(cfg, lr=5e-2)
    with pytest.raises(ValueError, match=r"--lr is 0\.05.*add --override-lr-schedule"):
        check_learner_resume(changed)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.learner_settings"):
        check_learner_resume(dataclasses.replace(changed, override_lr_schedule=True))
    assert "--override-lr-schedule: --lr 0.05 replaces the checkpoint's 0.01" in caplog.text
    # the same --lr with the flag: nothing to override, nothing said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.learner_settings"):
        check_learner_resume(dataclasses.replace(cfg, override_lr_schedule=True))
    assert "--override-lr-schedule" not in caplog.text


def _checkpoint(out: Path, step: int) -> tuple[dict[str, object], list[float]]:
    """A learner checkpoint's state.json `extra` and the lr of each optimizer param group."""
    path = out / "learner" / "checkpoints" / f"step_{step:08d}"
    extra = json.loads((path / STATE).read_text())["extra"]
    optimizer = torch.load(path / "optimizer.pt", weights_only=True)
    return extra, [float(group["lr"]) for group in optimizer["param_groups"]]


def _lr_by_step(out: Path) -> dict[int, float]:
    return {
        int(r["step"]): float(r["lr"])
        for r in read_metrics_jsonl(out / "learner" / "metrics.jsonl")
    }


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_learner_resumed_with_the_override_trains_at_the_new_lr(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=5, extra=model), tmp_path / "actor.log")
    _wait(actor, tmp_path / "actor.log")  # 20 samples: 5 steps of 4
    flags = ["--max-lag", "None", "--checkpoint-every", "2", "--max-wait-s", "30"]

    def learner(name: str, *extra: str) -> tuple[int, str]:
        process = spawn(_learner(redis_server, tmp_path, extra=[*flags, *extra]), tmp_path / name)
        code = process.wait(timeout=300)
        return code, (tmp_path / name).read_text()

    code, log = learner("l1.log", "--steps", "2")  # _learner's --lr 1e-2
    assert code == 0, log[-3000:]
    # another --lr: refused, naming the override, before any step
    code, log = learner("l2.log", "--lr", "0.05", "--steps", "4")
    assert code == 1, log[-3000:]
    assert "--lr is 0.05, the checkpoint's 0.01" in log, log[-3000:]
    assert "add --override-lr-schedule" in log
    assert "learner step" not in log
    # with the override: steps 3 and 4 train at 0.05, and step 4's checkpoint records it
    code, log = learner("l3.log", "--lr", "0.05", "--override-lr-schedule", "--steps", "4")
    assert code == 0, log[-3000:]
    assert "--override-lr-schedule: --lr 0.05 replaces the checkpoint's 0.01" in log
    assert "resumed from step 2" in log and "learner done at step 4" in log
    assert _lr_by_step(tmp_path) == {1: 0.01, 2: 0.01, 3: 0.05, 4: 0.05}
    extra, group_lrs = _checkpoint(tmp_path, 4)
    assert group_lrs and all(lr == 0.05 for lr in group_lrs)
    learner_record = extra[LEARNER_SETTINGS_KEY]
    trainer_record = extra[RECORD_KEY]
    assert isinstance(learner_record, dict) and learner_record["--lr"] == 0.05
    assert isinstance(trainer_record, dict) and trainer_record["lr"] == 0.05
    # the new --lr without the override: the same run goes on at it
    code, log = learner("l4.log", "--lr", "0.05", "--steps", "5")
    assert code == 0, log[-3000:]
    assert "resumed from step 4" in log and "learner done at step 5" in log
    assert "--override-lr-schedule" not in log
    assert _lr_by_step(tmp_path)[5] == 0.05
    assert all(lr == 0.05 for lr in _checkpoint(tmp_path, 5)[1])
    assert Counter(_sample_ids(redis_server)) == Counter(_produced_ids(tmp_path))  # each once
