"""`python bench/gigpo_vs_grpo.py merge` on hand-written part files: it refuses parts run with
different settings (or torch threads), a seed of one algorithm in two parts or a file given twice,
and an earlier merge's output, each with one line naming the files (exit 2); one seed per
algorithm gives null, not NaN, for the interval, so the report is strict JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gigpo_vs_grpo.py"
CONFIG = {
    "seeds": 1,
    "steps": 30,
    "groups_per_step": 2,
    "group_size": 8,
    "eval_episodes": 64,
    "algorithms": ["grpo"],
    "out": "part.json",
    "first_seed": 0,
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gigpo_merge_refusals", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gigpo_merge_refusals"] = module
    spec.loader.exec_module(module)
    return module


def part(
    folder: Path,
    name: str,
    algorithm: str,
    seeds: list[int],
    threads: int = 1,
    machine: dict[str, Any] | None = None,
    **config: Any,
) -> Path:
    """A file as `--algorithms ALGORITHM --first-seed seeds[0] --seeds len(seeds)` writes it."""
    runs = [{"seed": s, "success_before": 0.05, "success_after": 0.25 + 0.125 * s} for s in seeds]
    for run in runs:
        run |= {"train_seconds": 1.0, "train_mean_reward": [None, 0.5]}
    cfg = {**CONFIG, "seeds": len(seeds), "first_seed": seeds[0], "algorithms": [algorithm]}
    body = {
        "config": {**cfg, "out": name, **config},
        "machine": {"cpu": "test", "cores": 2, "torch": "2.x", "torch_threads": threads}
        | (machine or {}),
        algorithm: {"runs": runs},
    }
    path = folder / name
    path.write_text(json.dumps(body))
    return path


def refusal(bench: ModuleType, *paths: Path) -> str:
    with pytest.raises(bench.MergeError) as raised:
        bench.merge(list(paths))
    return str(raised.value)


def test_parts_run_alike_merge_as_strict_json(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0, 1])
    b = part(tmp_path, "part-gigpo-0.json", "gigpo", [0, 1])
    c = part(tmp_path, "part-grpo-2.json", "grpo", [2])
    merged = bench.merge([a, b, c])
    assert [r["seed"] for r in merged["grpo"]["runs"]] == [0, 1, 2]
    assert merged["grpo"]["success_after"]["n"] == 3
    assert merged["gigpo_minus_grpo"]["n"] == 2  # seeds 0 and 1 ran both
    json.dumps(merged, allow_nan=False)


def test_difference_pairs_the_seeds_both_ran(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0, 1, 2, 3])
    b = part(tmp_path, "part-gigpo-2.json", "gigpo", [2, 3])
    c = part(tmp_path, "part-gigpo-5.json", "gigpo", [5])
    b_runs = json.loads(b.read_text())["gigpo"]["runs"]
    for run in b_runs:
        run["success_after"] += 0.5
    b.write_text(json.dumps({**json.loads(b.read_text()), "gigpo": {"runs": b_runs}}))
    merged = bench.merge([a, b, c])
    # Seeds 2 and 3 ran both: gigpo is 0.5 higher on each; grpo's 0 and 1, gigpo's 5 are unpaired.
    assert merged["gigpo_minus_grpo"]["n"] == 2
    assert merged["gigpo_minus_grpo"]["mean"] == pytest.approx(0.5, abs=1e-9)


def test_one_seed_gives_null_interval_not_nan(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-3.json", "grpo", [3])
    b = part(tmp_path, "part-gigpo-3.json", "gigpo", [3])
    merged = bench.merge([a, b])
    text = json.dumps(merged, allow_nan=False)  # NaN would raise: it is not JSON
    assert merged["grpo"]["success_after"]["ci95_half"] is None
    assert merged["gigpo_minus_grpo"] == {"mean": 0.0, "std": 0.0, "ci95_half": None, "n": 1}
    assert json.loads(text)["gigpo"]["success_after"]["ci95_half"] is None


@pytest.mark.parametrize(
    ("config", "threads", "named"),
    [
        ({"steps": 10}, 1, "steps 30 vs 10"),
        ({"group_size": 4}, 1, "group_size 8 vs 4"),
        ({"eval_episodes": 32}, 1, "eval_episodes 64 vs 32"),
        ({}, 2, "machine.torch_threads 1 vs 2"),
        ({"lr": 0.01}, 1, "lr (absent) vs 0.01"),
    ],
)
def test_parts_with_different_settings_are_refused(
    bench: ModuleType, tmp_path: Path, config: dict[str, Any], threads: int, named: str
) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0])
    b = part(tmp_path, "part-grpo-1.json", "grpo", [1], threads=threads, **config)
    message = refusal(bench, a, b)
    assert named in message, message
    assert str(a) in message and str(b) in message, message
    assert "seeds" not in message and "first_seed" not in message, message  # per part


@pytest.mark.parametrize(
    ("machine", "named"),
    [
        ({"torch": "2.y"}, "machine.torch '2.x' vs '2.y'"),
        ({"cpu": "other"}, "machine.cpu 'test' vs 'other'"),
    ],
)
def test_parts_on_another_torch_or_cpu_are_refused(
    bench: ModuleType, tmp_path: Path, machine: dict[str, Any], named: str
) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0])
    b = part(tmp_path, "part-grpo-1.json", "grpo", [1], machine=machine)
    message = refusal(bench, a, b)
    assert named in message and "same CPU model and torch version" in message, message


def test_parts_on_another_core_count_merge(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0])
    b = part(tmp_path, "part-grpo-1.json", "grpo", [1], machine={"cores": 16})
    assert [r["seed"] for r in bench.merge([a, b])["grpo"]["runs"]] == [0, 1]


def test_a_seed_in_two_parts_is_refused(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0, 1])
    b = part(tmp_path, "part-grpo-1.json", "grpo", [1, 2])
    message = refusal(bench, a, b)
    assert f"seed 1 of grpo is in both {a} and {b}" in message, message


def test_a_file_given_twice_is_refused(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0])
    again = tmp_path / "." / "part-grpo-0.json"
    message = refusal(bench, a, again)
    assert "given twice" in message and str(a) in message, message


def test_an_earlier_merge_output_is_refused(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0])
    b = part(tmp_path, "part-gigpo-0.json", "gigpo", [0])
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(bench.merge([a, b]), allow_nan=False))
    message = refusal(bench, merged, a, b)  # `merge *.json` on a rerun
    assert f"{merged} is the output of an earlier merge" in message, message


def test_not_a_part_is_refused(bench: ModuleType, tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"steps": 3}')
    broken = tmp_path / "broken.json"
    broken.write_text('{"config": ')
    assert f"{other} is not a part" in refusal(bench, other)
    assert f"{broken} is not JSON" in refusal(bench, broken)


def test_command_line_refusal_is_one_error_line(bench: ModuleType, tmp_path: Path) -> None:
    a = part(tmp_path, "part-grpo-0.json", "grpo", [0, 1])
    b = part(tmp_path, "part-grpo-1.json", "grpo", [1])
    done = subprocess.run(
        [sys.executable, str(BENCH), "merge", a.name, b.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, (done.stdout[-500:], done.stderr[-2000:])
    assert done.stderr.startswith("error: seed 1 of grpo is in both"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr[-2000:]
