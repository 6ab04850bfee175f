"""MultiAgentProtocol: a turn-based game between two LLM agents gives two correct rollouts;
simultaneous moves; parse failures wait without stepping the env, or, on an env that takes
one reply per episode, end it for every seat."""

from __future__ import annotations

import dataclasses
import json

import pytest
from interaction_fakes import (
    CoinDuelEnv,
    OneReplyCoinDuelEnv,
    OneReplyRockPaperScissorsEnv,
    RockPaperScissorsEnv,
)

from ludic.agents import Agent
from ludic.eval import episode_record
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import Rollout

MOVE = xml_tag_parser("move")


def player(*replies: str) -> Agent:
    return Agent(ScriptedClient(list(replies)), parser=MOVE)


def by_agent(rollouts: list[Rollout]) -> dict[str, Rollout]:
    for r in rollouts:
        assert Rollout.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    return {r.agent_id: r for r in rollouts}


async def test_turn_based_duel_gives_each_agent_its_full_timeline() -> None:
    # 3 coins: first takes 1 (2 left), second takes 1 (1 left), first takes the last one.
    env = CoinDuelEnv(coins=3)
    first, second = player("<move>1</move>"), player("<move>1</move>")
    protocol = MultiAgentProtocol({"first": first, "second": second})
    r = by_agent(await protocol.run(env, env_seed=3))
    assert env.steps == [{"first": "1"}, {"second": "1"}, {"first": "1"}] and env.closed == 1

    f, s = r["first"], r["second"]
    assert [type(x).__name__[0] for x in f.steps] == list("AEEAE")
    assert [type(x).__name__[0] for x in s.steps] == list("EAEE")
    # The winner: its own two moves and the opponent's move in between (observed).
    f_env = f.env_steps
    assert [e.agent_step_ids == () for e in f_env] == [False, True, False]
    assert f_env[1].info["observed"] is True and f_env[1].action is None
    assert f_env[1].next_obs == "Opponent took 1; 1 left. Your move."
    assert f_env[2].reward == 1.0 and f_env[2].terminated
    assert f.total_reward == 1.0
    # The loser sees the winning move it did not make, with its terminal -1.
    s_env = s.env_steps
    assert s_env[0].agent_step_ids == () and s_env[0].next_obs.startswith("Opponent took 1")
    assert s_env[-1].agent_step_ids == () and s_env[-1].reward == -1.0 and s_env[-1].terminated
    assert s.total_reward == -1.0
    assert [e.index for e in s_env] == [0, 1, 2]
    # The loser's prompt before its move holds the opponent's move.
    (s_act,) = s.agent_steps
    assert s_act.prompt_messages[-1]["content"] == "Opponent took 1; 2 left. Your move."
    assert s_act.info["observation"] == "Opponent took 1; 2 left. Your move."
    assert s_act.info["state_key"] == repr((2, 1))
    # The second mover's move is linked to its env step; its steps name its seat.
    assert s_env[1].agent_step_ids == (s_act.id,) and s_env[1].prev_obs == s_act.info["observation"]
    assert {x.agent_id for x in s.steps} == {"second"} and s.agent_id == "second"
    # Turn grouping: the opponent's moves join the turn before them, terminal reward included.
    f_turns, s_turns = f.turns(), s.turns()
    assert [t.reward for t in f_turns] == [0.0, 1.0]
    assert f_turns[0].observed_steps == (f_env[1],)
    assert [t.agent_steps == () for t in s_turns] == [True, False]
    assert s_turns[1].observed_steps == (s_env[2],) and s_turns[1].reward == -1.0
    for r_ in (f, s):
        assert "episode_truncated" not in r_.meta and r_.meta["env_seed"] == 3


async def test_a_parse_failure_does_not_step_the_env_and_the_same_agent_retries() -> None:
    env = CoinDuelEnv(coins=2)
    first = player("oops", "<move>2</move>")
    second = player("<move>1</move>")
    r = by_agent(await MultiAgentProtocol({"first": first, "second": second}).run(env))
    assert env.steps == [{"first": "2"}]
    f = r["first"]
    synthetic, win = f.env_steps
    assert synthetic.info["parse_error"] and synthetic.action is None
    assert synthetic.agent_step_ids == (f.agent_steps[0].id,)
    assert win.reward == 1.0 and win.agent_step_ids == (f.agent_steps[1].id,)
    assert second.client.calls == 0  # type: ignore[attr-defined]
    (lost,) = r["second"].env_steps
    assert lost.reward == -1.0 and lost.info["observed"] is True


async def test_simultaneous_moves_and_a_valid_action_waits_for_a_failed_one() -> None:
    env = RockPaperScissorsEnv()
    a = player("<move>rock</move>")
    b = player("paper?", "<move>paper</move>")
    r = by_agent(await MultiAgentProtocol({"a": a, "b": b}).run(env))
    assert env.steps == [{"a": "rock", "b": "paper"}]
    assert a.client.calls == 1 and b.client.calls == 2  # type: ignore[attr-defined]
    ra, rb = r["a"], r["b"]
    assert [type(x).__name__[0] for x in ra.steps] == list("AE")
    assert [type(x).__name__[0] for x in rb.steps] == list("AEAE")
    assert ra.env_steps[0].reward == -1.0 and rb.env_steps[-1].reward == 1.0
    assert ra.env_steps[0].agent_step_ids == (ra.agent_steps[0].id,)
    assert rb.env_steps[0].info["parse_error"] is True


async def test_max_steps_truncates_every_unfinished_agent() -> None:
    env = CoinDuelEnv(coins=10)
    protocol = MultiAgentProtocol(
        {"first": player("<move>1</move>"), "second": player("<move>1</move>")}, max_steps=3
    )
    r = by_agent(await protocol.run(env))
    assert len(env.steps) == 3
    for rollout in r.values():
        last = rollout.env_steps[-1]
        assert last.truncated and last.truncation_reason == "max_steps"
        assert last.info["truncation_reason"] == "max_steps"
        assert rollout.meta["episode_truncated"] is True
        assert rollout.meta["truncation_reason"] == "max_steps"
        assert [e.truncated for e in rollout.env_steps[:-1]] == [False] * (
            len(rollout.env_steps) - 1
        )


async def test_each_seat_gets_its_own_call_seeds() -> None:
    a, b = player("<move>rock</move>"), player("<move>rock</move>")
    await MultiAgentProtocol({"a": a, "b": b}).run(
        RockPaperScissorsEnv(), sampling=SamplingConfig(seed=1)
    )
    seeds = [ag.client.requests[0].sampling.seed for ag in (a, b)]  # type: ignore[attr-defined]
    assert None not in seeds and seeds[0] != seeds[1]


async def test_missing_seats_and_missing_outcomes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"no agent for env seat\(s\) \['second'\]"):
        await MultiAgentProtocol({"first": player("x")}).run(CoinDuelEnv())

    class Forgetful(CoinDuelEnv):
        def step(self, actions):  # type: ignore[no-untyped-def]
            outcomes = super().step(actions)
            return {k: v for k, v in outcomes.items() if k not in actions}

    env = Forgetful(coins=5)
    protocol = MultiAgentProtocol(
        {"first": player("<move>1</move>"), "second": player("<move>1</move>")}
    )
    with pytest.raises(ValueError, match=r"no outcome for acting agent\(s\) \['first'\]"):
        await protocol.run(env)
    assert env.closed == 1
    with pytest.raises(ValueError, match="at least one agent"):
        MultiAgentProtocol({})


async def test_an_env_cannot_clobber_a_reserved_info_key() -> None:
    class Clobbering(CoinDuelEnv):
        def step(self, actions):  # type: ignore[no-untyped-def]
            outcomes = super().step(actions)
            waiting = "second" if "first" in actions else "first"
            outcomes[waiting] = dataclasses.replace(outcomes[waiting], info={"observed": 0})
            return outcomes

    protocol = MultiAgentProtocol(
        {"first": player("<move>1</move>"), "second": player("<move>1</move>")}
    )
    with pytest.raises(ValueError, match="'observed' is reserved by Ludic"):
        await protocol.run(Clobbering(coins=3))


async def test_a_valid_action_still_waiting_at_max_steps_closes_its_turn_unexecuted() -> None:
    env = RockPaperScissorsEnv()
    a, b = player("<move>rock</move>"), player("never valid")
    r = by_agent(await MultiAgentProtocol({"a": a, "b": b}, max_steps=2).run(env))
    assert env.steps == [] and a.client.calls == 1  # type: ignore[attr-defined]
    (waiting,) = r["a"].env_steps
    assert waiting.action == "rock" and waiting.next_obs is None and waiting.reward == 0.0
    assert waiting.info["action_not_executed"] is True
    assert waiting.truncated and waiting.truncation_reason == "max_steps"
    assert waiting.agent_step_ids == (r["a"].agent_steps[0].id,)
    assert [t.env_step for t in r["a"].turns()] == [waiting]
    b_steps = r["b"].env_steps
    assert len(b_steps) == 2 and all(s.info["parse_error"] for s in b_steps)
    assert b_steps[-1].truncated and r["b"].meta["truncation_reason"] == "max_steps"


async def test_a_one_reply_env_ends_the_round_at_a_seats_parse_failure() -> None:
    env = OneReplyRockPaperScissorsEnv()
    a = player("paper, I think", "<move>paper</move>")
    b = player("<move>rock</move>")
    r = by_agent(await MultiAgentProtocol({"a": a, "b": b}, max_steps=10).run(env, env_seed=0))
    assert env.steps == []  # the round is never played: a's answer was its parse failure
    (fail,) = r["a"].env_steps
    assert fail.action is None and fail.info["parse_error"] and fail.terminated
    assert fail.info["termination_reason"] == "parse_error"
    assert len(r["a"].agent_steps) == 1 and r["a"].total_reward == -1.0
    (waiting,) = r["b"].env_steps  # b's valid move closes its turn unexecuted
    assert waiting.action == "rock" and waiting.info["action_not_executed"] and waiting.terminated
    detail = "a's reply did not parse; OneReplyRockPaperScissorsEnv takes one reply"
    for rollout in r.values():
        assert rollout.meta["termination_reason"] == "parse_error"
        assert rollout.meta["termination_detail"] == detail
    assert [episode_record(r[s]).num_parse_errors for s in "ab"] == [1, 0]


async def test_a_one_reply_turn_based_env_ends_for_the_seat_that_already_moved() -> None:
    env = OneReplyCoinDuelEnv(coins=3)
    first, second = player("<move>1</move>"), player("junk", "<move>1</move>")
    protocol = MultiAgentProtocol({"first": first, "second": second}, max_steps=10)
    r = by_agent(await protocol.run(env, env_seed=0))
    assert env.steps == [{"first": "1"}]
    (fail,) = r["second"].env_steps[1:]  # after the move it observed
    assert fail.info["parse_error"] and fail.info["termination_reason"] == "parse_error"
    assert len(r["second"].agent_steps) == 1
    assert r["first"].env_steps[-1].terminated
    assert {x.meta["termination_reason"] for x in r.values()} == {"parse_error"}


async def test_format_retries_stay_the_default_for_multi_seat_games() -> None:
    env = RockPaperScissorsEnv()
    a = player("paper, I think", "<move>paper</move>")
    b = player("<move>rock</move>")
    r = by_agent(await MultiAgentProtocol({"a": a, "b": b}, max_steps=10).run(env, env_seed=0))
    assert env.steps == [{"a": "paper", "b": "rock"}]
    assert r["a"].meta["termination_reason"] == "env_terminated"
