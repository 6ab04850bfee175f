"""What a ServerLink error says when the server refuses: the whole explanation of a JSON error
(Ludic's server and vLLM send `{"error": {"message": ...}}`, FastAPI `{"detail": ...}`), however
long, and only the start of a reply that is no JSON error (a proxy's HTML page), marked as cut."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ludic.distributed.server_link import ServerLink, ServerUnreachable, WeightPushError
from ludic.inference.http.openai_protocol import error_body

URL = "http://server0:8000"
# A refusal long enough that a cut at 500 characters loses what it asks the user to do.
LONG_REFUSAL = (
    "the weights sent do not match what this server holds: "
    + ", ".join(
        f"model.layers.{i}.mlp.up_proj.weight: sent (64, 32), holds (32, 64)" for i in range(12)
    )
    + "; start the server on the checkpoint the trainer was started from (ludic serve --model DIR)"
)


def link_answering(status: int, **reply: Any) -> ServerLink:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, **reply))
    return ServerLink(URL, "token", http=httpx.Client(base_url=URL, transport=transport))


@pytest.mark.parametrize(
    "body",
    [error_body(400, LONG_REFUSAL), {"detail": LONG_REFUSAL}, {"error": LONG_REFUSAL}],
    ids=["ludic-and-vllm", "fastapi", "plain-error"],
)
def test_a_long_json_refusal_reaches_the_error_whole(body: dict[str, Any]) -> None:
    assert len(LONG_REFUSAL) > 900
    with pytest.raises(WeightPushError) as caught:
        link_answering(400, json=body).request("POST", "/ludic/weights/init", json={})
    assert str(caught.value).startswith(
        f"server {URL}: POST /ludic/weights/init refused (400): {LONG_REFUSAL}. "
    )
    assert "cut" not in str(caught.value)


def test_a_server_failure_keeps_its_whole_message_and_says_it_may_be_down() -> None:
    with pytest.raises(ServerUnreachable) as caught:
        link_answering(500, json=error_body(500, LONG_REFUSAL)).status()
    assert str(caught.value).endswith(f"failed (500): {LONG_REFUSAL}")


def test_fastapis_validation_problems_are_kept_whole() -> None:
    problems = [{"loc": ["body", f"field{i}"], "msg": "field required"} for i in range(20)]
    with pytest.raises(WeightPushError) as caught:
        link_answering(422, json={"detail": problems}).request("POST", "/ludic/weights/start")
    assert '"field19"' in str(caught.value) and "cut" not in str(caught.value)


def test_a_page_that_is_not_ours_is_cut_with_a_note() -> None:
    page = "<html><body>" + "<p>gateway says no</p>" * 200 + "<p>THE END</p></body></html>"
    with pytest.raises(ServerUnreachable) as caught:
        link_answering(502, text=page, headers={"content-type": "text/html"}).status()
    message = str(caught.value)
    assert page[:500] in message and "THE END" not in message
    assert f"[cut: {len(page) - 500} more characters" in message and "not a JSON error" in message


def test_a_short_reply_that_is_not_json_is_quoted_whole_without_a_note() -> None:
    with pytest.raises(WeightPushError) as caught:
        link_answering(404, text="Not Found").request("GET", "/ludic/weights/status")
    assert "refused (404): Not Found. " in str(caught.value)
