"""examples/awr_tictactoe.py: --state-prior, --value-folds or --features given with a
--baseline that never reads it is refused before any game is played, not silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_examples import config, load_example

from ludic.training.credit.value import action_features


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"baseline": "group", "value_folds": 3}, "--value-folds 3 applies only to --baseline"),
        ({"baseline": "state", "value_folds": 3}, "--value-folds 3 applies only to --baseline"),
        ({"baseline": "q_value", "state_prior": 4.0}, "--state-prior 4.0 applies only to"),
        ({"baseline": "mean", "state_prior": 4.0}, "--state-prior 4.0 applies only to"),
        ({"baseline": "state", "features": "board"}, "--features board applies only to"),
    ],
)
def test_a_flag_the_baseline_ignores_is_refused(flags: dict, named: str) -> None:
    example = load_example("awr_tictactoe.py")
    with pytest.raises(ValueError, match=named):
        example.check_baseline_flags(config(example, "AWRConfig", **flags))


def test_main_refuses_it_before_anything_runs(tmp_path: Path) -> None:
    example = load_example("awr_tictactoe.py")
    out = tmp_path / "run"
    tiny = {"expert_episodes": 8, "steps": 1, "batch_size": 4, "eval_episodes": 2}
    cfg = config(example, "AWRConfig", out_dir=out, baseline="group", value_folds=3, **tiny)
    with pytest.raises(ValueError, match="--value-folds 3 applies only to --baseline"):
        example.main(cfg)
    assert not out.exists()


@pytest.mark.parametrize(
    "flags",
    [
        {"baseline": "value", "value_folds": 3},
        {"baseline": "q_value", "value_folds": 3},
        {"baseline": "state", "state_prior": 4.0},
        {"baseline": "state_action", "state_prior": 4.0},
        {"baseline": "q_value", "features": "board"},
    ],
)
def test_a_flag_its_baseline_reads_is_taken(flags: dict) -> None:
    example = load_example("awr_tictactoe.py")
    example.check_baseline_flags(config(example, "AWRConfig", **flags))


def test_features_board_gives_q_its_afterstates_and_v_only_the_board() -> None:
    """--features board passes `featurize_action` (read only by Q) with --baseline q_value
    only, so `make_awr` does not refuse it with --baseline value."""
    example = load_example("awr_tictactoe.py")
    value = config(example, "AWRConfig", baseline="value", features="board")
    q_value = config(example, "AWRConfig", baseline="q_value", features="board")
    v_credit = example.algorithm(value, "awr").credit_assigner
    q_credit = example.algorithm(q_value, "awr").credit_assigner
    assert v_credit.featurize is example.board_features
    assert v_credit.featurize_action is action_features  # the default, unread by "value"
    assert q_credit.featurize_action is example.afterstate_features
