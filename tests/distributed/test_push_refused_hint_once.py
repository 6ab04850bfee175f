"""A push refused because the server serves a model of other shapes names the fix once: the
server's own words (the embedded server's and the vLLM extension's) already say to start the
trainer from the model the server loaded, so the trainer's refusal adds what happened (another
model), not the same advice again. A server's words without that hint still get Ludic's."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from ludic.distributed import PushRefused
from ludic.distributed.manifest import ManifestError, check_against, plan_manifest
from ludic.distributed.server_link import ServerLink
from ludic.inference.http.openai_protocol import error_body
from ludic.inference.vllm.routes import check_push_shapes

pytestmark = pytest.mark.distributed

SERVED = {"w": torch.zeros(4, 8)}
PUSHED = plan_manifest({"w": torch.zeros(4, 16)}, version=1, bucket_bytes=1 << 20)


def _refusal(said: str) -> str:
    transport = httpx.MockTransport(lambda request: httpx.Response(400, json=error_body(400, said)))
    link = ServerLink(
        "http://s0", "token", http=httpx.Client(base_url="http://s0", transport=transport)
    )
    with pytest.raises(PushRefused) as caught:
        link.status()
    return str(caught.value)


def _embedded_servers_words() -> str:
    with pytest.raises(ManifestError) as refused:
        check_against(PUSHED, {name: tuple(t.shape) for name, t in SERVED.items()})
    return str(refused.value)


def _vllm_extensions_words(tmp_path: Path) -> str:
    from safetensors.torch import save_file

    save_file(SERVED, str(tmp_path / "model.safetensors"))
    with pytest.raises(ManifestError) as refused:
        check_push_shapes(PUSHED, str(tmp_path))
    return str(refused.value)


@pytest.mark.parametrize("server", ["embedded", "vllm"])
def test_the_same_model_hint_is_said_once(server: str, tmp_path: Path) -> None:
    said = _embedded_servers_words() if server == "embedded" else _vllm_extensions_words(tmp_path)
    assert "shape mismatches" in said and "the model the server loaded" in said, said
    message = _refusal(said)
    assert said in message
    assert message.lower().count("start the trainer from the model the server loaded") == 1
    assert "same model directory" not in message, message
    assert message.endswith(
        "The server serves another model than the trainer's (another architecture or size)"
    ), message


def test_words_without_the_hint_still_get_ludics_fix() -> None:
    message = _refusal("refused weight manifest: 3 shape mismatches, e.g. [...]")
    assert message.endswith(
        "The server serves another model than the trainer's (another architecture or size): "
        "start both from the same model directory"
    ), message
