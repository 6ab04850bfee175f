"""The tiny model's TextCodec, and one that records how many ids each decode call was given."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from ludic.inference.embedded.sequence import TextCodec
from ludic.models import load_tiny_model


@cache
def tiny_codec() -> TextCodec:
    return TextCodec(load_tiny_model()[1])


class CountingCodec(TextCodec):
    """The tiny codec, recording the length of every decoded id list in `decoded`."""

    def __init__(self) -> None:
        super().__init__(tiny_codec().tokenizer)
        self.decoded: list[int] = []

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.decoded.append(len(ids))
        return super().decode(ids, skip_special_tokens)
