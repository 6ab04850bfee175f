"""`ludic train --batch-invariant`: a seeded run with 8 episodes in flight ends with the same
weights on an idle CPU and next to a busy process and thread; refused with a server URL."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ludic.models import build_tiny_model
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.recipes.training import make_inference

USER_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class SayO(SingleAgentEnv):
    """Two turns; each rewards the share of "o" characters in the reply."""

    def env_reset(self, seed=None):
        self.turn = 0
        return f"Say something ({seed}).", {}

    def env_step(self, action):
        self.turn += 1
        reward = action.count("o") / max(1, len(action))
        return StepOutcome(obs="Again.", reward=reward, terminated=self.turn >= 2)


def make_env():
    return SayO()
'''


@pytest.mark.slow
def test_a_batch_invariant_run_gives_the_same_weights_idle_and_under_load(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cpu_load: Callable[[], AbstractContextManager[object]],
) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # OpenMP threads spin badly on a shared, oversubscribed CPU
    (tmp_path / "say_o_env.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(name: str) -> dict[str, object]:
        cfg = TrainConfig(
            env="say_o_env:make_env",
            steps=2,
            problems_per_step=2,
            group_size=4,
            max_tokens=8,
            max_steps=2,
            concurrency=8,
            lr=1e-2,
            batch_invariant=True,
            out_dir=tmp_path / name,
            progress=False,
        )
        result = train_command(cfg)
        return load_file(str(next((result.checkpoint / "model").glob("*.safetensors"))))

    try:
        idle = run("idle")
        with cpu_load():
            loaded = run("loaded")
    finally:
        torch.set_num_threads(threads)
    assert idle.keys() == loaded.keys()
    different = [k for k in idle if not idle[k].equal(loaded[k])]  # type: ignore[attr-defined]
    assert not different, f"weights differ between the idle and the loaded run: {different}"


def test_batch_invariance_is_refused_for_a_server() -> None:
    model, tokenizer = build_tiny_model(seed=0)
    # it names the server's flag and the trainer's side, which the README's table promises
    with pytest.raises(
        ValueError,
        match=r"embedded engine.*ludic serve --batch-invariant.*TrainerConfig\(batch_invariant",
    ):
        make_inference(
            model,
            tokenizer,
            server_url="http://127.0.0.1:1",
            server_token="t",
            batch_invariant=True,
        )
