"""Environments: the multi-agent kernel (`LudicEnv`), the single-agent easy path, dataset QA,
and built-in games and tasks. Nothing here imports torch."""

from ludic.envs.base import LudicEnv, ResetResult, StepResult, state_key_to_str
from ludic.envs.code_env import (
    CodeProblem,
    CodeTest,
    CodeTestEnv,
    code_test_env,
    load_code_problems,
)
from ludic.envs.dataset_qa import (
    DatasetQAEnv,
    default_prompt_builder,
    default_target_parser,
    final_answer,
)
from ludic.envs.guess_number import GuessNumberEnv
from ludic.envs.key_door import KeyDoorGridEnv, shortest_plan
from ludic.envs.long_task import MemoryCorridorEnv, context_length_penalty
from ludic.envs.qa_data import load_jsonl_dataset, load_math_sample
from ludic.envs.registry import BUILTIN_ENVS, EnvSpec, env_parser, make_env, math_qa_env
from ludic.envs.single_agent import (
    SingleAgentEnv,
    check_reset_result,
    check_step_outcome,
    returns_checked,
)
from ludic.envs.tictactoe import TicTacToeEnv, render_board
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv
from ludic.envs.tictactoe_solver import minimax_move, optimal_moves, random_move
from ludic.envs.verifiers import (
    Verifier,
    exact_match,
    normalize_answer,
    numeric_match,
    parse_number,
)

__all__ = [
    "BUILTIN_ENVS",
    "CodeProblem",
    "CodeTest",
    "CodeTestEnv",
    "DatasetQAEnv",
    "EnvSpec",
    "GuessNumberEnv",
    "KeyDoorGridEnv",
    "LudicEnv",
    "MemoryCorridorEnv",
    "ResetResult",
    "SingleAgentEnv",
    "StepResult",
    "TicTacToeDuelEnv",
    "TicTacToeEnv",
    "Verifier",
    "check_reset_result",
    "check_step_outcome",
    "code_test_env",
    "context_length_penalty",
    "default_prompt_builder",
    "default_target_parser",
    "env_parser",
    "exact_match",
    "final_answer",
    "load_code_problems",
    "load_jsonl_dataset",
    "load_math_sample",
    "make_env",
    "math_qa_env",
    "minimax_move",
    "normalize_answer",
    "numeric_match",
    "optimal_moves",
    "parse_number",
    "random_move",
    "render_board",
    "returns_checked",
    "shortest_plan",
    "state_key_to_str",
]
