"""Turn-concatenated samples stitched exactly from token traces (seed 000)."""

from __future__ import annotations

import pytest
from rollout_fakes import call, env_step, uniform_weights

from ludic.inference.scripted import IM_END, encode_text, render_chatml_ids
from ludic.rollouts import ChatTemplateRetokenizer, build_samples, stitch_traces
from ludic.types import AgentStep, ParseResult, Rollout, ToolCall, ToolResult

SYS_USER = [1, 2, 3]


def react_rollout() -> Rollout:
    """Turn t0: think+tool (internal), tool result 20 21, think+tool, tool result 22, act.
    Turn t1: one call whose prompt extends everything with the env observation 30."""
    c1 = call(
        SYS_USER,
        [10, 11],
        target="internal",
        policy_version=3,
        finish_reason="tool_calls",
        tool_calls=(ToolCall(id="a", name="calc", arguments="{}"),),
        tool_results=(ToolResult(tool_call_id="a", name="calc", content="5"),),
    )
    c2 = call(
        [*SYS_USER, 10, 11, 20, 21],
        [12, 13],
        target="internal",
        policy_version=2,
        finish_reason="tool_calls",
    )
    c3 = call(
        [*SYS_USER, 10, 11, 20, 21, 12, 13, 22],
        [14],
        policy_version=3,
        finish_reason="stop",
        parse_result=ParseResult(action="5"),
    )
    t1_prompt = [*SYS_USER, 10, 11, 20, 21, 12, 13, 22, 14, 30]
    c4 = call(t1_prompt, [15, 16], turn_id="t1", policy_version=4, finish_reason="stop")
    return Rollout(
        steps=[
            c1,
            c2,
            c3,
            env_step("t0", reward=1.0),
            c4,
            env_step("t1", reward=0.5, terminated=True),
        ],
        meta={"group_id": "g"},
    )


def test_react_turn_stitches_prompt_suffixes_masked_and_completions_as_actions() -> None:
    rollout = react_rollout()
    weights = {(rollout.id, "t0"): 0.25, (rollout.id, "t1"): -0.5}
    s0, s1 = build_samples([rollout], weights)

    assert s0.input_ids == (1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 14)
    assert s0.action_mask == (0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1)
    # logprob of completion token t at position j is -(t + j/100); 0.0 on prompt tokens.
    assert s0.behavior_logprobs == (
        0.0,
        0.0,
        0.0,
        -10.0,
        -11.01,
        0.0,
        0.0,
        -12.0,
        -13.01,
        0.0,
        -14.0,
    )
    assert s0.weight == 0.25
    assert s0.meta["turn_id"] == "t0" and s0.meta["turn_index"] == 0
    assert s0.meta["reward"] == 1.0 and s0.meta["episode_return"] == 1.5
    assert s0.meta["policy_versions"] == [2, 3]
    assert s0.meta["finish_reason"] == "stop"
    assert s0.meta["group_id"] == "g" and s0.meta["rollout_id"] == rollout.id
    assert (s0.meta["segment_index"], s0.meta["num_segments"], s0.meta["is_snapshot"]) == (
        0,
        1,
        False,
    )
    assert s0.meta["parent_sample_id"] is None
    assert s0.meta["terminated"] is False and s0.meta["truncated"] is False

    # The next turn is its own sample, starting from its full prompt.
    assert s1.input_ids == (1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 14, 30, 15, 16)
    assert s1.action_mask == (0,) * 12 + (1, 1)
    assert s1.weight == -0.5 and s1.meta["turn_index"] == 1
    assert s1.meta["terminated"] is True and s1.meta["policy_versions"] == [4]


def test_episode_mode_concatenates_all_turns_into_one_sample() -> None:
    rollout = react_rollout()
    (s,) = build_samples([rollout], uniform_weights([rollout], 0.7), mode="episode")
    assert s.input_ids == (1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 14, 30, 15, 16)
    assert s.action_mask == (0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 1, 1)
    assert s.behavior_logprobs is not None
    assert s.behavior_logprobs[-2:] == (-15.0, -16.01)
    assert s.weight == 0.7
    assert s.meta["reward"] == 1.5 and s.meta["turn_ids"] == ["t0", "t1"]
    assert s.meta["policy_versions"] == [2, 3, 4] and s.meta["terminated"] is True


def test_episode_mode_refuses_per_turn_weights() -> None:
    rollout = react_rollout()
    weights = {(rollout.id, "t0"): 1.0, (rollout.id, "t1"): 2.0}
    with pytest.raises(ValueError, match="one weight per rollout"):
        build_samples([rollout], weights, mode="episode")


def test_logprobs_are_none_when_any_call_lacks_them() -> None:
    steps = [call([1], [5], target="internal"), call([1, 5, 6], [7], logprobs=False)]
    rollout = Rollout(steps=[*steps, env_step()])
    (s,) = build_samples([rollout], uniform_weights([rollout]))
    assert s.behavior_logprobs is None
    assert s.input_ids == (1, 5, 6, 7) and s.action_mask == (0, 1, 0, 1)


def test_parse_failure_turn_takes_weight_and_flags_from_its_last_agent_step() -> None:
    bad = call(
        [1], [9, 9], parse_result=ParseResult(action=None, reward=-1.0, obs="bad"), reward=-1.0
    )
    rollout = Rollout(steps=[bad])  # no env step: the turn is closed by the agent step
    (s,) = build_samples([rollout], {(rollout.id, "t0"): -0.3})
    assert s.weight == -0.3 and s.meta["parse_error"] is True and s.meta["reward"] == -1.0


def test_failed_rollouts_and_observation_only_turns_give_no_samples() -> None:
    failed = Rollout(meta={"error": "boom", "error_type": "RuntimeError"})
    observed_first = Rollout(
        steps=[
            env_step("opp", reward=0.0),
            call([1], [2], turn_id="t0"),
            env_step("t0", reward=1.0),
        ]
    )
    samples = build_samples(
        [failed, observed_first], {(observed_first.id, "opp"): 9.0, (observed_first.id, "t0"): 1.0}
    )
    assert [s.meta["turn_id"] for s in samples] == ["t0"]
    assert samples[0].meta["turn_index"] == 0


def test_missing_trace_is_a_clear_error_unless_retokenize_is_opted_in() -> None:
    rollout = Rollout(steps=[AgentStep(turn_id="t0", completion="x"), env_step()])
    with pytest.raises(ValueError, match=r"no token trace.*retokenizer="):
        build_samples([rollout], uniform_weights([rollout]))


def test_missing_weight_is_a_clear_error() -> None:
    rollout = Rollout(steps=[call([1], [2]), env_step()])
    with pytest.raises(KeyError, match="no weight for turn 't0'"):
        build_samples([rollout], {})


class ChatMLTokenizer:
    """A fake Hugging Face tokenizer rendering ChatML as byte ids (the scripted client's)."""

    def apply_chat_template(self, conversation, *, add_generation_prompt=False, **kwargs):
        assert kwargs["tokenize"] is True and kwargs["return_dict"] is False
        return render_chatml_ids(conversation, add_generation_prompt=add_generation_prompt)

    def encode(self, text, **kwargs):
        return encode_text(text)


def test_retokenize_rebuilds_ids_from_messages_and_completions() -> None:
    user = {"role": "user", "content": "hi"}
    tool = {"role": "user", "content": "5"}
    s1 = AgentStep(turn_id="t0", prompt_messages=(user,), completion="go", action_target="internal")
    s2 = AgentStep(
        turn_id="t0",
        completion="ok",
        prompt_messages=(user, {"role": "assistant", "content": "go"}, tool),
    )
    rollout = Rollout(steps=[s1, s2, env_step()])
    (s,) = build_samples(
        [rollout],
        uniform_weights([rollout]),
        retokenizer=ChatTemplateRetokenizer(tokenizer=ChatMLTokenizer()),
    )
    p1 = render_chatml_ids([user])
    c1 = [*encode_text("go"), IM_END, *encode_text("\n")]
    p2 = render_chatml_ids([user, {"role": "assistant", "content": "go"}, tool])
    c2 = [*encode_text("ok"), IM_END, *encode_text("\n")]
    assert p2[: len(p1) + len(c1)] == p1 + c1
    assert list(s.input_ids) == p2 + c2
    assert list(s.action_mask) == [0] * len(p1) + [1] * len(c1) + [0] * (
        len(p2) - len(p1) - len(c1)
    ) + [1] * len(c2)
    assert s.behavior_logprobs is None


def test_retokenize_with_a_real_hf_tokenizer() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "user", "assistant", "hello", "world", "bye"]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    tok.chat_template = (
        "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}<s> assistant {% endif %}"
    )
    step = AgentStep(
        turn_id="t0",
        prompt_messages=({"role": "user", "content": "hello"},),
        completion="world bye",
    )
    got = ChatTemplateRetokenizer(tokenizer=tok).trace(step)
    assert got.prompt_token_ids == (1, 3, 5, 2, 1, 4)
    assert got.completion_token_ids == (6, 7, 2)


def test_stitch_traces_checks_lengths() -> None:
    with pytest.raises(ValueError, match="2 steps but 1 traces"):
        stitch_traces([call([1], [2]), call([1], [2])], [call([1], [2]).trace])  # type: ignore[list-item]
