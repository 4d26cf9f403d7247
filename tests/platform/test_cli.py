from __future__ import annotations

from pathlib import Path

import pytest

from tidal.platform.cli import load_spec, main

REPO = Path(__file__).resolve().parents[2]


def test_load_spec_from_example() -> None:
    spec = load_spec(REPO / "examples" / "shakespeare_job.py")
    assert spec.name == "shakespeare-gpt" and spec.max_gpus == 4


def test_load_spec_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no such file"):
        load_spec(tmp_path / "missing.py")
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(SystemExit, match="defines neither"):
        load_spec(bad)


def test_plan_rejects_gpu_count_outside_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="outside the job"):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "9"])
    with pytest.raises(SystemExit, match="does not divide the job's global batch 32"):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "3"])
    with pytest.raises(SystemExit):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "2", "--samples", "9"])
