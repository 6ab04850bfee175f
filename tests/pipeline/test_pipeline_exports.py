"""What a learner loop of your own needs from `ludic.pipeline` is exported, documented for when to
use it, and importing it stays light (no torch), as the package's other names."""

from __future__ import annotations

import subprocess
import sys

import ludic.pipeline
from ludic.pipeline import RecordingPublisher, fork_versions


def test_every_exported_name_resolves() -> None:
    for name in ludic.pipeline.__all__:
        assert getattr(ludic.pipeline, name) is not None, name


def test_the_version_record_helpers_are_exported_and_say_when_to_use_them() -> None:
    assert {"RecordingPublisher", "fork_versions"} <= set(ludic.pipeline.__all__)
    for helper in (RecordingPublisher, fork_versions):
        assert "learner loop of your own" in (helper.__doc__ or ""), helper
    assert "RecordingPublisher" in (fork_versions.__doc__ or "")


def test_importing_them_loads_no_torch() -> None:
    check = (
        "import sys; from ludic.pipeline import RecordingPublisher, fork_versions; "
        "assert 'torch' not in sys.modules, 'importing them pulled in torch'"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
