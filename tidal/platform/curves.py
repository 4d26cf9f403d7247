"""Each job's loss curve over its ended runs: one JSON file per job beside the state file
(`<state dir>/curves/<job>.json`), later runs winning a step they share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Curves:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def read(self, job_id: str) -> list[dict[str, Any]]:
        path = self.dir / f"{job_id}.json"
        return json.loads(path.read_text()) if path.exists() else []

    def save(self, job_id: str, history: list[dict[str, Any]]) -> None:
        steps = {int(m["step"]): m for m in self.read(job_id)}
        steps.update({int(m["step"]): m for m in history})
        (self.dir / f"{job_id}.json").write_text(json.dumps([steps[k] for k in sorted(steps)]))

    # -- the controller ------------------------------------------------------------------
