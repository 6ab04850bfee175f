"""DatasetQAEnv with the exact-match, numeric and a partial-credit verifier; the GSM8K "####"
convention; the JSONL loader; the bundled math sample (every worked step re-checked)."""

from __future__ import annotations

import ast
import json
import operator
import re
from pathlib import Path

import pytest

from ludic.envs.dataset_qa import DatasetQAEnv, default_target_parser, final_answer
from ludic.envs.qa_data import load_jsonl_dataset, load_math_sample
from ludic.envs.verifiers import exact_match, normalize_answer, numeric_match, parse_number

CAPITALS = [
    {"question": "Capital of France?", "answer": "Paris"},
    {"question": "Capital of Japan?", "answer": "Tokyo"},
    {"question": "Capital of Peru?", "answer": "Lima"},
]


def test_exact_match_episode_rewards_and_info() -> None:
    env = DatasetQAEnv(CAPITALS, system_prompt="Answer in one word.")
    obs, info = env.env_reset(seed=4)  # 4 % 3 == 1
    assert obs == "Capital of Japan?" and info == {"sample_index": 1}
    assert env.system_prompt == "Answer in one word."
    out = env.env_step("  tokyo. ")
    assert (out.obs, out.reward, out.terminated) == ("Correct.", 1.0, True)
    assert out.info == {
        "target": "Tokyo",
        "prediction": "  tokyo. ",
        "correct": True,
        "sample_index": 1,
    }
    env.env_reset(seed=0)
    wrong = env.env_step("Lyon")
    assert (wrong.obs, wrong.reward, wrong.info["correct"]) == ("Incorrect.", 0.0, False)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.env_step("Paris")


def test_pluggable_prompt_target_and_partial_credit_verifier() -> None:
    data = [{"q": "Spell cat", "gold": ["c", "a", "t"]}]

    def letters_right(prediction: str, target: str) -> float:
        return sum(a == b for a, b in zip(prediction, target, strict=False)) / len(target)

    env = DatasetQAEnv(
        data,
        prompt_builder=lambda s: f"Task: {s['q']}",
        target_parser=lambda s: "".join(s["gold"]),
        verifier=letters_right,
    )
    assert env.env_reset(seed=123)[0] == "Task: Spell cat"
    out = env.env_step("cab")
    assert out.reward == pytest.approx(2 / 3) and out.info["correct"] is False
    env.env_reset()
    assert env.env_step("cat").info["correct"] is True


def test_sample_index_and_unseeded_reset() -> None:
    env = DatasetQAEnv(CAPITALS, sample_index=2)
    assert [env.env_reset(seed=s)[0] for s in (0, 1, 5)] == ["Capital of Peru?"] * 3
    free = DatasetQAEnv(CAPITALS)
    assert {free.env_reset()[1]["sample_index"] for _ in range(40)} == {0, 1, 2}


def test_misuse_and_bad_data_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="dataset is empty"):
        DatasetQAEnv([])
    with pytest.raises(TypeError, match="sequence of dicts"):
        DatasetQAEnv("not a dataset")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample_index 3 is outside"):
        DatasetQAEnv(CAPITALS, sample_index=3)
    with pytest.raises(RuntimeError, match="before reset"):
        DatasetQAEnv(CAPITALS).env_step("x")
    with pytest.raises(ValueError, match=r"no question field .*pass prompt_builder="):
        DatasetQAEnv([{"text": "hi", "answer": "1"}]).env_reset(seed=0)
    with pytest.raises(ValueError, match=r"no answer field .*pass target_parser="):
        DatasetQAEnv([{"question": "hi"}]).env_reset(seed=0)
    env = DatasetQAEnv(CAPITALS, verifier=lambda p, t: "yes")  # type: ignore[arg-type, return-value]
    env.env_reset(seed=0)
    with pytest.raises(TypeError, match="verifier must return a bool or float"):
        env.env_step("Paris")


def test_normalisation_and_exact_match() -> None:
    assert normalize_answer('  "New   York." ') == "new york"
    assert exact_match("NEW YORK", "new york!") and not exact_match("New York City", "New York")


@pytest.mark.parametrize(
    ("prediction", "target"),
    [("1,000", "1000"), ("1000.0", "1000"), ("$1000", "1,000"), ("\\$1,000.", "1000"),
     ("25%", "25"), ("-7", "-7.0"), ("0.5", "1/2"), ("\\frac{3}{4}", "0.75"),
     ("\\text{42}", "42"), ("1e3", "1000"), (" 42 ", "#### 42".removeprefix("#### "))],
)  # fmt: skip
def test_numeric_match_accepts_formats_of_the_same_number(prediction: str, target: str) -> None:
    assert numeric_match(prediction, target)


@pytest.mark.parametrize(
    ("prediction", "target"),
    [("999", "1000"), ("42 apples", "42"), ("", "0"), ("1/0", "0"), ("nan", "0"),
     ("inf", "1e999"), ("4 2", "42"), ("0x10", "16")],
)  # fmt: skip
def test_numeric_match_rejects_other_numbers_and_non_numbers(prediction: str, target: str) -> None:
    assert not numeric_match(prediction, target)


def test_parse_number_and_fallback_to_exact_match() -> None:
    assert parse_number("1,234.5") == 1234.5 and parse_number("abc") is None
    assert parse_number("9" * 50 + "/" + "9" * 50) is None  # too long to be an answer
    assert numeric_match("Paris", "paris")  # a non-numeric target compares as text


def test_gsm8k_answer_convention() -> None:
    assert final_answer("3*5=15 apples\n#### 15") == "15"
    assert final_answer("no marker") == "no marker"
    assert default_target_parser({"answer": "work\n#### 1,000"}) == "1,000"
    assert default_target_parser({"target": " 7 "}) == "7"


def test_load_jsonl_dataset(tmp_path: Path) -> None:
    good = tmp_path / "gsm.jsonl"
    rows = [
        {"question": "2+2?", "answer": "2+2=4\n#### 4"},
        {"question": "3*3?", "answer": "#### 9"},
    ]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert load_jsonl_dataset(good) == rows and load_jsonl_dataset(good, limit=1) == rows[:1]
    env = DatasetQAEnv(load_jsonl_dataset(good), verifier=numeric_match)
    env.env_reset(seed=1)
    assert env.env_step("9.0").info["correct"] is True
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        load_jsonl_dataset(bad)
    bad.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        load_jsonl_dataset(bad)
    with pytest.raises(FileNotFoundError, match="no dataset file"):
        load_jsonl_dataset(tmp_path / "missing.jsonl")


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _arith(node: ast.expr) -> float:
    """Evaluate + - * / and parentheses over integers (the calculator notes in the sample)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    assert isinstance(node, ast.BinOp) and type(node.op) in _OPS, ast.dump(node)
    return _OPS[type(node.op)](_arith(node.left), _arith(node.right))


def test_bundled_math_sample_loads_and_every_worked_step_is_right() -> None:
    sample = load_math_sample()
    assert 30 <= len(sample) <= 50
    assert len({r["id"] for r in sample}) == len(sample)
    for record in sample:
        answer = default_target_parser(record)
        assert re.fullmatch(r"-?\d+", answer), record["id"]
        notes = re.findall(r"<<([^=<>]+)=([^<>]+)>>", record["answer"])
        assert notes, record["id"]
        for expression, result in notes:
            assert _arith(ast.parse(expression, mode="eval").body) == float(result), record["id"]
        assert float(notes[-1][1]) == int(answer), record["id"]
    env = DatasetQAEnv(sample, verifier=numeric_match)
    obs, info = env.env_reset(seed=0)
    assert obs == sample[0]["question"] and info["sample_id"] == "math-001"
    assert env.env_step("$27").reward == 1.0
