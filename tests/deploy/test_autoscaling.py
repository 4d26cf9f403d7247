"""Node autoscaling on Ray's fake multi-node provider (`cluster-local.yaml`): a queued job makes
the autoscaler launch a training node, finishes on it, and the node goes away when idle. The
cluster and its driver run in tests/deploy/autoscaling_scenario.py, a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_queued_job_launches_a_node_that_goes_when_idle(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "tests.deploy.autoscaling_scenario", str(tmp_path / "state"),
                    str(out)], check=True, timeout=1200, cwd=ROOT)
    r = json.loads(out.read_text())
    head = set(r["head"])
    launched: dict[str, tuple[str, float]] = {}  # node → (pool, when first seen)
    for seen in r["nodes"]:
        for nid, pool in seen["nodes"].items():
            if nid not in head:
                launched.setdefault(nid, (pool, seen["t"]))
    assert len(launched) == 1, r["nodes"]  # one node for B's two GPUs, no more
    (node, (pool, up_at)), = launched.items()
    assert pool == "training", pool  # the request's label selector kept it off the inference type

    b = r["b"]
    assert b["final"]["state"] == "SUCCEEDED", b["final"]
    assert b["allocations"] == [[[node, 2]]], b["allocations"]  # B ran on the launched node, whole
    queued_at = next(e["t"] for e in b["events"] if e["to"] == "QUEUED")
    ended_at = next(e["t"] for e in b["events"] if e["to"] == "SUCCEEDED")
    assert queued_at < up_at, "the node came before B queued: it was not launched for B"
    asked = [e for e in r["events"] if "asked the autoscaler for 4 GPUs" in e]
    assert asked, r["events"]  # A's two GPUs and B's two, in one request
    assert any("withdrew the autoscaler request" in e for e in r["events"]), r["events"]
    assert r["a_state_before_cancel"] == "RUNNING"  # A kept its place on the head meanwhile

    assert set(r["nodes"][-1]["nodes"]) == head, r["nodes"][-1]  # the launched node went away
    gone_at = r["nodes"][-1]["t"]
    print(f"\nnode up {up_at - queued_at:.1f} s after B queued; B ran {ended_at - up_at:.1f} s on it; "
          f"node gone {gone_at - ended_at:.1f} s after B ended")
