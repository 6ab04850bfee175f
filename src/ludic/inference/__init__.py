"""Inference: the ChatClient contract, sampling config and backends.

Three rooms: `embedded` (the in-process engine: batching, KV cache, lean forward, sampling,
streaming), `http` (`ludic serve`, its protocol and the OpenAI-compatible client) and `vllm`
(the vLLM server extension). The contract (`client`, `sampling`), `scripted`, `weights` and
`template_check` sit here, shared by all three.

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
    from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig, EngineStatus
    from ludic.inference.http.openai_client import (
        InferenceRequestError,
        InferenceResponseError,
        InferenceUnavailableError,
        OpenAICompatibleClient,
    )
    from ludic.inference.http.serve_config import ServeConfig
    from ludic.inference.http.server import create_app, serve
    from ludic.inference.template_check import TemplateBreak, TemplateReport, check_append_only
    from ludic.inference.weights import NonFiniteWeightsError

# Public name -> module that defines it; imported on first access.
_LAZY = {
    "EmbeddedEngine": "ludic.inference.embedded.engine",
    "EngineConfig": "ludic.inference.embedded.engine",
    "EngineStatus": "ludic.inference.embedded.engine",
    "InferenceRequestError": "ludic.inference.http.openai_client",
    "InferenceResponseError": "ludic.inference.http.openai_client",
    "InferenceUnavailableError": "ludic.inference.http.openai_client",
    "NonFiniteWeightsError": "ludic.inference.weights",
    "OpenAICompatibleClient": "ludic.inference.http.openai_client",
    "ServeConfig": "ludic.inference.http.serve_config",
    "create_app": "ludic.inference.http.server",
    "serve": "ludic.inference.http.server",
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
    "InferenceResponseError",
    "InferenceUnavailableError",
    "NonFiniteWeightsError",
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
