"""Checkpoints: round trip, HF loadability, retention, atomicity, corrupt and partial ones."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from training_fakes import params_snapshot, tiny_llama
from transformers import AutoModelForCausalLM

from ludic.training import CheckpointConfig, CheckpointManager, CorruptCheckpointError, restore_into


def _manager(tmp_path: Path, **kw: object) -> CheckpointManager:
    return CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), **kw))  # type: ignore[arg-type]


def _trained_optimizer(
    model: torch.nn.Module,
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    return opt, sched


def test_round_trip(tmp_path: Path) -> None:
    model = tiny_llama(seed=1)
    opt, sched = _trained_optimizer(model)
    manager = _manager(tmp_path)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    path = manager.save(
        step=5,
        model=model,
        optimizer=opt,
        scheduler=sched,
        policy_version=9,
        data_state={"epoch": 2},
    )
    expected_draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    assert path.name == "step_00000005" and (path / "MANIFEST.json").is_file()

    loaded = manager.load()
    assert loaded.step == 5 and loaded.policy_version == 9 and loaded.data_state == {"epoch": 2}
    fresh = tiny_llama(seed=2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda s: 1.0 / (s + 1))
    restore_into(loaded, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in fresh.state_dict().items())
    assert fresh_sched.last_epoch == 1 and fresh_opt.param_groups[0]["lr"] == pytest.approx(5e-4)
    moments = fresh_opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(moments, opt.state_dict()["state"][0]["exp_avg"])
    # RNG restored to the state at save time: the same draws follow.
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_draws


def test_model_dir_loads_with_from_pretrained(tmp_path: Path) -> None:
    model = tiny_llama(seed=1)
    path = _manager(tmp_path, max_shard_size="60KB").save(step=1, model=model)
    assert (path / "model" / "model.safetensors.index.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(path / "model")
    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits
        )


def test_retention_keeps_last_n(tmp_path: Path) -> None:
    manager = _manager(tmp_path, keep_last=2)
    model = tiny_llama()
    for step in (1, 2, 3, 4):
        manager.save(step=step, model=model)
    assert [p.name for p in manager.list()] == ["step_00000003", "step_00000004"]
    assert not list(manager.root.glob(".tmp-*"))


def test_retention_never_deletes_the_checkpoint_just_saved(tmp_path: Path) -> None:
    manager = _manager(tmp_path, keep_last=2)
    model = tiny_llama()
    for step in (7, 8):  # another run's newer steps in the same directory
        manager.save(step=step, model=model)
    saved = manager.save(step=3, model=model, policy_version=3)
    assert saved.is_dir() and manager.load(saved).policy_version == 3
    assert [p.name for p in manager.list()] == ["step_00000003", "step_00000007", "step_00000008"]
    manager.save(step=4, model=model)  # the older one it saved before goes
    assert [p.name for p in manager.list()] == ["step_00000004", "step_00000007", "step_00000008"]


def test_resave_same_step_replaces(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    manager.save(step=1, model=tiny_llama(seed=1), policy_version=1)
    manager.save(step=1, model=tiny_llama(seed=2), policy_version=2)
    assert manager.load().policy_version == 2 and len(manager.list()) == 1


def test_crash_mid_save_keeps_last_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = _manager(tmp_path)
    model = tiny_llama(seed=1)
    good = manager.save(step=1, model=model, policy_version=1)
    before = params_snapshot(model)

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        manager.save(
            step=2, model=tiny_llama(seed=2), optimizer=torch.optim.SGD(model.parameters(), lr=1.0)
        )
    monkeypatch.undo()
    assert manager.list() == [good] and manager.latest() == good
    assert not list(manager.root.glob(".tmp-*"))
    loaded = manager.load()
    assert loaded.step == 1 and all(
        torch.equal(loaded.model_state[k], v) for k, v in before.items()
    )


def test_partial_checkpoint_refused_and_latest_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path)
    good = manager.save(step=1, model=tiny_llama())
    partial = manager.save(step=2, model=tiny_llama())
    (partial / "MANIFEST.json").unlink()  # as if copied or written without the atomic rename
    with pytest.raises(CorruptCheckpointError, match=r"no MANIFEST\.json.*partial"):
        manager.load(partial)
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == good
    assert "step_00000002" in caplog.text and "partial" in caplog.text


def test_corrupt_file_refused_and_latest_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = _manager(tmp_path)
    good = manager.save(step=1, model=tiny_llama())
    bad = manager.save(step=2, model=tiny_llama())
    weights = bad / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF  # same size, different contents
    weights.write_bytes(bytes(data))
    with pytest.raises(
        CorruptCheckpointError, match=r"model/model\.safetensors does not match its sha256"
    ):
        manager.load(bad)
    with caplog.at_level(logging.WARNING):
        assert manager.latest() == good
    assert "sha256" in caplog.text


def test_truncated_file_detected_by_size(tmp_path: Path) -> None:
    manager = _manager(tmp_path, verify="size")
    path = manager.save(step=1, model=tiny_llama(), optimizer=_trained_optimizer(tiny_llama())[0])
    opt_file = path / "optimizer.pt"
    opt_file.write_bytes(opt_file.read_bytes()[:-5])
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.pt has .* bytes"):
        manager.verify(path)
    assert manager.latest() is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        manager.load()


def test_manifest_lists_sizes_and_hashes(tmp_path: Path) -> None:
    path = _manager(tmp_path).save(step=3, model=tiny_llama())
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["step"] == 3
    entry = manifest["files"]["model/model.safetensors"]
    assert entry["size"] == (path / "model" / "model.safetensors").stat().st_size
    assert len(entry["sha256"]) == 64


def test_due_every_n_steps(tmp_path: Path) -> None:
    manager = _manager(tmp_path, every_n_steps=3)
    assert [s for s in range(10) if manager.due(s)] == [3, 6, 9]
    assert not _manager(tmp_path).due(3)


def test_an_unknown_verify_mode_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"sha256, size.*got 'sha265'"):
        CheckpointConfig(dir="ckpt", verify="sha265")  # type: ignore[arg-type]
    assert CheckpointConfig(dir="ckpt", verify="size").verify == "size"
