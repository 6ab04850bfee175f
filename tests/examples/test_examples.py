"""Smoke tests of every example on tiny budgets: each one's `main(config)` runs end to end on the
CPU with a tiny local model and produces what it promises."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(relative: str) -> ModuleType:
    path = EXAMPLES / relative
    name = "example_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def config(module: ModuleType, name: str, **kwargs: Any) -> Any:
    return getattr(module, name)(**kwargs)


def test_tictactoe_eval(tmp_path: Path) -> None:
    example = load_example("tictactoe/eval.py")
    result = example.main(config(example, "EvalConfig", episodes=4, out_dir=tmp_path))
    assert result.episodes == 4
    assert result.win + result.draw + result.loss == pytest.approx(1.0)  # shares of games
    assert 0.0 <= result.illegal <= 1.0  # a share of moves
    assert (tmp_path / "rollouts.jsonl").is_file()


COMPACT_START = "1|2|3\n4|5|6\n7|8|9\nX to move"  # TicTacToeEnv(observation="compact")


@pytest.mark.parametrize("observation", ["compact", "full"])
def test_tictactoe_eval_plays_the_observation_it_is_told(tmp_path: Path, observation: str) -> None:
    """Quickstart checkpoints are trained on the compact board: eval shows it by default, and
    the full text only when asked."""
    example = load_example("tictactoe/eval.py")
    kwargs = {} if observation == "compact" else {"observation": observation}
    example.main(config(example, "EvalConfig", episodes=1, out_dir=tmp_path, **kwargs))
    rollout = json.loads((tmp_path / "rollouts.jsonl").read_text().splitlines()[0])
    first_prompt = rollout["steps"][0]["prompt_messages"][-1]["content"]
    if observation == "compact":
        assert first_prompt == COMPACT_START
    else:
        assert "Legal moves: 1, 2, 3, 4, 5, 6, 7, 8, 9" in first_prompt


class _Stop(Exception):
    """Raised by the fakes below once the example has built its rollout requests."""


class _FirstRequests:
    """Stands in for RolloutEngine (and RolloutBatchSource): keeps the env registry and stops
    the example at its first rollout requests, before anything is generated or trained."""

    def __init__(self, **kwargs: Any) -> None:
        if "env_registry" in kwargs:
            self.env_registry = kwargs["env_registry"]
        else:  # RolloutBatchSource(engine=..., requests_fn=...)
            raise _Stop(kwargs["engine"].env_registry, kwargs["requests_fn"]())

    async def run(self, requests: Any) -> Any:
        raise _Stop(self.env_registry, list(requests))


def first_observation(example: ModuleType, cfg: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The observation the example's env shows at the start of its first game."""
    monkeypatch.setattr(example, "RolloutEngine", _FirstRequests)
    monkeypatch.setattr(example, "RolloutBatchSource", _FirstRequests, raising=False)
    with pytest.raises(_Stop) as stopped:
        example.main(cfg)
    registry, requests = stopped.value.args
    spec = requests[0].env
    env = registry[spec.name](**spec.kwargs)
    observations = env.reset(seed=0)
    return str(next(iter(observations.values()))[0])


@pytest.mark.parametrize(
    ("relative", "name"),
    [
        ("tictactoe/train.py", "TrainConfig"),
        ("tictactoe/selfplay.py", "SelfPlayConfig"),
        ("grpo_reference.py", "Config"),
    ],
)
def test_tictactoe_training_examples_build_the_observation_they_are_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: str, name: str
) -> None:
    example = load_example(relative)
    fields = {f.name for f in dataclasses.fields(getattr(example, name))}
    out = {"out_dir": tmp_path} if "out_dir" in fields else {}
    compact = first_observation(example, config(example, name, **out), monkeypatch)
    assert compact == COMPACT_START  # the quickstart's observation, by default
    cfg = config(example, name, observation="full", **out)
    assert "Legal moves" in first_observation(example, cfg, monkeypatch)


@pytest.mark.slow
def test_tictactoe_train(tmp_path: Path) -> None:
    example = load_example("tictactoe/train.py")
    cfg = config(example, "TrainConfig", steps=2, groups=2, group_size=2, out_dir=tmp_path)
    history = example.main(cfg)
    assert len(history) == 2 and history[-1]["policy_version"] == 2
    assert (tmp_path / "reward_curve.png").is_file()
    assert sorted((tmp_path / "checkpoints").glob("step_*/model/config.json"))


@pytest.mark.slow
def test_tictactoe_selfplay(tmp_path: Path) -> None:
    example = load_example("tictactoe/selfplay.py")
    cfg = config(
        example, "SelfPlayConfig", steps=1, games=2, group_size=2, eval_games=2, out_dir=tmp_path
    )
    before, after = example.main(cfg)
    for rates in (before, after):
        assert set(rates) == {"X wins", "O wins", "draw", "illegal"}
        assert sum(rates.values()) == pytest.approx(1.0)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # both seats' rollouts are trained on: 2 games x 2 samples x 2 seats; a seat that took no
    # part gets none (04d8f3c), so 4 when every game ended at X's first move (illegal for the
    # untrained model) before O acted
    assert records[0]["batch/num_rollouts"] in (4.0, 8.0)


def test_selfplay_outcome_rates_read_each_game_once() -> None:
    example = load_example("tictactoe/selfplay.py")
    from ludic.types import EnvironmentStep, Rollout

    def rollout(seat: str, outcome: str | None, **info: Any) -> Rollout:
        info = {**info, **({"outcome": outcome} if outcome else {})}
        return Rollout(agent_id=seat, steps=[EnvironmentStep(agent_id=seat, info=info)])

    games = [
        rollout("X", "win"),
        rollout("O", "loss"),
        rollout("X", "loss"),
        rollout("X", "draw"),
        rollout("X", "win", opponent_illegal_move=True),
        rollout("X", None),
    ]
    rates = example.outcome_rates(games)
    assert rates == {"X wins": 0.2, "O wins": 0.2, "draw": 0.2, "illegal": 0.4}


@pytest.mark.slow
def test_math_qa_train(tmp_path: Path) -> None:
    example = load_example("math_qa/train.py")
    cfg = config(
        example,
        "MathConfig",
        steps=1,
        problems_per_step=2,
        group_size=2,
        eval_problems=2,
        max_tokens=8,
        out_dir=tmp_path,
    )
    before, after = example.main(cfg)
    assert 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert (tmp_path / "metrics.jsonl").is_file()


def test_math_qa_reads_a_local_jsonl(tmp_path: Path) -> None:
    example = load_example("math_qa/train.py")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(
        "\n".join(
            json.dumps(
                {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1} #### {i + 1}"}
            )
            for i in range(5)
        )
    )
    problems = example.load_problems(config(example, "MathConfig", data=data, limit=3))
    assert [p["question"] for p in problems] == [f"What is {i} + 1?" for i in range(3)]
    assert len(example.load_problems(config(example, "MathConfig"))) > 10  # bundled sample


@pytest.mark.slow
def test_rejection_sampling_then_sft(tmp_path: Path) -> None:
    sampling = load_example("rejection_sampling.py")
    out = tmp_path / "kept.jsonl"
    path, kept, total = sampling.main(
        config(sampling, "RejectionSamplingConfig", expert=True, problems=8, out=out)
    )
    assert path == out and total == 8 and 0 < kept <= total
    assert len(out.read_text().splitlines()) == kept
    assert len(out.with_suffix(".all.jsonl").read_text().splitlines()) == total

    sft = load_example("sft_from_jsonl.py")
    history = sft.main(
        config(sft, "SFTConfig", data=out, steps=4, batch_size=8, out_dir=tmp_path / "sft")
    )
    assert len(history) == 4 and history[-1]["loss"] < history[0]["loss"]
    assert (tmp_path / "sft" / "loss_curve.png").is_file()
    assert sorted((tmp_path / "sft" / "checkpoints").glob("step_*/model/tokenizer.json"))


@pytest.mark.slow
def test_grpo_reference(capsys: pytest.CaptureFixture[str]) -> None:
    example = load_example("grpo_reference.py")
    cfg = config(example, "Config", steps=2, groups=2, group_size=2, eval_games=2)
    before, after, rewards = example.main(cfg)
    assert len(rewards) == 2 and 0.0 <= before <= 1.0 and 0.0 <= after <= 1.0
    assert "step   2" in capsys.readouterr().out


def test_grpo_reference_stays_short() -> None:
    lines = (EXAMPLES / "grpo_reference.py").read_text().splitlines()
    assert len(lines) <= 300, "the reference loop must stay readable (STYLE.md rule 15)"


@pytest.mark.slow
def test_tictactoe_train_on_an_inference_server(tmp_path: Path) -> None:
    """Scaling out: rollouts from `ludic serve` in another process, training here, and the new
    weights pushed to the server after each step."""
    import socket
    import subprocess

    import httpx

    from ludic.inference.vllm.server import wait_for_health
    from ludic.models import tiny_model_dir

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    model_dir, token, url = str(tiny_model_dir()), "example-token", f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "ludic.inference.http.server", "--model", model_dir]
    command += ["--port", str(port), "--token", token, "--threads", "1"]
    command += ["--served-model-name", "tiny"]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_health(url, timeout_s=120, process=server)
        import tyro

        example = load_example("tictactoe/train.py")
        args = ["--model", model_dir, "--server-url", url, "--server-token", token]
        args += ["--served-model", "tiny", "--steps", "2", "--groups", "2", "--group-size", "2"]
        cfg = tyro.cli(example.TrainConfig, args=[*args, "--out-dir", str(tmp_path / "run")])
        assert cfg.inference.server_url == (url,)  # the shared InferenceArgs flags
        history = example.main(cfg)
        assert [h["policy_version"] for h in history] == [1, 2]
        auth = {"Authorization": f"Bearer {token}"}
        served = httpx.get(url + "/ludic/version", headers=auth, timeout=10).json()
        assert served["policy_version"] == 2
        status = httpx.get(url + "/ludic/weights/status", headers=auth, timeout=10).json()
        assert status["last_error"] is None  # the example closed its group: no lost trainer
        assert "recvValueWithTimeout" not in (tmp_path / "server.log").read_text()
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_custom_env_grpo_then_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README tutorial: GRPO on the Lights env, a checkpoint, a resumed run that trains
    only the steps left, eval with pass@k, the viewer page and the reward curve."""
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_env"))  # as `python train.py` does
    example = load_example("custom_env/train.py")
    small = dict(problems_per_step=2, group_size=2, max_turns=3, eval_problems=2, eval_k=2)
    first = config(example, "LightsConfig", steps=1, checkpoint_every=1, out_dir=tmp_path, **small)
    example.main(first)
    assert (tmp_path / "checkpoints" / "step_00000001" / "model" / "tokenizer.json").is_file()
    resumed = config(example, "LightsConfig", steps=2, resume=True, out_dir=tmp_path, **small)
    capsys.readouterr()
    metrics = example.main(resumed)
    # the closing line numbers the steps as `ludic train`'s does, not "(first step)"
    closing = capsys.readouterr().out
    assert (
        "(step 2) -> " in closing
        and "(step 2), step 2 of this launch (resumed at step 1)" in closing
    )
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]  # the resumed run trained only step 2
    capsys.readouterr()
    example.main(resumed)  # again: nothing is left, which it says instead of training nothing
    said = capsys.readouterr().out
    assert "nothing to train: the checkpoint is at step 2 and --steps is 2" in said
    assert set(metrics) == {"success_rate", "pass@1", "pass@2"}
    assert 0.0 <= metrics["pass@1"] <= metrics["pass@2"] <= 1.0
    assert (tmp_path / "eval" / "metrics.json").is_file()
    page = (tmp_path / "rollouts.html").read_text()
    assert "Lamps:" in page
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    samples = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert samples and all("weight" in json.loads(line) for line in samples)


@pytest.mark.slow
def test_custom_env_gigpo_groups_steps_by_the_envs_state_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES / "custom_env"))
    example = load_example("custom_env/train.py")
    cfg = config(
        example,
        "LightsConfig",
        algorithm="gigpo",
        steps=1,
        problems_per_step=1,
        group_size=3,
        max_turns=3,
        eval_problems=1,
        eval_k=2,
        out_dir=tmp_path,
    )
    example.main(cfg)
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["batch/num_rollouts"] == 3
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    keys = {s["info"]["state_key"] for r in rollouts for s in r["steps"] if s["kind"] == "agent"}
    assert keys and all(len(k) == 4 and set(k) <= {"0", "1"} for k in keys)


def test_lights_env_and_parser() -> None:
    lights = load_example("custom_env/lights.py")
    env = lights.LightsEnv()
    ((obs, info),) = env.reset(3).values()  # a sync env: no await needed
    assert obs.startswith("Lamps:") and info["lamps_off"] == env.state_key("agent_0").count("0")
    assert lights.lamp_parser("flip lamp 3!").action == "3"
    bad = lights.lamp_parser("no digits")
    assert bad.action is None and bad.reward < 0 and "1 to 4" in bad.obs
    off = [i + 1 for i, c in enumerate(env.state_key("agent_0")) if c == "0"]
    for lamp in off[:-1]:
        assert not env.step({"agent_0": str(lamp)})["agent_0"].terminated
    last = env.step({"agent_0": str(off[-1])})["agent_0"]
    assert last.terminated and last.reward > 0 and env.state_key("agent_0") == "1111"
    from ludic.eval.env_spec import resolve_parser

    assert resolve_parser("auto", lights.LightsEnv) is lights.lamp_parser


def test_examples_wire_through_public_modules_only() -> None:
    """Examples import the documented helpers (`ludic.recipes`, `ludic.context`), never the
    modules behind them, so what they show is what a user can rely on."""
    private = ("ludic.recipes.training", "ludic.context.latest_observation")
    for path in sorted(EXAMPLES.rglob("*.py")):
        text = path.read_text()
        for name in private:
            assert name not in text, f"{path.relative_to(EXAMPLES)} imports {name}"
