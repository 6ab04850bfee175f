"""Every weights layout the loader reads, and loading into a model with tied weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from training_fakes import tiny_llama

from ludic.training import CorruptCheckpointError, load_weights, read_state_dict, save_weights


def _state() -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tiny_llama(seed=3).state_dict().items()}


def _halves(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    names = sorted(state)
    first = {k: state[k] for k in names[: len(names) // 2]}
    second = {k: state[k] for k in names[len(names) // 2 :]}
    return first, second


def _write_index(path: Path, index_name: str, shards: dict[str, dict]) -> None:
    weight_map = {k: shard for shard, tensors in shards.items() for k in tensors}
    (path / index_name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "pytorch_model.pt"])
def test_single_torch_file(tmp_path: Path, name: str) -> None:
    state = _state()
    torch.save(state, tmp_path / name)
    _assert_same(read_state_dict(tmp_path), state)


def test_sharded_torch_files(tmp_path: Path) -> None:
    state = _state()
    first, second = _halves(state)
    shards = {"pytorch_model-00001-of-00002.bin": first, "pytorch_model-00002-of-00002.bin": second}
    for shard, tensors in shards.items():
        torch.save(tensors, tmp_path / shard)
    _write_index(tmp_path, "pytorch_model.bin.index.json", shards)
    _assert_same(read_state_dict(tmp_path), state)


def test_single_safetensors(tmp_path: Path) -> None:
    state = _state()
    safetensors.torch.save_file(state, str(tmp_path / "model.safetensors"))
    _assert_same(read_state_dict(tmp_path), state)


def test_sharded_safetensors_from_save_pretrained(tmp_path: Path) -> None:
    model = tiny_llama(seed=3)
    save_weights(model, tmp_path, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    _assert_same(read_state_dict(tmp_path), _state())


def test_missing_shard_is_reported(tmp_path: Path) -> None:
    first, second = _halves(_state())
    shards = {"a.safetensors": first, "b.safetensors": second}
    safetensors.torch.save_file(first, str(tmp_path / "a.safetensors"))
    _write_index(tmp_path, "model.safetensors.index.json", shards)
    with pytest.raises(CorruptCheckpointError, match=r"b\.safetensors.*missing"):
        read_state_dict(tmp_path)


def test_damaged_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CorruptCheckpointError, match=r"model\.safetensors"):
        read_state_dict(tmp_path)


def test_no_weights_names_expected_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        read_state_dict(tmp_path)


def test_load_weights_allows_only_tied_keys_missing() -> None:
    source, target = tiny_llama(seed=3), tiny_llama(seed=4)
    load_weights(target, source.state_dict())
    _assert_same(target.state_dict(), source.state_dict())
    partial = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        load_weights(target, partial)
    with pytest.raises(ValueError, match="unexpected"):
        load_weights(target, {**source.state_dict(), "extra.weight": torch.zeros(1)})


def test_load_weights_with_tied_embeddings() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        tie_word_embeddings=True,
    )
    source, target = LlamaForCausalLM(config), LlamaForCausalLM(config)
    state = {k: v for k, v in source.state_dict().items() if k != "lm_head.weight"}
    load_weights(target, state)
    assert torch.equal(target.lm_head.weight, source.model.embed_tokens.weight)
