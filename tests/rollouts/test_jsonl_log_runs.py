"""A rerun into the same `jsonl_log` starts a fresh file (the earlier run's kept under a dated
name, said in a warning) instead of mixing two runs; one engine's later batches append, and a
training run's stamped rollouts continue the file as a resume does."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from tests.rollouts.test_rollout_engine import Harness, req

from ludic.rollouts import read_rollouts_jsonl
from ludic.rollouts.rollout_log import set_aside_earlier_log


def env_seeds(path: Path) -> list[int]:
    return [r.meta["env_seed"] for r in read_rollouts_jsonl(path)]


async def test_a_rerun_writes_a_fresh_file_and_keeps_the_earlier_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "rollouts.jsonl"
    first = Harness().engine(jsonl_log=log)
    await first.run([req(0), req(1)])
    await first.run([req(2)])  # the same engine, the same run: appended
    assert env_seeds(log) == [0, 1, 2]
    os.utime(log, (1_700_000_000, 1_700_000_000))  # when the earlier run last wrote

    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.engine"):
        await Harness().engine(jsonl_log=log).run([req(7)])  # the block run again
    assert env_seeds(log) == [7]
    (kept,) = tmp_path.glob("rollouts.*.jsonl")
    assert env_seeds(kept) == [0, 1, 2]
    assert kept.name == f"rollouts.{_local_stamp(1_700_000_000)}.jsonl"
    assert f"kept as {kept}; this run writes a fresh rollouts.jsonl" in caplog.text


async def test_a_training_runs_stamped_rollouts_continue_the_file(tmp_path: Path) -> None:
    log = tmp_path / "rollouts.jsonl"
    stamped = [req(i) for i in range(3)]
    for i, request in enumerate(stamped):
        request.meta["batch_index"] = i
    await Harness().engine(jsonl_log=log).run(stamped)
    await Harness().engine(jsonl_log=log).run([stamped[2]])  # resumed at batch 2: replayed
    assert env_seeds(log) == [0, 1, 2]
    assert list(tmp_path.iterdir()) == [log]


def test_an_empty_or_missing_log_is_not_kept(tmp_path: Path) -> None:
    log = tmp_path / "rollouts.jsonl"
    assert set_aside_earlier_log(log) is None
    log.write_text("")
    assert set_aside_earlier_log(log) is None and log.exists()


def test_a_taken_dated_name_gets_a_number(tmp_path: Path) -> None:
    log = tmp_path / "rollouts.jsonl"
    names = []
    for text in ("a\n", "b\n"):
        log.write_text(text)
        os.utime(log, (1_700_000_000, 1_700_000_000))
        kept = set_aside_earlier_log(log)
        assert kept is not None and kept.read_text() == text
        names.append(kept.name)
    stamp = _local_stamp(1_700_000_000)
    assert names == [f"rollouts.{stamp}.jsonl", f"rollouts.{stamp}-2.jsonl"]


def _local_stamp(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds).strftime("%Y%m%d-%H%M%S")
