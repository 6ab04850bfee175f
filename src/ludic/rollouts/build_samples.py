"""Rollouts -> SAWItems: stitched token sequences with a weight and the meta training needs.

Modes: "turn" (default; one sample per agent turn, seed 000's turn concatenation) and "episode"
(one sample per rollout, every turn concatenated, for single-sequence agents).

Where a sample is cut (see `ludic.rollouts.stitching`):

- At an edit (the context strategy rewrote history, seed 002's snapshot contract), the
  sequence so far is closed as a snapshot (`is_snapshot`) and a new segment starts from the
  rewritten prompt. A turn with k edits has k + 1 segments; the last one carries the outcome.
- At template drift (the history was append-only but the next prompt's ids do not extend the
  sequence), the sequence is split exactly at that call (`drift_split`, counted as
  `num_drift_splits`). A drift split is a packing artifact, not an edit: it never makes a
  snapshot, and each of its pieces gets exactly the weight and reward of the segment it
  belongs to, so every action token trains with the weight it would have had in one sequence.
  Pieces of one segment share `segment_index` and are told apart by `piece_index`.

`terminated` / `truncated` say what happened to each piece: a piece closed by an edit or drift
was not cut (both False) unless it also closes a turn, which it then speaks for; the episode's
last piece carries the episode's end. A piece with no action tokens (an empty completion) is
no sample, so its end passes to the last piece kept before it (in turn mode, of an earlier turn
when a whole turn completed nothing). `episode_truncated` and
`truncation_reason` name the episode's cut on every piece.

How segments are weighted is a `SnapshotPolicy`:

- "share" (default): every segment gets the credit weight w and the reward r of its turn
  (episode mode: of the episode). Each segment trains like a full sample, so a turn with k
  segments contributes k times the sequences of an unsplit one.
- "split": every segment gets w / k and reward r, so a turn's segments sum to one sample's
  weight and many rewrites never outweigh few.
- "own_reward": a snapshot segment uses its own precomputed reward, read from the
  `info["snapshot_reward"]` of the step that made the edit (e.g. a context-length penalty), as
  both its reward and its weight; the final segment carries w and r (the outcome). A snapshot
  whose edit step recorded no reward falls back to w and r (`weight_source` says so, with a
  one-time warning): a batch is never aborted for it.

Group ids and rollout ids carry to every segment, so group baselines (computed on rollouts by the
credit assigner, before this) see one member per rollout whatever the segment count. Failed
rollouts and pieces with no action tokens give no samples. No credit assignment happens here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

from ludic.rollouts.retokenize import Retokenizer
from ludic.rollouts.samples import SAWItem, TurnKey, behavior_sampling_meta
from ludic.rollouts.stitching import TokenSegment, stitch_traces
from ludic.types import JSON, AgentStep, Rollout, TokenTrace, Turn

SampleMode = Literal["turn", "episode"]
SnapshotPolicy = Literal["share", "split", "own_reward"]
SNAPSHOT_REWARD_KEY = "snapshot_reward"
_WEIGHT_TOLERANCE = 1e-9

logger = logging.getLogger(__name__)
_WARNED: set[str] = set()


def build_samples(
    rollouts: Sequence[Rollout],
    weights: Mapping[TurnKey, float],
    *,
    mode: SampleMode = "turn",
    snapshot_policy: SnapshotPolicy = "share",
    retokenizer: Retokenizer | None = None,
) -> list[SAWItem]:
    """Build training samples from rollouts and the credit assigner's per-turn weights.

    `weights` maps `(rollout.id, turn.turn_id)` to the turn's weight. With `retokenizer`
    (explicit opt-in), every step's tokens are rebuilt from its messages; without it, every
    agent step must carry a token trace.
    """
    if mode not in get_args(SampleMode):
        raise ValueError(f"sample mode must be one of {get_args(SampleMode)}, got {mode!r}")
    if snapshot_policy not in get_args(SnapshotPolicy):
        raise ValueError(
            f"snapshot_policy must be one of {get_args(SnapshotPolicy)}, got {snapshot_policy!r}"
        )
    samples: list[SAWItem] = []
    for rollout in rollouts:
        if rollout.failed:
            continue
        if mode == "turn":
            samples += _turn_samples(rollout, weights, snapshot_policy, retokenizer)
        else:
            samples += _episode_samples(rollout, weights, snapshot_policy, retokenizer)
    return samples


def _turn_samples(
    rollout: Rollout,
    weights: Mapping[TurnKey, float],
    policy: SnapshotPolicy,
    retokenizer: Retokenizer | None,
) -> list[SAWItem]:
    base = _rollout_meta(rollout, "turn")
    turns = [t for t in rollout.turns() if t.agent_steps]
    end_flags = _end_flags_of(rollout, turns)
    samples: list[SAWItem] = []
    for turn_index, turn in enumerate(turns):
        steps = turn.agent_steps
        meta = {
            **base,
            "turn_id": turn.turn_id,
            "turn_index": turn_index,
            "state_key": turn.state_key,
            **_failure_flags((turn,)),
        }
        segments = stitch_traces(steps, _traces(rollout, steps, retokenizer))
        kept = _segment_samples(
            segments,
            weight=_weight(weights, rollout, turn),
            reward=turn.reward,
            id_prefix=f"{rollout.id}:{turn.turn_id}",
            meta=meta,
            policy=policy,
            end_flags=end_flags,
        )
        if not kept and samples:
            # The turn completed nothing at all (no sample): its end goes to the last sample
            # before it, as an empty piece's does within a turn (`_kept_end_flags`).
            _pass_end(samples[-1].meta, end_flags(segments[-1]))
        samples += kept
    return samples


def _episode_samples(
    rollout: Rollout,
    weights: Mapping[TurnKey, float],
    policy: SnapshotPolicy,
    retokenizer: Retokenizer | None,
) -> list[SAWItem]:
    turns = [t for t in rollout.turns() if t.agent_steps]
    if not turns:
        return []
    turn_weights = [_weight(weights, rollout, t) for t in turns]
    if max(turn_weights) - min(turn_weights) > _WEIGHT_TOLERANCE * max(
        1.0, *map(abs, turn_weights)
    ):
        raise ValueError(
            f"episode sample mode needs one weight per rollout, but the credit assigner gave "
            f"rollout {rollout.id} per-turn weights {turn_weights}; use sample mode 'turn' with "
            "per-turn credit, or an episode-level credit assigner"
        )
    steps = tuple(s for t in turns for s in t.agent_steps)
    meta = {
        **_rollout_meta(rollout, "episode"),
        "turn_id": None,
        "turn_index": None,
        "num_turns": len(turns),
        "state_key": turns[0].state_key,
        **_failure_flags(turns),
    }
    segments = stitch_traces(steps, _traces(rollout, steps, retokenizer))
    return _segment_samples(
        segments,
        weight=turn_weights[-1],
        reward=rollout.total_reward,
        id_prefix=f"{rollout.id}:episode",
        meta=meta,
        policy=policy,
        end_flags=_end_flags_of(rollout, turns),
        record_turn_ids=True,
    )


def _segment_samples(
    pieces: list[TokenSegment],
    *,
    weight: float,
    reward: float,
    id_prefix: str,
    meta: JSON,
    policy: SnapshotPolicy,
    end_flags: Callable[[TokenSegment], JSON],
    record_turn_ids: bool = False,
) -> list[SAWItem]:
    segments = _group_by_edit(pieces)
    piece_flags = _kept_end_flags(pieces, end_flags)
    n = len(segments)
    samples: list[SAWItem] = []
    parent_id: str | None = None
    for k, (kept, edit_step) in enumerate(segments):
        w, r, source = _segment_credit(weight, reward, policy, n, edit_step)
        for j, seg in enumerate(kept):
            sample_id = f"{id_prefix}:{k}" if j == 0 else f"{id_prefix}:{k}.{j}"
            seg_meta: dict[str, Any] = {
                **meta,
                **piece_flags[id(seg)],
                "sample_id": sample_id,
                "parent_sample_id": parent_id,
                "segment_index": k,
                "num_segments": n,
                "piece_index": j,
                "num_pieces": len(kept),
                "is_snapshot": seg.end == "edit",
                "drift_split": seg.end == "drift",
                "snapshot_policy": policy,
                "reward": r,
                "weight": w,
                "credit_weight": weight,
                "weight_source": source,
                "finish_reason": seg.agent_steps[-1].finish_reason,
                "policy_versions": sorted(
                    {s.policy_version for s in seg.agent_steps if s.policy_version is not None}
                ),
                **behavior_sampling_meta([s.trace for s in seg.agent_steps], seg.num_action_tokens),
            }
            if record_turn_ids:
                seg_meta["turn_ids"] = list(dict.fromkeys(s.turn_id for s in seg.agent_steps))
            samples.append(
                SAWItem(
                    input_ids=seg.input_ids,
                    action_mask=seg.action_mask,
                    weight=w,
                    behavior_logprobs=seg.behavior_logprobs,
                    meta=seg_meta,
                )
            )
            parent_id = sample_id
    return samples


def _group_by_edit(
    pieces: list[TokenSegment],
) -> list[tuple[list[TokenSegment], AgentStep | None]]:
    """Stitched pieces grouped into edit-delimited segments: (the pieces with action tokens,
    the step that made the closing edit, None for the last segment). Drift splits stay inside
    their segment; segments with nothing to train on are dropped."""
    segments: list[tuple[list[TokenSegment], AgentStep | None]] = []
    current: list[TokenSegment] = []
    for piece in pieces:
        current.append(piece)
        if piece.end != "drift":
            kept = [p for p in current if p.num_action_tokens > 0]
            if kept:
                segments.append((kept, piece.agent_steps[-1] if piece.end == "edit" else None))
            current = []
    kept = [p for p in current if p.num_action_tokens > 0]
    if kept:  # only reachable when the last piece ended in drift, which stitching never does
        segments.append((kept, None))
    return segments


def _kept_end_flags(
    pieces: list[TokenSegment], end_flags: Callable[[TokenSegment], JSON]
) -> dict[int, JSON]:
    """end_flags of each piece with action tokens, by id. A piece without any (an empty final
    completion) is dropped from training, so its terminated / truncated go to the last kept
    piece before it: that turn's, else the episode's so far; otherwise no sample of a cut or
    ended episode would say so."""
    kept: dict[int, JSON] = {}
    last: JSON | None = None
    for piece in pieces:
        flags = end_flags(piece)
        if piece.num_action_tokens > 0:
            last = kept[id(piece)] = dict(flags)
        elif last is not None:
            _pass_end(last, flags)
    return kept


def _pass_end(kept: JSON, dropped: JSON) -> None:
    """A dropped piece's terminated / truncated, added to the flags of the kept one before it."""
    kept["terminated"] = bool(kept["terminated"] or dropped["terminated"])
    kept["truncated"] = bool(kept["truncated"] or dropped["truncated"])


def _segment_credit(
    weight: float, reward: float, policy: SnapshotPolicy, n: int, edit_step: AgentStep | None
) -> tuple[float, float, str]:
    """(weight, reward, weight_source) shared by every piece of one segment (module doc)."""
    if policy == "split" and n > 1:
        return weight / n, reward, f"credit/{n}"
    if policy == "own_reward" and edit_step is not None:
        own = _snapshot_reward(edit_step)
        if own is not None:
            return own, own, "snapshot_reward"
        return weight, reward, "credit (no snapshot_reward)"
    return weight, reward, "credit"


def _rollout_meta(rollout: Rollout, mode: SampleMode) -> JSON:
    return {
        "sample_mode": mode,
        "rollout_id": rollout.id,
        "agent_id": rollout.agent_id,
        "group_id": rollout.group_id,
        "request_id": rollout.meta.get("request_id"),
        "episode_return": rollout.total_reward,
        "episode_truncated": bool(rollout.meta.get("episode_truncated", False)),
    }


def _end_flags_of(rollout: Rollout, turns: Sequence[Turn]) -> Callable[[TokenSegment], JSON]:
    """terminated / truncated / truncation_reason of one piece (seed 000, "Training sees
    truncation"): those of the turn its last call closes, or neither when an edit or template
    drift closed it mid-turn (such a piece was not cut; the piece that ends the turn carries
    the turn's outcome, the episode's last piece the episode's end). `truncation_reason` names
    the episode's cut on every piece."""
    closing_turns = {id(t.agent_steps[-1]): t for t in turns}
    reason = rollout.meta.get("truncation_reason")

    def flags(piece: TokenSegment) -> JSON:
        closing = closing_turns.get(id(piece.agent_steps[-1]))
        if closing is None:
            return {"terminated": False, "truncated": False, "truncation_reason": reason}
        return _turn_end_flags(rollout, closing, is_last=closing is turns[-1])

    return flags


def _turn_end_flags(rollout: Rollout, closing: Turn, *, is_last: bool) -> JSON:
    outcomes = (
        [closing.env_step, *closing.observed_steps]
        if closing.env_step
        else list(closing.observed_steps)
    )
    last_info = closing.agent_steps[-1].info
    terminated = bool(last_info.get("terminated", False))
    truncated = bool(last_info.get("truncated", False))
    step_reason = None
    for outcome in outcomes:
        terminated = terminated or outcome.terminated
        if outcome.truncated:
            truncated = True
            step_reason = step_reason or outcome.truncation_reason
    # The protocol's max_steps cut ends the episode on its last turn, however it recorded it.
    truncated = truncated or (is_last and bool(rollout.meta.get("episode_truncated", False)))
    reason = rollout.meta.get("truncation_reason")
    if reason is None and truncated:
        reason = step_reason
    return {"terminated": terminated, "truncated": truncated, "truncation_reason": reason}


def _failure_flags(turns: Sequence[Turn]) -> JSON:
    """Whether any of the sample's turns had a parse error or an incomplete completion."""
    parse_error = incomplete = False
    for turn in turns:
        infos = [s.info for s in turn.agent_steps]
        if turn.env_step is not None:
            infos.append(turn.env_step.info)
        parse_error = parse_error or any(_is_parse_error(s) for s in turn.agent_steps)
        for info in infos:
            parse_error = parse_error or bool(info.get("parse_error", False))
            incomplete = incomplete or bool(info.get("incomplete_completion", False))
    return {"parse_error": parse_error, "incomplete_completion": incomplete}


def _is_parse_error(step: AgentStep) -> bool:
    pr = step.parse_result
    return step.action_target == "env" and pr is not None and not pr.ok


def _weight(weights: Mapping[TurnKey, float], rollout: Rollout, turn: Turn) -> float:
    try:
        return float(weights[(rollout.id, turn.turn_id)])
    except KeyError:
        raise KeyError(
            f"the credit assigner gave no weight for turn {turn.turn_id!r} of rollout "
            f"{rollout.id}; a CreditAssigner must return a weight for every turn of every "
            "non-failed rollout it is given"
        ) from None


def _snapshot_reward(step: AgentStep) -> float | None:
    """The snapshot reward recorded on the step that made an edit; None (with a one-time
    warning) when the agent or context strategy recorded none."""
    if SNAPSHOT_REWARD_KEY in step.info:
        return float(step.info[SNAPSHOT_REWARD_KEY])
    if "missing_snapshot_reward" not in _WARNED:
        _WARNED.add("missing_snapshot_reward")
        logger.warning(
            "snapshot_policy='own_reward' but AgentStep %s (the last call before a context "
            "rewrite) has no info[%r]: its snapshot takes the turn's credit instead "
            "(meta weight_source %r). Have the agent or context strategy record the "
            "snapshot's reward there (ContextEditingAgent(snapshot_reward=...)), or use "
            "snapshot_policy='share'. Warned once per process.",
            step.id,
            SNAPSHOT_REWARD_KEY,
            "credit (no snapshot_reward)",
        )
    return None


def _traces(
    rollout: Rollout, steps: Sequence[AgentStep], retokenizer: Retokenizer | None
) -> list[TokenTrace]:
    if retokenizer is not None:
        return [retokenizer.trace(s) for s in steps]
    traces: list[TokenTrace] = []
    for s in steps:
        if s.trace is None:
            raise ValueError(
                f"AgentStep {s.id} (rollout {rollout.id}, turn {s.turn_id!r}) has no token "
                "trace: the inference backend returned no token ids. Use a backend that returns "
                "ids (token-in mode), or opt in to retokenization with "
                "retokenizer=ChatTemplateRetokenizer(tokenizer=...)"
            )
        traces.append(s.trace)
    return traces
