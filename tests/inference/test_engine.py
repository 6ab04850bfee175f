"""EmbeddedEngine on the tiny model: exact ids, logprobs, seeds, finish reasons, max_think,
weight updates, and real episodes."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from ludic.inference import ChatRequest, ChatResponse, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.embedded.token_sampling import processed_logprobs
from ludic.models import load_tiny_model

USER = [{"role": "user", "content": "Your move."}]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: OpenMP threads spin badly on a shared, oversubscribed CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=[True, False], ids=["lean", "transformers"])
def engine(request: pytest.FixtureRequest) -> Iterator[EmbeddedEngine]:
    """The engine over both forwards: the lean one and the transformers model's own."""
    model, tokenizer = load_tiny_model()
    config = EngineConfig(lean_forward=request.param)
    with EmbeddedEngine(model, tokenizer, config=config) as eng:
        assert (eng._batch._lean is not None) == request.param
        yield eng


def req(
    messages: list[dict[str, str]] | None = None,
    prompt_ids: list[int] | None = None,
    **sampling: object,
) -> ChatRequest:
    sampling.setdefault("max_tokens", 8)
    return ChatRequest(
        messages=messages or USER,
        sampling=SamplingConfig(**sampling),  # type: ignore[arg-type]
        prompt_token_ids=prompt_ids,
    )


def reference_logprobs(
    engine: EmbeddedEngine, prompt: tuple[int, ...], completion: tuple[int, ...]
) -> torch.Tensor:
    """Raw log-softmax of a fresh, unbatched forward pass at every completion position (T x V)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)


async def test_prompt_ids_are_the_chat_template_applied_once(engine: EmbeddedEngine) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    r = await engine.complete(
        ChatRequest(messages=USER, sampling=SamplingConfig(max_tokens=4, seed=0), tools=tools)
    )
    text = engine.tokenizer.apply_chat_template(
        USER, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert "# Tools" in text
    assert list(r.prompt_token_ids) == engine.tokenizer.encode(text, add_special_tokens=False)
    assert r.finish_reason == "length" and len(r.completion_token_ids) == 4
    assert r.text == engine.tokenizer.decode(list(r.completion_token_ids), skip_special_tokens=True)
    assert r.policy_version == engine.policy_version


async def test_token_in_uses_prompt_ids_verbatim(engine: EmbeddedEngine) -> None:
    ids = engine.tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    r = await engine.complete(
        req(messages=[{"role": "user", "content": "ignored"}], prompt_ids=ids, seed=1)
    )
    assert list(r.prompt_token_ids) == ids


async def test_logprobs_match_a_separate_forward_pass(engine: EmbeddedEngine) -> None:
    r = await engine.complete(req(max_tokens=12, seed=3))
    ref_TV = reference_logprobs(engine, r.prompt_token_ids, r.completion_token_ids)
    expected = ref_TV.gather(-1, torch.tensor(r.completion_token_ids)[:, None]).squeeze(-1)
    assert r.completion_logprobs is not None
    assert torch.allclose(torch.tensor(r.completion_logprobs), expected, atol=1e-4)
    with pytest.raises(ValueError, match="must lie in"):
        engine.logprobs([1, 10**7])
    probe = engine.logprobs(list(r.prompt_token_ids) + list(r.completion_token_ids))
    assert torch.allclose(torch.tensor(probe[len(r.prompt_token_ids) - 1 :]), expected, atol=1e-4)


async def test_processed_logprobs_are_of_the_sampled_distribution(engine: EmbeddedEngine) -> None:
    r = await engine.complete(req(max_tokens=10, seed=4, temperature=0.7, top_k=20, top_p=0.9))
    raw_TV = reference_logprobs(engine, r.prompt_token_ids, r.completion_token_ids)
    n = raw_TV.shape[0]
    processed_TV = processed_logprobs(
        raw_TV, torch.full((n,), 0.7), torch.full((n,), 20), torch.full((n,), 0.9)
    )
    ids = torch.tensor(r.completion_token_ids)[:, None]
    expected = processed_TV.gather(-1, ids).squeeze(-1)
    assert torch.isfinite(expected).all(), "a sampled token lies outside the top-k/top-p set"
    assert torch.allclose(torch.tensor(r.completion_logprobs), expected, atol=1e-4)
    assert not torch.allclose(expected, raw_TV.gather(-1, ids).squeeze(-1), atol=1e-3)


async def test_seed_reproducible_regardless_of_batch_composition(engine: EmbeddedEngine) -> None:
    target = req(max_tokens=16, seed=1234)
    alone = await engine.complete(target)
    others = [
        req([{"role": "user", "content": "Board: " + "X O " * k}], max_tokens=4 + 3 * k, seed=k)
        for k in range(6)
    ]
    results = await asyncio.gather(
        *(engine.complete(r) for r in [*others[:3], target, *others[3:]])
    )
    crowded = results[3]
    assert crowded.completion_token_ids == alone.completion_token_ids
    assert torch.allclose(
        torch.tensor(crowded.completion_logprobs),
        torch.tensor(alone.completion_logprobs),
        atol=1e-4,
    )
    different = await engine.complete(req(max_tokens=16, seed=1235))
    assert different.completion_token_ids != alone.completion_token_ids


async def arriving_together(engine: EmbeddedEngine, requests: list[ChatRequest]) -> list[Any]:
    """Complete `requests` admitted in one batch: the engine thread is held while they queue."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait()

    held = asyncio.get_running_loop().run_in_executor(None, engine._call_on_worker, hold)
    while not entered.is_set():
        await asyncio.sleep(0.01)
    tasks = [asyncio.ensure_future(engine.complete(r)) for r in requests]
    while len(engine._pending) < len(requests):
        await asyncio.sleep(0.01)
    gate.set()
    await held
    return await asyncio.gather(*tasks)


async def test_identical_prompts_are_prefilled_once_and_sampled_apart(
    engine: EmbeddedEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRPO group: one prompt, many seeds. Each row matches the same request run alone."""
    group = [req(max_tokens=12, seed=s) for s in range(6)]
    other = req([{"role": "user", "content": "Board: X O X"}], max_tokens=12, seed=7)
    alone = [await engine.complete(r) for r in [*group, other]]
    prefilled: list[int] = []
    forward_prompts = engine._batch._forward_prompts

    def counting(new: list[Any], prefixes: list[Any]) -> Any:
        prefilled.append(len(new))
        return forward_prompts(new, prefixes)

    monkeypatch.setattr(engine._batch, "_forward_prompts", counting)
    engine._batch.prefix_cache.clear()  # so every prompt is prefilled, not read from the cache
    together = await arriving_together(engine, [*group, other])
    assert sum(prefilled) == 2  # the group's prompt once, the other prompt once
    for a, b in zip(alone, together, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.completion_token_ids == b.completion_token_ids
        assert torch.allclose(
            torch.tensor(a.completion_logprobs), torch.tensor(b.completion_logprobs), atol=1e-4
        )
    assert len({tuple(r.completion_token_ids) for r in together[:6]}) > 1  # seeds differ


async def test_greedy_is_deterministic_and_argmax(engine: EmbeddedEngine) -> None:
    a, b = await asyncio.gather(
        engine.complete(req(temperature=0.0)), engine.complete(req(temperature=0.0, seed=9))
    )
    assert a.completion_token_ids == b.completion_token_ids
    ref_TV = reference_logprobs(engine, a.prompt_token_ids, a.completion_token_ids)
    assert ref_TV.argmax(-1).tolist() == list(a.completion_token_ids)


async def test_stop_string_cuts_text_and_keeps_ids(engine: EmbeddedEngine) -> None:
    greedy = await engine.complete(req(temperature=0.0, max_tokens=12))
    stop = engine.tokenizer.decode(list(greedy.completion_token_ids[4:6]))
    assert stop.strip(), "need a visible stop string"
    r = await engine.complete(req(temperature=0.0, max_tokens=12, stop=(stop,)))
    assert r.finish_reason == "stop" and r.extra["stop_reason"] == stop
    assert stop not in r.text and greedy.text.startswith(r.text)
    assert r.completion_token_ids == greedy.completion_token_ids[: len(r.completion_token_ids)]
    assert engine.tokenizer.decode(list(r.completion_token_ids)).find(stop) == len(r.text)


async def test_stop_token_ids_and_ignore_eos(engine: EmbeddedEngine) -> None:
    greedy = await engine.complete(req(temperature=0.0, max_tokens=6))
    third = greedy.completion_token_ids[2]
    r = await engine.complete(
        req(temperature=0.0, max_tokens=6, extras={"stop_token_ids": [third]})
    )
    first_hit = greedy.completion_token_ids.index(third)
    assert r.finish_reason == "stop" and r.extra["stop_reason"] == third
    assert r.completion_token_ids == greedy.completion_token_ids[: first_hit + 1]


async def test_eos_stops_with_eos_in_ids() -> None:
    """Make <|im_end|> the greedy first token; the completion is just that token."""
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        greedy = await eng.complete(req(temperature=0.0, max_tokens=3))
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        head = model.lm_head.weight.detach().clone()
        head[im_end] = 2 * head[greedy.completion_token_ids[0]]
        version = eng.update_weights({"lm_head.weight": head}, strict=False)
        r = await eng.complete(req(temperature=0.0, max_tokens=3))
        assert r.completion_token_ids == (im_end,)
        assert r.finish_reason == "stop" and r.text == "" and "stop_reason" not in r.extra
        assert r.policy_version == version == 1
        ignored = await eng.complete(
            req(temperature=0.0, max_tokens=3, extras={"ignore_eos": True})
        )
        assert ignored.finish_reason == "length" and len(ignored.completion_token_ids) == 3
        assert ignored.completion_token_ids[0] == im_end


async def test_max_think_closes_an_open_think_block(engine: EmbeddedEngine) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("<|im_start|>user\nThink.<|im_end|>\n<|im_start|>assistant\n<think>")
    close = tok.convert_tokens_to_ids("</think>")
    r = await engine.complete(req(prompt_ids=prompt, max_tokens=8, max_think=3, seed=5))
    assert r.completion_token_ids[3] == close and r.extra["forced_token_positions"] == [3]
    assert r.completion_logprobs[3] == 0.0
    free = await engine.complete(req(prompt_ids=prompt, max_tokens=8, seed=5))
    assert free.completion_token_ids[:3] == r.completion_token_ids[:3]
    closed = tok.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>a</think>")
    untouched = await engine.complete(req(prompt_ids=closed, max_tokens=6, max_think=2, seed=5))
    assert "forced_token_positions" not in untouched.extra


async def test_length_is_capped_by_the_context(engine: EmbeddedEngine) -> None:
    model, tokenizer = engine.model, engine.tokenizer
    with EmbeddedEngine(model, tokenizer, config=EngineConfig(max_model_len=40)) as small:
        ids = tokenizer.encode("<|im_start|>user\n" + "1 " * 15)
        r = await small.complete(req(prompt_ids=ids, max_tokens=40, seed=0))
        assert r.finish_reason == "length" and len(ids) + len(r.completion_token_ids) == 40
        with pytest.raises(ValueError, match="context is 40"):
            await small.complete(req(prompt_ids=[5] * 40))
        with pytest.raises(ValueError, match="max_tokens=41 exceeds the model's context of 40"):
            await small.complete(req(prompt_ids=ids, max_tokens=41))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": []}, "empty"),
        ({"prompt_ids": [10**7]}, "outside the vocabulary"),
        ({"extras": {"repetition_penalty": 1.1}}, "does not support sampling extras"),
        ({"max_think": 0}, "max_think"),
        ({"temperature": math.nan}, "temperature must be a finite number"),
        ({"top_k": 2**63}, "top_k must be in"),
        ({"seed": 2**64}, "seed must be in"),
        ({"max_tokens": 2049}, "max_tokens=2049 exceeds the model's context of 2048 tokens"),
        ({"max_think": 4096}, "max_think=4096 exceeds the model's context of 2048 tokens"),
        ({"prompt_ids": [1] * 5000}, "the prompt has 5000 tokens but the model's context is 2048"),
        ({"stop": tuple(str(i) for i in range(65))}, "stop holds 65 strings; at most 64"),
        ({"stop": ("x" * 513,)}, "stop strings must be at most 512 characters"),
        ({"extras": {"stop_token_ids": [1] * 1025}}, "stop_token_ids holds 1025 ids; at most 1024"),
        ({"extras": {"ignore_eos": "yes"}}, "ignore_eos must be true or false"),
        (
            {"extras": {"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}},
            r"chat_template_kwargs may not set \['chat_template'\]",
        ),
    ],
)
async def test_invalid_requests_raise_value_error(
    engine: EmbeddedEngine, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await engine.complete(req(**kwargs))  # type: ignore[arg-type]
    assert engine.status().running


async def test_a_sampling_config_changed_after_construction_is_checked_again(
    engine: EmbeddedEngine,
) -> None:
    """Admission runs the same range checks as `SamplingConfig` itself, on both paths."""
    sampling = SamplingConfig(max_tokens=4)
    object.__setattr__(sampling, "temperature", math.nan)  # what a frozen dataclass forbids
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        await engine.complete(ChatRequest(messages=USER, sampling=sampling))
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        engine.stream(ChatRequest(messages=USER, sampling=sampling))


async def test_the_logprob_probe_is_capped_at_the_context(engine: EmbeddedEngine) -> None:
    with pytest.raises(ValueError, match="at most 2048 token ids"):
        engine.logprobs([1] * 2049)
    assert len(engine.logprobs([1] * 2048)) == 2047


async def test_update_weights_changes_outputs_and_version() -> None:
    model, tokenizer = load_tiny_model()
    other, _ = load_tiny_model(seed=1)
    with EmbeddedEngine(model, tokenizer, policy_version=5) as eng:
        before = await eng.complete(req(temperature=0.0, max_tokens=8))
        probe = list(before.prompt_token_ids) + list(before.completion_token_ids)
        old_probe = eng.logprobs(probe)
        with pytest.raises(ValueError, match="shape"):
            eng.update_weights({"lm_head.weight": torch.zeros(3, 3)}, strict=False)
        with pytest.raises(ValueError, match="missing"):
            eng.update_weights({"lm_head.weight": other.lm_head.weight})
        assert eng.policy_version == 5 and eng.logprobs(probe) == old_probe
        assert eng.update_weights(other) == 6
        after = await eng.complete(req(temperature=0.0, max_tokens=8))
        assert after.policy_version == 6
        assert after.completion_token_ids != before.completion_token_ids
        assert eng.logprobs(probe) != old_probe
        assert eng.update_weights(other.state_dict(), version=42) == 42
        assert eng.status().policy_version == 42 and eng.status().running


async def test_update_weights_in_place_writes_into_the_served_parameters() -> None:
    model, tokenizer = load_tiny_model()
    other, _ = load_tiny_model(seed=1)
    with EmbeddedEngine(model, tokenizer, policy_version=3) as eng:
        before = await eng.complete(req(temperature=0.0, max_tokens=8))
        served = {name: p.data_ptr() for name, p in eng.model.named_parameters()}

        def fill(target: torch.nn.Module) -> None:
            assert not torch.is_grad_enabled()  # copy_ into leaf parameters must not record
            for name, p in target.named_parameters():
                p.copy_(other.get_parameter(name))

        assert eng.update_weights_in_place(fill) == 4
        assert {name: p.data_ptr() for name, p in eng.model.named_parameters()} == served
        assert all(torch.equal(p, other.get_parameter(n)) for n, p in eng.model.named_parameters())
        after = await eng.complete(req(temperature=0.0, max_tokens=8))
        assert after.policy_version == 4
        assert after.completion_token_ids != before.completion_token_ids
        assert eng.update_weights_in_place(lambda _: None, version=42) == 42


async def test_closed_engine_refuses_requests() -> None:
    model, tokenizer = load_tiny_model()
    eng = EmbeddedEngine(model, tokenizer)
    eng.close()
    assert not eng.status().running
    with pytest.raises(RuntimeError, match="closed"):
        await eng.complete(req())


async def test_stream_yields_the_tokens_and_response_of_complete(engine: EmbeddedEngine) -> None:
    request = req(max_tokens=120, seed=11, extras={"ignore_eos": True})
    full = await engine.complete(request)
    deltas = [d async for d in engine.stream(request)]
    assert deltas[0].response is None  # tokens arrive while the request still runs
    assert deltas[-1].response == full
    assert sum((d.token_ids for d in deltas), ()) == full.completion_token_ids
    assert sum((d.logprobs for d in deltas), ()) == full.completion_logprobs
    assert deltas[0].prompt_token_ids == full.prompt_token_ids
    assert not any(d.prompt_token_ids for d in deltas[1:])
    with pytest.raises(ValueError, match="outside the vocabulary"):  # at the call, not later
        engine.stream(req(prompt_ids=[10**6]))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll `condition` (a guard against hanging, not a speed check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


async def test_closing_a_stream_early_cancels_its_request() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        stream = eng.stream(req(max_tokens=2000, extras={"ignore_eos": True}))
        first = await anext(stream)
        assert first.response is None and first.token_ids
        (seq,) = eng._batch.rows
        await stream.aclose()
        await asyncio.to_thread(wait_until, lambda: eng.status().cancelled == 1, "cancelled")
        assert seq.cancelled and len(seq.completion_ids) < 2000
        never_read = eng.stream(req(max_tokens=2000, extras={"ignore_eos": True}))
        await never_read.aclose()  # cancelled although iteration never began
        await asyncio.to_thread(wait_until, lambda: eng.status().cancelled == 2, "cancelled")
        r = await eng.complete(req(max_tokens=4, extras={"ignore_eos": True}))
        assert r.finish_reason == "length"


def test_a_request_outliving_its_event_loop_does_not_stop_the_engine() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        loop = asyncio.new_event_loop()

        async def start() -> list[asyncio.Future[Any]]:
            tasks = [
                asyncio.ensure_future(
                    eng.complete(req(max_tokens=200, extras={"ignore_eos": True}))
                ),
                asyncio.ensure_future(
                    anext(eng.stream(req(max_tokens=2000, extras={"ignore_eos": True})))
                ),
            ]
            await asyncio.to_thread(wait_until, lambda: eng.status().active == 2, "admitted")
            return tasks

        loop.run_until_complete(start())
        loop.close()  # both requests still generating: their callbacks find the loop closed
        # The stream is cancelled at its next token (not run to 2000 tokens); the completion
        # finishes, and its answer to the closed loop does not kill the worker.
        wait_until(lambda: eng.status().active == 0 and eng.status().cancelled == 1, "dropped")
        assert eng.status().running

        async def again() -> str:
            return (await asyncio.wait_for(eng.complete(req(max_tokens=3)), 60)).text

        asyncio.run(again())


async def test_a_failed_step_answers_the_rows_that_finished_in_it() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        batch = eng._batch
        real_forward = batch._forward

        def forward(tokens_B: torch.Tensor) -> None:  # fails once the short request has left
            if len(batch.rows) == 1 and batch.rows[0].max_tokens == 50:
                raise RuntimeError("simulated device error")
            real_forward(tokens_B)

        batch._forward = forward  # type: ignore[method-assign]
        short, long = (req(max_tokens=n, extras={"ignore_eos": True}) for n in (3, 50))
        results = await asyncio.wait_for(
            asyncio.gather(eng.complete(short), eng.complete(long), return_exceptions=True), 60
        )
        done, failed = results
        assert isinstance(done, ChatResponse) and done.finish_reason == "length"
        assert isinstance(failed, RuntimeError) and "simulated device error" in str(failed)
        assert eng.status().running


async def test_a_stream_fails_when_the_engine_closes_under_it() -> None:
    model, tokenizer = load_tiny_model()
    eng = EmbeddedEngine(model, tokenizer)
    stream = eng.stream(req(max_tokens=2000, extras={"ignore_eos": True}))
    await anext(stream)
    eng.close()
    with pytest.raises(RuntimeError, match="closed before the request finished"):
        async for _ in stream:
            pass


async def test_next_turn_reuses_the_finished_turns_kv_with_exact_logprobs() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        first = await eng.complete(req(max_tokens=6, seed=1))
        follow_up = tokenizer.encode(
            "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
        )
        prompts = [list(first.prompt_token_ids) + list(first.completion_token_ids) + follow_up]
        prompts.append(
            list(first.prompt_token_ids) + follow_up
        )  # shares less: a miss or shorter hit
        results = await asyncio.gather(
            *(eng.complete(req(prompt_ids=p, max_tokens=6, seed=2)) for p in prompts)
        )
        assert eng.status().prefix_hits >= 1
        for r in results:
            ref_TV = reference_logprobs(eng, r.prompt_token_ids, r.completion_token_ids)
            expected = ref_TV.gather(-1, torch.tensor(r.completion_token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(r.completion_logprobs), expected, atol=1e-4)
        with EmbeddedEngine(model, tokenizer, config=EngineConfig(prefix_cache_tokens=0)) as cold:
            again = await cold.complete(req(prompt_ids=prompts[0], max_tokens=6, seed=2))
        assert again.completion_token_ids == results[0].completion_token_ids
        eng.update_weights(model.state_dict())  # clears the reusable KV: no hit afterwards
        hits = eng.status().prefix_hits
        await eng.complete(req(prompt_ids=prompts[0], max_tokens=2, seed=2))
        assert eng.status().prefix_hits == hits


async def test_eager_attention_models_batch_correctly_too() -> None:
    model, tokenizer = load_tiny_model()
    model.set_attn_implementation("eager")
    with EmbeddedEngine(model, tokenizer, config=EngineConfig(lean_forward=False)) as eng:
        prompts = [
            req([{"role": "user", "content": "X " * k}], max_tokens=6, seed=k) for k in (1, 9)
        ]
        for r in await asyncio.gather(*(eng.complete(p) for p in prompts)):
            ref_TV = reference_logprobs(eng, r.prompt_token_ids, r.completion_token_ids)
            expected = ref_TV.gather(-1, torch.tensor(r.completion_token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(r.completion_logprobs), expected, atol=1e-4)
