"""Your own Ray Serve app on Tidal's inference pool: its idle GPUs are lent to training.

Nothing in it is Tidal's. Two settings put it in the pool and make its demand readable:

- `ray_actor_options["label_selector"] = {"tidal.io/pool": "inference"}`: its replicas run on
  the inference nodes (labelled by `ray start --labels` or the cluster's node types);
- Serve's own autoscaling (`autoscaling_config`): Tidal's loan manager reads the replicas Serve
  wants for it (running, starting or pending; `serve status` shows the same), keeps them and a
  forecast of their rise, and lends the rest of the pool's GPUs to training. When Serve wants
  more, training jobs on lent GPUs stop at a step boundary with a checkpoint and give them back.

    serve run --app-dir examples own_serve_app:app    # on a cluster where `tidal start` runs

A deployment may also run Tidal's autoscaling policy (`tidal.serving.autoscaling`), as
Tidal's own GPT app does: then Serve's replicas and the loans come from one forecast and a
surge starts a reclaim before requests queue. Without it, as here, the loan manager sees a surge
once Serve's autoscaler has raised the replica count.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve


@serve.deployment(
    ray_actor_options={"num_gpus": 1, "num_cpus": 0.25, "label_selector": {"tidal.io/pool": "inference"}},
    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 2,
                        "upscale_delay_s": 1.0, "downscale_delay_s": 600.0},
    max_ongoing_requests=8,
)
class Classifier:
    """A stand-in model: 0.2 s of 'GPU' work per request, then an answer."""

    async def __call__(self, request: Any) -> dict[str, Any]:
        body = await request.json()
        await asyncio.sleep(0.2)
        return {"label": "positive" if "good" in str(body.get("text", "")) else "negative"}


app = Classifier.bind()
