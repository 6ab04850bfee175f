"""A policy version past int64 is refused where a version enters: the HTTP weight upload and
`update_weights` in process, a broadcast manifest, an engine's start version. Before, 10**23
was served (replies and samples carried it; msgpack cannot pack it, the learner refuses it)."""

from __future__ import annotations

import pytest
import torch

from ludic.distributed.manifest import ManifestError, WeightManifest, plan_manifest
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import load_tiny_model


def test_update_weights_and_a_start_version_refuse_past_int64() -> None:
    model, tokenizer = load_tiny_model()
    with pytest.raises(ValueError, match=r"policy_version must be below 2\*\*63"):
        EmbeddedEngine(model, tokenizer, policy_version=2**63)
    with EmbeddedEngine(model, tokenizer) as engine:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with pytest.raises(ValueError, match=r"version must be below 2\*\*63"):
            engine.update_weights(state, version=10**23)
        assert engine.policy_version == 0
        assert engine.update_weights(state, version=2**63 - 1) == 2**63 - 1


def test_a_manifest_past_int64_is_refused() -> None:
    tensors = {"w": torch.zeros(3)}
    manifest = plan_manifest(tensors, version=1, bucket_bytes=64).to_json()
    with pytest.raises(ManifestError, match=r"manifest version must be below 2\*\*63"):
        WeightManifest.from_json({**manifest, "version": 10**23})
