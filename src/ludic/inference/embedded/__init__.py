"""The embedded engine: continuous batching over a local torch model in this process.

`engine` (the `EmbeddedEngine` ChatClient), `engine_config`, `batching` (admission and the decode
loop), `kv_cache` and `prefix_cache`, `lean_forward` (the cache-aware forward), `sequence` (one
in-flight generation), `prompts` (request to prompt ids), `token_sampling`, `batch_invariant`,
and `streaming` / `engine_stream` (deltas as tokens are produced).
"""
