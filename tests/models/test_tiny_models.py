"""Tiny local models: build, cache, save/load round trip with identical weights and ids."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from ludic.models import (
    TinyModelSpec,
    build_tiny_model,
    load_model,
    load_tokenizer,
    save_model,
    tiny_model_dir,
    train_tiny_tokenizer,
)

TEXTS = [
    "<|im_start|>user\nYour move.<|im_end|>\n<|im_start|>assistant\n<think>hm</think><move>5</move>",
    'Compute 17 * 23. <tool_call>\n{"name": "calculator", "arguments": {}}\n</tool_call>',
    "ünïcödé 日本語 \\boxed{72}\n\n\n  spaces",
]


def test_model_size_and_special_tokens() -> None:
    model, tok = build_tiny_model(seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n_params <= 5_000_000
    assert model.config.vocab_size == len(tok)
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.encode("<move>5</move>", add_special_tokens=False) == tok.encode(
        "<move>", add_special_tokens=False
    ) + tok.encode("5</move>", add_special_tokens=False)
    digits = tok.convert_ids_to_tokens(tok.encode("12345", add_special_tokens=False))
    assert digits == ["1", "2", "3", "4", "5"]
    think = tok.encode("<think>x</think>", add_special_tokens=False)
    assert think[0] == tok.convert_tokens_to_ids("<think>") and len(think) == 3


def test_tokenizer_training_is_deterministic_and_decodes_exactly() -> None:
    a, b = train_tiny_tokenizer(), train_tiny_tokenizer()
    assert a.get_vocab() == b.get_vocab()
    for text in TEXTS:
        assert a.decode(a.encode(text, add_special_tokens=False)) == text


def test_seeds_give_different_weights_and_global_rng_is_untouched() -> None:
    state = torch.random.get_rng_state()
    m0, _ = build_tiny_model(seed=0)
    m1, _ = build_tiny_model(seed=1)
    assert torch.equal(state, torch.random.get_rng_state())
    w0 = m0.model.embed_tokens.weight
    assert not torch.equal(w0, m1.model.embed_tokens.weight)
    assert torch.equal(w0, build_tiny_model(seed=0)[0].model.embed_tokens.weight)


def test_save_load_round_trip_identical(tmp_path: Path) -> None:
    model, tok = build_tiny_model(seed=3, spec=TinyModelSpec(num_hidden_layers=2))
    save_model(model, tok, tmp_path / "m")
    model2, tok2 = load_model(tmp_path / "m", dtype="float32")
    sd, sd2 = model.state_dict(), model2.state_dict()
    assert sd.keys() == sd2.keys()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd)
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == tok2.encode(
            text, add_special_tokens=False
        )
    messages = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(messages, tokenize=False) == tok2.apply_chat_template(
        messages, tokenize=False
    )
    assert list(model2.generation_config.eos_token_id) == list(model.generation_config.eos_token_id)


def test_cache_dir_builds_once(tmp_path: Path) -> None:
    spec = TinyModelSpec(num_hidden_layers=1)
    d1 = tiny_model_dir(seed=0, spec=spec, cache_dir=tmp_path)
    mtime = (d1 / "model.safetensors").stat().st_mtime_ns
    d2 = tiny_model_dir(seed=0, spec=spec, cache_dir=tmp_path)
    assert d1 == d2 and (d2 / "model.safetensors").stat().st_mtime_ns == mtime
    assert tiny_model_dir(seed=1, spec=spec, cache_dir=tmp_path) != d1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]


def test_load_tokenizer_guards_against_class_swap(tmp_path: Path) -> None:
    """A tokenizer_config naming a class whose ids differ from tokenizer.json is overridden."""
    src = tiny_model_dir(spec=TinyModelSpec(num_hidden_layers=1), cache_dir=tmp_path / "cache")
    shutil.copytree(src, tmp_path / "m")
    config_file = tmp_path / "m" / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    config.pop("backend", None)
    config_file.write_text(json.dumps(config))
    reference = load_tokenizer(src)
    swapped = load_tokenizer(tmp_path / "m")
    for text in TEXTS:
        assert swapped.encode(text, add_special_tokens=False) == reference.encode(
            text, add_special_tokens=False
        )


def test_load_model_rejects_non_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no model directory at Qwen/Qwen3-0\.6B"):
        load_model("Qwen/Qwen3-0.6B")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(
            tiny_model_dir(spec=TinyModelSpec(num_hidden_layers=1), cache_dir=tmp_path),
            dtype="fp99",
        )


def test_a_model_sized_to_a_task_tokenizer() -> None:
    corpus = "\n".join(f"1|2|{d}\nX to move <move>{d}</move>" for d in range(1, 10)) * 20
    task_tok = train_tiny_tokenizer(
        vocab_size=400, corpus=corpus, extra_tokens=("<move>", "</move>")
    )
    model, tok = build_tiny_model(seed=0, tokenizer=task_tok)
    assert tok is task_tok and model.config.vocab_size == len(task_tok) < 400
    assert tok.convert_ids_to_tokens(tok.encode("<move>7</move>")) == ["<move>", "7", "</move>"]
    assert tok.encode("<think>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<think>")]
    default_model, _ = build_tiny_model(seed=0)
    assert default_model.config.vocab_size > len(task_tok)  # other callers keep the general one


def test_a_tokenizer_without_chatml_specials_is_refused() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    raw.train_from_iterator(["plain text only"], trainer=trainers.BpeTrainer(vocab_size=300))
    with pytest.raises(ValueError, match=re.escape("has no '<|im_end|>' token")):
        build_tiny_model(tokenizer=PreTrainedTokenizerFast(tokenizer_object=raw))
