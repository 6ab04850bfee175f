"""`--model` (ludic train / sft, `load_policy`): a path that looks local and is not there is
refused at once with "no model directory at PATH", never tried on the model hub; a plain
"org/name" that is not a local path still goes to the hub (checked without network: the
download function is replaced)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers

from ludic.recipes.training import load_policy, local_path_reason


class HubCalled(Exception):
    pass


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and stop) every attempt to load `--model` through transformers' hub path."""
    calls: list[str] = []

    def from_pretrained(name: str, *args: object, **kwargs: object) -> None:
        calls.append(str(name))
        raise HubCalled(name)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return calls


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("runs/gigpoo", "runs/ is a local directory"),
        ("/nonexist", "it starts with '/'"),
        ("./model", "it starts with '.'"),
        ("~/models/qwen", "it starts with '~'"),
        ("runs/x/checkpoints/step_8", "a hub id has exactly one '/'"),
        ("gigpoo", "a hub id has exactly one '/'"),
        ("org/", "a hub id is 'org/name'"),
    ],
)
def test_local_looking_paths_are_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: list[str], model: str, reason: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert local_path_reason(model) == reason
    with pytest.raises(FileNotFoundError, match=re.escape(f"no model directory at {model} ")):
        load_policy(model)
    assert no_hub == []


def test_a_hub_id_goes_to_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert local_path_reason("Qwen/Qwen2.5-0.5B-Instruct") is None
    with pytest.raises(HubCalled):
        load_policy("Qwen/Qwen2.5-0.5B-Instruct")
    assert no_hub == ["Qwen/Qwen2.5-0.5B-Instruct"]


def test_an_existing_org_folder_makes_it_local(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen").mkdir()
    assert local_path_reason("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/ is a local directory"
    with pytest.raises(FileNotFoundError, match=r"no model directory at Qwen/Qwen2\.5"):
        load_policy("Qwen/Qwen2.5-0.5B-Instruct")
    assert no_hub == []


@pytest.mark.slow
@pytest.mark.parametrize("model", ["runs/gigpoo", "/nonexist"])
def test_ludic_train_with_a_mistyped_path_fails_at_once(tmp_path: Path, model: str) -> None:
    """The user's command: refused with the path named, before any hub attempt (offline mode
    keeps this test from reaching the network even if that broke)."""
    (tmp_path / "runs").mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", "--model", model, "--out-dir", "out"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    assert f"ludic train: error: no model directory at {model} " in result.stderr, result.stderr
    print(f"refused after {time.monotonic() - started:.1f} s")


def test_the_default_tiny_model_is_placed_on_the_asked_device() -> None:
    """`ludic train --device cuda` without `--model`: the tiny model (and so the embedded engine's
    copy of it, made before the Trainer moves the policy) is on the trainer's device, not left
    on the CPU (found on an H100: the engine sampled on the CPU while the trainer recomputed
    on the GPU, so `--batch-invariant` was 1.7e-5 off). "meta" stands in for a GPU here."""
    model, tokenizer = load_policy(None, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert tokenizer is not None
