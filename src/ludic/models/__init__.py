"""Local models: tiny Llama-style LMs with a trained BPE tokenizer, and loading of any local
Hugging Face model directory. Importing this package imports torch and transformers."""

from ludic.models.loading import load_model, load_tokenizer, model_directory, save_model
from ludic.models.tiny import (
    TinyModelSpec,
    build_tiny_model,
    default_cache_dir,
    load_tiny_model,
    tiny_model_dir,
)
from ludic.models.tokenizer import CHATML_TEMPLATE, train_tiny_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "TinyModelSpec",
    "build_tiny_model",
    "default_cache_dir",
    "load_model",
    "load_tiny_model",
    "load_tokenizer",
    "model_directory",
    "save_model",
    "tiny_model_dir",
    "train_tiny_tokenizer",
]
