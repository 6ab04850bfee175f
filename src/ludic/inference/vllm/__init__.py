"""The vLLM side: `python -m ludic.inference.vllm.server` runs vLLM with Ludic's routes.

`server` (launcher), `routes` (version stamping and `/ludic/*` weight routes), `worker` (the
worker extension that loads pushed weights) and `logits` (import guard, max_think processor).
Importing these modules never needs vLLM; using the vLLM parts without it raises ImportError.
"""
