"""`plural`: counts in command output take the noun's number ("1 step", "2 steps")."""

from __future__ import annotations

from ludic.recipes.train import _served_note
from ludic.recipes.training import plural


def test_plural_is_singular_only_for_one() -> None:
    assert plural(1, "step") == "1 step"
    assert [plural(n, "step") for n in (0, 2, 10)] == ["0 steps", "2 steps", "10 steps"]
    assert plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"


def test_the_local_server_note_counts_versions_in_their_number() -> None:
    assert _served_note(4, 4, 1).endswith("samples trained at most 1 version old")
    assert _served_note(4, 4, 0).endswith("samples trained at most 0 versions old")
    assert _served_note(4, 4, 2).endswith("samples trained at most 2 versions old")
