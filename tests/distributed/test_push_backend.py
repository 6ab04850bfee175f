"""Which collective a CUDA trainer pushes over: NCCL only where NCCL can join the server (another
GPU), gloo for a CPU server or one on the trainer's own GPU (NCCL refuses two processes on one
GPU: found on an H200, where the push failed with only "its receive failed"). The GPU path
itself: tests/recipes/test_train_cuda.py."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from ludic.distributed.push_backend import device_identity, push_backend
from ludic.recipes.inference import Spell, as_argument, as_flag

ON_GPU0 = {"device": "cuda:0", "device_uuid": "GPU-aaaa"}
ON_GPU1 = {"device": "cuda:1", "device_uuid": "GPU-bbbb"}


def test_a_cpu_trainer_always_pushes_over_gloo() -> None:
    assert push_backend("cpu", {"http://a": ON_GPU0}) == ("gloo", None)


def test_servers_on_other_gpus_get_nccl() -> None:
    statuses = {"http://a": ON_GPU1, "http://b": {"device": "cuda:2", "device_uuid": "GPU-c"}}
    assert push_backend("cuda:0", statuses, trainer_uuid="GPU-aaaa") == ("nccl", None)


def test_a_server_that_does_not_say_where_it_serves_keeps_nccl() -> None:
    statuses = {"http://vllm": {"connected": False}}
    assert push_backend("cuda", statuses, trainer_uuid="GPU-aaaa") == ("nccl", None)


def test_a_server_on_the_trainers_gpu_gets_gloo_and_the_reason() -> None:
    backend, why = push_backend(
        "cuda:0", {"http://a": ON_GPU1, "http://b": ON_GPU0}, trainer_uuid="GPU-aaaa"
    )
    assert backend == "gloo"
    assert why is not None and "http://b" in why and "one GPU" in why and "GPU-aaaa" in why


def test_the_same_gpu_reason_names_no_commands_flag_by_default() -> None:
    """It said "drop --server-url" also to a Python caller, who never passed that flag."""
    _, why = push_backend("cuda:0", {"http://b": ON_GPU0}, trainer_uuid="GPU-aaaa")
    assert why is not None and "drop the server URL to serve from the trainer's process" in why
    assert "--server-url" not in why


@pytest.mark.parametrize(
    ("spell", "words"), [(as_argument, "drop server_url= to"), (as_flag, "drop --server-url to")]
)
def test_make_inferences_reason_names_the_server_setting_as_its_caller_gave_it(
    spell: Spell, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`push_backend_for` as `make_inference` calls it, with its `spell` (`as_argument` from
    Python, `as_flag` from a command), against a server on the trainer's own GPU (faked: the
    choice is made before any tensor moves, so no GPU is needed)."""
    import httpx
    import torch

    import ludic.distributed.push_backend as backends
    from ludic.recipes import inference

    reply = httpx.Response(200, json=ON_GPU0, request=httpx.Request("GET", "http://srv"))
    monkeypatch.setattr(httpx, "get", lambda url, **kwargs: reply)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backends, "gpu_uuid", lambda device: "GPU-aaaa")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert inference.push_backend_for(["http://srv"], "t", "cuda:0", spell=spell) == "gloo"
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "on the trainer's GPU (GPU-aaaa)" in said[0], said
    assert words in said[0], said


def test_a_server_on_the_cpu_gets_gloo_and_the_reason() -> None:
    backend, why = push_backend(
        "cuda", {"http://a": {"device": "cpu", "device_uuid": None}}, trainer_uuid="GPU-aaaa"
    )
    assert backend == "gloo" and why is not None and "serves on cpu" in why


def test_device_identity_off_the_gpu_has_no_uuid() -> None:
    assert device_identity("cpu") == {"device": "cpu", "device_uuid": None}


def test_ludic_serve_reports_its_device_and_make_inference_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real route: a CPU `ludic serve` app says it serves on the CPU, so a CUDA trainer's
    `make_inference` chooses gloo and warns why (no GPU needed: the choice is made before any
    tensor moves)."""
    import httpx
    from fastapi.testclient import TestClient

    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.inference.http.server import create_app
    from ludic.models import build_tiny_model
    from ludic.recipes import inference

    model, tokenizer = build_tiny_model(seed=0)
    with EmbeddedEngine(model, tokenizer) as engine:
        app = create_app(engine, model_name="tiny", token="t")
        with TestClient(app) as client:
            status = client.get("/ludic/weights/status", headers={"Authorization": "Bearer t"})
            assert status.status_code == 200
            assert (status.json()["device"], status.json()["device_uuid"]) == ("cpu", None)

            def get(url: str, **kwargs: Any) -> Any:
                return client.get(url.removeprefix("http://srv"), **kwargs)

            monkeypatch.setattr(httpx, "get", get)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                backend = inference.push_backend_for(["http://srv"], "t", "cuda:0")
    assert backend == "gloo"
    assert any("serves on cpu" in str(w.message) for w in caught)
    assert inference.push_backend_for(["http://srv"], "t", "cpu") == "gloo"


def test_a_server_that_left_the_group_says_why_in_the_trainers_error() -> None:
    """The H200 run's push failed with only "its receive failed": the server knew NCCL's reason
    (its status's last_error) and the trainer did not pass it on."""
    import httpx

    from ludic.distributed.server_link import ServerLink

    nccl = "receiving weights failed (DistBackendError: NCCL error: Duplicate GPU detected)"

    def status_with(last_error: str | None) -> ServerLink:
        body = {"connected": False, "joining": False, "last_error": last_error}
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
        return ServerLink(
            "http://s", "t", http=httpx.Client(base_url="http://s", transport=transport)
        )

    why = status_with(nccl).why_gone()
    assert why is not None and "http://s" in why and "Duplicate GPU detected" in why
    assert "restarted" in (status_with(None).why_gone() or "")
