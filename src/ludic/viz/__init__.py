"""Visual tools: a self-contained HTML rollout viewer and PNG plots of training metrics.

Neither needs a server or network; plotting imports matplotlib only when called.
"""

from ludic.viz.plots import (
    PlotConfig,
    default_title,
    metrics_figure,
    plot_command,
    plot_metrics,
    read_metrics,
)
from ludic.viz.tokens import TokenDecoder, TokenizerLike, byte_decoder, resolve_decoder
from ludic.viz.viewer import ViewConfig, embed_json, render_html, view_command, write_viewer

__all__ = [
    "PlotConfig",
    "TokenDecoder",
    "TokenizerLike",
    "ViewConfig",
    "byte_decoder",
    "default_title",
    "embed_json",
    "metrics_figure",
    "plot_command",
    "plot_metrics",
    "read_metrics",
    "render_html",
    "resolve_decoder",
    "view_command",
    "write_viewer",
]
