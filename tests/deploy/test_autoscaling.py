"""Node autoscaling on Ray's fake multi-node provider (`cluster-local.yaml`): a job larger than
the cluster queues, makes the autoscaler launch training nodes, finishes on them, and the nodes
go away when idle. The
cluster and its driver run in tests/deploy/autoscaling_scenario.py, a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_job_larger_than_the_cluster_launches_nodes_that_go_when_idle(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "tests.deploy.autoscaling_scenario", str(tmp_path / "state"),
                           str(out)], timeout=1200, cwd=ROOT)
    r = json.loads(out.read_text()) if out.exists() else {}
    assert done.returncode == 0, json.dumps(r, indent=1)  # what the scenario saw, to say why
    head = set(r["head"])
    launched: dict[str, tuple[str, float]] = {}  # node → (pool, when first seen)
    for seen in r["nodes"]:
        for nid, pool in seen["nodes"].items():
            if nid not in head:
                launched.setdefault(nid, (pool, seen["t"]))
    assert len(launched) == 2, r["nodes"]  # two 2-GPU nodes for B's four GPUs, no more
    assert {pool for pool, _ in launched.values()} == {"training"}, launched  # the label selector
    up_at = max(t for _, t in launched.values())

    b = r["b"]
    assert b["final"]["state"] == "SUCCEEDED", b["final"]  # admitted though larger than the cluster was
    assert [sorted(map(tuple, a)) for a in b["allocations"]] == [sorted((n, 2) for n in launched)], \
        b["allocations"]  # B ran on the launched nodes, and only there
    queued_at = next(e["t"] for e in b["events"] if e["to"] == "QUEUED")
    ended_at = next(e["t"] for e in b["events"] if e["to"] == "SUCCEEDED")
    assert queued_at < min(t for _, t in launched.values()), "a node came before B queued: not for B"
    asked = [e for e in r["events"] if "asked the autoscaler for 6 GPUs" in e]
    assert asked, r["events"]  # A's two GPUs and B's four, in one request
    assert any("withdrew the autoscaler request" in e for e in r["events"]), r["events"]
    assert r["a_state_before_cancel"] == "RUNNING"  # A kept its place on the head meanwhile

    assert set(r["nodes"][-1]["nodes"]) == head, r["nodes"][-1]  # the launched node went away
    gone_at = r["nodes"][-1]["t"]
    print(f"\nnodes up {up_at - queued_at:.1f} s after B queued; B ran {ended_at - up_at:.1f} s on them; "
          f"nodes gone {gone_at - ended_at:.1f} s after B ended")
