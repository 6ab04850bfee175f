"""The viewer page in real headless Chromium: the DOM lists the expected episodes, filters from
the URL apply, action-token spans match the training masks, rollout text stays text, and
screenshots are saved under test-artifacts/ for a human to look at."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from viz_fakes import advantage_samples, all_rollouts

from ludic.rollouts import SAWItem
from ludic.types import Rollout
from ludic.viz import write_viewer

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ACTION_SPAN = re.compile(r'<span class="tok act[^"]*" title="#')
EPISODE_ITEM = re.compile(r'<li class="ep-item[^"]*" data-id="([^"]+)"')


def chromium(page: Path, fragment: str, profile: Path, *args: str) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
        f"--user-data-dir={profile}", *args, page.resolve().as_uri() + fragment,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def action_tokens(samples: list[SAWItem], rollout: Rollout) -> int:
    return sum(s.num_action_tokens for s in samples if s.meta["rollout_id"] == rollout.id)


@pytest.fixture(scope="module")
def page_and_data(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[Rollout], list[SAWItem]]:
    rollouts = asyncio.run(all_rollouts())
    samples = advantage_samples(rollouts)
    page = write_viewer(rollouts, tmp_path_factory.mktemp("viewer") / "rollouts.html", samples)
    return page, rollouts, samples


def by_request(rollouts: list[Rollout], request_id: str) -> Rollout:
    return next(r for r in rollouts if r.meta["request_id"] == request_id)


def test_dom_lists_episodes_and_action_masks(page_and_data, tmp_path: Path) -> None:
    page, rollouts, samples = page_and_data
    dom = chromium(page, "", tmp_path / "profile", "--dump-dom")
    assert 'data-ready="1"' in dom
    assert EPISODE_ITEM.findall(dom) == [r.id for r in rollouts]
    assert f'data-episode="{rollouts[0].id}"' in dom  # the first episode is open
    assert len(ACTION_SPAN.findall(dom)) == action_tokens(samples, rollouts[0]) == 30
    assert "6 of 6 shown" in dom


def test_tool_episode_masks_and_escaped_text(page_and_data, tmp_path: Path) -> None:
    page, rollouts, samples = page_and_data
    tool = by_request(rollouts, "req-tool")
    dom = chromium(page, f"#ep={tool.id}", tmp_path / "profile", "--dump-dom")
    assert f'data-episode="{tool.id}"' in dom
    # two model calls' completions are actions; the tool result between them is prompt
    assert len(ACTION_SPAN.findall(dom)) == action_tokens(samples, tool) == 85
    assert "<title>ludic rollouts</title>" in dom
    assert "&lt;/script&gt;&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in dom
    assert '<div class="toolcall">▸ <b>add</b>' in dom
    assert dom.count('class="msg tool') == 1


def test_url_filters_and_snapshot_boundary(page_and_data, tmp_path: Path) -> None:
    page, rollouts, samples = page_and_data
    dom = chromium(page, "#outcome=win&rmin=0.5", tmp_path / "profile", "--dump-dom")
    expected = [r.id for r in rollouts if not r.failed and r.total_reward >= 0.5]
    assert EPISODE_ITEM.findall(dom) == expected and len(expected) == 3
    snap = by_request(rollouts, "req-snap")
    dom = chromium(page, "#q=req-snap", tmp_path / "profile2", "--dump-dom")
    assert EPISODE_ITEM.findall(dom) == [snap.id]
    assert dom.count('class="snapcut"') == 1
    assert dom.count('data-snapshot="true"') == 1
    assert len(ACTION_SPAN.findall(dom)) == action_tokens(samples, snap) == 55
    assert "context rewritten before this call" in dom


def test_64_bit_seed_shown_and_searched_exactly(tmp_path: Path) -> None:
    rollouts = asyncio.run(all_rollouts())
    seed = 7503306085401639846  # a SeedSequencer seed; as a JS number it reads ...640000
    rollouts[2].meta["env_seed"] = seed
    page = write_viewer(rollouts, tmp_path / "rollouts.html")
    dom = chromium(page, f"#q={seed}", tmp_path / "profile", "--dump-dom")
    assert EPISODE_ITEM.findall(dom) == [rollouts[2].id]
    assert f"seed {seed}" in dom and "7503306085401640000" not in dom


def test_screenshots_saved_as_artifacts(page_and_data, tmp_path: Path) -> None:
    page, rollouts, _ = page_and_data
    ARTIFACTS.mkdir(exist_ok=True)
    shots = {
        "viewer-episode.png": "",
        "viewer-tools.png": f"#ep={by_request(rollouts, 'req-tool').id}",
    }
    for name, fragment in shots.items():
        path = ARTIFACTS / name
        path.unlink(missing_ok=True)
        chromium(page, fragment, tmp_path / name, f"--screenshot={path}", "--window-size=1440,1100")
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, name
