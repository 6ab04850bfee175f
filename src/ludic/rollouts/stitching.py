"""Stitching token traces of consecutive model calls into training sequences.

The first call's prompt ids start a sequence; each completion is appended as action tokens
(mask 1, behaviour logprobs aligned); each later call appends only the prompt suffix that extends
the sequence (mask 0: tool results, observations, template glue). When a later prompt does not
extend the sequence, the sequence is closed and a new one starts from that prompt, and the
close says why:

- "edit": the context strategy rewrote history between the two calls (the step's recorded
  history version changed, see `ludic.context.ContextStrategy.mark_rewrite`): a snapshot.
- "drift": the history was append-only but its tokens were not (the chat template re-rendered
  the previous completion differently, e.g. a tool call written without the template's
  newlines, or a non-canonical tokenization). Each side is still exact; it is not a snapshot.

This module knows tokens and that cause only: no rewards, weights or sample meta.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ludic._log_once import warn_once
from ludic.context.base import CONTEXT_VERSION_KEY
from ludic.types import AgentStep, TokenTrace

logger = logging.getLogger(__name__)

SegmentEnd = Literal["edit", "drift", "end"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenSegment:
    """One append-only sequence and the agent steps whose tokens it holds (in order).

    `behavior_logprobs` is aligned with `input_ids` (0.0 on prompt tokens), or None when any of
    the steps' traces has no logprobs. `end` is why the sequence was closed: "edit" (the next
    call's prompt was rewritten by the context strategy), "drift" (template drift) or "end"
    (the last call).
    """

    input_ids: tuple[int, ...]
    action_mask: tuple[int, ...]
    behavior_logprobs: tuple[float, ...] | None
    agent_steps: tuple[AgentStep, ...]
    end: SegmentEnd = "end"

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)


class _OpenSegment:
    __slots__ = ("ids", "logprobs", "mask", "steps")

    def __init__(self, prompt_ids: Sequence[int]) -> None:
        self.ids: list[int] = list(prompt_ids)
        self.mask: list[int] = [0] * len(self.ids)
        self.logprobs: list[float] | None = [0.0] * len(self.ids)
        self.steps: list[AgentStep] = []

    def extends(self, prompt_ids: tuple[int, ...]) -> bool:
        n = len(self.ids)
        # Compare as tuples: a tuple never equals a list.
        return len(prompt_ids) >= n and prompt_ids[:n] == tuple(self.ids)

    def append_prompt_suffix(self, prompt_ids: tuple[int, ...]) -> None:
        suffix = prompt_ids[len(self.ids) :]
        self.ids.extend(suffix)
        self.mask.extend([0] * len(suffix))
        if self.logprobs is not None:
            self.logprobs.extend([0.0] * len(suffix))

    def append_completion(self, step: AgentStep, trace: TokenTrace) -> None:
        completion = trace.completion_token_ids
        self.ids.extend(completion)
        self.mask.extend([1] * len(completion))
        if trace.completion_logprobs is None:
            self.logprobs = None
        elif self.logprobs is not None:
            self.logprobs.extend(trace.completion_logprobs)
        self.steps.append(step)

    def close(self, end: SegmentEnd) -> TokenSegment:
        return TokenSegment(
            input_ids=tuple(self.ids),
            action_mask=tuple(self.mask),
            behavior_logprobs=None if self.logprobs is None else tuple(self.logprobs),
            agent_steps=tuple(self.steps),
            end=end,
        )


def stitch_traces(steps: Sequence[AgentStep], traces: Sequence[TokenTrace]) -> list[TokenSegment]:
    """Stitch `traces` (one per step, in call order) into append-only segments.

    Returns one segment when every prompt extends the sequence so far, and one more per
    prompt that does not (each closed with "edit" or "drift", see `history_rewritten`). A
    segment may hold no action tokens (its calls sampled nothing); callers decide whether to
    keep it.
    """
    if len(steps) != len(traces):
        raise ValueError(f"stitch_traces: {len(steps)} steps but {len(traces)} traces")
    if len(steps) == 1:
        return [_single_call_segment(steps[0], traces[0])]
    segments: list[TokenSegment] = []
    current: _OpenSegment | None = None
    for step, trace in zip(steps, traces, strict=True):
        prompt = trace.prompt_token_ids
        if current is None:
            current = _OpenSegment(prompt)
        elif current.extends(prompt):
            current.append_prompt_suffix(prompt)
        else:
            edited = history_rewritten(current.steps[-1], step)
            if not edited:
                _warn_if_unmarked_rewrite(current.steps[-1], step)
            segments.append(current.close("edit" if edited else "drift"))
            current = _OpenSegment(prompt)
        current.append_completion(step, trace)
    if current is not None:
        segments.append(current.close("end"))
    return segments


def history_rewritten(previous: AgentStep, step: AgentStep) -> bool:
    """Whether the context was rewritten between two consecutive calls of one agent.

    Steps from Ludic's agents carry the history version of their prompt
    (`info["context_version"]`, which a strategy bumps with `mark_rewrite()`): rewritten iff
    it changed. A step without it (recorded by code that calls the model itself) is judged
    by its prompt messages: rewritten iff they do not start with the previous call's prompt
    messages. With neither there is no evidence of an edit.
    """
    before, after = previous.info.get(CONTEXT_VERSION_KEY), step.info.get(CONTEXT_VERSION_KEY)
    if before is not None and after is not None:
        return bool(before != after)
    return _messages_rewritten(previous, step)


def _messages_rewritten(previous: AgentStep, step: AgentStep) -> bool:
    """Whether `step`'s prompt messages do not start with `previous`'s (False when either
    call recorded none)."""
    old, new = previous.prompt_messages, step.prompt_messages
    if not old or not new:
        return False
    return tuple(new[: len(old)]) != tuple(old)


def _warn_if_unmarked_rewrite(previous: AgentStep, step: AgentStep) -> None:
    """Warn (once per agent id) when a cut counted as drift is an edit the context strategy
    did not mark: the history version stayed the same, yet the prompt messages no longer start
    with the previous call's. The cut stays a drift split (the version decides), so the
    strategy's author learns why it made no snapshot and `snapshot_policy` did not apply."""
    if CONTEXT_VERSION_KEY not in step.info or not _messages_rewritten(previous, step):
        return
    warn_once(
        logger,
        ("unmarked_rewrite", step.agent_id),
        "%s's prompt (AgentStep %s) no longer starts with its previous prompt's messages, yet "
        "its info[%r] did not change: the context strategy rewrote history without calling "
        "mark_rewrite(), so the cut counts as template drift (num_drift_splits), not a "
        "snapshot, and snapshot_policy does not apply to it. Call self.mark_rewrite() in the "
        "strategy where it drops or rewrites shown messages. Warned once per agent id.",
        step.agent_id,
        step.id,
        CONTEXT_VERSION_KEY,
    )


def _single_call_segment(step: AgentStep, trace: TokenTrace) -> TokenSegment:
    """The common one-call turn, without the incremental bookkeeping (hot path)."""
    n_prompt, n_completion = len(trace.prompt_token_ids), len(trace.completion_token_ids)
    lp = trace.completion_logprobs
    return TokenSegment(
        input_ids=trace.prompt_token_ids + trace.completion_token_ids,
        action_mask=(0,) * n_prompt + (1,) * n_completion,
        behavior_logprobs=None if lp is None else (0.0,) * n_prompt + lp,
        agent_steps=(step,),
    )
