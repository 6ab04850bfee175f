"""`--gigpo.state-key module:function` whose function cannot take one turn is refused when the
flag is resolved, naming the flag and the expected signature, before any episode runs (fails if
it surfaces as a bare TypeError after a batch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main as ludic_main
from ludic.recipes.algorithms import GiGPOOptions, make_algorithm

KEYS = """
def two_args(turn, board):
    return board

def no_args():
    return None

def one_arg(turn, scale=1):
    return turn.observation
"""


@pytest.fixture
def keys_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_keys.py").write_text(KEYS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_ludic_train_refuses_a_state_key_of_the_wrong_signature(keys_module: Path) -> None:
    args = ["train", "--algorithm", "gigpo", "--gigpo.state-key", "my_keys:two_args"]
    args += ["--steps", "1", "--problems-per-step", "1", "--group-size", "2", "--max-tokens", "4"]
    args += ["--out-dir", "run", "--no-progress"]
    with pytest.raises(ValueError) as e:
        ludic_main(args)
    message = str(e.value)
    assert "--gigpo.state-key my_keys:two_args: two_args(turn, board) cannot be called" in message
    assert "def state_key(turn: ludic.types.Turn) -> Hashable | None" in message
    assert not (keys_module / "run" / "rollouts.jsonl").exists()  # refused before any episode


def test_state_key_signatures_checked_when_resolved(keys_module: Path) -> None:
    with pytest.raises(ValueError, match=r"no_args\(\) cannot be called with one turn"):
        make_algorithm("gigpo", gigpo=GiGPOOptions(state_key="my_keys:no_args"))
    key = GiGPOOptions(state_key="my_keys:one_arg").anchor_key()  # extra defaulted args are fine
    assert key.__name__ == "one_arg"


@pytest.mark.parametrize(
    ("spec", "why"),
    [("my_keys:missing", "has no attribute 'missing'"), ("no_such_keys:fn", "cannot import")],
)
def test_a_state_key_that_does_not_resolve_names_the_flag(
    keys_module: Path, spec: str, why: str
) -> None:
    # `ludic train`, `ludic actor` and `ludic eval --credit gigpo` all resolve it here: the
    # error must say which flag held the bad import string, not only which module lacked it.
    with pytest.raises(ValueError) as e:
        make_algorithm("gigpo", gigpo=GiGPOOptions(state_key=spec))
    message = str(e.value)
    assert message.startswith(f"--gigpo.state-key {spec}: ")
    assert why in message
    assert "env, observation or a 'module:function'" in message  # the values it takes
