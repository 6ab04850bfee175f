"""Evaluation records: one `EpisodeRecord` per rollout and one `StepRecord` per turn, as JSONL.

Records are flat, JSON-ready summaries for analysis and reducers; the full trajectories stay in
the rollouts (write those with `ludic.rollouts.write_rollouts_jsonl` to view them). This module
does not aggregate anything (see `reducers.py`) and does not run episodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ludic.types import JSON, AgentStep, Rollout, Turn

# Decides whether an episode solved its task (pass@k counts these).
SuccessFn = Callable[[Rollout], bool]
# Info / meta keys an env may use to name an episode's outcome ("win", "draw", "correct", ...).
OUTCOME_KEYS: tuple[str, ...] = ("outcome", "result")


# Info keys an env may set (a bool, on the step that ends the episode) to say whether it was
# solved, whatever the rewards added up to (parse penalties, step costs).
SUCCESS_KEYS: tuple[str, ...] = ("success", "correct")


def reward_success(rollout: Rollout) -> bool:
    """The default success rule: the episode did not fail, and the env's own verdict where it
    gives one (`env_success`), else a positive total reward."""
    if rollout.failed:
        return False
    verdict = env_success(rollout)
    return verdict if verdict is not None else rollout.total_reward > 0


def env_success(rollout: Rollout) -> bool | None:
    """Whether the env says the episode solved its task: a bool under "success" (else
    "correct") in the last env step's info; None when it says nothing (a puzzle solved after
    penalties is a success, though its total reward may be <= 0)."""
    env_steps = rollout.env_steps
    if not env_steps:
        return None
    for key in SUCCESS_KEYS:
        verdict = env_steps[-1].info.get(key)
        if isinstance(verdict, bool):
            return verdict
    return None


def episode_outcome(rollout: Rollout, *, success: bool) -> str:
    """A short label for how an episode ended.

    In order: "error" for a failed episode; the env's own label (the last env step's `info`,
    then the rollout `meta`: a string under "outcome" or "result", or a boolean "correct" as
    "correct" / "incorrect"); "truncated" when the episode was cut off; else "success" or
    "failure" by `success`.
    """
    if rollout.failed:
        return "error"
    env_steps = rollout.env_steps
    sources: list[Mapping[str, Any]] = [rollout.meta]
    if env_steps:
        sources.insert(0, env_steps[-1].info)
    for source in sources:
        for key in OUTCOME_KEYS:
            label = source.get(key)
            if isinstance(label, str) and label:
                return label
        correct = source.get("correct")
        if isinstance(correct, bool):
            return "correct" if correct else "incorrect"
    if rollout.meta.get("episode_truncated"):
        return "truncated"
    return "success" if success else "failure"


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeRecord:
    """What happened in one episode (one rollout), flat enough for a table or a dataframe.

    `group_id` names the problem (episodes of one group share an env seed: pass@k groups them).
    `meta` is the rollout's meta (request meta, env seed, error details, ...), so reducers can
    read `meta.<key>` paths.
    """

    rollout_id: str
    agent_id: str
    request_id: str | None = None
    group_id: str | None = None
    env_name: str | None = None
    env_seed: int | None = None
    total_reward: float = 0.0
    success: bool = False
    outcome: str = "failure"
    failed: bool = False
    error: str | None = None
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    num_turns: int = 0
    num_agent_steps: int = 0
    num_env_steps: int = 0
    num_parse_errors: int = 0
    num_incomplete: int = 0
    num_tool_calls: int = 0
    completion_tokens: int = 0
    meta: JSON = field(default_factory=dict)

    @property
    def group_key(self) -> tuple[str, str]:
        """(problem, agent): the episodes pass@k compares. Ungrouped episodes stand alone."""
        problem = self.group_id or self.request_id or self.rollout_id
        return problem, self.agent_id

    def to_dict(self) -> JSON:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord:
    """One turn of one episode: the model calls it took and the env transition it led to.

    `action` is None and `parse_error` True when the parser rejected the reply (the env was not
    stepped). Turns that ended without an env step (an episode cut off mid-turn) have
    `reward` equal to the parser rewards only.
    """

    rollout_id: str
    agent_id: str
    group_id: str | None
    turn_index: int
    turn_id: str
    action: str | None = None
    reward: float = 0.0
    parse_error: bool = False
    incomplete_completion: bool = False
    terminated: bool = False
    truncated: bool = False
    truncation_reason: str | None = None
    finish_reason: str | None = None
    num_model_calls: int = 0
    num_tool_calls: int = 0
    completion_tokens: int = 0
    info: JSON = field(default_factory=dict)

    def to_dict(self) -> JSON:
        return asdict(self)


def episode_record(rollout: Rollout, success_fn: SuccessFn = reward_success) -> EpisodeRecord:
    """Summarise one rollout (failed rollouts included: they count as unsuccessful)."""
    success = bool(success_fn(rollout)) and not rollout.failed
    agent_steps = rollout.agent_steps
    env_steps = rollout.env_steps
    last = env_steps[-1] if env_steps else None
    meta = rollout.meta
    return EpisodeRecord(
        rollout_id=rollout.id,
        agent_id=rollout.agent_id,
        request_id=_opt_str(meta.get("request_id")),
        group_id=rollout.group_id,
        env_name=_opt_str(meta.get("env_name")),
        env_seed=meta.get("env_seed"),
        total_reward=rollout.total_reward,
        success=success,
        outcome=episode_outcome(rollout, success=success),
        failed=rollout.failed,
        error=_opt_str(meta.get("error")),
        terminated=bool(last is not None and last.terminated),
        truncated=bool(meta.get("episode_truncated", False)),
        truncation_reason=_opt_str(meta.get("truncation_reason")),
        num_turns=sum(1 for t in rollout.turns() if t.agent_steps),
        num_agent_steps=len(agent_steps),
        num_env_steps=len(env_steps),
        num_parse_errors=sum(1 for s in env_steps if s.info.get("parse_error")),
        num_incomplete=sum(1 for s in agent_steps if s.info.get("incomplete_completion")),
        num_tool_calls=sum(len(s.tool_calls) for s in agent_steps),
        completion_tokens=sum(_completion_tokens(s) for s in agent_steps),
        meta=dict(meta),
    )


def step_records(rollout: Rollout) -> list[StepRecord]:
    """One record per turn in which the agent acted, in order."""
    turns = [t for t in rollout.turns() if t.agent_steps]
    return [_step_record(rollout, i, t) for i, t in enumerate(turns)]


def _step_record(rollout: Rollout, index: int, turn: Turn) -> StepRecord:
    calls = turn.agent_steps
    env = turn.env_step
    final = calls[-1]
    parse_error = bool(env is not None and env.info.get("parse_error")) or (
        final.parse_result is not None and not final.parse_result.ok
    )
    return StepRecord(
        rollout_id=rollout.id,
        agent_id=rollout.agent_id,
        group_id=rollout.group_id,
        turn_index=index,
        turn_id=turn.turn_id,
        action=None if env is None else env.action,
        reward=turn.reward,
        parse_error=parse_error,
        incomplete_completion=any(s.info.get("incomplete_completion") for s in calls),
        terminated=bool(env is not None and env.terminated),
        truncated=bool(env is not None and env.truncated),
        truncation_reason=None if env is None else env.truncation_reason,
        finish_reason=final.finish_reason,
        num_model_calls=len(calls),
        num_tool_calls=sum(len(s.tool_calls) for s in calls),
        completion_tokens=sum(_completion_tokens(s) for s in calls),
        info={} if env is None else dict(env.info),
    )


def _completion_tokens(step: AgentStep) -> int:
    if step.trace is not None:
        return len(step.trace.completion_token_ids)
    return int(step.info.get("completion_tokens", 0) or 0)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def write_records_jsonl(records: Iterable[EpisodeRecord | StepRecord], path: str | Path) -> int:
    """Write records as JSON Lines (overwriting `path`); returns how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_dict(), ensure_ascii=False, default=str) + "\n")
            n += 1
    return n


def read_episode_records(path: str | Path) -> list[EpisodeRecord]:
    """The episode records of a file written by `write_records_jsonl`."""
    out: list[EpisodeRecord] = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(EpisodeRecord(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(
                    f"{path}:{lineno}: not an episode record ({e}); expected a file of "
                    "EpisodeRecord.to_dict() lines such as episodes.jsonl from `ludic eval`"
                ) from e
    return out
