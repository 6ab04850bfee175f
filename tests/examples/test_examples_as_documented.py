"""The examples as the README runs them: what a user types, and what they are told back.

Covers what a README walk-through found wrong: `ludic eval` on the custom env (as the README's
"The same from the command line" runs it, without `--context`) must see the context training
saw, and the math example must report the number of problems it actually evaluated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_examples import EXAMPLES, config, load_example


def test_ludic_eval_on_lights_sees_the_latest_observation_as_training_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ludic.cli import main

    custom_env = EXAMPLES / "custom_env"
    monkeypatch.chdir(custom_env)  # "from the directory that holds lights.py"
    monkeypatch.syspath_prepend(str(custom_env))
    monkeypatch.delitem(sys.modules, "lights", raising=False)
    out = tmp_path / "eval"
    flags = "--num-problems 1 --samples-per-problem 1 --max-tokens 2 --max-steps 3 --no-progress"
    main(["eval", "--env", "lights:LightsEnv", *flags.split(), "--out-dir", str(out)])
    printed = capsys.readouterr().out
    assert "context: latest (--context auto: the env's suggested_context)" in printed
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    prompts = [step["prompt_messages"] for step in rollout["steps"] if step["kind"] == "agent"]
    assert len(prompts) == 3
    # The latest context: the system prompt, then at most the previous reply and its feedback
    # (after a parse failure) or the latest observation alone; never the whole dialog.
    assert all(len(messages) <= 4 for messages in prompts)
    assert prompts[-1][0]["role"] == "system"


def test_math_qa_reports_the_problems_it_evaluated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example("math_qa/train.py")
    data = tmp_path / "two.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(2)]
    data.write_text("\n".join(json.dumps(row) for row in rows))
    cfg = config(
        example,
        "MathConfig",
        data=data,
        steps=1,
        problems_per_step=1,
        group_size=2,
        eval_problems=16,
        max_tokens=4,
        out_dir=tmp_path / "run",
    )
    example.main(cfg)
    printed = capsys.readouterr().out
    assert "greedy accuracy on 2 problems:" in printed, printed


def test_math_qa_names_a_row_without_a_question_before_training(tmp_path: Path) -> None:
    example = load_example("math_qa/train.py")
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "#### 2"}\n{"q": "2 + 2?", "answer": "4"}\n')
    with pytest.raises(SystemExit, match=r"problem 2 of 2: .*no question field.*'q'"):
        example.load_problems(config(example, "MathConfig", data=data))
    with pytest.raises(SystemExit, match="no problems"):
        example.load_problems(config(example, "MathConfig", data=data, limit=0))


@pytest.mark.slow
def test_delegation_says_where_its_model_is_and_how_to_view_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ludic.cli import main

    example = load_example("delegation/train.py")
    cfg = config(
        example,
        "DelegationConfig",
        demo_episodes=4,
        sft_steps=1,
        rl_steps=1,
        problems=1,
        group_size=2,
        eval_episodes=2,
        hidden_size=32,
        out_dir=tmp_path,
    )
    example.main(cfg)
    lines = capsys.readouterr().out.splitlines()
    model = Path(next(line for line in lines if line.startswith("model: ")).removeprefix("model: "))
    assert (model / "config.json").is_file() and model.parent.parent.parent == tmp_path / "rl"
    view = next(line for line in lines if line.startswith("browse the episodes with: "))
    command = view.removeprefix("browse the episodes with: ").split()
    assert command[:2] == ["ludic", "view"]
    main(command[1:])
    assert (tmp_path / "rl" / "rollouts.html").is_file()


def test_rejection_sampling_that_keeps_nothing_says_so_instead_of_suggesting_sft(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example("rejection_sampling.py")
    cfg = config(
        example,
        "RejectionSamplingConfig",
        problems=1,
        max_tokens=4,
        max_steps=1,
        min_reward=100.0,  # no tic-tac-toe episode reaches it
        out=tmp_path / "kept.jsonl",
    )
    _, kept, total = example.main(cfg)
    printed = capsys.readouterr().out
    assert (kept, total) == (0, 1)
    assert "nothing to train on" in printed and "--min-reward" in printed
    assert "sft_from_jsonl" not in printed  # it would fail on the empty file
    assert str(tmp_path / "kept.all.jsonl") in printed


def test_rejection_sampling_on_math_qa_as_its_docstring_runs_it(tmp_path: Path) -> None:
    """`--env math_qa` without --env-kwargs: tic-tac-toe's default opponent is not passed to
    it (every episode failed with "unexpected keyword argument 'opponent'")."""
    example = load_example("rejection_sampling.py")
    out = tmp_path / "kept.jsonl"
    cfg = config(
        example, "RejectionSamplingConfig", env="math_qa", problems=1, max_tokens=4, out=out
    )
    example.main(cfg)
    (rollout,) = [
        json.loads(line) for line in out.with_suffix(".all.jsonl").read_text().splitlines()
    ]
    assert "error" not in rollout["meta"], rollout["meta"]
    tictactoe = config(example, "RejectionSamplingConfig")
    assert example.env_kwargs(tictactoe) == {"opponent": "random"}
