"""A checkpoint whose state.json or rng.pt was edited after the save and its MANIFEST.json
rewritten to match (so it verifies) is refused when read, naming the file, what it holds and an
earlier step to resume from, not a bare TypeError or ValueError from the middle of a resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ludic.errors import is_refusal
from ludic.training.checkpoint import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_manifest import MANIFEST, write_manifest
from ludic.training.weights_io import CorruptCheckpointError


def _edit_state(change: Callable[[dict[str, object]], object]) -> Callable[[Path], None]:
    def edit(step_dir: Path) -> None:
        state = json.loads((step_dir / "state.json").read_text())
        changed = change(state)
        (step_dir / "state.json").write_text(json.dumps(state if changed is None else changed))

    return edit


def _float_rng(step_dir: Path) -> None:
    torch.save({"torch": torch.zeros(3)}, step_dir / "rng.pt")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_edit_state(lambda s: s.update(step="two")), "state.json: step is 'two', not an int"),
        (_edit_state(lambda s: [s]), "state.json: a JSON list, not an object"),
        (_edit_state(lambda s: s.update(policy_version=-1)), "state.json: policy_version is -1"),
        (_edit_state(lambda s: s.update(data_state=[1])), "state.json: data_state is a JSON list"),
        (
            _edit_state(lambda s: s.update(rng={"python": []})),
            "state.json: rng is not the python and numpy",
        ),
        (_float_rng, "rng.pt: it holds no torch RNG state"),
    ],
    ids=["step-text", "list", "negative-version", "data-state-list", "rng-json", "rng-pt"],
)
def test_an_edited_state_is_refused_naming_the_file_and_an_earlier_step(
    tmp_path: Path, edit: Callable[[Path], None], named: str
) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), keep_last=None))
    model = torch.nn.Linear(2, 2)
    earlier = manager.save(step=1, model=model)
    edited = manager.save(step=2, model=model)
    edit(edited)
    (edited / MANIFEST).unlink()
    write_manifest(edited, 2)  # the edit verifies

    with pytest.raises(CorruptCheckpointError) as e:
        manager.load(edited)
    message = str(e.value)
    assert f"{edited}/{named}" in message and f"resume from {earlier}" in message, message
    assert is_refusal(e.value)
