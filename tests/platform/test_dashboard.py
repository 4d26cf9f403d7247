"""Tidal's Grafana dashboard reads only metrics that exist: the scheduler's and Ray Serve's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tidal.platform import metrics
from tidal.platform.dashboard import dashboard, write_dashboard


def test_every_panel_reads_a_metric_tidal_or_serve_exports(tmp_path: Path) -> None:
    d = json.loads(write_dashboard(tmp_path).read_text())
    assert d == dashboard() and d["uid"] and d["panels"]
    source = Path(metrics.__file__).read_text()
    exported = {f"ray_{m}" for m in re.findall(r'"(tidal_[a-z_]+)"', source)}
    serve = {"ray_serve_http_request_latency_ms"}
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)
    for p in d["panels"]:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = {re.sub(r"_(bucket|count)$", "", n) for n in re.findall(r"\bray_[a-z_]+", t["expr"])}
            assert t["expr"].startswith("vector(") or names, t["expr"]
            assert names <= exported | serve, (p["title"], names - exported - serve)
    assert any("le=\"100\"" in t["expr"] for p in d["panels"] for t in p["targets"])  # the SLO bucket
