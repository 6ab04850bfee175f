"""Inference: the ChatClient contract, sampling config and backends.

Backends that need torch, HTTP or vLLM are imported lazily (on first attribute access) so that
importing `ludic.inference` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ludic.inference.client import ChatClient, ChatRequest, ChatResponse
from ludic.inference.sampling import SamplingConfig, resolve_sampling_args
from ludic.inference.scripted import ScriptedClient

if TYPE_CHECKING:
    from ludic.inference.engine import EmbeddedEngine, EngineConfig, EngineStatus
    from ludic.inference.openai_client import (
        InferenceRequestError,
        InferenceUnavailableError,
        OpenAICompatibleClient,
    )
    from ludic.inference.serve_config import ServeConfig
    from ludic.inference.server import create_app, serve
    from ludic.inference.template_check import TemplateBreak, TemplateReport, check_append_only

# Public name -> module that defines it; imported on first access.
_LAZY = {
    "EmbeddedEngine": "ludic.inference.engine",
    "EngineConfig": "ludic.inference.engine",
    "EngineStatus": "ludic.inference.engine",
    "InferenceRequestError": "ludic.inference.openai_client",
    "InferenceUnavailableError": "ludic.inference.openai_client",
    "OpenAICompatibleClient": "ludic.inference.openai_client",
    "ServeConfig": "ludic.inference.serve_config",
    "create_app": "ludic.inference.server",
    "serve": "ludic.inference.server",
    "TemplateBreak": "ludic.inference.template_check",
    "TemplateReport": "ludic.inference.template_check",
    "check_append_only": "ludic.inference.template_check",
}

__all__ = [
    "ChatClient",
    "ChatRequest",
    "ChatResponse",
    "EmbeddedEngine",
    "EngineConfig",
    "EngineStatus",
    "InferenceRequestError",
    "InferenceUnavailableError",
    "OpenAICompatibleClient",
    "SamplingConfig",
    "ScriptedClient",
    "ServeConfig",
    "TemplateBreak",
    "TemplateReport",
    "check_append_only",
    "create_app",
    "resolve_sampling_args",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ludic.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
