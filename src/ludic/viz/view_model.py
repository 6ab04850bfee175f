"""Rollouts (and optionally their training samples) -> the JSON the viewer page renders.

Each episode lists its turns; each turn its model calls (new messages, completion, tool calls
and results, parse outcome, finish reason), its env transition, and its training samples as
decoded tokens with the action mask. Without samples, the masks come from `build_samples`
(the same stitching training uses) and weights are unknown. No HTML here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ludic.eval.records import episode_record
from ludic.rollouts import SAWItem, build_samples
from ludic.types import JSON, AgentStep, EnvironmentStep, Message, Rollout, Turn
from ludic.viz.tokens import TokenDecoder

_SHOWN_META = (
    "request_id", "group_id", "env_name", "env_seed", "sampling_seed", "episode_truncated",
    "truncation_reason", "error", "error_type", "error_phase",
)  # fmt: skip


_SHOWN_STEP_INFO = ("parse_error", "synthetic", "truncation_reason")

_JS_SAFE_INT = 2**53 - 1
"""The largest integer a JavaScript number holds exactly; larger ones (the 64-bit episode seeds
`SeedSequencer` derives) go to the page as strings, or it would show and search a rounded one."""


def build_view(
    rollouts: Sequence[Rollout],
    samples: Sequence[SAWItem] | None,
    decode: TokenDecoder,
) -> list[JSON]:
    """One JSON object per rollout, in order (see the module docstring)."""
    derived = samples is None
    if samples is None:
        samples = _derived_samples(rollouts)
    by_turn: dict[tuple[str, str | None], list[SAWItem]] = defaultdict(list)
    for s in samples:
        by_turn[(str(s.meta.get("rollout_id")), s.meta.get("turn_id"))].append(s)
    return [_episode(r, i, by_turn, decode, derived) for i, r in enumerate(rollouts)]


def _derived_samples(rollouts: Sequence[Rollout]) -> list[SAWItem]:
    out: list[SAWItem] = []
    for rollout in rollouts:
        if rollout.failed:
            continue
        weights = {(rollout.id, t.turn_id): 0.0 for t in rollout.turns()}
        try:
            out += build_samples([rollout], weights)
        except ValueError:
            continue  # no token traces (a backend without ids): messages only
    return out


def _episode(
    rollout: Rollout,
    index: int,
    by_turn: Mapping[tuple[str, str | None], list[SAWItem]],
    decode: TokenDecoder,
    derived: bool,
) -> JSON:
    record = episode_record(rollout)
    turns = rollout.turns()
    calls = [s for t in turns for s in t.agent_steps]
    system = next(
        (
            m.get("content")
            for s in calls[:1]
            for m in s.prompt_messages
            if m.get("role") == "system"
        ),
        None,
    )
    prev: dict[str, Any] = {"prompt": None}
    episode_samples = by_turn.get((rollout.id, None), [])
    return {
        "index": index,
        "id": rollout.id,
        "agent": rollout.agent_id,
        "group": record.group_id,
        "request": record.request_id,
        "env": record.env_name,
        "seed": _exact_int(record.env_seed),
        "reward": _num(record.total_reward),
        "outcome": record.outcome,
        "failed": record.failed,
        "error": record.error,
        "error_type": rollout.meta.get("error_type"),
        "error_phase": rollout.meta.get("error_phase"),
        "truncated": record.truncated,
        "truncation_reason": record.truncation_reason,
        "terminated": record.terminated,
        "num_turns": record.num_turns,
        "parse_errors": record.num_parse_errors,
        "completion_tokens": record.completion_tokens,
        "system": system,
        "meta": _jsonable({k: v for k, v in rollout.meta.items() if k not in _SHOWN_META}),
        "derived_samples": derived,
        "turns": [
            _turn(t, i, by_turn.get((rollout.id, t.turn_id), []), decode, prev)
            for i, t in enumerate(turns)
        ],
        "samples": [_sample(s, decode) for s in episode_samples],
    }


def _turn(
    turn: Turn, index: int, samples: Sequence[SAWItem], decode: TokenDecoder, prev: dict[str, Any]
) -> JSON:
    return {
        "index": index,
        "id": turn.turn_id,
        "reward": _num(turn.reward),
        "calls": [_call(s, prev) for s in turn.agent_steps],
        "env": None if turn.env_step is None else _env(turn.env_step),
        "observed": [_env(s) for s in turn.observed_steps],
        "samples": [
            _sample(s, decode)
            for s in sorted(samples, key=lambda s: s.meta.get("segment_index", 0))
        ],
    }


def _call(step: AgentStep, prev: dict[str, Any]) -> JSON:
    prompt = list(step.prompt_messages)
    new_messages, rewritten = _new_messages(prompt, prev["prompt"])
    shown_results = prev.get("tool_result_ids", set())
    # Tool results are shown under the call that made them; do not repeat them as messages.
    new_messages = [
        m
        for m in new_messages
        if not (m.get("role") == "tool" and m.get("tool_call_id") in shown_results)
    ]
    prev["prompt"] = [*prompt, {"role": "assistant", "content": step.completion}]
    prev["tool_result_ids"] = {r.tool_call_id for r in step.tool_results}
    pr = step.parse_result
    trace = step.trace
    return {
        "index": step.index,
        "loop": step.loop_index,
        "target": step.action_target,
        "finish": step.finish_reason,
        "version": step.policy_version,
        "messages": [_message(m) for m in new_messages],
        "rewritten": rewritten,
        "completion": step.completion,
        "tool_calls": [t.to_dict() for t in step.tool_calls],
        "tool_results": [t.to_dict() for t in step.tool_results],
        "parse": None if pr is None else _jsonable({**pr.to_dict(), "ok": pr.ok}),
        "incomplete": bool(step.info.get("incomplete_completion", False)),
        "reward": _num(step.reward),
        "prompt_tokens": None if trace is None else len(trace.prompt_token_ids),
        "completion_tokens": None if trace is None else len(trace.completion_token_ids),
    }


def _new_messages(
    prompt: list[Message], previous: list[Message] | None
) -> tuple[list[Message], bool]:
    """Messages this call adds to the context, and whether the earlier context was rewritten
    (then every message is shown)."""
    if previous is None:
        return prompt, False
    n = 0
    while n < min(len(prompt), len(previous)) and _same(prompt[n], previous[n]):
        n += 1
    if n < len(previous) - 1 or n == 0:  # the old context (bar our own reply) did not survive
        return prompt, True
    return prompt[n:], False


def _same(a: Message, b: Message) -> bool:
    return a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "")


def _message(m: Message) -> JSON:
    out: JSON = {"role": str(m.get("role", "?")), "content": _text(m.get("content"))}
    for key in ("name", "tool_call_id"):
        if m.get(key):
            out[key] = str(m[key])
    if m.get("tool_calls"):
        out["tool_calls"] = _jsonable(m["tool_calls"])
    return out


def _env(step: EnvironmentStep) -> JSON:
    info = {k: v for k, v in step.info.items() if k not in _SHOWN_STEP_INFO}
    return {
        "action": step.action,
        "prev_obs": step.prev_obs,
        "obs": step.next_obs,
        "reward": _num(step.reward),
        "terminated": step.terminated,
        "truncated": step.truncated,
        "reason": step.truncation_reason,
        "parse_error": bool(step.info.get("parse_error", False)),
        "info": _jsonable(info),
    }


def _sample(sample: SAWItem, decode: TokenDecoder) -> JSON:
    meta = sample.meta
    lp = sample.behavior_logprobs
    return {
        "segment": meta.get("segment_index", 0),
        "segments": meta.get("num_segments", 1),
        "snapshot": bool(meta.get("is_snapshot", False)),
        "weight": _num(sample.weight),
        "reward": _num(meta.get("reward")),
        "source": meta.get("weight_source"),
        "finish": meta.get("finish_reason"),
        "truncated": bool(meta.get("truncated", False)),
        "reason": meta.get("truncation_reason"),
        "turn_ids": meta.get("turn_ids"),
        "ids": list(sample.input_ids),
        "t": decode(sample.input_ids),
        "m": "".join("1" if m else "0" for m in sample.action_mask),
        "lp": None if lp is None else _action_logprobs(lp, sample.action_mask),
    }


def _action_logprobs(logprobs: Sequence[float], mask: Sequence[int]) -> list[float]:
    return [round(x, 3) if m else 0.0 for x, m in zip(logprobs, mask, strict=True)]


def _num(value: object) -> float | None:
    """A JSON-safe number: NaN and infinities (invalid JSON) become None."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _exact_int(value: Any) -> Any:
    """`value`, or its decimal string when it is an int JavaScript would round."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _JS_SAFE_INT:
        return str(value)
    return value


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in value)
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return _exact_int(value)
    if value is None or isinstance(value, str):
        return value
    return str(value)
