"""The README's quickstart as a user runs it on a cluster: `ray job submit` (the command the
README and `examples/demo.py --keep` print, without `RAY_AUTH_MODE`: the session's cluster, like
the demo's, runs without Ray's token auth) of `examples/quickstart.py`, which submits its job
to the running scheduler and waits for it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_quickstart_runs_as_a_ray_job_to_success(ray_cluster: Any, scheduler: Any) -> None:
    import ray

    dashboard = ray_cluster.webui_url  # host:port of the session's dashboard
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    # `python` on the raylets' PATH is this interpreter's, as `. .venv/bin/activate` makes it
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", f"http://{dashboard}",
         "--working-dir", ".", "--", sys.executable, "examples/quickstart.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    assert re.search(r"^SUCCEEDED$", out.stdout, re.M), tail
    (row,) = [r for r in ray.get(scheduler.status.remote()) if r["name"] == "quickstart"]
    assert row["state"] == "SUCCEEDED" and row["step"] == 60, row
