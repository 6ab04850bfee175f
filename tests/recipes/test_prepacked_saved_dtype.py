"""--prepacked-gemm on a model directory saved in bfloat16, for a command that loads it as saved
(`ludic eval`), is refused by the shared flag check before any weights load, naming the flag and
the dtype, as `ludic serve` refuses it: the engine used to refuse it only after the model had
loaded, in its own words ("prepacked_gemm=True cannot be honoured ...")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.models import build_tiny_model
from ludic.recipes.inference import check_engine_flags, check_prepacked_gemm


@pytest.fixture(scope="module")
def bf16_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = build_tiny_model(seed=0)
    directory = tmp_path_factory.mktemp("bf16") / "tiny-bf16"
    model.to(torch.bfloat16).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_bfloat16_model_is_refused_naming_the_flag_and_its_dtype(bf16_model_dir: Path) -> None:
    with pytest.raises(ValueError) as refused:
        check_engine_flags(
            batch_invariant=False,
            prepacked_gemm=True,
            server_url=None,
            model=str(bf16_model_dir),
        )
    message = str(refused.value)
    assert message.startswith("--prepacked-gemm needs float32 weights"), message
    assert f"--model {bf16_model_dir} is saved in bfloat16" in message
    assert "drop --prepacked-gemm" in message


def test_a_checkpoint_step_folder_is_read_through_its_model_folder(tmp_path: Path) -> None:
    model_dir = tmp_path / "checkpoints" / "step_00000002" / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text('{"torch_dtype": "float16"}', encoding="utf-8")
    with pytest.raises(ValueError, match="is saved in float16"):
        check_prepacked_gemm(
            True, batch_invariant=False, server_url=None, device="cpu", model=str(model_dir.parent)
        )


def test_float32_models_and_float32_loads_are_accepted(
    bf16_model_dir: Path, tmp_path: Path
) -> None:
    model, _ = build_tiny_model(seed=0)
    model.save_pretrained(tmp_path / "fp32")
    for model_dir in (str(tmp_path / "fp32"), None):  # None: train and actor load float32
        check_prepacked_gemm(
            True, batch_invariant=False, server_url=None, device="cpu", model=model_dir
        )
    # without --prepacked-gemm the saved dtype is the command's business
    check_prepacked_gemm(
        False, batch_invariant=False, server_url=None, device="cpu", model=str(bf16_model_dir)
    )


def test_ludic_eval_refuses_it_before_the_model_loads(
    bf16_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ludic.cli import EXIT_REFUSED, main
    from ludic.inference.embedded.engine import EmbeddedEngine

    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before --prepacked-gemm was checked")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", load)
    argv = ["eval", "--env", "tictactoe", "--prepacked-gemm", "--model", str(bf16_model_dir)]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out-dir", str(tmp_path / "ev")], report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    out, err = capsys.readouterr()
    assert "engine: embedded" not in out, out
    errors = [line for line in err.splitlines() if line.startswith("ludic eval: error:")]
    assert len(errors) == 1 and "--prepacked-gemm needs float32 weights" in errors[0], err
