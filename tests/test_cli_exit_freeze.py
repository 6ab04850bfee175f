"""The `ludic` process leaves its objects out of the interpreter's last garbage collections
(`gc.freeze()` as `main` returns or raises), which took about 2 s of every command's exit
on 2 cores with torch and transformers loaded, far more under load; `main(argv)` called from
Python (a test, a user's script) freezes nothing, so that process's garbage is still freed."""

from __future__ import annotations

import gc

import pytest

from ludic import cli


@pytest.mark.parametrize("argv", [None, ["--help"]])
def test_only_the_ludic_process_freezes_its_objects_at_exit(
    argv: list[str] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setattr("sys.argv", ["ludic", "--help"])
    with pytest.raises(SystemExit) as done:  # tyro's listing exits 0, also when it raises
        cli.main(argv)
    assert done.value.code == 0
    assert frozen == ([True] if argv is None else [])
