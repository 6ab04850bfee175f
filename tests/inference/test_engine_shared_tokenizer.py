"""The engine's admission threads (and its worker, decoding) share one Hugging Face tokenizer.
That is safe only while they read it: a fast tokenizer's Rust backend releases the GIL while it
encodes, and changing its truncation or padding then (what `tokenizer.encode` does whenever
those settings differ from the call's) fails one of the threads with "Already borrowed" on
tokenizers < 0.23, which pyproject allows (huggingface/tokenizers#537; 0.23.3 did not fail in
a quick try). A
tokenizer.json may ship with truncation or padding set; the engine's constructor clears them
by encoding once, before any admission thread exists, so requests only read."""

from __future__ import annotations

import asyncio
from typing import Any

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import load_tiny_model

MUTATORS = ("enable_truncation", "no_truncation", "enable_padding", "no_padding")


class _ReadOnlyBackend:
    """A backend tokenizer that records every call or assignment that would change it."""

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "changes", [])

    def __getattr__(self, name: str) -> Any:
        if name in MUTATORS:
            self.changes.append(name)
        return getattr(self.backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self.changes.append(f"{name} = {value!r}")
        setattr(self.backend, name, value)


async def test_requests_only_read_the_shared_tokenizer() -> None:
    model, tokenizer = load_tiny_model()
    tokenizer.backend_tokenizer.enable_truncation(max_length=8)  # as a tokenizer.json may ship
    tokenizer.backend_tokenizer.enable_padding(length=16)
    sampling = SamplingConfig(max_tokens=4, seed=1)
    requests = [
        ChatRequest(messages=[{"role": "user", "content": f"move {k} " * 20}], sampling=sampling)
        for k in range(8)
    ]
    requests.append(ChatRequest(messages=[], prompt_token_ids=[5, 6, 7], sampling=sampling))
    with EmbeddedEngine(model, tokenizer) as engine:
        assert tokenizer.backend_tokenizer.truncation is None
        assert tokenizer.backend_tokenizer.padding is None
        backend = _ReadOnlyBackend(tokenizer._tokenizer)
        tokenizer._tokenizer = backend
        replies = await asyncio.gather(*(engine.complete(r) for r in requests))
    assert backend.changes == []
    assert all(len(r.completion_token_ids) == 4 for r in replies)
    assert len(replies[0].prompt_token_ids) > 8  # not truncated to the shipped max_length
