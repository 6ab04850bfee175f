"""An unverified push (`verify=False`) spares the server its checksum pass; turning verification
back on asks for the checksums again, on the same connection."""

from __future__ import annotations

import copy

import pytest
import torch
from distributed_fakes import SPEC, TOKEN, BufferedEngine, nudge_
from fastapi.testclient import TestClient

from ludic.distributed import BroadcastPolicyPublisher
from ludic.distributed.checksum import checksums
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


@pytest.mark.parametrize(
    "engine_class", [EmbeddedEngine, BufferedEngine], ids=["in_place", "buffered"]
)
@pytest.mark.parametrize("control", ["store", "http"])
def test_checksums_follow_the_verify_flag(engine_class: type[EmbeddedEngine], control: str) -> None:
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    engine = engine_class(copy.deepcopy(model), tokenizer)
    app = create_app(engine, model_name="tiny", token=TOKEN)
    with TestClient(app, base_url="http://testserver") as client:
        publisher = BroadcastPolicyPublisher(
            "http://testserver",
            TOKEN,
            http=client,
            timeout_s=20,
            verify=False,
            control=control,  # type: ignore[arg-type]
        )
        held = []
        for version, verify in enumerate([False, True, False, True], start=1):
            publisher.verify = verify
            nudge_(model, 0.01)
            publisher.publish(model, version=version)
            stats = publisher.last_push
            assert stats is not None
            held.append(stats.held_checksums)
            served = engine.model.state_dict()
            assert all(torch.equal(served[n], t) for n, t in model.state_dict().items())
        publisher.close()
    engine.close()
    assert held[0] is None and held[2] is None  # unverified: the server read nothing back
    expected = {name: list(c) for name, c in checksums(model.state_dict()).items()}
    assert held[3] == expected and held[1] is not None and held[1] != expected
