"""Bearer tokens of the control endpoints: where `ludic serve` reads its token, and comparing one.

Compares bytes in constant time, so a header holding any characters is a plain mismatch (401),
never an error. It does not issue, rotate or scope tokens.
"""

from __future__ import annotations

import hmac
import os

TOKEN_ENV = "LUDIC_SERVER_TOKEN"


def token_matches(given: str | None, token: str) -> bool:
    """Whether the bearer token `given` is `token` (constant time, any characters)."""
    if given is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape")
    )


def well_formed_token(token: str) -> bool:
    """Whether `token` can be a server's token: printable ASCII without surrounding spaces (an
    HTTP header carries nothing else reliably; `resolve_token` refuses the rest)."""
    return token.isascii() and token.isprintable() and token == token.strip()


def resolve_token(token: str | None) -> str | None:
    """`token`, else `$LUDIC_SERVER_TOKEN`, else None (control endpoints off). A token must be
    printable ASCII: an HTTP header carries nothing else reliably."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is not None and not well_formed_token(token):
        raise ValueError(
            f"the server token (--token or ${TOKEN_ENV}) must be printable ASCII without "
            "surrounding spaces"
        )
    return token
