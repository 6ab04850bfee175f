"""README walk (walkG), "Benchmarks": the section names every script under bench/ (a reader
lists the folder and looks each one up; `_args.py` was in neither the list of benches nor the
helpers), and every bench it names exists."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = Path(os.environ.get("LUDIC_README", ROOT / "README.md"))


def _benchmarks_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Benchmarks\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _named_scripts() -> set[str]:
    """Script names in backticks, bare (`http_client.py`) or under bench/ (other paths, such
    as tests/..., are not benches)."""
    return set(re.findall(r"`(?:bench/)?(\w+\.py)`", _benchmarks_section()))


ON_DISK = {p.name for p in (ROOT / "bench").glob("*.py")}


def test_every_bench_script_is_named_in_the_section() -> None:
    missing = sorted(ON_DISK - _named_scripts())
    assert not missing, f"bench/ scripts the README's Benchmarks section never names: {missing}"


def test_every_script_the_section_names_exists() -> None:
    gone = sorted(_named_scripts() - ON_DISK)
    assert not gone, f"the Benchmarks section names scripts that are not in bench/: {gone}"
