"""A server receiving in place keeps its lean forward's fused q/k/v and gate/up GEMMs through
the first push, which lays each packed bucket out back to back: the old storage is not pinned
meanwhile (the fused views are dropped before the fill), and the fused groups (with Qwen2's
attention biases, and with a bucket boundary falling inside a layer) stay adjacent, so every
layer still runs fused afterwards. In process: the embedded server app over a real gloo group."""

from __future__ import annotations

import copy
import gc
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import torch
from distributed_fakes import SPEC, TOKEN, nudge_
from fastapi.testclient import TestClient

from layout_fakes import BASE_URL, served_in_process, storages, tiny_qwen2
from ludic.distributed import BroadcastPolicyPublisher
from ludic.distributed.transfer import adjacent_view
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.kv_cache import new_cache
from ludic.inference.embedded.lean_forward import LeanForward
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def flatten_in_state_dict_order_(model: torch.nn.Module) -> None:
    """Every parameter a view of one buffer, in state-dict order (q.w, q.b, k.w, k.b, ...)."""
    params = list(model.parameters())
    flat = torch.empty(sum(p.numel() for p in params))
    offset = 0
    with torch.no_grad():
        for p in params:
            view = flat[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            offset += p.numel()


def fused_groups_of(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """Per layer: q/k/v weights, q/k/v biases, gate/up weights (the served tensors)."""
    groups = []
    for layer in model.model.layers:  # type: ignore[union-attr]
        attention, mlp = layer.self_attn, layer.mlp
        qkv = (attention.q_proj, attention.k_proj, attention.v_proj)
        groups.append([m.weight.detach() for m in qkv])
        groups.append([m.bias.detach() for m in qkv])
        groups.append([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])
    return groups


def run_lean(lean: LeanForward, model: torch.nn.Module) -> torch.Tensor:
    """One small prefill through the lean forward (its fused groups re-check their layout)."""
    ids_BS = torch.tensor([[3, 14, 15, 92, 65]])
    mask_BT = torch.ones_like(ids_BS)
    positions_BS = torch.arange(5)[None]
    return lean(ids_BS, mask_BT, positions_BS, new_cache(model.config), keep=5)


def pinned_old_bytes(old: set[int], model: torch.nn.Module) -> int:
    """Bytes of the storages in `old` (data pointers) that live tensors still hold although no
    parameter of `model` lives there any more (tensor storage accounting over the heap)."""
    current = storages(model)
    held: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance() on deprecated module proxies warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        if obj.device.type != "cpu":
            continue
        try:  # tensors left on the heap by earlier tests may have no valid storage any more
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
        except RuntimeError:
            continue
        if ptr in old and ptr not in current:
            held[ptr] = storage.nbytes()
    return sum(held.values())


Server = tuple[EmbeddedEngine, TestClient, Any]


@pytest.fixture
def server() -> Iterator[Callable[[torch.nn.Module], Server]]:
    with ExitStack() as stack:

        def make(model: torch.nn.Module) -> Server:
            tokenizer = build_tiny_model(seed=0, spec=SPEC)[1]
            return stack.enter_context(served_in_process(model, tokenizer, token=TOKEN))

        yield make


def publisher(client: TestClient, **kwargs: Any) -> BroadcastPolicyPublisher:
    """Tensors >= 1 KB count as large; ~12 KB buckets, so boundaries fall inside layers."""
    options: dict[str, Any] = {"pack_below_mb": 1024 / 2**20, "bucket_mb": 12000 / 2**20}
    return BroadcastPolicyPublisher(
        BASE_URL,
        TOKEN,
        http=client,
        timeout_s=20,
        control="store",
        probe=False,
        **{**options, **kwargs},
    )


@pytest.mark.parametrize("trainer_layout", ["flat", "separate"])
def test_first_push_keeps_qwen2_layers_fused_and_pins_no_old_storage(
    server: Callable[[torch.nn.Module], Server], trainer_layout: str
) -> None:
    tokenizer_vocab = len(build_tiny_model(seed=0, spec=SPEC)[1])
    trainer = tiny_qwen2(vocab=tokenizer_vocab).eval()
    engine, client, receiver = server(copy.deepcopy(trainer))
    lean = engine._batch._lean
    assert isinstance(lean, LeanForward)
    served = engine.model
    run_lean(lean, served)
    assert all(layer.qkv.fused and layer.gate_up.fused for layer in lean.layers)
    if trainer_layout == "flat":
        flatten_in_state_dict_order_(trainer)
    nudge_(trainer, 0.01)

    old = storages(served)
    arranged: list[list[list[str]]] = []
    pinned: list[int] = []
    arrange = receiver.arrange

    def watched(groups: list[list[str]]) -> object:
        arranged.append(groups)
        moved = arrange(groups)
        pinned.append(pinned_old_bytes(old, served))
        return moved

    receiver.arrange = watched
    push = publisher(client)
    push.publish(trainer, version=1)
    assert arranged, "the first push lays packed buckets out"
    assert pinned == [0], f"{pinned[0]} bytes of the old parameter storage stayed alive"
    for group in fused_groups_of(served):
        assert adjacent_view(group) is not None  # still back to back after the layout
    assert all(torch.equal(served.state_dict()[n], t) for n, t in trainer.state_dict().items())
    logits = run_lean(lean, served)
    assert all(layer.qkv.fused and layer.gate_up.fused for layer in lean.layers)
    with torch.no_grad():
        expected = served(input_ids=torch.tensor([[3, 14, 15, 92, 65]])).logits
    torch.testing.assert_close(logits, expected.float(), atol=1e-4, rtol=0)

    pointers = [p.data_ptr() for p in served.parameters()]
    nudge_(trainer, 0.01)
    push.publish(trainer, version=2)  # lands in place: nothing moves again
    assert [p.data_ptr() for p in served.parameters()] == pointers
    assert push.last_push is not None and push.last_push.num_buckets < len(pointers)
