"""`--model org/name` (a hub id) that cannot be loaded, with no network or no such model, is a
refusal naming the flag, the hub's words and the fix, not a traceback from deep in the
download (transformers' OSError, or an httpx ConnectError)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import transformers

from ludic.errors import is_refusal
from ludic.recipes.training import HubModelUnavailable, load_policy


def offline_hub(error: BaseException) -> Callable[..., None]:
    def from_pretrained(*args: object, **kwargs: object) -> None:
        raise error

    return from_pretrained


@pytest.mark.parametrize(
    "error",
    [
        OSError(
            "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't "
            "find them in the cached files.\nCheck your internet connection."
        ),
        httpx.ConnectError("[Errno -3] Temporary failure in name resolution"),
    ],
)
def test_an_unreachable_hub_is_a_refusal_naming_the_flag_and_the_fix(
    error: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline_hub(error))
    with pytest.raises(HubModelUnavailable) as caught:
        load_policy("someorg/somemodel")
    message = str(caught.value)
    assert is_refusal(caught.value)
    assert message.startswith(
        "--model someorg/somemodel reads as a Hugging Face hub id ('org/name') and could not "
        "be loaded from the hub: "
    )
    assert str(error).splitlines()[0].rstrip(".") in message
    assert "Pass a local model directory" in message and "HF_HUB_OFFLINE=1" in message
    assert "\n" not in message


def test_another_error_while_loading_is_not_called_a_hub_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM,
        "from_pretrained",
        offline_hub(ValueError("unrecognized configuration class")),
    )
    with pytest.raises(ValueError, match="unrecognized configuration class"):
        load_policy("someorg/somemodel")
