"""Test server: the embedded server (`create_app`, which mounts the weight-sync routes) for a
local model, plus a test-only `/test/sabotage` route that makes the engine skip loading pushed
weights (the version is still bumped; buffered or in place), to prove verification catches a sync that did nothing.

Usage: python weight_server_main.py MODEL_DIR PORT TOKEN
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import uvicorn

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app


def main() -> None:
    model_dir, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    engine = EmbeddedEngine.from_pretrained(model_dir, dtype="float32")
    sabotage = {"skip_load": False}
    update_weights = engine.update_weights

    def sabotaged_update(state: Any, *, version: int | None = None, strict: bool = True) -> int:
        if sabotage["skip_load"]:  # bump the version, keep the old weights
            return update_weights({}, version=version, strict=False)
        return update_weights(state, version=version, strict=strict)

    update_in_place = engine.update_weights_in_place

    def sabotaged_in_place(fill: Any, *, version: int | None = None) -> int:
        if not sabotage["skip_load"]:
            return update_in_place(fill, version=version)
        old = {k: v.clone() for k, v in engine.model.state_dict().items()}

        def fill_then_undo(model: torch.nn.Module) -> None:  # receive, then keep the old
            fill(model)
            model.load_state_dict(old)

        return update_in_place(fill_then_undo, version=version)

    engine.update_weights = sabotaged_update  # type: ignore[method-assign]
    engine.update_weights_in_place = sabotaged_in_place  # type: ignore[method-assign]
    app = create_app(engine, model_name="tiny", token=token)

    @app.post("/test/sabotage")
    async def set_sabotage(skip_load: bool) -> dict[str, bool]:
        sabotage["skip_load"] = skip_load
        return sabotage

    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
