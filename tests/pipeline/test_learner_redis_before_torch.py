"""`ludic learner` with nothing listening at `--redis-url` fails naming the URL and the fix
before it imports torch or transformers (whose import took 10-40 s of the failure on a loaded
box), with or without `--model`; a `--model` path that does not exist and checkpoints in
`--out-dir` still have their refusals first (`test_pipeline_flag_checks.py`,
`test_learner_fresh_out_dir.py`). A live Redis passes the check, torch or not."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, free_port, ludic_without_torch, redis_server

from ludic.models import TinyModelSpec, tiny_model_dir
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.stream import RedisUnavailableError

pytestmark = pytest.mark.timeout(120)
__all__ = ["redis_server"]


@pytest.mark.parametrize("with_model", [False, True])
def test_no_redis_is_named_before_torch_is_imported(tmp_path: Path, with_model: bool) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # a free port: nothing listens there
    model = ["--model", str(tiny_model_dir(spec=TinyModelSpec()))] if with_model else []
    out = ["--out-dir", str(tmp_path / "run")]
    result = ludic_without_torch("learner", "--redis-url", url, "--steps", "1", *out, *model)
    assert result.returncode == 1, result.stderr
    assert f"ludic learner: error: redis at {url} unreachable since startup (PING" in result.stderr
    assert "Is Redis running there? Start it (e.g. `redis-server --port" in result.stderr
    assert "imported before the Redis check" not in result.stderr


def test_checks_that_need_torch_keep_their_place(tmp_path: Path) -> None:
    """A missing --model and checkpoints in --out-dir are checked before Redis; an existing
    --model, an empty --out-dir or a run that keeps no checkpoints are not."""
    from ludic.pipeline.flag_checks import refusals_need_torch

    model = tiny_model_dir(spec=TinyModelSpec())
    out = tmp_path / "run"
    assert not refusals_need_torch(LearnerConfig(out_dir=out, model=model))
    assert refusals_need_torch(LearnerConfig(out_dir=out, model=tmp_path / "nonexist"))
    (out / "checkpoints").mkdir(parents=True)
    assert not refusals_need_torch(LearnerConfig(out_dir=out))  # empty: nothing to check
    (out / "checkpoints" / "step_00000002").mkdir()
    assert refusals_need_torch(LearnerConfig(out_dir=out))
    assert refusals_need_torch(LearnerConfig(out_dir=out, resume=False))
    assert not refusals_need_torch(LearnerConfig(out_dir=out, checkpoint_every=None))


@pytest.mark.redis
def test_a_live_redis_passes(redis_server: RedisServer) -> None:
    from ludic.pipeline.stream_url import check_reachable

    check_reachable(redis_server.url)
    redis_server.stop()
    with pytest.raises(RedisUnavailableError, match=f"redis at {redis_server.url} unreachable"):
        check_reachable(redis_server.url)
