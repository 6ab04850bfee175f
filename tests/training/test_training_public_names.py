"""Every error and warning a `ludic.training` module raises is public under `ludic.training`, so a
caller can catch it (`except CheckpointSaveError`) without knowing which module defines it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import ludic.training


def _defined_errors_and_warnings() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(ludic.training.__path__, "ludic.training."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found[name] = value
    return found


def test_every_training_error_and_warning_is_exported() -> None:
    defined = _defined_errors_and_warnings()
    assert "CheckpointSaveError" in defined  # the walk reaches the modules
    missing = sorted(set(defined) - set(ludic.training.__all__))
    assert missing == []
    for name, cls in defined.items():
        assert getattr(ludic.training, name) is cls


def test_all_is_sorted_and_names_only_what_the_package_holds() -> None:
    names = ludic.training.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert [n for n in names if not hasattr(ludic.training, n)] == []
