"""A queued job makes Ray's autoscaler launch a node, runs on it, and the node goes when idle: a
script of its own (its Ray cluster, with Ray's autoscaler in it, cannot be the test session's),
run by `test_autoscaling.test_queued_job_launches_a_node`.

    python -m tests.deploy.autoscaling_scenario STATE_DIR OUT.json

The cluster is `cluster-local.yaml` (Ray's fake multi-node provider: a launched "node" is another
raylet on this machine) started by `ray.cluster_utils.AutoscalingCluster` with autoscaler v2,
which honours the node request's label selector (training pool only). The head is one 2-GPU
training node. Job A, guaranteed its 2 GPUs (so the policy does not stop it for B, the shorter
job), takes both of the head's GPUs and keeps training. Job B needs 4 GPUs, more than the
cluster has: admission sizes it against the nodes the autoscaler may launch (the scheduler is
given the config), so it queues; the scheduler asks for B's GPUs
(`tidal.core.autoscale.node_request`; A's are in its Ray Train run's registration with the same
`AutoscalingCoordinator`); the autoscaler launches two `training_gpu` nodes; B runs
there and finishes; A is cancelled; the idle nodes are terminated. Writes the nodes seen over
time, B's allocations and the scheduler's events to OUT.json (the test asserts on them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

# `ray start` turns token authentication on (Ray 2.60): a driver of such a cluster sends the token
# (~/.ray/auth_token) only with this set, and Ray reads it once, so before it is imported
os.environ["RAY_AUTH_MODE"] = "token"

import ray
import yaml
from ray.cluster_utils import AutoscalingCluster

from tests.conftest import tiny_gpt_spec
from tests.platform.ray_restart_scenario import wait  # the nodes seen are in OUT.json
from tidal.core.policy import PolicyConfig
from tidal.jobs import Plan
from tidal.platform import sdk
from tidal.platform.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "cluster-local.yaml"
HEAD = "ray.head.default"
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"  # the fake provider's


class LocalAutoscalingCluster(AutoscalingCluster):
    """`AutoscalingCluster` on `cluster-local.yaml`, on a GCS port of its own.

    Two departures from the base class, both so that it can share a machine with other Ray
    clusters (a developer's, the test session's): it neither starts nor stops with
    `ray stop --force` (which ends every Ray process on the machine), and its head listens on
    `port`, not 6379. It reads the node types from `cluster-local.yaml` instead of the fake
    provider's example.yaml, which the Ray 2.60 wheel does not ship."""

    def __init__(self, config: Path, port: int) -> None:
        self.port = port
        self.file = yaml.safe_load(config.read_text())
        head = self.file["available_node_types"][HEAD]
        workers = {k: v for k, v in self.file["available_node_types"].items() if k != HEAD}
        super().__init__(head_resources=dict(head["resources"]), worker_node_types=workers,
                         autoscaler_v2=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{ray.util.get_node_ip_address()}:{self.port}"

    def _generate_config(self, head_resources: dict[str, Any], worker_node_types: dict[str, Any],
                         autoscaler_v2: bool = False, **config_kwargs: Any) -> dict[str, Any]:
        config: dict[str, Any] = json.loads(json.dumps(self.file))  # a deep copy
        config["available_node_types"] = {**worker_node_types, HEAD: self.file["available_node_types"][HEAD]}
        config["provider"]["gcs_address"] = self.address
        if autoscaler_v2:  # as the base class does
            config["provider"]["launch_multiple"] = True
            config["provider"]["head_node_id"] = FAKE_HEAD_NODE_ID
        return config

    def start(self, _system_config: dict[str, Any] | None = None,
              override_env: dict[str, str] | None = None) -> None:
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(self._config, f)
        head = self.file["available_node_types"][HEAD]
        res = dict(head["resources"])
        ray_cli = str(Path(sys.executable).with_name("ray"))  # this interpreter's, PATH or not
        cmd = [ray_cli, "start", "--head", "--block", f"--port={self.port}", f"--autoscaling-config={path}",
               f"--num-cpus={res.pop('CPU')}", f"--num-gpus={res.pop('GPU', 0)}", "--include-dashboard=false"]
        if res:
            cmd.append(f"--resources={json.dumps(res)}")
        env = {**os.environ, "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1",
               "RAY_OVERRIDE_LABELS": json.dumps(head.get("labels", {})),
               # autoscaler v2, as the base class sets it up
               "RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
               "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID, **(override_env or {})}
        # `ray start` with RAY_AUTH_MODE=token needs a token and does not make one (a fresh
        # machine has none): make it, as `ray.init` does for a local cluster, if none exists
        subprocess.run([ray_cli, "get-auth-token", "--generate"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:  # the head is up once its GCS accepts connections
            try:
                socket.create_connection((ray.util.get_node_ip_address(), self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"the head did not start: {' '.join(cmd)}") from None
                time.sleep(0.5)

    def shutdown(self) -> None:
        """The head's `ray start --block` ends the head's processes; a node the autoscaler
        launched and has not terminated yet is ended by its GCS address."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        mine = {f"--gcs-address={self.address}", f"--gcs_server_port={self.port}"}
        for p in psutil.process_iter(["cmdline"]):
            if mine & set(p.info["cmdline"] or []):
                with contextlib.suppress(psutil.Error):
                    p.kill()


def say(what: str) -> None:
    """A progress line on stderr (the test shows it when the scenario fails)."""
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def gpu_nodes() -> dict[str, str]:
    """Alive nodes with GPUs: id → pool label."""
    return {n["NodeID"]: (n.get("Labels") or {}).get("tidal.io/pool", "")
            for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU", 0) > 0}


def diagnose(cluster: LocalAutoscalingCluster, result: dict[str, Any]) -> dict[str, Any]:
    """The jobs' states and events, the scheduler's last events and the autoscaler's view of the
    cluster (launches, pending requests, failures), each best effort."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    got: dict[str, Any] = {}
    probes: dict[str, Any] = {
        "jobs": lambda: ray.get(sdk.connect().status.remote(), timeout=30),
        "events": lambda: ray.get(sdk.connect().recent_events.remote(), timeout=30),
        "autoscaler": lambda: str(get_cluster_status(cluster.address)),
        "nodes": lambda: [{k: n.get(k) for k in ("NodeID", "Alive", "Resources", "Labels")}
                          for n in ray.nodes()],
    }
    for name, probe in probes.items():
        try:
            got[name] = probe()
        except Exception as e:  # a diagnosis must not hide the failure
            got[name] = f"{type(e).__name__}: {e}"
    return got


def main(state: Path, out: Path) -> None:
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    os.environ.setdefault("TIDAL_STORAGE", str(state / "runs"))
    cluster = LocalAutoscalingCluster(CONFIG, free_port())
    cluster.start()
    say(f"head up at {cluster.address}")
    seen: list[dict[str, Any]] = []
    result: dict[str, Any] = {"nodes": seen}
    try:
        for attempt in range(3):  # the head's raylet registers late on a loaded machine (30-s wait)
            try:
                ray.init(address=cluster.address, log_to_driver=False)
                break
            except ConnectionError:
                if attempt == 2:
                    raise
        cfg = SchedulerConfig(tick_s=1.0, state_path=str(state / "tidal.sqlite"), profile_samples=1,
                              profile_steps=1, profile_gpus=0.0, cpus_per_worker=0.5,
                              policy=PolicyConfig(aging_s=1e6), autoscaling_config=cluster.file)
        actor = sdk.connect(cfg)
        say("connected; the scheduler is up")
        head = set(gpu_nodes())
        result["head"] = sorted(head)

        def look() -> dict[str, str]:
            now = gpu_nodes()
            if not seen or seen[-1]["nodes"] != now:
                seen.append({"t": time.time(), "nodes": now})
                say(f"GPU nodes: {sorted(now.values())}")
            return now

        a = sdk.JobHandle(ray.get(actor.submit.remote(tiny_gpt_spec(
            name="autoscale-a", total_steps=10**6, min_gpus=2, max_gpus=2, checkpoint_every=200,
            guaranteed=True, requested_gpus=2, plan=Plan(dp=2, zero_stage=1, micro_batch=4)))), actor)
        wait(lambda: look() and a.status()["state"] == "RUNNING", "A to run on the head", 240)
        say("A runs")
        b = sdk.JobHandle(ray.get(actor.submit.remote(tiny_gpt_spec(
            name="autoscale-b", total_steps=150, min_gpus=4, max_gpus=4, seed=5))), actor)
        b_alloc: list[list[Any]] = []
        b_last: list[tuple[str, str]] = [("", "")]

        def b_done() -> bool:
            look()
            st = b.status()
            if (st["state"], st["reason"]) != b_last[-1]:
                b_last.append((st["state"], st["reason"]))
                say(f"B {st['state']} {st['reason']}")
            if st["state"] == "RUNNING" and st["allocation"] and st["allocation"] not in b_alloc:
                b_alloc.append(st["allocation"])
            return bool(st["state"] in ("SUCCEEDED", "FAILED", "REJECTED", "CANCELLED"))

        wait(b_done, "B to finish", 420)
        result["b"] = {"final": b.status(), "allocations": b_alloc,
                       "events": ray.get(actor.job_events.remote(b.job_id))}
        result["a_state_before_cancel"] = a.status()["state"]
        say(f"B ended {result['b']['final']['state']}; A cancelled")
        a.cancel()
        wait(lambda: set(look()) <= head, "the launched node to go when idle", 240)
        result["events"] = ray.get(actor.recent_events.remote())
    except BaseException:  # what a failure needs to be understood, in OUT.json
        result["on_failure"] = diagnose(cluster, result)
        raise
    finally:
        out.write_text(json.dumps(result, indent=1, default=str))
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
