"""A training checkpoint is served (and evaluated, and sampled by the debugging actor) at the
policy version its weights were saved at, not 0: what it generates is tagged with the policy
that generated it, so a learner resumed from that checkpoint sees its samples as fresh, not
`version` steps stale. A plain model directory is version 0; an unreadable state.json is named
in a warning and gives 0."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import httpx
import pytest

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.local_server import LocalServer
from ludic.models import load_model, tiny_model_dir
from ludic.models.loading import saved_policy_version
from ludic.training.checkpoint import CheckpointConfig, CheckpointManager


def _checkpoint(tmp_path: Path, step: int, version: int) -> Path:
    """Checkpoint `step` as the Trainer writes it, its weights at policy version `version`."""
    model, tokenizer = load_model(tiny_model_dir())
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "run" / "checkpoints")))
    return manager.save(step=step, model=model, policy_version=version, tokenizer=tokenizer)


def test_the_saved_version_is_read_from_the_step_folder_or_its_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _checkpoint(tmp_path, step=6, version=5)
    assert saved_policy_version(folder) == 5
    assert saved_policy_version(folder / "model") == 5
    assert saved_policy_version(f"{folder}/model/") == 5
    assert saved_policy_version(tiny_model_dir()) == 0  # starting weights
    state = folder / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "policy_version": "five"}))
    with caplog.at_level(logging.WARNING, logger="ludic.models.loading"):
        assert saved_policy_version(folder) == 0
    assert str(state) in caplog.text and "'five'" in caplog.text, caplog.text
    state.write_text("{")
    assert saved_policy_version(folder) == 0
    # a model/ beside some other state.json, without the Trainer's manifest: not a checkpoint
    other = tmp_path / "project"
    shutil.copytree(tiny_model_dir(), other / "model")
    (other / "state.json").write_text(json.dumps({"policy_version": 12}))
    assert saved_policy_version(other / "model") == 0


def test_an_engine_from_a_checkpoint_starts_at_its_version_unless_told(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, step=4, version=3)
    with EmbeddedEngine.from_pretrained(folder) as engine:
        assert engine.policy_version == 3
    with EmbeddedEngine.from_pretrained(folder, policy_version=0) as engine:
        assert engine.policy_version == 0
    with EmbeddedEngine.from_pretrained(tiny_model_dir()) as engine:
        assert engine.policy_version == 0


@pytest.mark.slow
def test_ludic_serve_on_a_checkpoint_reports_its_version(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, step=8, version=7)
    with LocalServer(folder, token="t0k") as server:
        auth = {"Authorization": "Bearer t0k"}
        version = httpx.get(server.url + "/ludic/version", headers=auth, timeout=30)
        assert version.json() == {"policy_version": 7}
        reply = httpx.post(
            server.url + "/v1/completions",
            json={"model": "ludic", "prompt": [1, 2], "max_tokens": 1},
            headers=auth,
            timeout=30,
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-ludic-policy-version"] == "7"


@pytest.mark.slow
def test_ludic_serve_policy_version_0_starts_a_new_run_from_a_checkpoint(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, step=8, version=7)
    with LocalServer(folder, token="t0k", args=["--policy-version", "0"]) as server:
        auth = {"Authorization": "Bearer t0k"}
        version = httpx.get(server.url + "/ludic/version", headers=auth, timeout=30)
        assert version.json() == {"policy_version": 0}


def test_a_negative_serve_policy_version_is_refused_before_loading() -> None:
    from ludic.inference.http.serve_config import ServeConfig, check_serve_config

    with pytest.raises(ValueError, match="--policy-version must be >= 0, got -2"):
        check_serve_config(ServeConfig(model="anything", policy_version=-2))


def test_the_embedded_actor_takes_the_checkpoints_version_or_its_flag(tmp_path: Path) -> None:
    from ludic.pipeline.commands import _embedded_engine
    from ludic.pipeline.config import ActorConfig
    from ludic.pipeline.flag_checks import check_actor_counts

    folder = _checkpoint(tmp_path, step=4, version=3)
    with _embedded_engine(ActorConfig(model=str(folder))) as engine:
        assert engine.policy_version == 3
    with _embedded_engine(ActorConfig(model=str(folder), policy_version=0)) as engine:
        assert engine.policy_version == 0
    with pytest.raises(ValueError, match="ludic serve --policy-version"):
        check_actor_counts(ActorConfig(server_url="http://127.0.0.1:8000", policy_version=0))
    with pytest.raises(ValueError, match="--policy-version must be >= 0, got -1"):
        check_actor_counts(ActorConfig(policy_version=-1))
