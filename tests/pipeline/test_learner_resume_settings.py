"""A learner resumed with other run-defining flags is refused, naming each changed flag with
both values and the two ways on; flags that may change on resume (steps, intervals, Redis URL,
lease ttl, ...) resume. Unit tests of the comparison, then real `python -m ludic.pipeline
learner` processes against a real redis-server, as the README runs them."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server, spawn
from test_pipeline_processes import SPEC, _actor, _learner, _produced_ids, _sample_ids, _wait

from ludic.models import tiny_model_dir
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.learner_settings import (
    LEARNER_SETTINGS_KEY,
    changed_settings,
    check_learner_resume,
    learner_settings,
    resume_refusal,
)
from ludic.training.checkpoint import STATE
from ludic.training.checkpoint_manifest import MANIFEST

__all__ = ["redis_server"]
BASE = LearnerConfig(out_dir=Path("run"))


def _changed(**given: object) -> list[str]:
    return changed_settings(
        learner_settings(BASE), learner_settings(dataclasses.replace(BASE, **given))
    )


def test_run_defining_flags_are_each_named() -> None:
    assert _changed(algorithm="cispo", lr=1e-3, max_lag=2) == ["--algorithm", "--lr", "--max-lag"]
    assert _changed(max_lag=None) == ["--max-lag"]
    assert _changed(model="other_model", stale="downweight") == ["--model", "--stale"]
    assert _changed(stream="s2", group="g2", consumer="c2") == ["--stream", "--group", "--consumer"]


def test_flags_that_may_change_on_resume_are_not_compared() -> None:
    assert not _changed(
        steps=500,
        batch_size=8,
        micro_batch_tokens=None,
        checkpoint_every=10,
        publish_every=3,
        max_wait_s=30.0,
        redis_url="redis://elsewhere:6379/0",
        lease_ttl_s=60.0,
        server_url=("http://a:8000",),
        device="cuda",
        ledger=True,
        out_dir=Path("run"),
    )


def test_a_model_path_compares_by_the_directory_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    saved = learner_settings(dataclasses.replace(BASE, model="m"))
    assert not changed_settings(
        saved, learner_settings(dataclasses.replace(BASE, model=str(tmp_path / "m")))
    )
    assert changed_settings(saved, learner_settings(BASE)) == ["--model"]


def test_preset_and_stale_knobs_are_compared_only_where_they_act() -> None:
    # --max-tokens is dr_grpo's loss normaliser, unused by the other presets
    assert not _changed(max_tokens=64)
    dr = dataclasses.replace(BASE, algorithm="dr_grpo", max_tokens=128)
    assert changed_settings(
        learner_settings(dr), learner_settings(dataclasses.replace(dr, max_tokens=64))
    )
    # --stale-decay acts only when stale samples are downweighted
    assert not _changed(stale_decay=0.9)
    down = dataclasses.replace(BASE, stale="downweight")
    assert changed_settings(
        learner_settings(down), learner_settings(dataclasses.replace(down, stale_decay=0.9))
    ) == ["--stale-decay"]


def test_the_refusal_names_both_values_and_both_fixes() -> None:
    saved = learner_settings(BASE)
    given = learner_settings(dataclasses.replace(BASE, algorithm="cispo", max_lag=None))
    text = resume_refusal(Path("run/checkpoints/step_00000004"), saved, given)
    assert text is not None
    assert (
        "--algorithm is cispo, the checkpoint's grpo; --max-lag is None, the checkpoint's 4" in text
    )
    assert "Pass the checkpoint's flags (--algorithm grpo --max-lag 4) to continue it" in text
    assert "or another --out-dir to start a new run" in text
    assert "--model run/checkpoints/step_00000004/model" in text
    assert resume_refusal(Path("x"), saved, saved) is None


def _fake_checkpoint(out_dir: Path, extra: dict[str, object]) -> Path:
    """A complete checkpoint directory as far as the settings check reads it."""
    path = out_dir / "checkpoints" / "step_00000002"
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    (path / STATE).write_text(json.dumps({"step": 2, "extra": extra}))
    return path


def test_another_commands_checkpoint_is_refused_and_an_unrecorded_one_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = dataclasses.replace(BASE, out_dir=tmp_path / "a")
    _fake_checkpoint(cfg.out_dir, {"run_settings": {"--env": "tictactoe"}})
    with pytest.raises(ValueError, match=r"is a `ludic train` checkpoint.*another --out-dir"):
        check_learner_resume(cfg)
    cfg = dataclasses.replace(BASE, out_dir=tmp_path / "b")
    _fake_checkpoint(cfg.out_dir, {})
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.learner_settings"):
        check_learner_resume(cfg)
    assert "does not record its run's settings" in caplog.text
    # nothing resumes: no check at all
    check_learner_resume(dataclasses.replace(cfg, resume=False, algorithm="cispo"))


def test_a_recorded_checkpoint_refuses_a_changed_flag(tmp_path: Path) -> None:
    cfg = dataclasses.replace(BASE, out_dir=tmp_path)
    path = _fake_checkpoint(tmp_path, {LEARNER_SETTINGS_KEY: learner_settings(cfg)})
    check_learner_resume(dataclasses.replace(cfg, steps=7, lease_ttl_s=3.0))
    with pytest.raises(
        ValueError, match=rf"resuming {re.escape(str(path))}.*--lr is 0\.001, the checkpoint's"
    ):
        check_learner_resume(dataclasses.replace(cfg, lr=1e-3))


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_resumed_learner_process_refuses_changed_flags_and_takes_allowed_ones(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=3, extra=model), tmp_path / "actor.log")
    _wait(actor, tmp_path / "actor.log")  # 12 samples: 3 steps of 4
    flags = ["--max-lag", "None", "--checkpoint-every", "2", "--max-wait-s", "30"]
    first = spawn(
        _learner(redis_server, tmp_path, extra=[*flags, "--steps", "2"]), tmp_path / "l1.log"
    )
    _wait(first, tmp_path / "l1.log")
    # other preset, learning rate and staleness: refused in one error naming each
    changed = ["--algorithm", "cispo", "--lr", "0.5", "--max-lag", "2", "--checkpoint-every", "2"]
    second = spawn(
        _learner(redis_server, tmp_path, extra=[*changed, "--steps", "3"]), tmp_path / "l2.log"
    )
    assert second.wait(timeout=120) == 1
    log = (tmp_path / "l2.log").read_text()
    assert "ludic learner: error: resuming " in log
    for part in (
        "--algorithm is cispo, the checkpoint's grpo",
        "--lr is 0.5, the checkpoint's 0.01",
        "--max-lag is 2, the checkpoint's None",
        "Pass the checkpoint's flags (--algorithm grpo --lr 0.01 --max-lag None)",
        "another --out-dir",
    ):
        assert part in log, log[-3000:]
    assert "learner step" not in log  # refused before it trained
    # more steps, other intervals, lease ttl and wait: the same run goes on
    allowed = ["--max-lag", "None", "--checkpoint-every", "1", "--publish-every", "2"]
    allowed += ["--lease-ttl-s", "5", "--max-wait-s", "20", "--steps", "3"]
    third = spawn(_learner(redis_server, tmp_path, extra=allowed), tmp_path / "l3.log")
    _wait(third, tmp_path / "l3.log")
    log = (tmp_path / "l3.log").read_text()
    assert "resumed from step 2" in log and "learner done at step 3" in log
    assert Counter(_sample_ids(redis_server)) == Counter(_produced_ids(tmp_path))  # each once


def test_a_seed_change_is_named_but_not_refused() -> None:
    """The resumed learner restores the checkpoint's RNG state: --seed has no effect there."""
    assert _changed(seed=7) == ["--seed"]
    given = learner_settings(dataclasses.replace(BASE, seed=7))
    assert resume_refusal(Path("run"), learner_settings(BASE), given) is None


def test_a_moved_model_folder_with_the_same_config_is_the_same_model(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"hidden_size": 4}')
    (tmp_path / "c" / "config.json").write_text('{"hidden_size": 8}')
    saved = learner_settings(dataclasses.replace(BASE, model=str(tmp_path / "a")))
    moved = learner_settings(dataclasses.replace(BASE, model=str(tmp_path / "b")))
    other = learner_settings(dataclasses.replace(BASE, model=str(tmp_path / "c")))
    assert changed_settings(saved, moved) == []
    assert changed_settings(saved, other) == ["--model"]
