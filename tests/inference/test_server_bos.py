"""A text prompt to `/v1/completions` gets the tokenizer's special tokens (a Llama-style BOS),
as `tokenizer.encode(prompt)` and vLLM give; a chat template's rendered text does not (the
template holds its own). The tokenizer is the tiny one with a BOS post-processor, built here;
the over-context checks count the BOS, from the head of a long text too."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.embedded.prompts import HEAD_SLACK_TOKENS, encode_prompt_text
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

BOS = "<|endoftext|>"  # a special token the tiny model already has: its BOS here
MAX_MODEL_LEN = 64
PROMPT = "x = 3 + 4"


def with_bos(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """The same vocabulary and template, with a post-processor that puts BOS first."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    bos_id = tokenizer.convert_tokens_to_ids(BOS)
    backend.post_processor = TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        chat_template=tokenizer.chat_template,
        clean_up_tokenization_spaces=False,
    )


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tiny = load_tiny_model()
    tokenizer = with_bos(tiny)
    assert tokenizer.encode(PROMPT)[0] == tokenizer.bos_token_id  # the tokenizer adds BOS
    config = EngineConfig(max_model_len=MAX_MODEL_LEN)
    with (
        EmbeddedEngine(model, tokenizer, config=config) as engine,
        TestClient(create_app(engine, model_name="tiny")) as test_client,
    ):
        test_client.tokenizer = tokenizer  # type: ignore[attr-defined]
        yield test_client


def post(client: TestClient, path: str, **body: Any) -> Any:
    return client.post(path, json={"max_tokens": 2, "return_token_ids": True, **body})


def test_a_text_completion_prompt_starts_with_bos_as_encode_gives(client: TestClient) -> None:
    tokenizer = client.tokenizer  # type: ignore[attr-defined]
    reply = post(client, "/v1/completions", prompt=PROMPT)
    assert reply.status_code == 200, reply.text
    ids = reply.json()["choices"][0]["prompt_token_ids"]
    assert ids == tokenizer.encode(PROMPT) and ids[0] == tokenizer.bos_token_id
    assert ids[1:] == tokenizer.encode(PROMPT, add_special_tokens=False)


def test_a_chat_prompt_gets_no_bos_beyond_its_template(client: TestClient) -> None:
    tokenizer = client.tokenizer  # type: ignore[attr-defined]
    messages = [{"role": "user", "content": PROMPT}]
    reply = post(client, "/v1/chat/completions", messages=messages)
    assert reply.status_code == 200, reply.text
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = reply.json()["prompt_token_ids"]
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.bos_token_id not in ids


def _text_of(tokenizer: PreTrainedTokenizerFast, n_tokens: int) -> str:
    """A text of exactly `n_tokens` tokens without specials (" the", one token each)."""
    word = " the"
    assert len(tokenizer.encode(word * 10, add_special_tokens=False)) == 10
    return word * n_tokens


def test_the_exact_context_check_counts_the_bos(client: TestClient) -> None:
    tokenizer = client.tokenizer  # type: ignore[attr-defined]
    fits = post(client, "/v1/completions", prompt=_text_of(tokenizer, MAX_MODEL_LEN - 4))
    assert fits.status_code == 200, fits.text
    assert len(fits.json()["choices"][0]["prompt_token_ids"]) == MAX_MODEL_LEN - 3
    over = post(client, "/v1/completions", prompt=_text_of(tokenizer, MAX_MODEL_LEN - 1))
    assert over.status_code == 400, over.text  # 63 words + BOS fill the 64-token context
    assert f"the prompt has {MAX_MODEL_LEN} tokens" in over.json()["error"]["message"]


def test_the_head_check_counts_the_bos(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long text is refused from a head tokenized with the BOS, and the count it reports is
    that head's tokens (BOS included) less the slack a cut can add."""
    tokenizer = client.tokenizer  # type: ignore[attr-defined]
    text = _text_of(tokenizer, 100 * MAX_MODEL_LEN)
    encode, seen = tokenizer.encode, []

    def recording_encode(text: str, *args: Any, **kwargs: Any) -> Any:
        ids = encode(text, *args, **kwargs)
        seen.append((len(text), kwargs.get("add_special_tokens"), ids))
        return ids

    monkeypatch.setattr(tokenizer, "encode", recording_encode)
    with pytest.raises(ValueError, match=r"at least (\d+) tokens") as raised:
        encode_prompt_text(tokenizer, text, MAX_MODEL_LEN, add_special_tokens=True)
    assert seen and all(special is True for _, special, _ in seen)
    head_len, _, head_ids = seen[-1]
    assert head_len < len(text) and head_ids[0] == tokenizer.bos_token_id
    counted = re.search(r"at least (\d+) tokens", str(raised.value))
    assert counted is not None and int(counted.group(1)) == len(head_ids) - HEAD_SLACK_TOKENS
