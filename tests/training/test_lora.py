"""LoRA through peft: merging equals peft's `merge_and_unload`, the Trainer publishes merged
full weights, adapter checkpoints resume exactly (one process, and across 1 <-> 2 FSDP ranks)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from dist_worker_common import ALGORITHM, batches_for, lora_model, torchrun, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.distributed import Weights
from ludic.training import Trainer, is_lora_model, merge_lora_weights, read_checkpoint
from ludic.training.lora import adapter_keys_to_model, lora_scalings

peft = pytest.importorskip("peft")

IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])


class Recorder:
    def __init__(self) -> None:
        self.published: list[tuple[int, Weights]] = []

    def publish(self, weights: Weights, *, version: int) -> None:
        self.published.append((version, weights))


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _trainer(checkpoint_dir: Path, *, seed: int = 0, every: int = 2, **kw: Any) -> Trainer:
    source = ListSource(batches_for(0, 1))
    config = trainer_config(checkpoint_dir, every_n_steps=every)
    return Trainer(lora_model(seed=seed), ALGORITHM, source, config, **kw)


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def test_merge_equals_peft_merge_and_unload() -> None:
    model = lora_model(seed=3)
    assert is_lora_model(model) and not is_lora_model(tiny_llama())
    scalings = lora_scalings(model)
    assert len(scalings) == 4 and set(scalings.values()) == {2.0}  # alpha 8 / rank 4, q+v x 2
    merged = merge_lora_weights(model.state_dict(), scalings)
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-7, rtol=0, msg=name)
    # Merging did not touch the live adapters (the model still computes W0 x + s B A x).
    plain = tiny_llama()
    plain.load_state_dict(merged)
    torch.testing.assert_close(_logits(plain), _logits(model), atol=1e-5, rtol=0)


def test_adapter_keys_map_to_live_names() -> None:
    stored = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(1)}
    assert list(adapter_keys_to_model(stored)) == [
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    ]
    live = adapter_keys_to_model(stored)
    assert adapter_keys_to_model(live).keys() == live.keys()


def test_trainer_trains_only_adapters_and_publishes_merged_weights(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, publisher=recorder)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.run(1, progress=False)
    after = trainer.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    version, weights = recorder.published[0]
    assert version == 1 and isinstance(weights, dict)
    plain = tiny_llama()
    plain.load_state_dict(weights)  # strict: exactly the base model's names
    torch.testing.assert_close(_logits(plain), _logits(trainer.model), atol=1e-5, rtol=0)


def test_adapter_checkpoint_resume_equals_uninterrupted(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "a")
    full_losses = [m["loss"] for m in full.run(3, progress=False)]
    first = _trainer(tmp_path / "b")
    first.run(2, progress=False)
    path = tmp_path / "b" / "step_00000002"
    assert (path / "model" / "adapter_model.safetensors").is_file()
    assert not (path / "model" / "model.safetensors").exists()  # adapters only

    resumed = _trainer(tmp_path / "b", seed=9)  # other adapters: everything must load
    assert resumed.resume() == 2
    assert [m["loss"] for m in resumed.run(1, progress=False)] == full_losses[2:]
    for name, tensor in _adapters(full.model).items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    # The adapter directory is a regular peft checkpoint.
    reloaded = peft.PeftModel.from_pretrained(tiny_llama(), str(path / "model"))
    torch.testing.assert_close(_logits(reloaded), _logits(first.model), atol=0, rtol=0)


@pytest.mark.distributed
def test_lora_on_two_fsdp_ranks_resumes_across_world_sizes(tmp_path: Path) -> None:
    single = _trainer(tmp_path / "single", publisher=(recorder := Recorder()))
    history = single.run(2, progress=False)
    step2 = _adapters(single.model)
    history += single.run(1, progress=False)
    torchrun(
        "dist_worker_lora.py", str(tmp_path / "dist"), str(tmp_path / "single" / "step_00000002")
    )
    dist = torch.load(tmp_path / "dist" / "results.pt", weights_only=False)

    # Same numerics as one process, and merged full weights published by rank 0.
    for ref, got in zip(history, dist["history"], strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert [v for v, _ in dist["published"]] == [v for v, _ in recorder.published] == [1, 2, 3]
    for (_, ref_weights), (_, got_weights) in zip(
        recorder.published, dist["published"], strict=True
    ):
        assert isinstance(ref_weights, dict) and got_weights.keys() == ref_weights.keys()
        for name, tensor in ref_weights.items():
            torch.testing.assert_close(got_weights[name], tensor, atol=2e-6, rtol=1e-5)

    # 1 -> 2: the single-process adapters, bit for bit, on the sharded model.
    assert dist["resumed_step"] == 2
    for name, tensor in step2.items():
        assert torch.equal(dist["loaded"][name], tensor), name
    # 2 -> 1: the 2-rank adapter checkpoint into one process, bit for bit.
    path = tmp_path / "dist" / "ckpt" / "step_00000002"
    assert read_checkpoint(path).rank_states is not None
    resumed = _trainer(tmp_path / "resumed", seed=9)
    assert resumed.resume(path) == 2
    saved = {k: v for k, v in dist["step2"].items() if "lora_" in k}
    assert saved.keys() == _adapters(resumed.model).keys()
    for name, tensor in _adapters(resumed.model).items():
        assert torch.equal(tensor, saved[name]), name
