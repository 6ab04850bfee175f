"""A LoRA checkpoint records its base model (`base_model_name_or_path`) as an absolute path when
the run named it by a relative one (`--model ./base`), so loading it from another directory
finds that base, not a missing or another folder of the same name there. A recorded path that
is not found is refused naming it and the fix. A bit flip in the adapter is refused too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ludic.models import load_model, save_model, tiny_model_dir
from ludic.training import CheckpointConfig, CheckpointManager, add_lora

pytest.importorskip("peft")

IDS = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


@pytest.fixture(scope="module")
def lora_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.Tensor]:
    """(base folder, checkpoint step folder, the LoRA model's logits) of a run started as
    `--model base` from inside `run/`."""
    run = tmp_path_factory.mktemp("run")
    base = run / "base"
    shutil.copytree(tiny_model_dir(), base)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(run)
        model, tokenizer = load_model("base", dtype="float32")  # relative, as --model base
        model = add_lora(model, rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
        torch.manual_seed(0)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.05)
        manager = CheckpointManager(CheckpointConfig(dir="ckpt"))
        step = manager.save(step=1, model=model, tokenizer=tokenizer)
    return base, run / step, _logits(model)


def test_the_base_is_recorded_absolute(lora_step: tuple[Path, Path, torch.Tensor]) -> None:
    base, step, _ = lora_step
    config = json.loads((step / "model" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base.resolve())


def test_loading_from_another_directory_finds_the_runs_base(
    lora_step: tuple[Path, Path, torch.Tensor],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base, step, expected = lora_step
    # Another folder named `base` where the checkpoint is loaded from: not the run's base.
    decoy, tokenizer = load_model(base, dtype="float32")
    with torch.no_grad():
        for param in decoy.parameters():
            param.mul_(0.5)
    save_model(decoy, tokenizer, tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    model, _ = load_model(step, dtype="float32")
    torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=0)


def test_a_relative_base_not_found_is_named_with_the_fix(
    lora_step: tuple[Path, Path, torch.Tensor],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As checkpoints saved before the base was made absolute: `models/base`, relative to the
    run's directory. Refused from elsewhere; the fix the message gives (a link there) loads."""
    base, step, expected = lora_step
    adapter = tmp_path / "adapter"
    shutil.copytree(step / "model", adapter)
    config_file = adapter / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = "models/base"
    config_file.write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        load_model(adapter)
    message = str(e.value)
    assert "'models/base'" in message and str(adapter) in message, message
    assert f"relative path, looked up from the current directory {tmp_path}" in message, message
    assert f"at {tmp_path / 'models' / 'base'} (a symlink will do)" in message, message
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "base").symlink_to(base)
    model, _ = load_model(adapter, dtype="float32")
    torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=0)


def test_a_bit_flip_in_the_adapter_is_refused(
    lora_step: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    _, step, _ = lora_step
    copy = tmp_path / "step_00000001"
    shutil.copytree(step, copy)
    weights = copy / "model" / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"damaged: model/adapter_model\.safetensors .* sha256"):
        load_model(copy)
