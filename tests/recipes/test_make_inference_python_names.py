"""`make_inference` called from Python names its own arguments in its refusals (`api_key=`,
`server_url=`, `batch_invariant=`, `server_token=`), as its wait already did (`server_url=`):
the API key, prepacked-GEMM, batch-invariant, token and duplicate-URL checks named the `ludic`
commands' flags (`--api-key`, `--server-url`), which a Python caller never passed. The checks
called as the commands call them keep naming the flags."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ludic.models import build_tiny_model
from ludic.recipes.inference import (
    check_api_key,
    check_prepacked_gemm,
    make_inference,
    server_push_token,
    server_urls,
)

URL = "http://127.0.0.1:1"  # nothing is asked: each refusal comes before any request
FLAG = re.compile(r"--[a-z][a-z-]*")


def _python_flags(message: str) -> list[str]:
    """The flags `message` names as this caller's settings: not those of another program, a
    command in backticks (`ludic serve --token SECRET`) or vLLM's (`vLLM --api-key`), which a
    Python caller does type."""
    message = re.sub(r"`[^`]*`", "", message).replace("vLLM --api-key", "")
    return FLAG.findall(message)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(api_key="K"), r"^api_key= is the key of the servers' inference endpoints .* "
         r"drop api_key=, or pass server_url=$"),
        (dict(prepacked_gemm=True, batch_invariant=True),
         r"^prepacked_gemm= and batch_invariant= round their GEMMs differently"),
        (dict(prepacked_gemm=True, server_url=URL, server_token="T"),
         r"^prepacked_gemm= applies to the embedded engine, not to server_url="),
        (dict(prepacked_gemm=True, device="cuda:0"), r"device= is 'cuda:0': drop prepacked_gemm="),
        (dict(batch_invariant=True, server_url=URL, server_token="T"),
         r"Drop batch_invariant= or server_url=; .* is TrainerConfig\(batch_invariant=True\)$"),
        (dict(server_url=URL), r"pass server_token= with the token"),
        (dict(server_url=URL, server_token="a b\n"), r"the control token in server_token= is"),
        (dict(server_url=[URL, URL], server_token="T"), r"^server_url= names a server twice"),
    ],
)  # fmt: skip
def test_make_inference_names_its_arguments(
    kwargs: dict[str, Any], words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    model, tokenizer = build_tiny_model(seed=0)
    with pytest.raises(ValueError, match=words) as refused:
        make_inference(model, tokenizer, **kwargs)
    assert _python_flags(str(refused.value)) == [], str(refused.value)


def test_the_commands_checks_still_name_their_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `ludic train`, `ludic actor` and `ludic learner` call them (their CLI tests pin the
    whole lines)."""
    monkeypatch.delenv("LUDIC_SERVER_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"^--api-key is the key of --server-url's inference"):
        check_api_key("K", None)
    with pytest.raises(ValueError, match=r"^--prepacked-gemm and --batch-invariant round"):
        check_prepacked_gemm(True, batch_invariant=True, server_url=None, device="cpu")
    with pytest.raises(ValueError, match=r"drop the flag here$"):
        check_prepacked_gemm(True, batch_invariant=False, server_url=URL, device="cpu")
    with pytest.raises(ValueError, match=r"Drop --batch-invariant or --server-url; .*ludic train"):
        server_push_token("T", batch_invariant=True)
    with pytest.raises(ValueError, match=r"pass --token with the token"):
        server_push_token(None, flag="--token")
    with pytest.raises(ValueError, match=r"^--server-url names a server twice"):
        server_urls([URL, URL])
