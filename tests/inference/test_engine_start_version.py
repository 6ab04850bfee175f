"""The policy version an `EmbeddedEngine` starts at is an int >= 0, as `ludic serve
--policy-version` and every push require: `EmbeddedEngine.from_pretrained(path,
policy_version=-2)` served at version -2 and stamped every sample with it (and a learner
counts a negative version as a sample from before its first push). `from_pretrained` refuses
before the model loads."""

from __future__ import annotations

import pytest

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import load_tiny_model, tiny_model_dir


@pytest.mark.parametrize("version", [-2, 1.5, True, "3"])
def test_a_start_version_that_is_not_an_int_at_least_0_is_refused(
    version: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = load_tiny_model()
    with pytest.raises(ValueError, match=rf"policy_version must be an int >= 0, got {version!r}"):
        EmbeddedEngine(model, tokenizer, policy_version=version)  # type: ignore[arg-type]

    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model loaded before the version was checked")

    monkeypatch.setattr("ludic.models.loading.load_model", load)
    with pytest.raises(ValueError, match="policy_version must be an int >= 0"):
        EmbeddedEngine.from_pretrained(tiny_model_dir(), policy_version=version)  # type: ignore[arg-type]


def test_version_0_and_above_start_as_given() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer, policy_version=7) as engine:
        assert engine.policy_version == 7
    with EmbeddedEngine.from_pretrained(tiny_model_dir(), policy_version=0) as engine:
        assert engine.policy_version == 0
