"""A batch source that wraps another (`self.source`) and whose checkpoint state is the
wrapped source's; subclasses write `next_batch`."""

from __future__ import annotations

from typing import Any


class WrappedSource:
    source: Any

    def state_dict(self) -> Any:
        state_dict = getattr(self.source, "state_dict", None)
        return state_dict() if state_dict is not None else {}

    def load_state_dict(self, state: Any) -> None:
        load = getattr(self.source, "load_state_dict", None)
        if load is not None:
            load(state)
