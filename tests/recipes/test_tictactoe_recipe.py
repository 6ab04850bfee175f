"""Tic-tac-toe recipe pieces: reading the board back from observations, the scripted expert,
stage summaries and the results table."""

from __future__ import annotations

import random

import pytest
from rich.console import Console

from ludic.envs import TicTacToeEnv, random_move
from ludic.envs.tictactoe_solver import legal_moves, optimal_moves
from ludic.eval import EvalResult, StepRecord
from ludic.recipes.tictactoe import (
    StageResult,
    board_from_observation,
    expert_policy,
    print_results,
    stage_result,
    task_corpus,
    task_tokenizer,
    whole_percents,
)


def random_game_observations(seed: int) -> list[tuple[str, str]]:
    """(observation, board) pairs along one random game against the random opponent."""
    env = TicTacToeEnv(opponent="random")
    rng = random.Random(seed)
    obs = env.reset(seed=seed)[env.agent_id][0]  # a sync env: no event loop needed
    pairs = [(obs, env.board)]
    while env.outcome is None:
        move = random_move(env.board, rng)
        obs = env.step({env.agent_id: str(move)})[env.agent_id].obs
        pairs.append((obs, env.board))
    return pairs


def test_board_is_read_back_from_every_observation() -> None:
    for seed in range(30):
        for obs, board in random_game_observations(seed):
            assert board_from_observation(obs) == board


def test_board_reader_refuses_text_without_a_board() -> None:
    with pytest.raises(ValueError, match="no tic-tac-toe board"):
        board_from_observation("Could not find <move>...</move>.")


def test_greedy_expert_plays_optimal_moves() -> None:
    policy = expert_policy(0.0)
    rng = random.Random(0)
    for seed in range(10):
        for obs, board in random_game_observations(seed):
            if not legal_moves(board) or board.count("X") != board.count("O"):
                continue
            reply = policy([{"role": "user", "content": obs}], rng)
            move = int(reply.removeprefix("<move>").removesuffix("</move>"))
            assert move in optimal_moves(board, "X")


def test_noisy_expert_still_plays_legal_moves_from_the_latest_message() -> None:
    policy = expert_policy(1.0)  # always random
    rng = random.Random(1)
    obs, board = random_game_observations(3)[1]
    messages = [
        {"role": "user", "content": "You are X.\n 1 | 2 | 3\n 4 | 5 | 6\n 7 | 8 | 9"},
        {"role": "assistant", "content": "<move>1</move>"},
        {"role": "user", "content": obs},
    ]
    for _ in range(20):
        move = int(policy(messages, rng)[len("<move>") : -len("</move>")])
        assert move in legal_moves(board)
    with pytest.raises(ValueError, match="epsilon"):
        expert_policy(1.5)


def step(action: str | None, *, illegal: bool = False) -> StepRecord:
    return StepRecord(
        rollout_id="r",
        agent_id="agent_0",
        group_id=None,
        turn_index=0,
        turn_id="t",
        action=action,
        parse_error=action is None,
        info={"illegal_move": illegal} if action is not None else {"parse_error": True},
    )


def test_stage_result_counts_forfeits_as_losses_and_illegal_moves_per_move() -> None:
    metrics = {
        "episodes": 10.0,
        "reward/mean": 0.1,
        "outcome/win": 0.4,
        "outcome/draw": 0.1,
        "outcome/loss": 0.2,
        "outcome/illegal": 0.2,
        "outcome/truncated": 0.1,
    }
    steps = [step("5"), step("1"), step("1", illegal=True), step(None)]
    result = stage_result(
        "after RL", EvalResult(rollouts=[], episodes=[], steps=steps, metrics=metrics)
    )
    assert result == StageResult(
        stage="after RL",
        episodes=10,
        win=0.4,
        draw=0.1,
        loss=pytest.approx(0.5),
        illegal=0.5,
        mean_reward=0.1,
    )


def test_results_table_has_one_row_per_stage() -> None:
    console = Console(record=True, width=100)
    rows = [
        StageResult(
            stage=s, episodes=8, win=w, draw=0.0, loss=0.5 - w, illegal=0.5, mean_reward=-0.5
        )
        for s, w in (("before SFT", 0.0), ("after SFT", 0.25), ("after RL", 0.5))
    ]
    print_results(rows, console=console)
    text = console.export_text()
    assert "before SFT" in text and "after RL" in text
    assert "25%" in text and "-0.50" in text


COMPACT = {"opponent": "random", "illegal_move": "retry", "observation": "compact"}


def test_task_tokenizer_shortens_prompts_and_replies() -> None:
    from ludic.inference.embedded.prompts import render_prompt_ids
    from ludic.models import train_tiny_tokenizer

    corpus = task_corpus(COMPACT, games=50)
    assert "Illegal move: cell" in corpus and "<move>" in corpus and "X to move" in corpus
    assert corpus == task_corpus(COMPACT, games=50)  # seeded
    general = train_tiny_tokenizer()
    task = task_tokenizer(COMPACT)
    assert task.convert_ids_to_tokens(task.encode("<move>5</move>")) == ["<move>", "5", "</move>"]
    assert len(general.encode("<move>5</move>")) == 7
    assert len(task) < len(general) and task.eos_token == "<|im_end|>"
    full = {**COMPACT, "observation": "full"}
    env = TicTacToeEnv(**full)
    env.env_reset(seed=3)
    messages = [{"role": "user", "content": env.env_step("5").obs}]
    prompt_ids = render_prompt_ids(task_tokenizer(full), messages, None)
    assert len(prompt_ids) < 0.7 * len(render_prompt_ids(general, messages, None))


def test_board_is_read_back_from_compact_observations() -> None:
    env = TicTacToeEnv(**COMPACT)
    rng = random.Random(0)
    obs, _ = env.env_reset(seed=0)
    while env.outcome is None:
        assert board_from_observation(obs) == env.board
        obs = env.env_step(str(random_move(env.board, rng))).obs


def test_expert_names_taken_cells_when_asked_and_training_leaves_them_out(tmp_path) -> None:
    import asyncio

    from ludic.recipes.expert import PolicyClient
    from ludic.recipes.tictactoe import (
        ENV_NAME,
        PROTOCOL_NAME,
        drop_penalised_turns,
        rollout_engine,
    )
    from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl
    from ludic.training import OfflineBatchSource, make_sft

    with pytest.raises(ValueError, match="taken"):
        expert_policy(0.0, taken=-0.1)
    tokenizer = task_tokenizer(COMPACT)
    engine = rollout_engine(PolicyClient(expert_policy(0.0, taken=0.3), tokenizer))
    spec = ComponentSpec(name=ENV_NAME, kwargs=COMPACT)
    requests = [RolloutRequest(env=spec, protocol=ComponentSpec(name=PROTOCOL_NAME))] * 12
    seeded = SeedSequencer(run_seed=0).seed_requests(requests, batch_index=0)
    rollouts = asyncio.run(engine.run(seeded))
    path = tmp_path / "expert.jsonl"
    with path.open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(rollouts, f)
    credit = make_sft().credit_assigner
    every = OfflineBatchSource(paths=path, credit_assigner=credit, batch_size=4)
    kept = OfflineBatchSource(
        paths=path, credit_assigner=credit, batch_size=4, filters=[drop_penalised_turns]
    )
    illegal = sum(1 for r in rollouts for s in r.env_steps if s.info.get("illegal_move"))
    assert illegal > 0 and len(kept.samples) == len(every.samples) - illegal
    texts = [tokenizer.decode(s.input_ids) for s in kept.samples]
    assert any("Illegal move: cell" in t for t in texts)  # recoveries are trained on
    for text in texts:  # ... and every trained move is legal on the board it was shown
        prompt = text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        board = board_from_observation(prompt)
        move = int(text.split("<move>")[1][0])
        assert board[move - 1] == "."


def test_outcome_percents_add_up_to_100() -> None:
    assert whole_percents([0.335, 0.335, 0.33]) == [34, 33, 33]
    assert whole_percents([1 / 3, 1 / 3, 1 / 3]) == [34, 33, 33]
    assert whole_percents([0.29, 0.0, 0.71]) == [29, 0, 71]
    assert whole_percents([0.125, 0.125, 0.75]) == [13, 12, 75]
    console = Console(record=True, width=100)
    row = StageResult(
        stage="after RL",
        episodes=200,
        win=0.335,
        draw=0.335,
        loss=0.33,
        illegal=0.25,
        mean_reward=0.0,
    )
    print_results([row], console=console)
    text = console.export_text()
    assert "34%" in text and text.count("33%") == 2 and "25%" in text and "101" not in text
