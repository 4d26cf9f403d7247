"""Tidal's Grafana dashboard, for Ray's Prometheus/Grafana integration.

Ray writes its own dashboards (default, Train, Serve, ...) into the session's
`metrics/grafana/dashboards` folder, which the Grafana that `ray metrics launch-prometheus` and
Ray's docs set up provisions from; `write_dashboard()` puts `tidal_grafana_dashboard.json`
beside them (`tidal start` calls it on the head). Every panel reads metrics that exist:
the scheduler's (`tidal.platform.metrics`, exported as `ray_tidal_*`) and Ray Serve's own
request-latency histogram (`ray_serve_http_request_latency_ms`), whose default buckets hold the
SLO of `tidal.serving.app` (100 ms), so SLO attainment is a ratio of two bucket rates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidal.serving.app import SLO_P99_S

UID = "tidalDashboard"


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int,
           stack: bool = False, description: str = "") -> dict[str, Any]:
    return {
        "id": pid, "title": title, "type": "timeseries", "datasource": "${datasource}",
        "description": description, "gridPos": {"x": x, "y": y, "w": 12, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {
            "stacking": {"mode": "normal" if stack else "none"}, "fillOpacity": 30 if stack else 0}},
            "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom",
                               "calcs": ["lastNotNull", "max"]}},
        "targets": [{"expr": e, "legendFormat": legend, "refId": chr(ord("A") + i)}
                    for i, (e, legend) in enumerate(exprs)],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard's JSON model (Grafana schema 27+, one Prometheus datasource variable)."""
    slo_ms = round(SLO_P99_S * 1000)
    lat = "ray_serve_http_request_latency_ms"
    panels = [
        _panel(1, "Jobs per state", [('sum(ray_tidal_jobs{state!~"SUCCEEDED|FAILED|CANCELLED|REJECTED"}) '
                                      'by (state)', "{{state}}")], "none", 0, 0, stack=True,
               description="Tidal jobs not yet ended, by state (PROFILING, QUEUED, RUNNING, STOPPING)"),
        _panel(2, "GPUs per job", [("sum(ray_tidal_job_gpus) by (job) > 0", "{{job}}")], "none", 12, 0,
               stack=True, description="GPUs each running job holds: the allocation timeline"),
        _panel(3, "GPUs per pool", [(f'sum(ray_tidal_pool_gpus{{kind="{k}"}}) by (pool)', f"{{{{pool}}}} {k}")
                                    for k in ("total", "lendable", "lent")],
               "none", 0, 8, description="Training and inference pools; inference GPUs lent to training"),
        _panel(4, "Reclaims and plan changes", [("sum(increase(ray_tidal_reclaims[5m]))", "reclaims / 5 min"),
                                                ("sum(increase(ray_tidal_plan_changes[5m]))",
                                                 "plan changes / 5 min")],
               "none", 12, 8, description="Jobs stopped to return lent GPUs to Serve; reconfigurations"),
        _panel(5, "Samples/s: predicted vs measured",
               [('sum(ray_tidal_job_samples_per_s{kind="predicted"}) by (job) > 0', "{{job}} predicted"),
                ('sum(ray_tidal_job_samples_per_s{kind="measured"}) by (job) > 0', "{{job}} measured")],
               "none", 0, 16, description="The performance model's prediction for the plan a job runs, "
                                          "and what the run measures (the online correction's input)"),
        _panel(6, "Admission time", [("max(ray_tidal_admission_seconds) by (job)", "{{job}}")], "s", 12, 16,
               description="Seconds from submit to QUEUED (profiled) or REJECTED"),
        _panel(7, "Serving p99 latency", [
            (f"histogram_quantile(0.99, sum(rate({lat}_bucket{{route!~\"/-/.*\"}}[1m])) "
             "by (application, le))", "{{application}} p99"), (f"vector({slo_ms})", "SLO")],
               "ms", 0, 24, description="Ray Serve's HTTP request latency per application"),
        _panel(8, "Serving SLO attainment", [
            (f"sum(rate({lat}_bucket{{le=\"{slo_ms}\",route!~\"/-/.*\"}}[1m])) by (application) / "
             f"sum(rate({lat}_count{{route!~\"/-/.*\"}}[1m])) by (application)", "{{application}}")],
               "percentunit", 12, 24, description=f"Share of requests answered within {slo_ms} ms"),
        _panel(9, "Restart cost charged by the policy",
               [("max(ray_tidal_restart_cost_seconds)", "restart cost")], "s", 0, 32,
               description="Median stop + median launch-to-first-step of the scheduler's own runs "
                           "(tidal.core.restarts), or the pinned value"),
    ]
    return {
        "uid": UID, "title": "Tidal", "tags": ["tidal", "ray"], "timezone": "browser", "editable": True,
        "schemaVersion": 27, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "hide": 0, "current": {"selected": False}, "options": [], "refresh": 1}]},
        "panels": panels,
    }


def dashboards_dir(session: Path | None = None) -> Path:
    """Ray's Grafana dashboards folder of a session (default: this machine's latest)."""
    root = session or Path("/tmp/ray/session_latest")
    return root / "metrics" / "grafana" / "dashboards"


def write_dashboard(folder: Path | None = None) -> Path:
    """Write `tidal_grafana_dashboard.json` beside Ray's dashboards; returns its path."""
    folder = folder or dashboards_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tidal_grafana_dashboard.json"
    path.write_text(json.dumps(dashboard(), indent=2))
    return path
