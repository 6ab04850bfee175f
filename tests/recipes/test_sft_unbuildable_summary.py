"""`ludic sft`'s summary line counts the stored rollouts dropped as unbuildable (here: an agent
step without a token trace), next to those filtered out; nothing is said when none was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ludic.recipes.sft import _unbuildable
from ludic.training import ConstantCredit, OfflineBatchSource

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from test_offline_build_failures import _write_rollouts


@pytest.mark.parametrize(
    ("untraced", "said"),
    [((), ""), ((1,), ", 1 rollout dropped as unbuildable"), ((0, 2), ", 2 rollouts dropped")],
)
def test_the_summary_counts_unbuildable_rollouts(
    tmp_path: Path, untraced: tuple[int, ...], said: str
) -> None:
    path = tmp_path / "rollouts.jsonl"
    _write_rollouts(path, 4, untraced)
    source = OfflineBatchSource(paths=path, credit_assigner=ConstantCredit(), batch_size=1)
    assert _unbuildable(source).startswith(said)
    assert bool(_unbuildable(source)) == bool(untraced)
