"""GroupNormalizedReturn(split_over_turns=True): each of a k-turn episode's turns carries
A / k, so through the loss a 3-turn episode weighs exactly what a 1-turn episode with the same
advantage weighs; off, it weighs three times as much."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from ludic.recipes.algorithms import make_algorithm
from ludic.rollouts.build_samples import build_samples
from ludic.training import LossInputs, make_grpo
from ludic.training.credit import GroupNormalizedReturn
from ludic.types import AgentStep, EnvironmentStep, Rollout, TokenTrace

# one turn's action logprobs (4 action tokens after a 2-token prompt); every turn of the
# episodes below has these same tokens, so only the weights tell the episodes apart
TURN_LOGPROBS = [0.0, 0.0, -0.5, -1.25, -2.0, -0.75]
TURN_MASK = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def episode(rid: str, reward: float, turns: int) -> Rollout:
    """`turns` agent turns (a retry after each parse failure, say); the last turn's env step
    carries the reward."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k in range(turns):
        act = AgentStep(index=2 * k, turn_id=f"t{k}", agent_id="a", info={"observation": "p"})
        env_reward = reward if k == turns - 1 else 0.0
        steps += [
            act,
            EnvironmentStep(
                index=2 * k + 1,
                turn_id=f"t{k}",
                agent_id="a",
                reward=env_reward,
                agent_step_ids=(act.id,),
            ),
        ]
    return Rollout(id=rid, agent_id="a", steps=steps, meta={"group_id": rid[0]})


def winner_loss_and_grad(winner_turns: int, split: bool) -> tuple[float, torch.Tensor]:
    """GRPO's loss of the winning episode's turn samples (group: that episode, reward 1, and a
    1-turn loser, reward 0), on-policy, with batch totals held fixed so that only the weights
    differ; and the gradient summed over the episode's rows (what its tokens get)."""
    algorithm = make_grpo(aggregation="seq_mean_token_sum", split_over_turns=split)
    weights = algorithm.credit_assigner.assign(
        [episode("w", 1.0, winner_turns), episode("w-lose", 0.0, 1)]
    )
    advantages = [weights[("w", f"t{k}")] for k in range(winner_turns)]
    logprobs = torch.tensor([TURN_LOGPROBS] * winner_turns, requires_grad=True)
    out = algorithm.loss(
        LossInputs(
            logprobs_BT=logprobs,
            action_mask_BT=torch.tensor([TURN_MASK] * winner_turns),
            advantages_B=torch.tensor(advantages),
            total_action_tokens=16.0,
            total_sequences=4.0,
            behavior_logprobs_BT=torch.tensor([TURN_LOGPROBS] * winner_turns),
        )
    )
    out.loss.backward()
    assert logprobs.grad is not None
    return float(out.loss.detach()), logprobs.grad.sum(dim=0)


def test_a_three_turn_episode_weighs_as_one_turn_with_the_split() -> None:
    # group of two, rewards (1, 0): mean 1/2, sample std sqrt(2 * 1/4 / 1) = 1/sqrt(2), so
    # A = (1/2) / (1/sqrt(2) + 1e-6) ~ 0.7071 for the winner. On-policy the ratio is 1 and
    # each row's loss is -A * 4 tokens / total_sequences 4 = -A: one 1-turn episode gives
    # -0.7071; three rows of A/3 give 3 * -(A/3) = the same, three rows of A give -2.1213.
    a = 0.5 / (1 / math.sqrt(2) + 1e-6)
    one_loss, one_grad = winner_loss_and_grad(1, split=True)
    three_loss, three_grad = winner_loss_and_grad(3, split=True)
    assert one_loss == pytest.approx(-a, abs=1e-6)
    assert three_loss == pytest.approx(one_loss, abs=1e-6)
    torch.testing.assert_close(three_grad, one_grad, atol=1e-7, rtol=0.0)
    unsplit_loss, unsplit_grad = winner_loss_and_grad(3, split=False)
    assert unsplit_loss == pytest.approx(3 * one_loss, abs=1e-6)
    torch.testing.assert_close(unsplit_grad, 3 * one_grad, atol=1e-6, rtol=0.0)
    assert winner_loss_and_grad(1, split=False)[0] == pytest.approx(one_loss, abs=1e-12)


def test_retries_no_longer_push_the_group_sum_below_zero() -> None:
    # winner: 1 turn, A = +a; loser retried twice (3 turns), A = -a on each turn. Summed over
    # the group's samples: a - 3a = -2a without the split, a - 3 * (a / 3) = 0 with it.
    batch = [episode("g-win", 1.0, 1), episode("g-lose", 0.0, 3)]
    a = 0.5 / (1 / math.sqrt(2) + 1e-6)
    plain = GroupNormalizedReturn().assign(batch)
    split = GroupNormalizedReturn(split_over_turns=True).assign(batch)
    assert math.fsum(plain.values()) == pytest.approx(-2 * a, abs=1e-9)
    assert math.fsum(split.values()) == pytest.approx(0.0, abs=1e-12)
    assert split[("g-lose", "t1")] == pytest.approx(-a / 3, abs=1e-12)


def test_turns_the_agent_did_not_act_in_are_not_counted() -> None:
    # an outcome observed before the agent first acts (another seat moved) is a turn without
    # agent steps: it builds no sample, so the two acting turns split A = 1 - 1/2 in halves
    acted = episode("h-two", 1.0, 2)
    seen = EnvironmentStep(index=-1, turn_id="before", agent_id="a", reward=0.0)
    rollout = Rollout(id="h-two", agent_id="a", steps=[seen, *acted.steps], meta=acted.meta)
    assert len(rollout.turns()) == 3 and not rollout.turns()[0].agent_steps
    weights = GroupNormalizedReturn(split_over_turns=True, normalize_std=False).assign(
        [rollout, episode("h-lose", 0.0, 1)]
    )
    assert weights[("h-two", "t0")] == pytest.approx(0.5 / 2, abs=1e-12)


def traced_episode(rid: str, reward: float, completions: list[tuple[int, ...]]) -> Rollout:
    """`episode`, each agent step with a token trace whose completion is that turn's entry
    (an empty one: the model replied nothing)."""
    plain = episode(rid, reward, len(completions))
    agent_steps = [s for s in plain.steps if isinstance(s, AgentStep)]
    traced = {
        s.id: replace(s, trace=TokenTrace(prompt_token_ids=(1, 2), completion_token_ids=ids))
        for s, ids in zip(agent_steps, completions, strict=True)
    }
    return replace(plain, steps=[traced.get(s.id, s) for s in plain.steps])


def test_an_empty_turn_is_not_counted_and_the_episodes_samples_sum_to_its_advantage() -> None:
    # 3 turns, the middle one an empty reply (no sample): the other two carry A / 2 each, and
    # the samples built sum to A = 1 - 1/2 (normalize_std off); A / 3 each summed to 2A / 3
    rollouts = [
        traced_episode("e-win", 1.0, [(5, 6), (), (7,)]),
        traced_episode("e-lose", 0.0, [(8,)]),
    ]
    weights = GroupNormalizedReturn(split_over_turns=True, normalize_std=False).assign(rollouts)
    samples = [s for s in build_samples(rollouts, weights) if s.meta["rollout_id"] == "e-win"]
    assert [s.meta["turn_id"] for s in samples] == ["t0", "t2"]
    assert [s.weight for s in samples] == [0.25, 0.25]
    assert math.fsum(s.weight for s in samples) == 0.5


def test_a_turn_without_a_token_trace_is_counted() -> None:
    # retokenized later: the chat template renders even an empty reply with end-of-turn tokens
    weights = GroupNormalizedReturn(split_over_turns=True, normalize_std=False).assign(
        [episode("r-win", 1.0, 2), episode("r-lose", 0.0, 1)]
    )
    assert weights[("r-win", "t0")] == weights[("r-win", "t1")] == 0.25


def test_the_command_registry_sets_it_on_group_presets_and_refuses_it_elsewhere() -> None:
    for name in ("grpo", "dr_grpo", "gspo", "reinforce_baseline"):
        credit = make_algorithm(name, max_tokens=8, split_over_turns=True).credit_assigner
        assert isinstance(credit, GroupNormalizedReturn) and credit.split_over_turns
    assert not make_algorithm("grpo").credit_assigner.split_over_turns  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"--split-over-turns applies to .* not 'rloo'"):
        make_algorithm("rloo", split_over_turns=True)
