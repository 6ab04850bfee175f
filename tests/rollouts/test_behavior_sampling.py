"""The sampling transform travels from the request to the sample: ChatResponse stamp -> token
trace (JSON round trip) -> sample meta (`behavior_sampling`, `forced_action_tokens`)."""

from __future__ import annotations

import pytest

from ludic.inference.client import ChatResponse
from ludic.inference.sampling import SamplingConfig
from ludic.rollouts.samples import behavior_sampling_meta, sampling_runs
from ludic.types import BehaviorSampling, TokenTrace

HOT = BehaviorSampling(temperature=0.7, top_p=0.9)
GREEDY_K = BehaviorSampling(temperature=0.0, top_k=5)


def trace(n: int, sampling: BehaviorSampling | None, forced: tuple[int, ...] = ()) -> TokenTrace:
    return TokenTrace(
        prompt_token_ids=(1, 2),
        completion_token_ids=tuple(range(10, 10 + n)),
        completion_logprobs=(-0.1,) * n,
        sampling=sampling,
        forced_positions=forced,
    )


def test_the_response_is_stamped_with_the_requests_transform_and_forced_tokens() -> None:
    response = ChatResponse(
        text="x",
        prompt_token_ids=(1,),
        completion_token_ids=(5, 6, 7),
        completion_logprobs=(-1.0, 0.0, -2.0),
        extra={"forced_token_positions": [1]},
    )
    stamped = response.with_sampling(SamplingConfig(temperature=0.7, top_p=0.9, top_k=-1))
    t = stamped.trace()
    assert t is not None
    assert t.sampling == HOT
    assert t.forced_positions == (1,)
    assert TokenTrace.from_dict(t.to_dict()) == t
    # a backend that set the transform itself keeps it
    assert stamped.with_sampling(SamplingConfig(temperature=1.0)).sampling == HOT


def test_trace_refuses_forced_positions_outside_the_completion() -> None:
    with pytest.raises(ValueError, match="forced_positions"):
        trace(2, None, forced=(2,))


def test_one_shared_transform_is_one_dict() -> None:
    meta = behavior_sampling_meta([trace(3, HOT), trace(2, HOT)], num_action_tokens=5)
    assert meta == {"behavior_sampling": HOT.to_dict()}
    assert sampling_runs(meta) == [(HOT, None)]


def test_mixed_transforms_become_runs_and_forced_tokens_ordinals() -> None:
    # calls: 3 tokens HOT (token 2 forced), 2 tokens GREEDY_K, 1 token unstamped (identity)
    traces = [trace(3, HOT, forced=(2,)), trace(2, GREEDY_K, forced=(0,)), trace(1, None)]
    meta = behavior_sampling_meta(traces, num_action_tokens=6)
    assert meta["forced_action_tokens"] == [2, 3]
    assert sampling_runs(meta) == [(HOT, 3), (GREEDY_K, 2), (BehaviorSampling(), 1)]


def test_without_any_stamp_there_is_no_meta() -> None:
    assert behavior_sampling_meta([trace(3, None)], num_action_tokens=3) == {}


def test_retokenized_samples_keep_only_a_shared_transform() -> None:
    # the completions are not the sample's action tokens (7 != 5): positions are unknowable
    shared = behavior_sampling_meta([trace(3, HOT, forced=(1,)), trace(2, HOT)], 7)
    assert shared == {"behavior_sampling": HOT.to_dict()}
    assert behavior_sampling_meta([trace(3, HOT), trace(2, GREEDY_K)], 7) == {}
