"""Shared by the weight-layout tests of two folders (`tests/distributed/test_fused_layout.py`,
`tests/training/test_trainer_contiguous.py`): a tiny Qwen2 (its q/k/v biases make the fused
groups with biases), the storages a model's parameters live in, and the embedded server app in
process behind a `TestClient` that a `BroadcastPolicyPublisher` pushes to. Helpers used by one
folder stay in that folder's `*_fakes.py`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from fastapi.testclient import TestClient
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app

BASE_URL = "http://testserver"


def tiny_qwen2(seed: int = 0, vocab: int = 300) -> Qwen2ForCausalLM:
    """A tiny Qwen2 (q/k/v biases), two layers, untied embeddings; global RNG untouched."""
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def storages(model: torch.nn.Module) -> set[int]:
    """The data pointers of the storages `model`'s parameters live in."""
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


@contextmanager
def served_in_process(
    model: torch.nn.Module, tokenizer: Any, *, token: str
) -> Iterator[tuple[EmbeddedEngine, TestClient, Any]]:
    """The embedded server app over `model` (served as "tiny" at `BASE_URL`): its engine, a
    client for a publisher's `http=`, and its weight receiver; all closed at the end."""
    engine = EmbeddedEngine(model, tokenizer)
    try:
        app = create_app(engine, model_name="tiny", token=token)
        with TestClient(app, base_url=BASE_URL) as client:
            yield engine, client, app.state.weight_receiver
    finally:
        engine.close()
