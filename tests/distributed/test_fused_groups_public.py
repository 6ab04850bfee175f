"""`fused_groups` is public (`ludic.distributed`): a custom publisher keeps the Llama-family
groups `plan_manifest` keeps by default while adding its own model family's groups, all
travelling consecutively in one bucket."""

from __future__ import annotations

import torch

import ludic.distributed
from ludic.distributed import fused_groups, plan_manifest


def layer_with_a_fused_pair() -> dict[str, torch.Tensor]:
    """A Llama layer (q/k/v, o, gate/up, down) plus a pair this family's server also fuses."""
    layer = {
        f"l.self_attn.{p}_proj.weight": torch.zeros(rows, 8)
        for p, rows in (("q", 8), ("k", 4), ("v", 4), ("o", 8))
    }
    layer["l.router.weight"] = torch.zeros(4, 8)
    layer["l.mlp.gate_proj.weight"] = torch.zeros(12, 8)
    layer["l.mlp.up_proj.weight"] = torch.zeros(12, 8)
    layer["l.mlp.down_proj.weight"] = torch.zeros(8, 12)
    layer["l.shared.weight"] = torch.zeros(4, 8)
    return layer


def consecutive(layout: list[list[str]], group: list[str]) -> bool:
    """`group` lies in one bucket of `layout`, in order, with nothing between its members."""
    for names in layout:
        if group[0] in names:
            start = names.index(group[0])
            return names[start : start + len(group)] == group
    return False


def test_a_custom_publisher_extends_the_default_groups() -> None:
    assert "fused_groups" in ludic.distributed.__all__
    layer = layer_with_a_fused_pair()
    ours = ["l.router.weight", "l.shared.weight"]
    groups = [*fused_groups(list(layer)), ours]
    assert len(groups) == 3  # q/k/v, gate/up, and ours

    def layout(together: list[list[str]] | None) -> list[list[str]]:
        plan = plan_manifest(
            layer, version=0, bucket_bytes=700, alone_bytes=10_000, together=together
        )
        return [[e.name for e in entries] for entries in plan.bucket_entries()]

    extended = layout(groups)
    assert len(extended) > 1  # boundaries fall inside the layer, never inside a group
    assert all(consecutive(extended, group) for group in groups), extended
    assert not consecutive(layout(None), ours)  # the default pulls only the Llama groups
