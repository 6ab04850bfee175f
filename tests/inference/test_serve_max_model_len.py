"""`ludic serve --max-model-len N` beyond the model's max_position_embeddings is refused before the
model loads, as one error line naming the flag and the model's limit (read from config.json; vLLM
refuses it too). It used to be served silently, past positions the model was never built for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import EXIT_REFUSED, main
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.serve_config import ServeConfig, check_serve_config


def _model_dir(tmp_path: Path, **config: object) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(tmp_path)


def test_a_context_beyond_the_models_is_one_error_line_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before --max-model-len was checked")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", load)
    model = _model_dir(tmp_path, max_position_embeddings=2048)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", model, "--max-model-len", "4096"], report_refusals=True)
    assert exit_.value.code == EXIT_REFUSED
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("ludic serve: error:")]
    assert out == "" and len(errors) == 1 and "Traceback" not in err, err
    assert err.startswith("ludic serve: error: --max-model-len 4096 is more than the model's "), err
    assert "2048 positions (max_position_embeddings" in err and "--max-model-len 2048" in err


def test_the_models_own_context_or_less_is_accepted(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, max_position_embeddings=2048)
    for length in (None, 512, 2048):
        check_serve_config(ServeConfig(model=model, max_model_len=length))


def test_a_checkpoint_step_folder_is_read_through_its_model_folder(tmp_path: Path) -> None:
    step = tmp_path / "step_00000003"
    (step / "model").mkdir(parents=True)
    _model_dir(step / "model", max_position_embeddings=1024)
    with pytest.raises(ValueError, match="1024 positions"):
        check_serve_config(ServeConfig(model=str(step), max_model_len=1025))


def test_a_context_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--max-model-len must be >= 1"):
        check_serve_config(ServeConfig(model=str(tmp_path), max_model_len=0))


def test_scaled_rotary_positions_and_unknown_limits_are_left_to_the_engine(tmp_path: Path) -> None:
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    scaled = _model_dir(tmp_path, max_position_embeddings=2048, rope_scaling=yarn)
    check_serve_config(ServeConfig(model=scaled, max_model_len=8192))
    check_serve_config(ServeConfig(model=str(tmp_path / "absent"), max_model_len=8192))
