"""`PolicyClient`: a scripted ChatClient whose token traces are exactly a real model's.

It replies with a Python policy's text (an expert, a heuristic, a replayed dataset) but renders
the prompt with the model's own chat template and tokenises the reply with the model's own
tokenizer, ending it with the end-of-turn token, as `EmbeddedEngine` does. Its rollouts can
therefore be trained on directly (SFT, offline RL) with no retokenization. It has no logprobs
(`completion_logprobs` is None) and does not model a distribution: it is data, not a policy.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.types import Message

# A policy gets the prompt messages and a random generator seeded from the request's seed.
ReplyPolicy = Callable[[Sequence[Message], random.Random], str]


class PolicyClient:
    """Replies with `policy(messages, rng)`, tokenised with `tokenizer` (an HF tokenizer).

    `rng` is seeded from `request.sampling.seed` (the agent derives one per call from the
    episode's sampling seed), so runs are reproducible. `eos_token` ends every completion
    (default: the tokenizer's eos token, `<|im_end|>` for ChatML models).
    """

    def __init__(
        self,
        policy: ReplyPolicy,
        tokenizer: Any,
        *,
        eos_token: str | None = None,
        policy_version: int = 0,
    ) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        eos = eos_token if eos_token is not None else tokenizer.eos_token
        eos_id = tokenizer.convert_tokens_to_ids(eos) if eos is not None else None
        if not isinstance(eos_id, int):
            raise ValueError(
                "PolicyClient needs an end-of-turn token: the tokenizer has no eos_token; pass "
                "eos_token='<|im_end|>' (or your template's end-of-turn token)"
            )
        self.eos_id = eos_id
        self.policy_version = policy_version
        self.calls = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        from ludic.inference.embedded.prompts import render_prompt_ids

        if request.prompt_token_ids is not None:
            prompt_ids = [int(t) for t in request.prompt_token_ids]
        else:
            prompt_ids = render_prompt_ids(self.tokenizer, request.messages, request.tools)
        rng = random.Random(request.sampling.seed)
        text = self.policy(request.messages, rng)
        self.calls += 1
        completion_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return ChatResponse(
            text=text,
            prompt_token_ids=tuple(prompt_ids),
            completion_token_ids=(*completion_ids, self.eos_id),
            completion_logprobs=None,
            finish_reason="stop",
            policy_version=self.policy_version,
        )
