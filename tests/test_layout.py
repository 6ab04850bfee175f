"""The README's "Where things live" section matches the package tree of `src/ludic`: every
package it lists exists, and every package (a folder with `__init__.py`) is listed, once, with
what it holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Where things live"
ENTRY = re.compile(r"^(?P<path>ludic(?:/[A-Za-z_][A-Za-z0-9_]*)*)/(?:\s+(?P<holds>\S.*))?$")


def section_entries(readme: str) -> list[tuple[str, str]]:
    """(package path, what it holds) for each line of the section's code block, in order."""
    if HEADING not in readme:
        raise AssertionError(f"README has no {HEADING!r} section")
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")
    if len(blocks) < 3:
        raise AssertionError(f"{HEADING!r} has no code block listing the packages")
    entries: list[tuple[str, str]] = []
    for line in blocks[1].splitlines():
        if not line.strip():
            continue
        match = ENTRY.match(line.strip())
        if match is None:
            raise AssertionError(f"{HEADING!r}: cannot read {line!r}; write 'ludic/sub/  what'")
        entries.append((match["path"], (match["holds"] or "").strip()))
    return entries


def packages(src: Path) -> set[str]:
    """Every folder under `src` (the `ludic` package) that has an `__init__.py`."""
    return {
        init.parent.relative_to(src.parent).as_posix()
        for init in src.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def layout_problems(readme: str, src: Path) -> list[str]:
    entries = section_entries(readme)
    listed = [path for path, _ in entries]
    tree = packages(src)
    problems = [f"{p}/ is listed but is not a package of src/" for p in listed if p not in tree]
    problems += [f"{p}/ is a package but is not listed" for p in sorted(tree - set(listed))]
    problems += [
        f"{p}/ is listed twice" for p in sorted({p for p in listed if listed.count(p) > 1})
    ]
    problems += [f"{p}/ does not say what it holds" for p, holds in entries if not holds]
    return problems


def test_where_things_live_matches_the_package_tree() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert layout_problems(readme, ROOT / "src" / "ludic") == []


SECTION = """# Demo

## Where things live

```
ludic/          the root
ludic/a/        package a
{extra}
```

## Next
"""


def demo_tree(tmp_path: Path, *subpackages: str) -> Path:
    src = tmp_path / "ludic"
    for sub in ("", "a", *subpackages):
        (src / sub).mkdir(parents=True, exist_ok=True)
        (src / sub / "__init__.py").write_text("")
    (src / "data").mkdir()  # a folder without __init__.py is not a package
    return src


def test_a_new_subpackage_missing_from_the_section_is_reported(tmp_path: Path) -> None:
    src = demo_tree(tmp_path, "b", "b/inner")
    readme = SECTION.format(extra="ludic/b/   package b")
    assert layout_problems(readme, src) == ["ludic/b/inner/ is a package but is not listed"]


def test_a_listed_package_that_does_not_exist_is_reported(tmp_path: Path) -> None:
    src = demo_tree(tmp_path)
    readme = SECTION.format(extra="ludic/gone/   moved away\nludic/data/   not a package")
    assert layout_problems(readme, src) == [
        "ludic/gone/ is listed but is not a package of src/",
        "ludic/data/ is listed but is not a package of src/",
    ]


def test_duplicates_and_empty_descriptions_are_reported(tmp_path: Path) -> None:
    src = demo_tree(tmp_path)
    readme = SECTION.format(extra="ludic/a/   again\nludic/")
    assert layout_problems(readme, src) == [
        "ludic/ is listed twice",
        "ludic/a/ is listed twice",
        "ludic/ does not say what it holds",
    ]


def test_an_unreadable_line_or_a_missing_section_fails_clearly(tmp_path: Path) -> None:
    src = demo_tree(tmp_path)
    with pytest.raises(AssertionError, match="cannot read"):
        layout_problems(SECTION.format(extra="* ludic/a: bullet"), src)
    with pytest.raises(AssertionError, match="no '## Where things live' section"):
        layout_problems("# Demo\n", src)
