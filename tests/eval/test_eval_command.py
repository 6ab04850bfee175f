"""`ludic eval` end to end on the embedded engine over the tiny local model: a user env given
as `module:factory`, records and a summary table written, then viewed with the real tokenizer."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from ludic.eval.command import EvalConfig, run_eval_command
from ludic.eval.env_spec import import_object, resolve_env_factory, resolve_parser
from ludic.parsers import identity_parser
from ludic.viz import ViewConfig, view_command


def test_eval_command_on_tiny_model_then_view(tmp_path: Path) -> None:
    from ludic.models import tiny_model_dir

    console = Console(record=True, width=100)
    cfg = EvalConfig(
        env="eval_fakes:QuizEnv",
        env_kwargs='{"hint": "close"}',
        model=str(tiny_model_dir()),
        num_problems=2,
        samples_per_problem=2,
        max_steps=1,
        max_tokens=4,
        temperature=0.0,
        out_dir=tmp_path / "eval",
        progress=False,
    )
    result = run_eval_command(cfg, console=console)
    assert len(result.episodes) == 4 and not any(e.failed for e in result.episodes)
    assert [e.env_seed for e in result.episodes] == [0, 0, 1, 1]
    assert result.metrics["episodes"] == 4 and "pass@2" in result.metrics
    text = console.export_text()
    assert "ludic eval: eval_fakes:QuizEnv" in text and "pass@2" in text
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics == pytest.approx(result.metrics)
    steps = (tmp_path / "eval" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 4 and all(json.loads(s)["completion_tokens"] <= 4 for s in steps)

    page = view_command(
        ViewConfig(rollouts=tmp_path / "eval" / "rollouts.jsonl", tokenizer=str(cfg.model)),
        console=console,
    )
    html = page.read_text()
    assert page.suffix == ".html" and '"tokenizer":' + json.dumps(str(cfg.model)) in html


def test_env_and_parser_resolution_errors(tmp_path: Path) -> None:
    assert resolve_env_factory("eval_fakes:QuizEnv").__name__ == "QuizEnv"
    with pytest.raises(ValueError, match="not an import string"):
        import_object("eval_fakes")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        resolve_env_factory("eval_fakes:Nope")
    with pytest.raises(ValueError, match="cannot import module"):
        resolve_env_factory("no_such_module_xyz:Env")
    with pytest.raises(ValueError, match=r"unknown env .no-such-env.|no built-in env registry"):
        resolve_env_factory("no-such-env")
    assert resolve_parser("auto") is identity_parser
    assert resolve_parser("xml:move")("<move>a</move>").action == "a"
    assert resolve_parser("boxed")(r"\boxed{7}").action == "7"
    with pytest.raises(ValueError, match="unknown parser"):
        resolve_parser("regex")
    with pytest.raises(ValueError, match="JSON object"):
        run_eval_command(
            EvalConfig(env="eval_fakes:QuizEnv", env_kwargs="[1]", out_dir=tmp_path / "eval")
        )


@pytest.mark.parametrize("served_model", ["tiny", None])  # None: asked from /v1/models
def test_eval_command_against_an_openai_compatible_server(
    tmp_path: Path, served_model: str | None
) -> None:
    import uvicorn

    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.inference.http.server import create_app
    from ludic.models import tiny_model_dir

    engine = EmbeddedEngine.from_pretrained(tiny_model_dir())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, model_name="tiny"), log_level="error")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.05)
        result = run_eval_command(
            EvalConfig(
                env="eval_fakes:QuizEnv",
                server_url=f"http://127.0.0.1:{port}/v1",
                served_model=served_model,
                num_problems=2,
                max_steps=1,
                max_tokens=4,
                out_dir=tmp_path / "eval",
                progress=False,
            ),
            console=Console(record=True),
        )
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.close()
        sock.close()
    assert [e.failed for e in result.episodes] == [False, False], result.episodes
    calls = [s for r in result.rollouts for s in r.agent_steps]
    assert all(s.trace is not None and 0 < len(s.trace.completion_token_ids) <= 4 for s in calls)


def _sampling_records(node: object) -> list[dict[str, float]]:
    """Every `sampling` dict of a rollouts.jsonl record (one per model call)."""
    if isinstance(node, dict):
        found = [node["sampling"]] if isinstance(node.get("sampling"), dict) else []
        return found + [s for value in node.values() for s in _sampling_records(value)]
    if isinstance(node, list):
        return [s for value in node for s in _sampling_records(value)]
    return []


def test_eval_samples_under_top_p(tmp_path: Path) -> None:
    """`ludic eval --top-p 0.9` (as a run trained with `ludic train --top-p 0.9`): every model
    call of the episodes is sampled under it."""
    from ludic.cli import main as ludic_main
    from ludic.models import tiny_model_dir

    out = tmp_path / "eval"
    args = ["eval", "--env", "eval_fakes:QuizEnv", "--model", str(tiny_model_dir())]
    args += ["--num-problems", "2", "--max-steps", "1", "--max-tokens", "4", "--no-progress"]
    ludic_main([*args, "--temperature", "0.7", "--top-p", "0.9", "--out-dir", str(out)])
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    calls = [s for line in lines for s in _sampling_records(json.loads(line))]
    assert len(calls) >= 2
    assert {(s["temperature"], s["top_p"]) for s in calls} == {(0.7, 0.9)}


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_a_top_p_out_of_range_is_refused_before_the_model_loads(
    top_p: float, tmp_path: Path
) -> None:
    cfg = EvalConfig(env="eval_fakes:QuizEnv", model=str(tmp_path / "none"), top_p=top_p)
    with pytest.raises(ValueError, match=r"^--top-p must be in \(0, 1\], got "):
        run_eval_command(cfg)  # the model dir does not exist: the check came first


def test_engine_only_flags_are_refused_with_a_server_url() -> None:
    url = "http://127.0.0.1:1/v1"
    with pytest.raises(ValueError, match="--threads sets the embedded engine's"):
        run_eval_command(EvalConfig(env="eval_fakes:QuizEnv", server_url=url, threads=2))
    with pytest.raises(ValueError, match="--batch-invariant applies to the embedded engine"):
        run_eval_command(EvalConfig(env="eval_fakes:QuizEnv", server_url=url, batch_invariant=True))


def test_a_user_module_not_found_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--env lights:LightsEnv` run from another folder than lights.py's: the refusal names the
    working directory (importable, as with `python -m`) and the file it looked for."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="cannot import module 'no_such_env_xyz'") as refused:
        resolve_env_factory("no_such_env_xyz:LightsEnv")
    assert f"no_such_env_xyz.py in {tmp_path}" in str(refused.value)
    assert "run from the folder that holds it" in str(refused.value)
    with pytest.raises(ValueError, match=r"cannot import module 'pkg_xyz\.envs'") as refused:
        resolve_env_factory("pkg_xyz.envs:Env")
    assert "pkg_xyz/envs.py" in str(refused.value)


def test_xml_parser_without_a_tag_names_the_form() -> None:
    with pytest.raises(ValueError, match=r"--parser xml: needs a tag, e.g. xml:move"):
        resolve_parser("xml:")
