"""The README's quickstart as a user runs it on a cluster: `ray job submit` (the command the
README and `examples/demo.py --keep` print, without `RAY_AUTH_MODE`: the session's cluster, like
the demo's, runs without Ray's token auth) of `examples/quickstart.py`, which submits its job
to the running scheduler and waits for it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _readme_line() -> list[str]:
    """The README's `ray job submit` line for the demo's cluster (its dashboard at 127.0.0.1:8265)."""
    text = (ROOT / "README.md").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ray job submit --address http://127.0.0.1:8265")]
    return shlex.split(line)


def test_the_readmes_ray_job_submit_line_runs_the_quickstart(ray_cluster: Any, scheduler: Any) -> None:
    import ray

    argv = _readme_line()
    assert argv[argv.index("--") + 1:] == ["python", "examples/quickstart.py"]
    # as printed, but for the session's dashboard address, the venv's `ray`, and its `python`
    # (`. .venv/bin/activate` puts it first on the raylets' PATH; the session's raylets have the
    # test's PATH)
    argv[0] = str(Path(sys.executable).parent / "ray")
    argv[argv.index("--address") + 1] = f"http://{ray_cluster.webui_url}"
    argv[argv.index("--") + 1] = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    assert re.search(r"^SUCCEEDED$", out.stdout, re.M), tail
    (row,) = [r for r in ray.get(scheduler.status.remote()) if r["name"] == "quickstart"]
    assert row["state"] == "SUCCEEDED" and row["step"] == 60, row
