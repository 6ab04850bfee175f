"""`ludic train` takes user code: an env module in the working directory (no PYTHONPATH), the
parser the env class declares, every online preset (GiGPO included), --reject-incomplete,
--server-url, and the training samples that `ludic view --samples` reads."""

from __future__ import annotations

import dataclasses
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
    assert "gigpo on my_env:make_env: 1 step of 1 x 2 episodes" in result.stdout
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
class ServeProcess:
    """`ludic serve` on the tiny model in a subprocess on a free port, stopped on exit."""

    token = "train-token"

    def __init__(self, model_dir: str, log: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "ludic.inference.http.server", "--model", model_dir]
        command += ["--port", str(port), "--token", self.token, "--threads", "1"]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def __enter__(self) -> ServeProcess:
        from ludic.inference.vllm.server import wait_for_health

        wait_for_health(self.url, timeout_s=120, process=self.process)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def served_version(self) -> int:
        import httpx

        auth = {"Authorization": f"Bearer {self.token}"}
        reply = httpx.get(self.url + "/ludic/version", headers=auth, timeout=10)
        return int(reply.json()["policy_version"])


def server_train_config(model_dir: str, url: str, out_dir: Path, steps: int) -> TrainConfig:
    return TrainConfig(
        model=model_dir,
        server_url=url,
        context="latest",
        steps=steps,
        problems_per_step=1,
        group_size=2,
        max_tokens=4,
        max_steps=2,
        out_dir=out_dir,
        progress=False,
    )


@pytest.mark.slow
def test_ludic_train_resumed_against_a_fresh_server_publishes_then_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--server-url: rollouts from `ludic serve` in another process, weights pushed to it;
    then --resume --server-url: a restarted `ludic serve` (version 0) gets the checkpoint's
    weights before the first rollout, so the resumed step trains on fresh samples."""
    from ludic.models import tiny_model_dir

    model_dir, run = str(tiny_model_dir()), tmp_path / "run"
    with ServeProcess(model_dir, tmp_path / "server1.log") as server:
        monkeypatch.setenv("LUDIC_SERVER_TOKEN", server.token)  # no --server-token: from env
        assert train_command(server_train_config(model_dir, server.url, run, steps=1)).steps == 1
        assert server.served_version() == 1
    with ServeProcess(model_dir, tmp_path / "server2.log") as fresh:
        assert fresh.served_version() == 0
        resumed = server_train_config(model_dir, fresh.url, run, steps=2)
        assert (
            train_command(dataclasses.replace(resumed, resume="latest")).steps == 1
        )  # step 2 only
        assert fresh.served_version() == 2
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["step"] == 2 and last["dropped_stale"] == 0 and last["num_samples"] > 0


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
