"""The worker extension mixed into each vLLM worker (`--worker-extension-cls`): joins the
trainer's group, receives broadcast weights bucket by bucket, loads them through vLLM's
layerwise `reload_weights` and reports checksums of what it holds. It never imports vLLM
itself; the HTTP routes that drive it live in `ludic.inference.vllm.routes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class WeightSyncWorkerExtension:
    """Mixed into each vLLM worker; called through `engine_client.collective_rpc`.

    Speaks the embedded server's `/ludic/weights/*` protocol (`ludic.distributed.transfer`):
    each worker joins the trainer's group as rank `init.rank + its vLLM rank`, receives every
    bucket and loads the full tensors with `load_weights` (which shards them for TP).
    """

    _ludic_group: Any = None  # the c10d group of the trainer's broadcasts, once joined
    _ludic_pool: Any = None  # receive buffers (two buckets), kept across pushes

    def ludic_worker_rank(self) -> int:
        return int(getattr(self, "rank", 0))

    def ludic_weights_init(self, request: dict[str, Any]) -> None:
        from ludic.distributed.transfer import join_store, open_group
        from ludic.inference.http.weight_join import InitRequest

        req = InitRequest(**request)
        store = join_store(req.host, req.port, world_size=req.world_size, timeout_s=req.timeout_s)
        self._ludic_store = store  # must outlive the group
        self._ludic_group = open_group(
            store,
            rank=req.rank + self.ludic_worker_rank(),
            world_size=req.world_size,
            backend=req.backend,
            timeout_s=req.timeout_s,
        )

    def ludic_weights_receive(self, manifest_json: dict[str, Any]) -> dict[str, Any]:
        """Receive the push bucket by bucket and hand the tensors to `ludic_reload` as they
        land: only two buckets are received at a time (`bucket_mb` each, or one large tensor
        sent alone), never a copy of the whole model beside vLLM's reserved memory. Each
        tensor is copied out of the receive buffer as it is handed over, because vLLM's
        layerwise reload keeps a layer's weights until the whole layer has arrived.

        Returns {"num_tensors", "nonfinite"}: the names of the tensors that held a nan or an
        inf (each bucket is checked as it lands, one device sync per bucket). With no room
        for a copy, they are loaded like the rest: the route then refuses the push (422)
        and keeps the served policy version, as the embedded server does for a push it
        received in place."""
        from ludic.distributed.checksum import nonfinite
        from ludic.distributed.manifest import WeightManifest
        from ludic.distributed.transfer import BufferPool, receive_each_bucket

        if self._ludic_group is None:
            raise RuntimeError("no communicator: POST /ludic/weights/init first")
        worker: Any = self
        manifest = WeightManifest.from_json(manifest_json)
        if self._ludic_pool is None:  # kept across pushes: fresh memory is slow to fault in
            self._ludic_pool = BufferPool(worker.device)
        buckets = receive_each_bucket(self._ludic_group, manifest, pool=self._ludic_pool)
        count = 0
        bad: list[str] = []

        def weights() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for bucket in buckets:
                bad.extend(nonfinite(bucket))
                for name, view in bucket.items():
                    count += 1
                    yield name, view.clone()

        stream = weights()
        self.ludic_reload(stream)
        for _ in stream:  # every broadcast must be matched, whatever the loader took
            pass
        return {"num_tensors": count, "nonfinite": bad}

    def ludic_reload(self, weights: Iterator[tuple[str, Any]]) -> None:
        """Load the received tensors (Hugging Face names, full tensors) into the served model.
        vLLM's `reload_weights` (the worker's) restores the checkpoint layout of each layer,
        loads into it (fusing and sharding) and re-runs the layer's post-load processing
        (e.g. the CPU backend's repacked GEMM weights): calling the model's `load_weights`
        after start-up fails there (its processed parameters lost their `weight_loader`).
        Older vLLM without `reload_weights`: the model's `load_weights`."""
        worker: Any = self
        reload = getattr(worker, "reload_weights", None)
        if callable(reload):
            reload(weights_iterator=weights, is_checkpoint_format=True)
        else:
            worker.model_runner.model.load_weights(weights=weights)

    def ludic_weights_held(self) -> dict[str, Any]:
        """What this worker holds after a load, for the trainer to verify: per parameter (in
        vLLM's fused, sharded layout) [total of its bits mod 2^32, numel, dtype], the model's
        `packed_modules_mapping` (which sent tensors were fused into which), and under
        "opaque" the parameters left empty because the backend keeps the weight elsewhere
        (vLLM's CPU backend packs linear weights into oneDNN / SGL kernel handles): those
        cannot be checksummed, only probed."""
        from ludic.distributed.checksum import element_totals
        from ludic.distributed.manifest import dtype_name

        worker: Any = self
        model = worker.model_runner.model
        named = [(n, t) for n, t in model.named_parameters() if t.numel() > 0]
        opaque = [n for n, t in model.named_parameters() if t.numel() == 0]
        totals = element_totals(named)
        held = {}
        for name, tensor in named:
            try:
                held[name] = [*totals[name], dtype_name(tensor.dtype)]
            except ValueError:  # a quantized dtype: reported without a comparable dtype
                held[name] = [*totals[name], str(tensor.dtype)]
        packed = getattr(model, "packed_modules_mapping", None) or {}
        return {
            "held": held,
            "opaque": opaque,
            "packed": {k: list(v) for k, v in dict(packed).items()},
        }

    def ludic_weights_close(self) -> None:
        self._ludic_group = None
