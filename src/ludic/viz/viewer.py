"""The rollout viewer: one self-contained HTML file to browse episodes, their turns, and the
tokens training sees (action mask, weights, snapshot boundaries).

The page embeds its data as JSON and needs no network or server; open it in any browser. It
is read-only: it does not edit, re-run or score rollouts.
"""

from __future__ import annotations

import datetime
import html
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro
from rich.console import Console
from rich.markup import escape

from ludic._jsonl_errors import undecodable_line
from ludic.inference.scripted import decode_ids
from ludic.rollouts import SAWItem, read_rollouts_jsonl
from ludic.rollouts.token_check import TextDecoder, foreign_token_ids
from ludic.types import JSON, Rollout
from ludic.viz._viewer_js import JS
from ludic.viz._viewer_page import CSS, PAGE_TEMPLATE
from ludic.viz.tokens import IDS_NO_TOKENIZER, TokenDecoder, TokenizerLike, resolve_decoder
from ludic.viz.view_model import build_view

RolloutSource = str | Path | Iterable[Rollout]
SampleSource = str | Path | Iterable[SAWItem]


def write_viewer(
    rollouts: RolloutSource,
    out_html: str | Path,
    samples: SampleSource | None = None,
    tokenizer: TokenizerLike | str | Path | None = None,
    *,
    title: str | None = None,
    max_episodes: int | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Path:
    """Write the viewer page for `rollouts` (a JSONL path or Rollout objects) to `out_html`.

    - `samples`: the SAWItems built from these rollouts (objects or a JSONL of
      `SAWItem.to_dict()` lines) to show their weights; without them the token masks are
      rebuilt from the rollouts' traces and weights show as n/a.
    - `tokenizer`: decodes token ids (an HF tokenizer, a tokenizer directory, "bytes" for
      ScriptedClient ids, or "ids"); None auto-detects byte-level ids, else shows ids.
    - `max_episodes`: keep only the first N episodes (large files make large pages).
    - `on_warning`: called with the warning when the token ids are not `tokenizer`'s (the
      check `ludic sft` makes, `ludic.rollouts.token_check`); default: `warnings.warn`. The
      page is still written, its "tokens shown as" saying so.
    """
    return _write_page(rollouts, out_html, samples, tokenizer, title, max_episodes, on_warning)[0]


def _write_page(
    rollouts: RolloutSource,
    out_html: str | Path,
    samples: SampleSource | None,
    tokenizer: TokenizerLike | str | Path | None,
    title: str | None,
    max_episodes: int | None,
    on_warning: Callable[[str], None] | None,
) -> tuple[Path, str]:
    """`write_viewer`, also returning what the page's tokens are shown as."""
    if max_episodes is not None and max_episodes < 1:  # [:-1] would drop the last, silently
        raise ValueError(
            f"max_episodes (--max-episodes) must be >= 1 (or left out for every episode), got "
            f"{max_episodes}"
        )
    source = str(rollouts) if isinstance(rollouts, str | Path) else None
    episodes = _load_rollouts(rollouts)
    if max_episodes is not None:
        episodes = episodes[:max_episodes]
    items = None if samples is None else _load_samples(samples)
    if items and (unmatched := samples_not_shown(items, episodes, samples, source)) is not None:
        (on_warning or _warn)(unmatched)
    decode, decoder_name = resolve_decoder(tokenizer, episodes)
    mismatch = tokenizer_mismatch(tokenizer, decode, decoder_name, episodes, source)
    if mismatch is not None:
        (on_warning or _warn)(mismatch)
        decoder_name = f"{decoder_name} (NOT these rollouts' tokenizer)"
    data: JSON = {
        "title": title or "",
        "source": source,
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tokenizer": decoder_name,
        "episodes": build_view(episodes, items, decode),
    }
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data, title=title or "ludic rollouts"), encoding="utf-8")
    return out, decoder_name


def samples_not_shown(
    items: Sequence[SAWItem],
    episodes: Sequence[Rollout],
    samples: object,
    source: str | None,
) -> str | None:
    """A warning when no sample belongs to an episode shown (their `rollout_id`s differ: the
    samples of another run), which would leave the page without sample tokens or weights."""
    shown = {str(r.id) for r in episodes}
    if any(str(s.meta.get("rollout_id")) in shown for s in items):
        return None
    where = str(samples) if isinstance(samples, str | Path) else "the samples given"
    return (
        f"none of the {len(items)} samples in {where} belongs to the {len(episodes)} episodes "
        f"shown from {source or 'these rollouts'} (no sample's rollout_id is among theirs), so "
        "the page shows no sample tokens or weights. Pass the samples.jsonl written beside "
        "these rollouts (the same run's --out-dir)"
    )


class TokenizerMismatchWarning(UserWarning):
    """The viewer's tokenizer is not the one that produced the rollouts' token ids."""


def _warn(message: str) -> None:
    warnings.warn(message, TokenizerMismatchWarning, stacklevel=3)


def tokenizer_mismatch(
    tokenizer: TokenizerLike | str | Path | None,
    decode: TokenDecoder,
    decoder_name: str,
    episodes: Sequence[Rollout],
    source: str | None,
) -> str | None:
    """A warning naming the mismatch when the first completions' ids do not decode, with
    the chosen tokenizer, to their recorded text (`foreign_token_ids`); None when they do, or
    when the page shows plain ids."""
    decoders = _text_decoders(tokenizer, decode)
    foreign = foreign_token_ids(episodes, decoders) if decoders else None
    if foreign is None:
        return None
    return (
        f"{foreign.describe(source or 'these rollouts', f'those of {decoder_name}')}: the "
        "page's tokens show the wrong text (the messages are right). Pass --tokenizer with the "
        "model directory that generated them (a run's checkpoint folder), or --tokenizer ids"
    )


def _text_decoders(
    tokenizer: TokenizerLike | str | Path | None, decode: TokenDecoder
) -> list[TextDecoder]:
    """Whole-text decoders for the check: the tokenizer's own decode where there is one, and
    the page's per-token strings joined."""
    if tokenizer is None or str(tokenizer) == "ids":
        return []  # auto-detection already checked byte ids; plain ids decode to nothing
    if str(tokenizer) == "bytes":
        return [decode_ids]
    joined: TextDecoder = lambda ids: "".join(decode(ids))  # noqa: E731
    if isinstance(tokenizer, TokenizerLike) and not isinstance(tokenizer, str | Path):
        tok = tokenizer
        return [lambda ids: str(tok.decode(list(ids))), joined]
    return [joined]


def render_html(data: JSON, *, title: str) -> str:
    """The page with `data` embedded as JSON (escaped so no string can close the script)."""
    page = PAGE_TEMPLATE.replace("__TITLE__", html.escape(title))
    page = page.replace("__CSS__", CSS).replace("__JS__", JS)
    return page.replace("__DATA__", embed_json(data))


def embed_json(data: object) -> str:
    """JSON safe inside `<script type="application/json">`: `<`, `>` and `&` become `\\u`
    escapes (so `</script>` or `<!--` in a string cannot end the element), as do U+2028/9."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def _load_rollouts(rollouts: RolloutSource) -> list[Rollout]:
    if isinstance(rollouts, str | Path):
        path = Path(rollouts)
        inside = path / "rollouts.jsonl"
        if path.is_dir() and inside.is_file():  # e.g. `ludic eval`'s --out-dir
            raise FileNotFoundError(
                f"{path} is a folder, not a rollout file; its rollouts are in {inside}: "
                f"`ludic view {inside}`"
            )
        if not path.is_file():
            raise FileNotFoundError(
                f"no rollout file at {path}; pass a JSONL written by the RolloutEngine's "
                "jsonl_log or `ludic eval` (rollouts.jsonl)"
            )
        return read_rollouts_jsonl(path)
    out = list(rollouts)
    for r in out:
        if not isinstance(r, Rollout):
            raise TypeError(f"write_viewer expects Rollout objects, got {type(r).__name__}")
    return out


def _load_samples(samples: SampleSource) -> list[SAWItem]:
    if not isinstance(samples, str | Path):
        return list(samples)
    if not Path(samples).is_file():
        raise ValueError(f"no samples file at {samples}; {_SAMPLES_FILE}")
    items: list[SAWItem] = []
    with Path(samples).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(undecodable_line(samples, lineno, line, e, "sample record")) from e
            try:
                items.append(SAWItem.from_dict(record))
            except (KeyError, ValueError, TypeError, AttributeError) as e:
                raise ValueError(_not_a_sample(samples, lineno, record, e)) from e
    return items


_SAMPLES_FILE = (
    "--samples takes the samples.jsonl `ludic train` writes next to its rollouts.jsonl "
    "(one SAWItem.to_dict() per line)"
)


def _not_a_sample(path: str | Path, lineno: int, record: object, error: Exception) -> str:
    what = f"not a training sample ({type(error).__name__}: {error})"
    if isinstance(record, dict) and "id" in record and "steps" in record:
        what = "a rollout (as in rollouts.jsonl), not a training sample"
    elif isinstance(record, dict) and "rollout_id" in record:
        what = "an eval summary record (episodes.jsonl or steps.jsonl of `ludic eval`), not a training sample"
    return f"{path}:{lineno}: {what}; {_SAMPLES_FILE}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ViewConfig:
    """Write a self-contained HTML page to browse rollouts."""

    rollouts: Annotated[Path, tyro.conf.Positional]
    """Rollouts JSONL (RolloutEngine jsonl_log, or rollouts.jsonl from `ludic eval`)."""
    out: Path | None = None
    """Output HTML file (default: next to the rollouts, with a .html suffix)."""
    samples: Path | None = None
    """Optional JSONL of SAWItem.to_dict() lines, to show per-sample weights."""
    tokenizer: str | None = None
    """Tokenizer or model directory to decode token ids; 'bytes' for ScriptedClient ids;
    default: auto-detect byte-level ids, else show ids."""
    title: str | None = None
    """Page title."""
    max_episodes: int | None = None
    """Show only the first N episodes."""


def view_command(cfg: ViewConfig, *, console: Console | None = None) -> Path:
    """`ludic view`: write the page and print where it is."""
    out = cfg.out or cfg.rollouts.with_suffix(".html")
    console = console or Console()
    evaluated = _evaluated_here(cfg.rollouts)
    if evaluated is not None:
        console.print(f"ludic eval's episodes of {evaluated}", markup=False, highlight=False)
    path, shown_as = _write_page(
        cfg.rollouts,
        out,
        cfg.samples,
        cfg.tokenizer,
        cfg.title or (f"ludic eval: {evaluated}" if evaluated is not None else None),
        cfg.max_episodes,
        on_warning=lambda text: console.print(f"[yellow]warning[/yellow]: {escape(text)}"),
    )
    console.print(f"wrote [bold]{path}[/bold] (open it in a browser)")
    if shown_as == IDS_NO_TOKENIZER:
        console.print(ids_note(cfg.rollouts), markup=False, highlight=False)
    return path


def _evaluated_here(rollouts: Path) -> str | None:
    """What `ludic eval` evaluated, when `rollouts` is its rollouts.jsonl (its run.json is
    beside it): the model, its checkpoint step and version, and the sampling."""
    from ludic.eval.evaluated_model import describe_run, read_run_record

    if rollouts.name != "rollouts.jsonl":
        return None
    record = read_run_record(rollouts.parent)
    return None if record is None else describe_run(record)


def _evaluated_model_path(rollouts: Path) -> str | None:
    """The local model `ludic eval` ran, from the run.json beside its rollouts.jsonl."""
    from ludic.eval.evaluated_model import read_run_record

    record = read_run_record(rollouts.parent) if rollouts.name == "rollouts.jsonl" else None
    model = (record or {}).get("model")
    path = model.get("path") if isinstance(model, dict) else None
    return path if isinstance(path, str) else None


def ids_note(rollouts: Path) -> str:
    """What to pass when the page shows token ids because no --tokenizer was given (a model's
    ids are not byte-level): the newest checkpoint's model beside the rollouts, when a
    `ludic train` run folder holds one, else the model a `ludic eval` there ran."""
    found = (rollouts.parent / "checkpoints").glob("step_*/model/tokenizer_config.json")
    # a complete step_N only, the one resume would take: not a quarantined step_N.corrupt, a
    # save's scratch copy, nor a step without its MANIFEST.json (a save that never finished)
    beside = sorted(
        p
        for p in found
        if p.parent.parent.name.removeprefix("step_").isdigit()
        and (p.parent.parent / "MANIFEST.json").is_file()
    )
    evaluated = _evaluated_model_path(rollouts)
    if beside:
        where = f" (this run's: --tokenizer {beside[-1].parent})"
    elif evaluated is not None:
        where = f" (the model this evaluation ran: --tokenizer {evaluated})"
    else:
        where = " (a run's checkpoint .../checkpoints/step_N/model)"
    return (
        "its tokens are shown as ids (no --tokenizer given): to see them as text, pass "
        f"--tokenizer with the model directory that generated them{where}"
    )
