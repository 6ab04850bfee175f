"""Ludic: a hackable library for training LLM agents with reinforcement learning.

Importing `ludic` is light: no torch, vLLM, CUDA or Redis. Subpackages hold the components.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
