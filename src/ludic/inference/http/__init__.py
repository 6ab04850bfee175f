"""The HTTP side: `ludic serve` and the OpenAI-compatible client that talks to any such server.

`server` (the app and `serve`), `serve_config`, `openai_protocol` (request and response shapes),
`openai_client` (the `ChatClient` over HTTP), `pool` (one client over several servers), `auth`
(bearer tokens), `weight_receiver` with its routes `weight_routes` (the server end of a
weight push, shared with the vLLM extension), `health` (waiting until a server, `ludic serve`
or vLLM, serves), `server_wait` (waiting for the `--server-url` servers a command is given to
listen, as `ludic actor`, `learner`, `eval` and `train` do) and `local_server` (`ludic serve` in a child process, for generation in
parallel with training).
"""
