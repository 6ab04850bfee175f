"""`ludic sft` and `ludic quickstart` hold OUT_DIR's run lock, the one every `ludic train` holds:
each command a fresh process as a user starts it. A second run into a directory a live run
holds (sft, train or quickstart, in any pairing) is refused at once, naming the holder's pid and
command, before it loads or builds a model; a killed holder's file is taken over; the quickstart
takes one lock for the whole command, so its SFT and RL stages train under it without refusing
themselves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ludic.models import build_tiny_model
from ludic.recipes import quickstart as quickstart_module
from ludic.recipes import sft as sft_module
from ludic.recipes.configs import QuickstartConfig, SFTConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.run_lock import RUN_LOCK, RunDirInUseError
from ludic.recipes.tictactoe import ENV_NAME, PROTOCOL_NAME, expert_policy, rollout_engine
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl

pytestmark = pytest.mark.skipif(os.name != "posix", reason="flock is POSIX")
HOLD = """
import sys, time
from pathlib import Path
from ludic.recipes.run_lock import run_lock
with run_lock(Path(sys.argv[1]), what="`ludic train`"):
    print("held", flush=True)
    time.sleep(600)
"""
SMALL_QUICKSTART = (
    *("--expert-episodes", "12", "--sft-steps", "3", "--sft-batch-size", "8"),
    *("--rl-groups", "2", "--group-size", "2", "--eval-episodes", "4", "--hidden-size", "64"),
)


@pytest.fixture(scope="module")
def expert_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six expert tic-tac-toe games, tokenized as `ludic sft` (no --model) reads them."""
    tokenizer = build_tiny_model()[1]
    requests = [
        RolloutRequest(env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME))
        for _ in range(6)
    ]
    engine = rollout_engine(PolicyClient(expert_policy(0.0), tokenizer))
    rollouts = asyncio.run(engine.run(SeedSequencer(run_seed=0).seed_requests(requests, 0)))
    path = tmp_path_factory.mktemp("data") / "expert.jsonl"
    with path.open("w") as f:
        write_rollouts_jsonl(rollouts, f)
    return path


def ludic(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def sft_args(data: Path, out: Path, steps: int) -> list[str]:
    return ludic(
        *("sft", "--data", str(data), "--out-dir", str(out), "--steps", str(steps)),
        *("--batch-size", "4", "--no-progress"),
    )


def hold(path: Path) -> subprocess.Popen[str]:
    """A process holding `path`'s lock as a `ludic train` would (it says "held" once it does)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def refused(holder_pid: int, run: Path, *commands: list[str]) -> list[str]:
    """Run `commands` side by side to their ends (each a process that starts up, then checks
    the lock); each must fail with the refusal naming `holder_pid`. Their outputs, in order."""
    children = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    try:
        outputs = [child.communicate(timeout=300) for child in children]
    finally:
        for child in children:
            child.kill()
    texts = []
    for child, (out, err) in zip(children, outputs, strict=True):
        text = " ".join((out + err).split())
        assert child.returncode != 0, text[-3000:]
        assert f": error: {run} is in use" in text, text[-3000:]  # the refusal block
        assert f"{run} is in use by another" in text and f"run (pid {holder_pid} " in text, text
        texts.append(text)
    return texts


def until(path: Path, child: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 300
    while not path.exists():
        if child.poll() is not None:
            out, _ = child.communicate()
            pytest.fail(f"the first run exited with {child.returncode} before {what}:\n{out}")
        assert time.monotonic() < deadline, f"no {what} in 300 s"
        time.sleep(0.2)


def no_model(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a model was loaded or built before the run lock was checked")


def test_sft_and_quickstart_are_refused_before_a_model_loads(
    expert_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    holder = hold(run / RUN_LOCK)
    try:
        monkeypatch.setattr(sft_module, "load_policy", no_model)
        with pytest.raises(RunDirInUseError, match=rf"another ludic run \(pid {holder.pid} "):
            sft_module.sft_command(SFTConfig(data=expert_data, out_dir=run, steps=1))
        monkeypatch.setattr(quickstart_module, "build_policy", no_model)
        with pytest.raises(RunDirInUseError, match=rf"another ludic run \(pid {holder.pid} "):
            quickstart_module.run_quickstart(QuickstartConfig(out_dir=run, tiny=True))
        assert sorted(p.name for p in run.iterdir()) == [RUN_LOCK]  # nothing else written
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_second_ludic_sft_or_train_is_refused_then_a_killed_sft_taken_over(
    expert_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    first = subprocess.Popen(
        sft_args(expert_data, run, steps=100_000),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        until(run / "metrics.jsonl", first, "trained step")
        train = ludic("train", "--env", "tictactoe", "--out-dir", str(run), "--no-progress")
        sft, train = refused(first.pid, run, sft_args(expert_data, run, steps=1), train)
        assert "--steps 100000" in sft  # the first run's command line
        assert " sft --data " in train  # the holder is named by its command line
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()  # SIGKILL: its lock file stays behind, its lock goes with it
        first.communicate(timeout=60)
    assert (run / RUN_LOCK).exists()

    third = subprocess.run(
        sft_args(expert_data, run, steps=1), capture_output=True, text=True, timeout=300
    )
    output = "".join((third.stdout + third.stderr).split())  # rich wraps, even inside a path
    assert third.returncode == 0, output[-3000:]
    took_over = f"tookover{run / RUN_LOCK}fromarunthatnolongerholdsit(pid{first.pid}on"
    assert "".join(took_over.split()) in output, output[-3000:]
    assert not (run / RUN_LOCK).exists()  # removed when the run ended


@pytest.mark.slow
def test_the_quickstart_holds_one_lock_through_its_sft_and_rl_stages(
    expert_data: Path, tmp_path: Path
) -> None:
    """Its stages train in sft/ and rl/ under the command's one lock (they take none of their
    own, so neither refuses itself), and a `ludic sft` or `ludic train` into its directory is
    refused meanwhile."""
    run = tmp_path / "run"
    command = ludic("quickstart", *SMALL_QUICKSTART, "--rl-steps", "100000", "--out-dir", str(run))
    quickstart = subprocess.Popen(
        [*command, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        until(run / "rl" / "metrics.jsonl", quickstart, "RL step")  # SFT done, RL training
        assert (run / "sft" / "metrics.jsonl").is_file()
        train = ludic("train", "--env", "tictactoe", "--out-dir", str(run))
        sft, _ = refused(quickstart.pid, run, sft_args(expert_data, run, steps=1), train)
        assert "quickstart" in sft and "--rl-steps 100000" in sft  # the holder's command
        assert quickstart.poll() is None  # the quickstart goes on
    finally:
        quickstart.kill()
        quickstart.communicate(timeout=60)


def test_a_second_sft_into_an_out_dir_with_checkpoints_is_refused_before_a_model_loads(
    expert_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun with fewer steps left the earlier run's newer checkpoint as the newest, with
    this run's metrics beside it (found in review)."""
    run = tmp_path / "run"
    sft_module.sft_command(SFTConfig(data=expert_data, out_dir=run, steps=2, progress=False))
    monkeypatch.setattr(sft_module, "load_policy", no_model)
    with pytest.raises(FileExistsError, match=r"newest: step_00000002.*another --out-dir"):
        sft_module.sft_command(SFTConfig(data=expert_data, out_dir=run, steps=1))
