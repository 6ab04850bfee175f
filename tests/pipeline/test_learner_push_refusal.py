"""A weight push that too few servers take (the one `--server-url` server vanished, e.g. it
exited mid-run) ends `ludic learner` with one `error:` line naming the server's URL and what to
do, not a traceback; Python callers still catch a `WeightPushError`."""

from __future__ import annotations

import pytest
from pipeline_fakes import free_port

from ludic.cli import main
from ludic.distributed import BroadcastPolicyPublisher, WeightPushError
from ludic.errors import is_refusal
from ludic.models import build_tiny_model
from ludic.pipeline import commands
from ludic.pipeline.config import LearnerConfig

pytestmark = pytest.mark.timeout(120)


def _push_to_vanished_server(url: str) -> None:
    """What the learner's publisher does once its server is gone: push, find nobody."""
    publisher = BroadcastPolicyPublisher([url], "token", timeout_s=10.0)
    try:
        model = build_tiny_model()[0]
        publisher.publish(model.state_dict(), version=1)
    finally:
        publisher.close()


def test_a_vanished_server_is_a_weight_push_error_and_a_refusal() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # a free port: the server is gone
    with pytest.raises(WeightPushError, match=r"0 of 1 servers could be reached") as caught:
        _push_to_vanished_server(url)
    assert is_refusal(caught.value)
    assert url in str(caught.value)
    assert "Start each server named again (`ludic serve`" in str(caught.value)


def test_ludic_learner_reports_it_as_one_error_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"

    def learner_whose_server_vanished(cfg: LearnerConfig) -> list[dict[str, float]]:
        _push_to_vanished_server(url)
        return []

    monkeypatch.delenv("LUDIC_TRACEBACK", raising=False)
    monkeypatch.setattr(commands, "run_learner", learner_whose_server_vanished)
    with pytest.raises(SystemExit) as exited:
        main(["learner", "--server-url", url], report_refusals=True)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if line.startswith("ludic learner: error:")]
    assert len(error_lines) == 1, err
    assert url in error_lines[0] and "rerun this command" in error_lines[0]
    assert "Traceback" not in err
