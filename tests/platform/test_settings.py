"""`tidal start --config tidal.yaml`: the scheduler's settings from a file, checked whole before
anything starts, each mistake one line naming the setting and its value; the settings reference
is written from the same dataclasses."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tidal.platform.config import SchedulerConfig
from tidal.platform.settings import SettingsError, load_settings, reference

ROOT = Path(__file__).resolve().parents[2]


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tidal.yaml"
    p.write_text(text)
    return p


def test_a_file_sets_what_it_names_and_keeps_every_other_default(tmp_path: Path) -> None:
    cfg = load_settings(_file(tmp_path, "tick_s: 5\ncpus_per_worker: 4\n"
                                        "policy: {aging_s: 600, admission_preempts: later, settle_s: .inf}\n"
                                        "loans: {risk: 0.05}\ncorrection: {bounds: [0.1, 10]}\n"))
    default = SchedulerConfig()
    assert cfg.tick_s == 5.0 and cfg.cpus_per_worker == 4.0 and cfg.state_path is None
    assert cfg.policy.aging_s == 600.0 and cfg.policy.admission_preempts == "later"
    assert math.isinf(cfg.policy.settle_s) and cfg.policy.horizon_s == default.policy.horizon_s
    # the scheduler's own loan defaults stay (replica counts per 2-s tick), not LoanConfig's class ones
    assert cfg.loans.risk == 0.05 and cfg.loans.replica_rps == 1.0
    assert cfg.loans.lead_s == default.loans.lead_s
    assert cfg.correction is not None and cfg.correction.bounds == (0.1, 10.0)
    assert load_settings(_file(tmp_path, "correction: null\n")).correction is None
    assert load_settings(_file(tmp_path, "")) == default  # an empty file: the defaults


@pytest.mark.parametrize(("text", "line"), [
    ("tick_s: fast\n",
     "tidal.yaml: tick_s = 'fast': Input should be a valid number, unable to parse string as a number"),
    ("policy: {admission_preempts: sometimes}\n",
     "tidal.yaml: policy.admission_preempts = 'sometimes': Input should be 'none', 'later' or 'any'"),
    ("policy: {agin_s: 600}\n", "tidal.yaml: unknown setting policy.agin_s (known: admission_preempts, "
                                "aging_s, aging_width_cap, grow_into_idle, guarantee_margin, horizon_s, "
                                "max_restarts, settle_s)"),
    ("tick: 2\n", "tidal.yaml: unknown setting tick (known: autoscale, "),
    ("tick_s: -1\n", "tidal.yaml: SchedulerConfig.tick_s must be"),
    ("policy: {aging_s: -5}\n",
     "tidal.yaml: PolicyConfig.aging_s must be a positive number of seconds, got -5.0"),
    ("loans: {risk: 1.5}\n", "tidal.yaml: loans: risk: a probability in (0, 1), got 1.5"),
    ("policy: 3\n", "tidal.yaml: policy must be a mapping of settings, got int 3"),
    ("- tick_s\n", "tidal.yaml: the file must be a mapping of settings, got list ['tick_s']"),
    ("tick_s: [1\n", "tidal.yaml: not YAML at line 2"),
])
def test_a_bad_file_is_one_line_naming_the_setting_and_value(tmp_path: Path, text: str, line: str) -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(_file(tmp_path, text))
    msg = str(e.value).replace(str(tmp_path) + "/", "")
    assert "\n" not in msg and msg.startswith(line), msg


def test_a_missing_file_is_one_line() -> None:
    with pytest.raises(SettingsError, match=r"^nope/tidal\.yaml: no such file$"):
        load_settings("nope/tidal.yaml")


def test_tidal_start_refuses_a_bad_file_before_joining_any_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tidal.platform.cli import main

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # joining would fail: the file's error comes first
    bad = _file(tmp_path, "stall_s: 0\n")
    t = time.monotonic()
    with pytest.raises(SystemExit, match=rf"^tidal: --config {bad}: SchedulerConfig\.stall_s must be"):
        main(["start", "--config", str(bad)])
    with pytest.raises(SystemExit, match=r"^tidal: --config missing\.yaml: no such file$"):
        main(["start", "--config", "missing.yaml"])
    assert time.monotonic() - t < 10


def test_the_settings_reference_is_written_from_the_dataclasses() -> None:
    """docs/reference/settings.md is `reference()` (regenerate: python -m tidal.platform.settings >
    docs/reference/settings.md), and it names every setting, nested ones with their prefix."""
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    stale = ("docs/reference/settings.md is stale: "
             "python -m tidal.platform.settings > docs/reference/settings.md")
    assert page == reference(), stale
    for name in ("tick_s", "policy.aging_s", "loans.risk", "correction.half_life_s", "autoscaling_config"):
        assert f"| `{name}` |" in page, name
