"""The README's "Train your own environment" program run again into the same `out` (a second
launch of the same script, or `train(..., steps=30)` after the run reached 40) resumes the
newest checkpoint and trains nothing: `train` used to call `trainer.train(steps - trainer.step)`
with a negative count and crash with `num_steps must be an int >= 0`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _block_defining(text: str, marker: str) -> str:
    """The ```python block of README.md that contains `marker`."""
    blocks = text.split("```python\n")[1:]
    found = [b.split("\n```", 1)[0] for b in blocks if marker in b]
    assert len(found) == 1, f"expected one README block with {marker!r}, found {len(found)}"
    return found[0]


@pytest.mark.slow
def test_training_to_fewer_steps_than_the_checkpoint_returns_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = README.read_text()
    env_block = _block_defining(text, "class LightsEnv(SingleAgentEnv)")
    train_block = _block_defining(text, "async def train(algorithm, steps")
    # the definitions only: the block's own asyncio.run(...) lines train 30 and 40 steps
    train_defs = "\n".join(
        line for line in train_block.splitlines() if not line.startswith("checkpoint = ")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme_rerun"}
    exec(compile(env_block, "README.md (step 1)", "exec"), namespace)
    exec(compile(train_defs, "README.md (step 2)", "exec"), namespace)
    real_strategy = namespace["GRPORequestStrategy"]
    namespace["GRPORequestStrategy"] = lambda group_size: real_strategy(group_size=2)  # smaller

    out = tmp_path / "runs" / "lights"
    first = asyncio.run(namespace["train"](namespace["make_gigpo"](), steps=1, out=out))
    assert first.name == "step_00000001"
    again = asyncio.run(namespace["train"](namespace["make_gigpo"](), steps=0, out=out))
    assert again == first  # resumed at step 1, nothing trained, the same checkpoint
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
