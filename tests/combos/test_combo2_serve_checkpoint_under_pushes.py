"""`ludic serve` of a training checkpoint, hit by concurrent clients while `ludic train
--resume --server-url` pushes each step's weights into it, with malformed requests among theirs,
each side a new process: every malformed request is answered 400 and every other one 200,
before, during and after the pushes; each reply's first token was sampled from exactly the
weights of the checkpoint whose policy version the reply names (no half-applied push is ever
served), and the server ends at the run's last version."""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from combo_processes import SPEC, TOKEN, finish, ludic, run, serve, served_version, start, stop

from ludic.models import load_model, tiny_model_dir

CLIENTS = 4
LAST = 3  # the resumed run trains steps 2..LAST
PROMPT_IDS = [5, 17, 42, 99, 3, 250, 7]
GOOD = {
    "model": "ludic",
    "prompt": PROMPT_IDS,
    "max_tokens": 6,
    "temperature": 1.0,
    "logprobs": 1,
    "return_token_ids": True,
}
# Each is refused by the server's checks, while well-formed requests are in flight beside it.
MALFORMED: list[dict[str, Any]] = [
    {"json": {**GOOD, "prompt": [5, 10**6]}},  # a token id far past the vocabulary
    {"json": {**GOOD, "max_tokens": -1}},
    {
        "content": b'{"model": "ludic", "prompt": [5, 6',
        "headers": {"content-type": "application/json"},
    },
]
TRAIN_FLAGS = (
    *("--env", "combo_say_o:SayOEnv", "--problems-per-step", "2", "--group-size", "3"),
    *("--max-steps", "1", "--max-tokens", "8", "--lr", "3e-2", "--checkpoint-every", "1"),
    *("--threads", "1", "--no-progress", "--out-dir", "run"),
)


class Traffic:
    """Clients that post completions to `url` until stopped, each every turn a well-formed
    request, and the first client a malformed one every third turn; every reply is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stopped = threading.Event()
        self.good: list[httpx.Response] = []
        self.bad: list[httpx.Response] = []

    def round(self, client: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as http:
            turn = 0
            while not self.stopped.is_set():
                if client == 0 and turn % 3 == 2:
                    kind = MALFORMED[(turn // 3) % len(MALFORMED)]
                    self.bad.append(http.post("/v1/completions", **kind))
                else:
                    self.good.append(http.post("/v1/completions", json=GOOD))
                turn += 1

    def burst(self) -> None:
        """One well-formed request per client, all at once."""
        with ThreadPoolExecutor(CLIENTS) as pool:
            replies = pool.map(
                lambda _: httpx.post(self.url + "/v1/completions", json=GOOD, timeout=120),
                range(CLIENTS),
            )
            self.good.extend(replies)


def _first_token_logprobs(checkpoint: Path, completions: list[list[int]]) -> torch.Tensor:
    """The checkpoint's logprob of each completion's first token after PROMPT_IDS."""
    model, _ = load_model(str(checkpoint))
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor([PROMPT_IDS])).logits[0, -1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return torch.stack([logprobs[c[0]] for c in completions])


@pytest.mark.slow
def test_a_served_checkpoint_answers_concurrent_clients_while_pushes_land(tmp_path: Path) -> None:
    model = str(tiny_model_dir(seed=0, spec=SPEC, cache_dir=tmp_path / "models"))
    run(ludic("train", *TRAIN_FLAGS, "--model", model, "--steps", "1"), tmp_path)
    checkpoints = tmp_path / "run" / "checkpoints"
    first = checkpoints / "step_00000001"
    shutil.copytree(first, tmp_path / "kept" / first.name)  # retention will remove it
    server, url = serve(first, tmp_path, tmp_path / "serve.log")
    traffic = Traffic(url)
    try:
        traffic.burst()  # at the checkpoint's own version
        with ThreadPoolExecutor(CLIENTS) as pool:
            clients = [pool.submit(traffic.round, i) for i in range(CLIENTS)]
            training = start(
                ludic(
                    *("train", *TRAIN_FLAGS, "--model", model, "--steps", str(LAST), "--resume"),
                    *("--server-url", url, "--server-token", TOKEN),
                ),
                tmp_path,
            )
            try:
                resumed = finish(training)
            finally:
                traffic.stopped.set()
            for client in clients:
                client.result()
        traffic.burst()  # at the run's last version
        version = served_version(url)
    finally:
        stop(server)
    assert "resumed at step 1" in resumed, resumed
    assert version == LAST

    assert traffic.bad and {r.status_code for r in traffic.bad} == {400}, [
        r.text for r in traffic.bad
    ]
    assert {r.status_code for r in traffic.good} == {200}, [
        r.text for r in traffic.good if r.status_code != 200
    ]
    by_version: dict[int, list[dict[str, Any]]] = {}
    for reply in traffic.good:
        body = reply.json()
        by_version.setdefault(body["policy_version"], []).append(body["choices"][0])
    assert {1, LAST} <= set(by_version) <= set(range(1, LAST + 1)), sorted(by_version)
    for version, choices in by_version.items():
        served = torch.tensor([c["logprobs"]["token_logprobs"][0] for c in choices])
        checkpoint = (tmp_path / "kept" if version == 1 else checkpoints) / f"step_{version:08d}"
        expected = _first_token_logprobs(checkpoint, [c["token_ids"] for c in choices])
        torch.testing.assert_close(served, expected, atol=1e-4, rtol=0)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
