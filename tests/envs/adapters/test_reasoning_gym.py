"""ReasoningGymEnv on real reasoning-gym datasets: its questions, its scorer as the reward,
seeds and difficulty passed through, the CLI's `reasoning_gym:NAME`, and a short GRPO run."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from ludic._aio import maybe_await
from ludic.agents import Agent
from ludic.envs.adapters.reasoning_gym import ReasoningGymEnv, answer_parser
from ludic.errors import is_refusal
from ludic.eval.env_spec import resolve_env_factory
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Message

rg = pytest.importorskip(
    "reasoning_gym", reason="needs reasoning-gym: pip install 'ludic[reasoning-gym]'"
)


def oracle(name: str, **config: object) -> ScriptedClient:
    """Answers every question of `reasoning_gym.create_dataset(name, **config)` correctly."""
    dataset = rg.create_dataset(name, **config)
    answers = {entry["question"]: entry["answer"] for entry in dataset}

    def reply(messages: Sequence[Message]) -> str:
        return f"<answer>{answers[messages[-1]['content']]}</answer>"

    return ScriptedClient(reply)


async def test_correct_answers_get_reasoning_gyms_full_score() -> None:
    client = oracle("countdown", seed=5, size=20)
    for seed in (0, 1, 27):  # 27 wraps to entry 7
        env = ReasoningGymEnv("countdown", size=20, dataset_seed=5)
        agent = Agent(client, parser=answer_parser())
        (rollout,) = await SingleAgentProtocol(agent).run(env, env_seed=seed)
        (step,) = rollout.env_steps
        assert step.reward == 1.0 and step.info["correct"] and step.terminated
        assert step.info["source_dataset"] == "countdown" and step.info["sample_index"] == seed % 20
    system = client.requests[0].messages[0]
    assert system["role"] == "system" and "<answer>" in (system["content"] or "")


async def test_a_wrong_answer_gets_reasoning_gyms_partial_credit() -> None:
    env = ReasoningGymEnv("countdown", size=5, dataset_seed=3)
    await maybe_await(env.reset(seed=0))
    entry = rg.create_dataset("countdown", seed=3, size=5)[0]
    expected = rg.create_dataset("countdown", seed=3, size=5).score_answer("1 + 1", entry=entry)
    out = (await maybe_await(env.step({"agent_0": "1 + 1"})))["agent_0"]
    assert out.reward == pytest.approx(expected) and 0.0 < out.reward < 1.0
    assert not out.info["correct"] and out.info["score"] == out.reward


async def test_seeds_pick_entries_and_dataset_seed_picks_the_data() -> None:
    async def question(env: ReasoningGymEnv, seed: int) -> str:
        return (await maybe_await(env.reset(seed=seed)))["agent_0"][0]

    a, b = (
        ReasoningGymEnv("basic_arithmetic", size=10),
        ReasoningGymEnv("basic_arithmetic", size=10),
    )
    assert await question(a, 4) == await question(b, 4)
    assert await question(a, 4) != await question(a, 5)
    other = ReasoningGymEnv("basic_arithmetic", size=10, dataset_seed=1)
    assert await question(other, 4) != await question(a, 4)


def test_difficulty_passes_through_as_config_fields_and_curriculum_level() -> None:
    env = ReasoningGymEnv("basic_arithmetic", size=8, min_terms=4, max_terms=4)
    assert all(entry["metadata"]["num_terms"] == 4 for entry in env.dataset)
    easy = ReasoningGymEnv("basic_arithmetic", size=4, level=0).rg_dataset.config
    hard = ReasoningGymEnv("basic_arithmetic", size=4, level=2).rg_dataset.config
    assert hard.max_terms > easy.max_terms and hard.max_digits > easy.max_digits
    # an explicit config field wins over the curriculum level
    harder = ReasoningGymEnv("basic_arithmetic", size=4, level=2, max_terms=3)
    assert harder.rg_dataset.config.max_terms == 3


def test_unknown_datasets_and_fields_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"no dataset 'no_such'.*countdown"):
        ReasoningGymEnv("no_such")
    with pytest.raises(ValueError, match=r"no config field not_a_field.*min_numbers") as typo:
        ReasoningGymEnv("countdown", not_a_field=1)
    assert is_refusal(typo.value)  # `ludic train` prints one line, not the env's traceback
    with pytest.raises(ValueError, match="pass dataset_seed, not seed"):
        ReasoningGymEnv("countdown", seed=5)  # would be silently replaced by dataset_seed
    with pytest.raises(ValueError, match="refused its config: min_numbers") as out_of_range:
        ReasoningGymEnv("countdown", min_numbers=0)
    assert is_refusal(out_of_range.value)


def test_cli_resolves_reasoning_gym_names_with_the_answer_parser() -> None:
    factory = resolve_env_factory("reasoning_gym:countdown")
    parser = getattr(factory, "parser", None)
    assert parser is not None and parser("<answer>1+2</answer>").action == "1+2"
    env = factory(size=3)
    assert isinstance(env, ReasoningGymEnv) and len(env.dataset) == 3


def test_missing_reasoning_gym_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[reasoning-gym\]'"):
        ReasoningGymEnv("countdown")


@pytest.mark.slow
def test_ludic_train_runs_grpo_on_a_reasoning_gym_dataset(tmp_path: Path) -> None:
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    cfg = TrainConfig(
        env="reasoning_gym:basic_arithmetic",
        env_kwargs='{"size": 16}',
        steps=2,
        problems_per_step=1,
        group_size=2,
        max_tokens=8,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2 and (result.checkpoint / "model" / "config.json").is_file()
    assert len((tmp_path / "rollouts.jsonl").read_text().splitlines()) == 2 * 1 * 2
