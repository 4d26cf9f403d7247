"""The inference side: a Ray Serve application that continues prompts with the repository's GPT,
loaded from a Tidal checkpoint (the full fp32 weights any plan writes).

    app = gpt_app(checkpoint="~/.cache/tidal/runs/<run>/step_00000300")  # at the shape it was trained
    serve.run(app, name="gpt", route_prefix="/gpt")
    # POST /gpt  {"prompt": "ROMEO:", "max_new_tokens": 32, "seed": 0}
    #        →   {"completion": "...", "tokens": 32, "step": 300}

Each replica asks for one GPU (`num_gpus=1`: logical GPUs on CPU machines) and, through a Ray
label selector, a node of the inference pool (`tidal.io/pool=inference`, set by `ray start
--labels` or the cluster launcher's node types). A request that is not valid JSON, has no
`prompt` string, uses characters outside the model's vocabulary, or asks for more than
`MAX_NEW_TOKENS` is answered 400 with one line naming the field; no request reaches the model
unchecked.

**Overload degrades into fast refusals, not long waits.** A body over `MAX_BODY_BYTES` is
answered 413 from its `Content-Length` (or as soon as a streamed body passes the bound) without
being parsed: the model reads a prompt's last `seq_len` characters, so a larger body only costs
a replica time. Each caller (Serve's HTTP proxy) queues at most `max_queued_requests` requests
for the deployment beyond those the replicas hold (`max_ongoing_requests` each); more are
answered 503 with `Retry-After` at once (Serve's backpressure). The default bound is what one
replica drains in `QUEUE_S` at its measured capacity, so a request that is queued waits about
that long at worst, even with the availability floor of one replica.

**Autoscaling** is Tidal's policy (`tidal.serving.autoscaling`): Serve's own ratio of ongoing
requests to `target_ongoing_requests`, raised to the replicas the loan step keeps for the
deployment, and published as the loan step's demand, so the replicas and the loans come from one
signal and one forecast. `target_ongoing_requests` per replica is chosen from the latency SLO and
one replica's measured capacity (Little's law: a replica that serves `REPLICA_RPS` requests/s
within the SLO holds on average `REPLICA_RPS · mean latency` requests in flight). The loan
manager (`tidal.serving.loans`) lends the GPUs these replicas do not need.

`REPLICA_RPS` is one replica's measured capacity at the SLO on this repository's CPU machines
(benchmarks/serve_capacity.py: the highest offered rate whose p99 stays within `SLO_P99_S`); the
simulator (`benchmarks/loan_compare.py`) uses it.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import time
from typing import Any

POOL_LABEL = "tidal.io/pool"
SLO_P99_S = 0.1  # the deployment's latency SLO: p99 of a 16-token continuation
MAX_NEW_TOKENS = 64
MAX_BODY_BYTES = 64 * 1024  # a request body's bound: 413 beyond it
QUEUE_S = 2.0  # the longest a queued request should wait: the queue's bound is one replica's work of it
RETRY_AFTER_S = 1.0  # what a shed request is told to wait
# benchmarks/serve_capacity.py on a 2-core CPU machine (d_model 64, 2 layers, 16 tokens): 40 req/s
# within the SLO in two runs (60 req/s once within, once at p99 0.127 s: the replayer shares the cores)
REPLICA_RPS = 40.0
SERVING_NICE = 0  # a replica's OS priority on logical GPUs where it may raise it (claim_cpu_before_training)


class BadRequest(ValueError):
    """A request the model cannot answer: 400 with this message."""


def parse_request(body: Any, vocab: str) -> tuple[str, int, int]:
    """(prompt, max_new_tokens, seed) of a request body, or BadRequest naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt: a non-empty string is required")
    bad = sorted(set(prompt) - set(vocab))
    if bad:
        raise BadRequest(f"prompt: characters outside the model's vocabulary: {''.join(bad)!r}")
    n = body.get("max_new_tokens", 16)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_NEW_TOKENS:
        raise BadRequest(f"max_new_tokens: an integer from 1 to {MAX_NEW_TOKENS}")
    seed = body.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**64:
        # what torch.Generator.manual_seed takes: 2**64 was a 500 with a traceback
        raise BadRequest("seed: an integer from -2**63 to 2**64 - 1")
    return prompt, n, seed


class GPTServer:
    """One replica: the model in eval mode on this replica's device."""

    def __init__(self, checkpoint: str | None, model: dict[str, Any]) -> None:
        import torch

        from tidal.jobs.checkpoint import TrainState
        from tidal.jobs.data import load_shakespeare
        from tidal.jobs.reference import load_model, shakespeare_gpt

        torch.set_num_threads(1)
        self.spec = shakespeare_gpt(**model)
        self.corpus = load_shakespeare()
        if checkpoint:
            state = TrainState.load(checkpoint)
            self.model = load_model(self.spec, state.params)
            self.step = state.step
        else:  # untrained weights: the deployment still works (capacity measurements)
            self.model = self.spec.model().eval()
            self.step = 0
        # a replica that sees a GPU (Ray sets CUDA_VISIBLE_DEVICES for num_gpus=1) serves on it
        self.model = self.model.to("cuda" if torch.cuda.is_available() else "cpu")
        if not torch.cuda.is_available():
            claim_cpu_before_training()
        self.vocab = self.corpus.vocab

    async def __call__(self, request: Any) -> Any:
        import json

        from starlette.responses import JSONResponse

        too_big = JSONResponse({"error": f"the body is over {MAX_BODY_BYTES} bytes"}, status_code=413)
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > MAX_BODY_BYTES):
            return too_big
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return too_big
        try:
            body = json.loads(bytes(raw))
        except ValueError:
            return JSONResponse({"error": "the body is not valid JSON"}, status_code=400)
        try:
            prompt, n, seed = parse_request(body, self.vocab)
        except BadRequest as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return self.complete(prompt, n, seed)

    def complete(self, prompt: str, n: int, seed: int) -> dict[str, Any]:
        import torch

        from tidal.jobs.reference import generate

        t = time.perf_counter()
        with torch.inference_mode():  # no autograd graph: eval mode alone still records one
            text = generate(self.model, self.corpus, prompt, n, seed=seed)
        return {"completion": text[len(prompt):], "tokens": n, "step": self.step,
                "seconds": time.perf_counter() - t}


def claim_cpu_before_training() -> bool:
    """On logical GPUs, move this replica, and Serve's HTTP proxies on this machine, from Ray's
    worker priority (nice 15, training's too until its loop lowers it) to `SERVING_NICE`, where
    the OS allows it (root, CAP_SYS_NICE): on one machine they share the cores with training's
    workers, their start-ups and Ray Train's actors, which a real GPU would isolate them from,
    and every request passes through a proxy. Elsewhere they stay at 15 and only training's loop
    yields (`tidal.jobs.engine.yield_cpu_to_serving`). Whether the replica could."""
    from tidal.jobs.engine import renice_threads

    if not renice_threads(SERVING_NICE):
        return False
    for pid in serve_proxies():
        renice_threads(SERVING_NICE, pid=pid)
    return True


def serve_proxies() -> list[int]:
    """The process ids of Ray Serve's HTTP proxies on this machine (Ray titles them
    `ray::ProxyActor`); none where there is no procfs."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read(64).startswith(b"ray::ProxyActor"):
                        found.append(int(entry))
    return found


def target_ongoing(replica_rps: float = REPLICA_RPS, slo_s: float = SLO_P99_S) -> float:
    """Requests in flight per replica at capacity (Little's law, latency ≈ half the p99 SLO)."""
    return max(1.0, replica_rps * slo_s / 2)


SHAPE = ("seq_len", "d_model", "n_layer", "n_head", "vocab_size")  # the served GPT's shape fields


def check_serving(checkpoint: str | None, model: Any) -> tuple[str | None, dict[str, Any]]:
    """The checkpoint (`~` expanded) and model shape a replica would load, checked on this
    machine before anything is deployed: the shape must be a mapping of `SHAPE` fields to
    integers that make a GPT (`GPTConfig`'s rules, over `shakespeare_gpt`'s defaults, which a
    replica uses); a local checkpoint must be a whole Tidal checkpoint (its meta and state file)
    whose weights have that shape (a URI is left to the replicas). The shape a run recorded in
    the checkpoint's meta (`"model"`: `tidal.jobs.checkpoint.model_config`) gives the fields
    `model` leaves out; a field `model` gives otherwise is an error. A ValueError of one line
    naming what is wrong otherwise: a replica that cannot load retries until Serve gives up, and
    its traceback is in a replica's log, not in front of the user."""
    from tidal.jobs.checkpoint import CheckpointError, read_complete_meta

    if model is None:
        model = {}
    if not isinstance(model, dict):
        raise ValueError(f"model: expected a mapping of {', '.join(SHAPE)}, got {model!r}")
    if unknown := sorted(set(model) - set(SHAPE)):
        raise ValueError(f"model: unknown field(s) {', '.join(map(str, unknown))} "
                         f"(known: {', '.join(SHAPE)})")
    if bad := [k for k, v in model.items() if not _is_int(v)]:
        raise ValueError(f"model: {bad[0]} must be an integer, got {model[bad[0]]!r}")
    try:
        _served_config(model, vocab_size=1)
    except ValueError as e:
        raise ValueError(f"model: {e}") from None
    if checkpoint and "://" not in checkpoint:
        checkpoint = os.path.expanduser(checkpoint)
        try:
            trained = read_complete_meta(checkpoint).get("model")
        except (CheckpointError, OSError, ValueError) as e:
            raise ValueError(f"checkpoint: {e}") from None
        if not isinstance(trained, dict):  # a checkpoint older than the record: `model` alone
            trained = {}
        trained = {k: v for k, v in trained.items() if k in SHAPE and _is_int(v)}
        if differ := [k for k in SHAPE if k in model and k in trained and model[k] != trained[k]]:
            raise ValueError("model: " + ", ".join(f"{k} {model[k]}" for k in differ) + f" is not the shape "
                             f"{checkpoint} was trained at (" + ", ".join(f"{k} {trained[k]}" for k in differ)
                             + "): leave it out, a checkpoint is served at its own shape")
        model = {**trained, **model}
        try:
            _check_weights(checkpoint, model)
        except (CheckpointError, OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
            raise ValueError(f"checkpoint: {e}") from None
    return checkpoint, dict(model)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _served_config(model: dict[str, Any], vocab_size: int) -> Any:
    """The `GPTConfig` a replica builds from `model` (`shakespeare_gpt(**model)`: its defaults,
    not GPTConfig's), with `vocab_size` where `model` gives none (a replica uses the corpus's)."""
    import inspect

    from tidal.jobs.models import GPTConfig
    from tidal.jobs.reference import shakespeare_gpt

    defaults = {k: p.default for k, p in inspect.signature(shakespeare_gpt).parameters.items()
                if k in SHAPE and k != "vocab_size"}
    return GPTConfig(**{**defaults, "vocab_size": vocab_size, **model})


def _check_weights(checkpoint: str, model: dict[str, Any]) -> None:
    """The checkpoint's weights fit the served model: same names, same shapes (the state file is
    memory-mapped, so only what the shapes need is read). The vocabulary's size is checked
    only where `model` names one: otherwise a replica takes the corpus's, which a checkpoint of
    this repository's GPT was trained on. CheckpointError naming the first difference."""
    from pathlib import Path

    import torch

    from tidal.jobs.checkpoint import STATE_FILE, CheckpointError
    from tidal.jobs.models import TinyGPT

    raw = torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", mmap=True, weights_only=False)
    params = raw.get("params") if isinstance(raw, dict) else None
    have = {k: tuple(v.shape) for k, v in (params if isinstance(params, dict) else {}).items()
            if isinstance(v, torch.Tensor)}
    if not have:
        raise CheckpointError(f"{checkpoint} holds no model weights")
    vocab = have.get("tok.weight", (1,))[0]
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        want = {k: tuple(v.shape) for k, v in TinyGPT(_served_config(model, vocab)).state_dict().items()}
    if have == want:
        return

    def shape(w: dict[str, tuple[int, ...]]) -> str:  # the shape fields weights show (n_head: none)
        n_layer = len({k.split(".")[1] for k in w if k.startswith("blocks.")})
        (v, d), (t, _) = w.get("tok.weight", (0, 0)), w.get("pos.weight", (0, 0))
        return f"seq_len {t}, d_model {d}, n_layer {n_layer}, vocab_size {v}"

    diff = (f"no weight {m[0]!r}" if (m := sorted(set(want) - set(have)))
            else f"weight {e[0]!r} is not the served GPT's" if (e := sorted(set(have) - set(want)))
            else next(f"weight {k!r} is {list(have[k])}, the served GPT's {list(want[k])}"
                      for k in want if have[k] != want[k]))
    raise CheckpointError(f"{checkpoint} holds a GPT of {shape(have)}, the served one is {shape(want)} "
                          f"({diff}): serve it at the shape it was trained with (--serve-model, "
                          "gpt_app's model=)")


def gpt_app(*, checkpoint: str | None = None, model: dict[str, Any] | None = None, min_replicas: int = 1,
            max_replicas: int = 4, pool: str | None = "inference", num_cpus: float = 0.5,
            replica_rps: float = REPLICA_RPS, slo_s: float = SLO_P99_S,
            upscale_delay_s: float = 2.0, downscale_delay_s: float = 30.0,
            max_queued_requests: int | None = None) -> Any:
    """The Serve application (bind it with `serve.run`). `replica_rps` sets the autoscaler's
    target; `max_queued_requests` (default: ⌈REPLICA_RPS · QUEUE_S⌉, one replica's measured
    capacity) bounds each caller's queue, beyond which requests are shed with 503."""
    from ray import serve
    from ray.serve.config import AutoscalingPolicy, BackpressureConfig

    from tidal.serving.autoscaling import POLICY

    if not 0 <= min_replicas <= max_replicas:
        raise ValueError(f"replicas: need 0 <= min_replicas ({min_replicas}) "
                         f"<= max_replicas ({max_replicas})")
    queued = math.ceil(REPLICA_RPS * QUEUE_S) if max_queued_requests is None else max_queued_requests
    if queued < 1:
        raise ValueError(f"max_queued_requests: at least 1, got {queued}")
    checkpoint, model = check_serving(checkpoint, model)
    actor: dict[str, Any] = {"num_gpus": 1, "num_cpus": num_cpus}
    if pool:
        actor["label_selector"] = {POOL_LABEL: pool}
    dep = serve.deployment(GPTServer, name="gpt", ray_actor_options=actor,
                           max_ongoing_requests=max(4, math.ceil(2 * target_ongoing(replica_rps, slo_s))),
                           max_queued_requests=queued,
                           backpressure_config=BackpressureConfig(status_code=503,
                                                                  retry_after_s=RETRY_AFTER_S),
                           autoscaling_config={
                               "min_replicas": min_replicas, "max_replicas": max_replicas,
                               "initial_replicas": max(1, min_replicas),
                               "target_ongoing_requests": target_ongoing(replica_rps, slo_s),
                               "upscale_delay_s": upscale_delay_s, "downscale_delay_s": downscale_delay_s,
                               # replicas and handles push their request counts every
                               # metrics_interval_s (Ray 2.60's default: 10 s, so a surge would
                               # wait up to 10 s to be seen); the look-back must be longer
                               "metrics_interval_s": 1.0, "look_back_period_s": 3.0,
                               "policy": AutoscalingPolicy(policy_function=POLICY),
                           })
    return dep.bind(checkpoint, model)  # type: ignore[attr-defined]
