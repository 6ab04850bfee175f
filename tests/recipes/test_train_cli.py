"""`ludic train` takes user code: an env module in the working directory (no PYTHONPATH), the
parser the env class declares, every online preset (GiGPO included), --reject-incomplete,
--server-url, and the training samples that `ludic view --samples` reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import ludic.training.algorithm as algorithm_module
from ludic.recipes.configs import Algorithm, TrainConfig
from ludic.recipes.train import PRESETS, make_algorithm, train_command
from ludic.viz.viewer import ViewConfig, view_command

USER_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.parsers import xml_tag_parser
from ludic.types import StepOutcome


class Count(SingleAgentEnv):
    """Two turns; reward 1 for an answer with an "o", the count of turns is the state key."""

    parser = xml_tag_parser("answer", penalty=-0.5)
    system_prompt = "Reply as <answer>...</answer>."

    def env_reset(self, seed=None):
        self.turn = 0
        return f"Say something ({seed}).", {}

    def env_step(self, action):
        self.turn += 1
        return StepOutcome(obs="Again.", reward=float("o" in action), terminated=self.turn >= 2)

    def env_state_key(self):
        return self.turn


def make_env():
    return Count()
'''


def test_every_online_preset_is_a_train_algorithm() -> None:
    names = set(typing.get_args(Algorithm))
    assert names == set(PRESETS)
    made = {n.removeprefix("make_") for n in algorithm_module.__all__ if n.startswith("make_")} - {
        "sft"
    }
    assert made <= {a.removesuffix("_baseline") for a in PRESETS} | set(PRESETS)
    cfg = TrainConfig()
    for name in PRESETS:
        assert make_algorithm(name, cfg).name == name  # type: ignore[arg-type]


def test_help_lists_the_flags_users_need() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for flag in (
        "--server-url",
        "--server-token",
        "--resume",
        "--temperature",
        "--reject-incomplete",
        "gigpo",
        "samples.jsonl",
    ):
        assert flag in result.stdout, flag


@pytest.mark.slow
def test_ludic_train_imports_the_users_env_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(USER_ENV)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["--env", "my_env:make_env", "--algorithm", "gigpo", "--steps", "1"]
    args += ["--problems-per-step", "1", "--group-size", "2", "--max-tokens", "6"]
    args += ["--max-steps", "3"]
    args += ["--out-dir", "run", "--no-progress"]
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parser: xml_tag_parser" in result.stdout  # the env class declared it
    assert "gigpo" in result.stdout
    run = tmp_path / "run"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    (metrics,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(samples) == metrics["batch/num_samples"] >= 2  # one per turn of each episode
    assert {"input_ids", "action_mask", "weight"} <= set(samples[0])
    page = view_command(
        ViewConfig(
            rollouts=run / "rollouts.jsonl",
            samples=run / "samples.jsonl",
            tokenizer=str(run / "checkpoints" / "step_00000001" / "model"),
        )
    )
    assert "weight" in page.read_text()


@pytest.mark.slow
def test_reject_incomplete_is_counted_and_the_parser_sees_cut_replies_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_env2.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))

    def run(reject: bool) -> dict[str, float]:
        out = tmp_path / f"r{int(reject)}"
        cfg = TrainConfig(
            env="my_env2:make_env",
            steps=1,
            problems_per_step=1,
            group_size=2,
            max_tokens=2,  # every reply is cut off
            max_steps=2,
            reject_incomplete=reject,
            out_dir=out,
            progress=False,
        )
        train_command(cfg)
        return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])

    kept, rejected = run(False), run(True)
    assert kept["batch/num_incomplete"] == rejected["batch/num_incomplete"] == 4
    assert kept["batch/num_incomplete_rejected"] == 0
    assert rejected["batch/num_incomplete_rejected"] == 4
    assert rejected["batch/mean_reward"] == pytest.approx(-2.0)  # -1 per turn, unparsed
    assert kept["batch/mean_reward"] == pytest.approx(-1.0)  # the parser's -0.5 per turn


@pytest.mark.slow
def test_ludic_train_on_an_inference_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--server-url: rollouts from `ludic serve` in another process, weights pushed to it."""
    import socket

    import httpx

    from ludic.inference.vllm_server import wait_for_health
    from ludic.models import tiny_model_dir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    model_dir, token, url = str(tiny_model_dir()), "train-token", f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "ludic.inference.server", "--model", model_dir]
    command += ["--port", str(port), "--token", token, "--threads", "1"]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_health(url, timeout_s=120, process=server)
        monkeypatch.setenv("LUDIC_SERVER_TOKEN", token)  # no --server-token: read from env
        cfg = TrainConfig(
            model=model_dir,
            server_url=url,
            context="latest",
            steps=1,
            problems_per_step=1,
            group_size=2,
            max_tokens=4,
            max_steps=2,
            out_dir=tmp_path / "run",
            progress=False,
        )
        assert train_command(cfg).steps == 1
        auth = {"Authorization": f"Bearer {token}"}
        served = httpx.get(url + "/ludic/version", headers=auth, timeout=10).json()
        assert served["policy_version"] == 1
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_ludic_eval_imports_the_users_env_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "my_env.py").write_text(USER_ENV)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["--env", "my_env:make_env", "--num-problems", "2", "--samples-per-problem", "2"]
    args += ["--max-tokens", "4", "--max-steps", "2", "--out-dir", "ev", "--no-progress"]
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert "pass@2" in json.dumps(metrics)
    episodes = (tmp_path / "ev" / "rollouts.jsonl").read_text().splitlines()
    assert len(episodes) == 4 and all("error" not in json.loads(e)["meta"] for e in episodes)
