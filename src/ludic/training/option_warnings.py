"""The warning for an option that the rest of a configuration never reads (`dual_clip_c`
without `dual_clip=True`, `kl_clamp` with `kl_beta=0`). An ablation grid passes every knob to
every arm, so an unread knob is reported, not refused; a value no arm could use still raises.
"""

from __future__ import annotations

import warnings


class UnreadOptionWarning(UserWarning):
    """An option was set that this configuration ignores. Shown once per distinct message (the
    default warnings filter); `warnings.simplefilter("error", UnreadOptionWarning)` makes it an
    error for a run that wants every knob to count."""


def warn_unread_option(owner: str, option: str, value: object, why: str) -> None:
    """Warn that `owner` ignores `option=value` because `why`. The warning points at this
    fixed line, so the default filter shows one message once however many arms repeat it."""
    shown = getattr(value, "__name__", None) or repr(value)  # a function by its name
    message = f"{owner}: {option}={shown} is ignored: {why}"
    warnings.warn(message, UnreadOptionWarning, stacklevel=1)
