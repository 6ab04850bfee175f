"""The `ludic` console script: every command's --help, the command list, errors, dispatch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ludic import cli

COMMANDS = ("quickstart", "train", "sft", "eval", "serve", "actor", "learner", "view", "plot")


def run_ludic(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "ludic"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_every_command_is_registered_with_an_importable_config() -> None:
    assert tuple(cli.COMMANDS) == COMMANDS
    for command in cli.COMMANDS.values():
        config = command.load_config()
        assert config.__doc__ and command.summary


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help(name: str) -> None:
    result = run_ludic(name, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: ludic {name}" in result.stdout
    assert "--" in result.stdout  # at least one documented option


def test_top_level_help_lists_the_commands() -> None:
    result = run_ludic("--help")
    assert result.returncode == 0, result.stderr
    for name in COMMANDS:
        assert name in result.stdout


def test_unknown_command_and_bad_option_fail_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["no-such-command"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["quickstart", "--no-such-option", "1"])
    assert exc.value.code == 2


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from ludic import cli\n"
        "for c in cli.COMMANDS.values(): c.load_config()\n"
        "assert 'torch' not in sys.modules, 'building the CLI imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_dispatch_runs_the_named_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[object] = []
    monkeypatch.setattr(cli, "_import", _fake_import(seen))
    cli.main(["plot", str(tmp_path / "metrics.jsonl"), "--smooth", "0.5"])
    (cfg,) = seen
    assert type(cfg).__name__ == "PlotConfig"
    assert cfg.metrics == tmp_path / "metrics.jsonl"  # type: ignore[attr-defined]
    assert cfg.smooth == 0.5  # type: ignore[attr-defined]


def _fake_import(seen: list[object]):  # type: ignore[no-untyped-def]
    real = cli._import

    def fake(spec: str) -> object:
        if spec == cli.COMMANDS["plot"].run:
            return seen.append
        return real(spec)

    return fake
