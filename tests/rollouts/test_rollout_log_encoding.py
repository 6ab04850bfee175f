"""`iter_rollouts_jsonl` (so `ludic sft --data`, `ludic view`, OfflineBatchSource) on a file that
is not UTF-8 refuses it naming the file, the line and what the file is (gzip, UTF-16), not the
codec's bare UnicodeDecodeError traceback; a UTF-8 byte order mark (an editor's) and CRLF line
ends read as the file without them."""

from __future__ import annotations

import codecs
import gzip
from pathlib import Path

import pytest

from ludic.errors import is_refusal
from ludic.rollouts import read_rollouts_jsonl, write_rollouts_jsonl
from ludic.types import Rollout


def _good(tmp_path: Path) -> Path:
    path = tmp_path / "good.jsonl"
    write_rollouts_jsonl([Rollout(id="a"), Rollout(id="b")], path)
    return path


def test_a_bom_and_crlf_read_as_the_plain_file(tmp_path: Path) -> None:
    good = _good(tmp_path)
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(codecs.BOM_UTF8 + good.read_bytes().replace(b"\n", b"\r\n"))
    assert [r.id for r in read_rollouts_jsonl(edited)] == ["a", "b"]


@pytest.mark.parametrize(
    ("encode", "where", "what"),
    [
        (lambda b: b.split(b"\n", 1)[0] + b"\n\xff\xfe" + b.split(b"\n", 1)[1], 2, "damaged"),
        (gzip.compress, 1, "gzip-compressed"),
        (lambda b: b.decode().encode("utf-16"), 1, "UTF-16 text"),
    ],
    ids=["bad-byte", "gzip", "utf-16"],
)
def test_bytes_that_are_not_utf8_are_refused_naming_the_line(
    tmp_path: Path, encode: object, where: int, what: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(encode(_good(tmp_path).read_bytes()))  # type: ignore[operator]
    with pytest.raises(ValueError) as e:
        read_rollouts_jsonl(path)
    message = str(e.value)
    assert f"{path}:{where}: not UTF-8 text" in message and what in message, message
    assert is_refusal(e.value)
