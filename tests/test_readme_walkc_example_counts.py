"""README walk (walkC), "The `ludic command` and the examples": `python
examples/tictactoe/train.py --steps 0` loaded the model, trained nothing, saved a step-0
checkpoint, then failed in a traceback plotting an empty metrics.jsonl; the checkpoint made the
next run in that --out-dir refused as an earlier run's. The training examples now refuse a
count below 1 before anything loads or is written, in `ludic train`'s words."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "examples"))
from test_examples import EXAMPLES, config, load_example

# (example, config class, its entry point, the flag set to 0 as a config field)
CASES = [
    ("tictactoe/train.py", "TrainConfig", "train", "steps"),
    ("tictactoe/train.py", "TrainConfig", "train", "group_size"),
    ("tictactoe/selfplay.py", "SelfPlayConfig", "selfplay", "games"),
    ("custom_env/train.py", "LightsConfig", "train", "problems_per_step"),
    ("math_qa/train.py", "MathConfig", "train", "steps"),
    ("sft_from_jsonl.py", "SFTConfig", "main", "batch_size"),
]


@pytest.mark.parametrize(("relative", "name", "entry", "field"), CASES)
def test_a_count_below_one_is_refused_before_anything_is_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    relative: str,
    name: str,
    entry: str,
    field: str,
) -> None:
    # as `python train.py` runs it: its directory importable (custom_env imports lights.py)
    monkeypatch.syspath_prepend(str(EXAMPLES / Path(relative).parent))
    example = load_example(relative)
    out = tmp_path / "run"
    kwargs: dict[str, Any] = {field: 0, "out_dir": out}
    if name == "SFTConfig":
        kwargs["data"] = tmp_path / "expert.jsonl"  # the count is refused before the data
    cfg = config(example, name, **kwargs)
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=f"^{flag} is 0, so nothing would train: pass {flag} >= 1"):
        run = getattr(example, entry)(cfg)
        if asyncio.iscoroutine(run):
            asyncio.run(run)
    assert not out.exists()
