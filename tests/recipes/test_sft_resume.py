"""`ludic sft --checkpoint-every N --keep-checkpoints K --resume`: a run killed after a
checkpoint (SIGINT or SIGKILL) and resumed in a fresh process ends with the same weights, bit
for bit, as the run left alone, for SFT and AWR; the flags a resume must keep are refused when
they change, and the AWR flags are refused with --algorithm sft."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import tyro
from safetensors.torch import load_file

from ludic.models import TinyModelSpec, load_model, tiny_model_dir
from ludic.recipes.configs import RESUME_LATEST, SFTConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.sft import offline_algorithm, sft_command
from ludic.recipes.sft_resume import SFT_SETTINGS_KEY, check_sft_resume_settings
from ludic.recipes.tictactoe import ENV_NAME, PROTOCOL_NAME, expert_policy, rollout_engine
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl

SPEC = TinyModelSpec(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tokenizer_vocab_size=300,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: several spin against each other on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny model directory, a JSONL of 8 tictactoe games of a sloppy expert, tokenized by
    that model's tokenizer: wins, draws and losses, so AWR's weights differ)."""
    root = tmp_path_factory.mktemp("sft_resume")
    model = tiny_model_dir(seed=0, spec=SPEC, cache_dir=root / "models")
    client = PolicyClient(expert_policy(0.8), load_model(model)[1])
    requests = [
        RolloutRequest(env=ComponentSpec(name=ENV_NAME), protocol=ComponentSpec(name=PROTOCOL_NAME))
        for _ in range(8)
    ]
    engine = rollout_engine(client)
    rollouts = asyncio.run(engine.run(SeedSequencer(run_seed=3).seed_requests(requests, 0)))
    data = root / "data.jsonl"
    with data.open("w") as f:
        write_rollouts_jsonl(rollouts, f)
    return model, data


def config(inputs: tuple[Path, Path], out: Path, **changes: object) -> SFTConfig:
    model, data = inputs
    cfg = SFTConfig(data=data, model=str(model), batch_size=4, lr=1e-2, seed=3, out_dir=out)
    return replace(cfg, progress=False, **changes)  # type: ignore[arg-type]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model" / "model.safetensors")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def losses(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


def step_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("step_*"))


# -- in process ---------------------------------------------------------------------------


def test_the_cli_takes_the_checkpoint_flags() -> None:
    base = ["--data", "d.jsonl", "--checkpoint-every", "5", "--keep-checkpoints", "3"]
    cfg = tyro.cli(SFTConfig, args=[*base, "--resume"])
    assert (cfg.checkpoint_every, cfg.keep_checkpoints, cfg.resume) == (5, 3, RESUME_LATEST)
    cfg = tyro.cli(SFTConfig, args=[*base, "--resume", "runs/x/checkpoints/step_00000005"])
    assert cfg.resume == "runs/x/checkpoints/step_00000005"
    cfg = tyro.cli(SFTConfig, args=["--data", "d.jsonl", "--keep-checkpoints", "None"])
    assert (cfg.checkpoint_every, cfg.keep_checkpoints, cfg.resume) == (None, None, None)


def test_awr_flags_with_algorithm_sft_are_refused(tmp_path: Path) -> None:
    cfg = tyro.cli(
        SFTConfig, args=["--data", "d.jsonl", "--awr-beta", "2", "--awr-min-weight", "0.1"]
    )
    with pytest.raises(
        ValueError,
        match=r"--awr-beta 2.0 --awr-min-weight 0.1 apply only to --algorithm awr.*pass --algorithm awr",
    ):
        offline_algorithm(cfg)
    data = tmp_path / "d.jsonl"
    data.write_text("")
    with pytest.raises(
        ValueError, match=r"--awr-baseline mean applies only to --algorithm awr.*drop it"
    ):
        sft_command(SFTConfig(data=data, awr_baseline="mean", out_dir=tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # refused before anything ran
    assert offline_algorithm(replace(cfg, algorithm="awr")).name == "awr"
    assert offline_algorithm(SFTConfig(data=data)).name == "sft"  # defaults pass


@pytest.mark.parametrize(
    ("flag", "value"),
    [("steps", 0), ("batch_size", 0), ("checkpoint_every", 0), ("keep_checkpoints", 0)],
)
def test_counts_below_one_are_refused_naming_the_flag(
    tmp_path: Path, flag: str, value: int
) -> None:
    cfg = SFTConfig(data=tmp_path / "d.jsonl", out_dir=tmp_path / "o", **{flag: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} is 0: pass"):
        sft_command(cfg)


def test_resume_continues_to_the_weights_of_the_uninterrupted_run(
    run_inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    everything = sft_command(config(run_inputs, whole, steps=13, checkpoint_every=4))
    assert step_dirs(whole) == ["step_00000012", "step_00000013"]  # the last two kept
    # 35 samples, 4 a step: step 9 starts the second epoch, so the resume crosses it.
    first = sft_command(config(run_inputs, split, steps=6, checkpoint_every=4))
    assert first.checkpoint.name == "step_00000006"
    rest = sft_command(
        config(run_inputs, split, steps=13, checkpoint_every=4, resume=RESUME_LATEST)
    )
    assert rest.steps == 7 and rest.checkpoint.name == "step_00000013"
    assert same_weights(rest.checkpoint, everything.checkpoint)
    assert losses(split) == losses(whole)


def test_resume_refusals(run_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(
        FileNotFoundError, match=r"--resume: no complete checkpoint.*without --resume"
    ):
        sft_command(config(run_inputs, out, steps=2, resume=RESUME_LATEST))
    sft_command(config(run_inputs, out, steps=4, checkpoint_every=2))
    # An earlier run's checkpoints without --resume: refused, saying how to continue it.
    with pytest.raises(FileExistsError, match=r"newest: step_00000004.*Pass --resume"):
        sft_command(config(run_inputs, out, steps=6))
    # Flags that decide what trains: refused before the model loads, naming both values.
    changed = [
        ({"batch_size": 8}, r"--batch-size is 8, the checkpoint's 4.*\(--batch-size 4\)"),
        ({"algorithm": "awr"}, r"--algorithm is awr, the checkpoint's sft"),
        ({"lr": 1e-3}, r"--lr is 0.001, the checkpoint's 0.01"),
        ({"retokenize": True}, r"\(--no-retokenize\)"),
        ({"min_reward": 0.0}, r"--min-reward is 0.0, the checkpoint's None"),
    ]
    for change, message in changed:
        with pytest.raises(ValueError, match=message):
            sft_command(config(run_inputs, out, steps=6, resume=RESUME_LATEST, **change))
    # Nothing left: --steps or --epochs reached.
    with pytest.raises(ValueError, match=r"at step 4 and --steps is 4.*raise --steps"):
        sft_command(config(run_inputs, out, steps=4, resume=RESUME_LATEST))
    epoch = tmp_path / "epoch"
    done = sft_command(config(run_inputs, epoch, steps=100, epochs=1))
    assert done.steps == 9  # 35 samples, 4 a step
    with pytest.raises(ValueError, match=r"step 9 has finished --epochs 1.*raise --epochs"):
        sft_command(config(run_inputs, epoch, steps=100, epochs=1, resume=RESUME_LATEST))
    more = sft_command(config(run_inputs, epoch, steps=100, epochs=2, resume=RESUME_LATEST))
    assert more.steps == 9 and more.checkpoint.name == "step_00000018"
    # --resume PATH behind newer checkpoints in OUT_DIR: refused, naming them.
    old = out / "checkpoints" / "step_00000002"
    with pytest.raises(
        FileExistsError, match=r"at step 2, but .* holds newer checkpoints \(step_00000004\)"
    ):
        sft_command(config(run_inputs, out, steps=6, resume=str(old)))


def test_other_data_under_the_same_flags_is_refused(
    run_inputs: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    sft_command(config(run_inputs, out, steps=2))
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join(run_inputs[1].read_text().splitlines(keepends=True)[:-1]))
    cfg = replace(config(run_inputs, out, steps=4, resume=RESUME_LATEST), data=fewer)
    with pytest.raises(ValueError, match="belongs to other data: it has 35 samples, this source"):
        sft_command(cfg)


def test_keep_checkpoints_sets_how_many_stay(run_inputs: tuple[Path, Path], tmp_path: Path) -> None:
    sft_command(
        config(run_inputs, tmp_path / "k3", steps=5, checkpoint_every=1, keep_checkpoints=3)
    )
    assert step_dirs(tmp_path / "k3") == ["step_00000003", "step_00000004", "step_00000005"]
    sft_command(
        config(run_inputs, tmp_path / "all", steps=5, checkpoint_every=2, keep_checkpoints=None)
    )
    assert step_dirs(tmp_path / "all") == ["step_00000002", "step_00000004", "step_00000005"]


def test_a_train_checkpoint_or_an_old_one_is_told_apart(tmp_path: Path) -> None:
    step = tmp_path / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    cfg = SFTConfig(data=tmp_path / "d.jsonl", out_dir=tmp_path, resume=RESUME_LATEST)

    def write(extra: dict[str, object]) -> None:
        (step / "state.json").write_text(json.dumps({"step": 2, "extra": extra}))
        (step / "MANIFEST.json").write_text("{}")

    write({"run_settings": {"--env": "tictactoe"}})
    with pytest.raises(ValueError, match=r"is a `ludic train` checkpoint.*--model"):
        check_sft_resume_settings(cfg, lambda text: None)
    notes: list[str] = []
    write({})
    check_sft_resume_settings(cfg, notes.append)
    assert notes and "resuming without checking" in notes[0]
    write({SFT_SETTINGS_KEY: {"--awr-beta": 3.0, "--algorithm": "sft"}})  # not given: skipped
    check_sft_resume_settings(cfg, notes.append)


# -- fresh processes ----------------------------------------------------------------------

TOTAL_STEPS = 40
EVERY = 4


def start_sft(inputs: tuple[Path, Path], out: Path, *extra: str) -> subprocess.Popen[str]:
    model, data = inputs
    args = [
        *("--data", str(data), "--model", str(model), "--batch-size", "4", "--lr", "1e-2"),
        *("--seed", "3", "--checkpoint-every", str(EVERY), "--out-dir", str(out), "--no-progress"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COLUMNS": "400"}
    return subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", "sft", *args, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str], code: int = 0) -> tuple[str, str]:
    try:
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code, out + err
    return out, err


def newest_complete(out: Path) -> int:
    done = [
        int(p.name[5:])
        for p in (out / "checkpoints").glob("step_*")
        if (p / "MANIFEST.json").is_file()
    ]
    return max(done, default=0)


def last_row(out: Path) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["step"] for line in lines if line.endswith("}")), default=0)


def stop_past_a_checkpoint(process: subprocess.Popen[str], out: Path) -> tuple[int, int]:
    """Pause the run (SIGSTOP) once it has a checkpoint and has logged steps after it; returns
    (newest checkpoint step, last logged step) as they are while it is paused."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the run ended first: {process.communicate()}")
        if newest_complete(out) >= EVERY:
            process.send_signal(signal.SIGSTOP)
            time.sleep(0.2)  # let a write in flight land
            checkpoint, row = newest_complete(out), last_row(out)
            if row > checkpoint:
                return checkpoint, row
            process.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    process.kill()
    pytest.fail("no checkpoint in time")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "signum"),
    [
        (("--algorithm", "sft"), signal.SIGINT),
        (("--algorithm", "awr", "--awr-beta", "0.5"), signal.SIGKILL),
    ],
    ids=["sft-sigint", "awr-sigkill"],
)
def test_a_killed_run_resumed_in_a_new_process_ends_with_the_same_weights(
    run_inputs: tuple[Path, Path], tmp_path: Path, algorithm: tuple[str, ...], signum: int
) -> None:
    whole, split = tmp_path / "whole", tmp_path / "split"
    running = start_sft(run_inputs, whole, "--steps", str(TOTAL_STEPS), *algorithm)
    killed = start_sft(run_inputs, split, "--steps", "100000", *algorithm)
    try:
        checkpoint, _ = stop_past_a_checkpoint(killed, split)
        assert checkpoint < TOTAL_STEPS - 2, "the machine paused the test too long"
        killed.send_signal(signum)
        killed.send_signal(signal.SIGCONT)
        if signum == signal.SIGINT:  # Ctrl-C: cleanup runs, one line names the checkpoint
            _, err = finished(killed, code=130)
            newest = split / "checkpoints" / f"step_{newest_complete(split):08d}"
            assert f"ludic sft: interrupted (Ctrl-C); last checkpoint: {newest}" in err
            assert "Traceback" not in err
        else:
            finished(killed, code=-signal.SIGKILL)
        checkpoint = newest_complete(split)  # a save in flight may have landed meanwhile
        assert last_row(split) > checkpoint  # rows of steps the resume discards
        resumed, _ = finished(
            start_sft(run_inputs, split, "--steps", str(TOTAL_STEPS), "--resume", *algorithm)
        )
        finished(running)
    finally:
        for process in (running, killed):
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert f"resumed at step {checkpoint} " in resumed
    launch = f"steps {checkpoint + 1}-{TOTAL_STEPS} of this launch (resumed at step {checkpoint})"
    assert launch in resumed
    final = f"step_{TOTAL_STEPS:08d}"
    assert same_weights(split / "checkpoints" / final, whole / "checkpoints" / final)
    assert losses(split) == losses(whole)  # the discarded rows were dropped, none twice
    assert [step for step, _ in losses(whole)] == list(range(1, TOTAL_STEPS + 1))
