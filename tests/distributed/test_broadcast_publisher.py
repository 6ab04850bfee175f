"""BroadcastPolicyPublisher against the embedded server app in process (FastAPI TestClient,
real gloo group): pushes change the served weights and version, bad pushes are caught."""

from __future__ import annotations

import copy
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from distributed_fakes import SPEC, TOKEN, BufferedEngine, nudge_
from fastapi.testclient import TestClient

from ludic.distributed import (
    BroadcastPolicyPublisher,
    PolicyPublisher,
    PublishVerificationError,
    WeightPushError,
)
from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import adjacent_view
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Rig:
    trainer_model: torch.nn.Module
    engine: EmbeddedEngine
    client: TestClient
    sabotage: dict[str, str]
    control: str
    flat: bool = False

    def publisher(self, **kwargs: object) -> BroadcastPolicyPublisher:
        if self.flat:  # tensors >= 2 KB count as large: back to back, they share buckets
            kwargs = {"pack_below_mb": 2048 / 2**20, "bucket_mb": 20000 / 2**20, **kwargs}
            kwargs.setdefault("piece_mb", 8192 / 2**20)
        return BroadcastPolicyPublisher(
            "http://testserver",
            TOKEN,
            http=self.client,
            timeout_s=20,
            control=self.control,  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )


def flatten_parameters_(model: torch.nn.Module) -> torch.Tensor:
    """Make every parameter a view of one flat buffer (as a trainer with flat parameters)."""
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params))
    offset = 0
    with torch.no_grad():
        for p in params:
            view = flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            offset += p.numel()
    return flat


@pytest.fixture(
    params=[
        ("buffered", "http"),
        ("in_place", "http"),
        ("buffered", "store"),
        ("in_place", "store"),
        ("buffered", "http", "flat"),
        ("in_place", "store", "flat"),
    ],
    ids=lambda p: "-".join(p),
)
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    """The embedded server over an engine that receives in place or into buffers, driven by
    HTTP requests (what the vLLM extension speaks) or by the trainer's store; "flat": the
    trainer's parameters are views of one buffer, so large tensors share buckets."""
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    receive, control = request.param[:2]
    flat = "flat" in request.param
    engine_class = EmbeddedEngine if receive == "in_place" else BufferedEngine
    engine = engine_class(copy.deepcopy(model), tokenizer)
    if flat:
        flatten_parameters_(model)
    sabotage = {"mode": "none"}
    _sabotage(engine, sabotage)
    app = create_app(engine, model_name="tiny", token=TOKEN)  # mounts /ludic/weights/*
    with TestClient(app, base_url="http://testserver") as client:
        yield Rig(model, engine, client, sabotage, control, flat)
    engine.close()


def _kept_old(mode: str, old: dict[str, torch.Tensor], new: Any) -> set[str]:
    """The tensors a sabotaged load leaves as they were."""
    if mode in ("skip_load", "skip_all"):
        return set(old)
    if mode == "skip_norm":
        return {"model.norm.weight"}
    if mode == "drop_small":  # a receiver that drops updates it considers negligible
        return {n for n in old if (new[n] - old[n]).abs().max() <= 1e-5}
    return set()


def _sabotage(engine: EmbeddedEngine, sabotage: dict[str, str]) -> None:
    """Modes: skip_load (receive the bytes, keep the old weights, bump the version); skip_all
    (keep the old weights and version, report success); skip_norm (load all but the final
    norm); drop_small (drop tensors that moved by <= 1e-5); nan / inf (load correctly, but the
    forward gives a non-finite logprob at one position)."""
    update_weights = engine.update_weights

    def sabotaged_update(state: Any, *, version: int | None = None, strict: bool = True) -> int:
        old = {k: v.clone() for k, v in engine.model.state_dict().items()}
        kept = _kept_old(sabotage["mode"], old, state)
        if sabotage["mode"] == "skip_all":
            return version if version is not None else 0
        kept_state = {k: v for k, v in state.items() if k not in kept}
        return update_weights(kept_state, version=version, strict=strict and not kept)

    engine.update_weights = sabotaged_update  # type: ignore[method-assign]
    in_place = engine.update_weights_in_place
    if in_place is not None:

        def sabotaged_in_place(fill: Any, *, version: int | None = None) -> int:
            if sabotage["mode"] in ("none", "nan", "inf"):
                return in_place(fill, version=version)
            old = {k: v.clone() for k, v in engine.model.state_dict().items()}

            def fill_then_undo(model: torch.nn.Module) -> None:
                fill(model)
                live = model.state_dict()
                with torch.no_grad():
                    for name in _kept_old(sabotage["mode"], old, live):
                        live[name].copy_(old[name])

            if sabotage["mode"] == "skip_all":
                in_place(fill_then_undo, version=engine.policy_version)
                return version if version is not None else 0
            return in_place(fill_then_undo, version=version)

        engine.update_weights_in_place = sabotaged_in_place  # type: ignore[method-assign]
    logprobs = engine.logprobs

    def sabotaged_logprobs(token_ids: Any) -> list[float]:
        sabotage["probes"] = sabotage.get("probes", "") + "."  # counts probe requests
        values = logprobs(token_ids)
        if sabotage["mode"] in ("nan", "inf"):
            values[2] = math.nan if sabotage["mode"] == "nan" else -math.inf
        return values

    engine.logprobs = sabotaged_logprobs  # type: ignore[method-assign]


def _served_equals(rig: Rig, model: torch.nn.Module) -> bool:
    served = rig.engine.model.state_dict()
    return all(torch.equal(served[n], t) for n, t in model.state_dict().items())


def test_push_changes_served_weights_version_and_outputs(rig: Rig) -> None:
    publisher = rig.publisher(bucket_mb=0.01)  # ~10 KB buckets: many broadcasts
    assert isinstance(publisher, PolicyPublisher)
    probe = [3, 14, 15, 92, 65]
    before = rig.engine.logprobs(probe)
    nudge_(rig.trainer_model, 0.05)
    publisher.publish(rig.trainer_model, version=1)
    assert rig.engine.policy_version == 1 and _served_equals(rig, rig.trainer_model)
    assert rig.engine.logprobs(probe) != before
    stats = publisher.last_push
    assert stats is not None and stats.num_buckets > 3 and stats.version == 1
    assert stats.num_bytes == sum(t.numel() * 4 for t in rig.trainer_model.state_dict().values())
    nudge_(rig.trainer_model, -0.02)
    publisher.publish(rig.trainer_model.state_dict(), version=2)  # a state dict works too
    assert rig.engine.policy_version == 2 and _served_equals(rig, rig.trainer_model)
    publisher.close()


def test_bfloat16_wire_dtype_arrives_rounded(rig: Rig) -> None:
    publisher = rig.publisher(wire_dtype=torch.bfloat16, atol=0.1)
    nudge_(rig.trainer_model, 0.05)
    publisher.publish(rig.trainer_model, version=1)
    for name, tensor in rig.trainer_model.state_dict().items():
        expected = tensor.to(torch.bfloat16).float()
        assert torch.equal(rig.engine.model.state_dict()[name], expected), name
    publisher.close()


def _adam_step_(model: torch.nn.Module, lr: float) -> None:
    """One real optimizer step: every parameter moves by about `lr`."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_server_that_reports_the_version_but_never_loads_is_caught(rig: Rig) -> None:
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    rig.sabotage["mode"] = "skip_load"
    _adam_step_(rig.trainer_model, lr=1e-2)
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        publisher.publish(rig.trainer_model, version=2)
    assert "policy version" not in str(info.value)  # the version did move
    assert rig.engine.policy_version == 2


def test_a_server_that_skips_the_final_norm_is_caught(rig: Rig) -> None:
    publisher = rig.publisher()
    rig.sabotage["mode"] = "skip_norm"
    _adam_step_(rig.trainer_model, lr=1e-2)
    with pytest.raises(PublishVerificationError, match=r"1 tensors .*\[model\.norm\.weight\]"):
        publisher.publish(rig.trainer_model, version=1)


def test_a_server_that_drops_a_tiny_adam_step_is_caught(rig: Rig) -> None:
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    rig.sabotage["mode"] = "drop_small"
    _adam_step_(rig.trainer_model, lr=1e-6)
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        publisher.publish(rig.trainer_model, version=2)
    assert "probe logprobs differ" not in str(info.value)  # too small for the probe to see


@pytest.mark.parametrize("mode", ["nan", "inf"])
def test_non_finite_served_logprobs_fail(rig: Rig, mode: str) -> None:
    publisher = rig.publisher(atol=1e9)  # no finite gap fails; nan and inf still do
    rig.sabotage["mode"] = mode
    with pytest.raises(PublishVerificationError, match=r"server's probe logprobs are not finite"):
        publisher.publish(rig.trainer_model, version=1)


def test_probe_on_the_first_push_and_every_nth_checksums_always(rig: Rig) -> None:
    publisher = rig.publisher(probe_every=3)
    for version in range(1, 6):
        nudge_(rig.trainer_model, 0.01)
        publisher.publish(rig.trainer_model, version=version)
    assert rig.sabotage.get("probes") == ".."  # pushes 1 and 4
    rig.sabotage["mode"] = "skip_norm"  # push 6 is not probed: the checksums catch it
    nudge_(rig.trainer_model, 0.01)
    with pytest.raises(PublishVerificationError, match=r"model\.norm\.weight"):
        publisher.publish(rig.trainer_model, version=6)
    assert rig.sabotage.get("probes") == ".."


def test_state_dict_pushes_are_probed_with_the_probe_model(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # The Trainer publishes state dicts: the probe then runs the trainer's live model.
    publisher = rig.publisher(probe_model=rig.trainer_model)
    nudge_(rig.trainer_model, 0.05)
    rig.sabotage["mode"] = "skip_norm"  # the served forward differs from the probe model's
    with pytest.raises(PublishVerificationError, match="probe logprobs differ"):
        publisher.publish(dict(rig.trainer_model.state_dict()), version=1)
    rig.sabotage["mode"] = "none"
    blind = rig.publisher()  # no probe model: the weights are checked, the forward is not
    with caplog.at_level("WARNING"):
        blind.publish(dict(rig.trainer_model.state_dict()), version=2)
    assert "not the server's forward" in caplog.text
    assert _served_equals(rig, rig.trainer_model)


def test_sync_that_did_nothing_reports_version_checksums_and_probe(rig: Rig) -> None:
    publisher = rig.publisher()
    rig.sabotage["mode"] = "skip_all"
    nudge_(rig.trainer_model, 0.05)
    with pytest.raises(PublishVerificationError) as info:
        publisher.publish(rig.trainer_model, version=1)
    assert "reports policy version 0, expected 1" in str(info.value)
    assert "differ from the ones sent" in str(info.value)
    assert "probe logprobs differ" in str(info.value)


def test_architecture_mismatch_is_refused_before_any_byte(rig: Rig) -> None:
    publisher = rig.publisher()
    state = dict(rig.trainer_model.state_dict())
    state["lm_head.weight"] = torch.zeros(3, 3)
    with pytest.raises(WeightPushError, match=r"400.*lm_head.weight: sent \(3, 3\)"):
        publisher.publish(state, version=1)
    # the group is still usable: the next good push goes through
    publisher.publish(rig.trainer_model, version=1)
    assert rig.engine.policy_version == 1


def test_wrong_token_fails_fast(rig: Rig) -> None:
    publisher = BroadcastPolicyPublisher("http://testserver", "nope", http=rig.client)
    with pytest.raises(WeightPushError, match="401"):
        publisher.publish(rig.trainer_model, version=1)


def test_reconnects_after_the_server_drops_the_group(rig: Rig) -> None:
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    publisher.close()  # the server forgets the group; the next publish joins a new one
    nudge_(rig.trainer_model, 0.05)
    publisher.publish(rig.trainer_model, version=2)
    assert rig.engine.policy_version == 2 and _served_equals(rig, rig.trainer_model)


def test_non_zero_ranks_return_without_contacting_the_server(rig: Rig) -> None:
    publisher = BroadcastPolicyPublisher("http://127.0.0.1:9", TOKEN, rank=1)  # nothing listens
    publisher.publish(rig.trainer_model, version=1)
    assert publisher.last_push is None


def _listeners() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ludic-weights-listen" and t.is_alive()]


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_store_control_acks_each_layout_once(rig: Rig) -> None:
    if rig.control != "store":
        pytest.skip("store control only")
    others = set(_listeners())  # left by earlier tests' publishers
    publisher = rig.publisher()
    for version in (1, 2):
        nudge_(rig.trainer_model, 0.05)
        publisher.publish(rig.trainer_model, version=version)
        assert rig.engine.policy_version == version and _served_equals(rig, rig.trainer_model)
    assert publisher._channel is not None and len(publisher._channel.accepted) == 1
    publisher.wire_dtype = torch.bfloat16  # a new layout: sent in full and acked again
    publisher.atol = 0.1
    publisher.publish(rig.trainer_model, version=3)
    assert len(publisher._channel.accepted) == 2 and rig.engine.policy_version == 3
    manifest = plan_manifest(rig.trainer_model.state_dict(), version=4, bucket_bytes=1 << 20)
    reply = rig.client.post("/ludic/weights/start", headers=AUTH, json=manifest.to_json())
    assert reply.status_code == 409 and "driven through the trainer's store" in reply.text
    publisher.close()  # /close returns once the listener is done with the trainer's store
    assert not set(_listeners()) - others
    assert rig.client.get("/ludic/weights/status", headers=AUTH).json()["last_error"] is None


def test_store_control_keys_do_not_pile_up(rig: Rig) -> None:
    if rig.control != "store":
        pytest.skip("store control only")
    publisher = rig.publisher()
    for version in range(1, 5):
        publisher.publish(rig.trainer_model, version=version)
    earlier = [f"ludic-control/{kind}/{n}" for kind in ("push", "ack", "done") for n in range(3)]
    assert _wait_until(lambda: not any(publisher._store.check([key]) for key in earlier))
    publisher.close()


def test_a_replaced_module_is_published(rig: Rig) -> None:
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    norm = copy.deepcopy(rig.trainer_model.model.norm)
    with torch.no_grad():
        norm.weight.mul_(3.0)
    rig.trainer_model.model.norm = norm  # a new module, new parameter objects
    publisher.publish(rig.trainer_model, version=2)
    assert torch.equal(rig.engine.model.model.norm.weight, norm.weight)
    assert _served_equals(rig, rig.trainer_model)


def test_listener_stops_when_the_trainer_goes_away(rig: Rig) -> None:
    if rig.control != "store":
        pytest.skip("store control only")
    others = set(_listeners())  # left by earlier tests' publishers
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    assert set(_listeners()) - others
    publisher._drop_group()  # the trainer's store (and group) vanish without a goodbye
    gc.collect()
    assert _wait_until(lambda: not set(_listeners()) - others)
    status = rig.client.get("/ludic/weights/status", headers=AUTH).json()
    assert "lost the trainer's store" in status["last_error"]
    publisher.publish(rig.trainer_model, version=2)  # a new connection works
    assert rig.engine.policy_version == 2
    status = rig.client.get("/ludic/weights/status", headers=AUTH).json()
    assert status["last_error"] is None  # the old group's loss is not the new one's state


def test_close_returns_once_the_listener_let_go_of_the_trainers_store(rig: Rig) -> None:
    """A trainer frees its store right after `/close`: the listener must be done with it by
    then (else its last store call fails: a c10d stack trace and a bogus `last_error`)."""
    if rig.control != "store":
        pytest.skip("store control only")
    others = set(_listeners())  # left by earlier tests' publishers
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)
    assert set(_listeners()) - others
    reply = rig.client.post("/ludic/weights/close", headers=AUTH)  # no close on the channel
    assert reply.status_code == 200 and not set(_listeners()) - others
    publisher._drop_group()
    gc.collect()
    assert rig.client.get("/ludic/weights/status", headers=AUTH).json()["last_error"] is None


def test_packed_buckets_land_in_the_engines_own_memory(rig: Rig) -> None:
    if not hasattr(rig.engine, "update_weights_in_place") or not callable(
        rig.engine.update_weights_in_place
    ):
        pytest.skip("in-place engines only")
    publisher = rig.publisher()
    publisher.publish(rig.trainer_model, version=1)  # the first push lays the buckets out
    manifest_groups = [
        [e.name for e in entries]
        for entries in plan_manifest(
            rig.trainer_model.state_dict(),
            version=0,
            bucket_bytes=publisher.bucket_bytes,
            alone_bytes=publisher.alone_bytes,
        ).bucket_entries()
    ]
    served = rig.engine.model.state_dict()
    packed = [names for names in manifest_groups if len(names) > 1]
    assert packed
    assert all(adjacent_view([served[n] for n in names]) is not None for names in packed)
    pointers = {n: t.data_ptr() for n, t in served.items()}
    nudge_(rig.trainer_model, 0.05)
    publisher.publish(rig.trainer_model, version=2)
    served = rig.engine.model.state_dict()
    assert {n: t.data_ptr() for n, t in served.items()} == pointers  # received in place
    assert _served_equals(rig, rig.trainer_model)


def test_flat_trainer_parameters_travel_as_few_spans_and_land_in_place(rig: Rig) -> None:
    """Parameters lying back to back share buckets (fewer broadcasts), sent without a packing
    copy and, on an in-place server, received straight into its parameters after the first
    push; verification (checksums of every tensor, the probe) still passes and still fails a
    server that skips one tensor."""
    if not rig.flat:
        pytest.skip("flat trainer parameters only")
    publisher = rig.publisher()
    nudge_(rig.trainer_model, 0.05)
    publisher.publish(rig.trainer_model, version=1)
    stats = publisher.last_push
    assert stats is not None and _served_equals(rig, rig.trainer_model)
    num_tensors = len(rig.trainer_model.state_dict())
    assert 1 < stats.num_buckets < num_tensors - 2  # large tensors share spans
    assert publisher._pool.nbytes == 0  # every bucket was sent from the parameters' memory
    served = rig.engine.model.state_dict()
    pointers = {n: t.data_ptr() for n, t in served.items()}
    _adam_step_(rig.trainer_model, lr=1e-2)
    publisher.publish(rig.trainer_model, version=2)
    assert _served_equals(rig, rig.trainer_model)
    if callable(getattr(rig.engine, "update_weights_in_place", None)):
        served = rig.engine.model.state_dict()
        assert {n: t.data_ptr() for n, t in served.items()} == pointers  # received in place
    rig.sabotage["mode"] = "skip_norm"
    _adam_step_(rig.trainer_model, lr=1e-2)
    with pytest.raises(PublishVerificationError, match=r"1 tensors .*\[model\.norm\.weight\]"):
        publisher.publish(rig.trainer_model, version=3)


def test_server_shutdown_ends_the_listener(rig: Rig) -> None:
    if rig.control != "store":
        pytest.skip("store control only")
    others = set(_listeners())
    app = create_app(rig.engine, model_name="tiny", token=TOKEN)
    with TestClient(app, base_url="http://testserver") as client:
        publisher = BroadcastPolicyPublisher(
            "http://testserver", TOKEN, http=client, timeout_s=20, control="store"
        )
        publisher.publish(rig.trainer_model, version=1)
        assert set(_listeners()) - others
    assert _wait_until(lambda: not set(_listeners()) - others)  # the publisher never closed


def test_a_server_of_another_dtype_is_checked_against_casts_taken_beside_the_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ludic.distributed.held_check as held_check

    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    engine = EmbeddedEngine(copy.deepcopy(model).to(torch.bfloat16), tokenizer)
    sabotage = {"mode": "none"}
    _sabotage(engine, sabotage)
    after_reply: list[str] = []
    whole = held_check.checksums

    def counting(tensors: Any, **kwargs: Any) -> Any:
        after_reply.extend(tensors)
        return whole(tensors, **kwargs)

    monkeypatch.setattr(held_check, "checksums", counting)
    app = create_app(engine, model_name="tiny", token=TOKEN)
    with TestClient(app, base_url="http://testserver") as client:
        publisher = BroadcastPolicyPublisher(
            "http://testserver", TOKEN, http=client, timeout_s=20, control="store", piece_mb=0.001
        )
        _adam_step_(model, lr=1e-2)
        publisher.publish(model, version=1)  # fp32 sent, bf16 held: compared as the cast
        assert publisher._served_dtype == "bfloat16" and after_reply == []
        served = engine.model.state_dict()
        assert all(
            torch.equal(served[n], t.to(torch.bfloat16)) for n, t in model.state_dict().items()
        )
        sabotage["mode"] = "skip_norm"
        _adam_step_(model, lr=1e-2)
        with pytest.raises(PublishVerificationError, match=r"\[model\.norm\.weight\]"):
            publisher.publish(model, version=2)
        publisher.close()
    engine.close()


@pytest.mark.parametrize("pieces", [True, False], ids=["pieces", "older-server"])
def test_pieces_go_only_to_servers_that_say_they_take_them(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, pieces: bool
) -> None:
    """A server whose status lacks `"pieces": true` (an older one) ignores `piece_bytes` and
    posts one broadcast per bucket: it must get whole buckets, or the two sides fall out of
    step (a gloo error or a hang). Here it is played by a receiver that drops `piece_bytes`."""
    from ludic.distributed.manifest import WeightManifest
    from ludic.inference.http.weight_receiver import WeightSyncReceiver

    asked: list[int] = []
    parse = WeightManifest.from_json.__func__  # type: ignore[attr-defined]

    def receiver_side(cls: type[WeightManifest], data: dict[str, Any]) -> WeightManifest:
        asked.append(data.get("piece_bytes", 0))
        body = data if pieces else {k: v for k, v in data.items() if k != "piece_bytes"}
        return parse(cls, body)

    monkeypatch.setattr(WeightManifest, "from_json", classmethod(receiver_side))
    if not pieces:
        status = WeightSyncReceiver.status
        monkeypatch.setattr(
            WeightSyncReceiver,
            "status",
            lambda self, group=None: {
                k: v for k, v in status(self, group).items() if k != "pieces"
            },
        )
    publisher = rig.publisher(piece_mb=0.001)  # ~1 KiB pieces: every large bucket is split
    nudge_(rig.trainer_model, 0.01)
    publisher.publish(rig.trainer_model, version=1)  # verified: checksums and probe
    nudge_(rig.trainer_model, 0.01)
    publisher.publish(rig.trainer_model, version=2)
    assert asked and set(asked) == ({1048} if pieces else {0})
    assert rig.client.get("/ludic/version", headers=AUTH).json()["policy_version"] == 2
    publisher.close()
