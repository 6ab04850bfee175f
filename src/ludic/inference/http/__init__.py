"""The HTTP side: `ludic serve` and the OpenAI-compatible client that talks to any such server.

`server` (the app and `serve`), `serve_config`, `openai_protocol` (request and response shapes),
`openai_client` (the `ChatClient` over HTTP), `auth` (bearer tokens) and `weight_receiver`
(the server end of a weight push, shared with the vLLM extension).
"""
