"""LoRA with the embedded engine: `make_inference` before or after `add_lora` serves the same
merged policy, and a push after a training step makes the served logprobs (probe and sampled
completion) match the trainer's LoRA model. `add_lora` refuses a (model, tokenizer) tuple."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from dist_worker_common import ALGORITHM
from training_fakes import ListSource, mixed_items

from ludic.distributed.verification import reference_logprobs
from ludic.inference import ChatRequest, SamplingConfig
from ludic.models import build_tiny_model, load_model, tiny_model_dir
from ludic.recipes.inference import Inference, make_inference
from ludic.training import Trainer, TrainerConfig, add_lora

pytest.importorskip("peft")

PROBE_IDS = list(range(5, 29))


def _add_lora(model: torch.nn.Module) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)  # the same adapters (A) whichever order builds them
        return add_lora(model, rank=4, alpha=8)


def _setup(order: str) -> tuple[torch.nn.Module, Inference]:
    model, tokenizer = build_tiny_model(seed=0)
    if order == "after":
        model = _add_lora(model)
        return model, make_inference(model, tokenizer)
    inference = make_inference(model, tokenizer)
    return _add_lora(model), inference


def _served_completion(inference: Inference) -> tuple[list[int], list[float]]:
    request = ChatRequest(
        messages=[{"role": "user", "content": "hello there"}],
        sampling=SamplingConfig(max_tokens=8, temperature=1.0, seed=3),
    )
    reply = asyncio.run(inference.client.complete(request))
    ids = list(reply.prompt_token_ids) + list(reply.completion_token_ids)
    return ids, list(reply.completion_logprobs or [])


@pytest.mark.parametrize("order", ["before", "after"])
def test_push_after_a_step_serves_the_merged_lora_policy(order: str) -> None:
    model, inference = _setup(order)
    served_before = inference.client.logprobs(PROBE_IDS)  # type: ignore[attr-defined]
    config = TrainerConfig(device="cpu", lr=2e-2, micro_batch_tokens=64, seed=0)
    source = ListSource([mixed_items(4, seed=1)])
    trainer = Trainer(model, ALGORITHM, source, config, publisher=inference.publisher)
    trainer.run(1, progress=False)

    served = inference.client.logprobs(PROBE_IDS)  # type: ignore[attr-defined]
    expected = reference_logprobs(trainer.model, PROBE_IDS)
    torch.testing.assert_close(torch.tensor(served), torch.tensor(expected), atol=1e-4, rtol=0)
    moved = (torch.tensor(served) - torch.tensor(served_before)).abs().max().item()
    assert moved > 1e-3, f"the push did not change the served policy ({moved})"

    ids, completion_logprobs = _served_completion(inference)
    n = len(completion_logprobs)
    assert n > 0
    trainer_side = reference_logprobs(trainer.model, ids)[-n:]
    torch.testing.assert_close(
        torch.tensor(completion_logprobs), torch.tensor(trainer_side), atol=1e-4, rtol=0
    )
    asyncio.run(inference.aclose())


def test_both_orders_serve_the_same_policy_after_a_step() -> None:
    served = []
    for order in ("before", "after"):
        model, inference = _setup(order)
        config = TrainerConfig(device="cpu", lr=2e-2, micro_batch_tokens=64, seed=0)
        source = ListSource([mixed_items(4, seed=1)])
        trainer = Trainer(model, ALGORITHM, source, config, publisher=inference.publisher)
        trainer.run(1, progress=False)
        served.append(torch.tensor(inference.client.logprobs(PROBE_IDS)))  # type: ignore[attr-defined]
        asyncio.run(inference.aclose())
    torch.testing.assert_close(served[0], served[1], atol=1e-5, rtol=0)


def test_add_lora_refuses_the_model_tokenizer_tuple(tmp_path: Path) -> None:
    directory = tiny_model_dir(cache_dir=tmp_path)
    with pytest.raises(TypeError, match=r"model, tokenizer = load_model\(DIR\)"):
        add_lora(load_model(directory))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        add_lora("my_model_dir")  # type: ignore[arg-type]
    model, _ = load_model(directory)  # the README's form
    lora = add_lora(model, rank=16, alpha=32)
    with pytest.raises(TypeError, match="already has LoRA adapters"):
        add_lora(lora)
