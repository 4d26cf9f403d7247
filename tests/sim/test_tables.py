"""The simulator's truth: the Rubick tables' lookup rules (README §6, quirks fixed knowingly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.sim.tables import Truth, canonical, code_of, packed, plan_of

RUBICK = Path(__file__).resolve().parents[3] / "shared" / "traces" / "rubick"


@pytest.fixture(scope="module")
def truth() -> Truth:
    assert RUBICK.exists(), f"{RUBICK}: the shared traces lie beside the checkout"
    return Truth(RUBICK)


def test_placements_canonicalise_like_the_artifact() -> None:
    assert canonical((2, 1, 1)) == "112"
    assert canonical((1, 2, 1, 2)) == "1212"  # a rotation, not a sort
    assert canonical((0, 4, 0, 4)) == "44"  # empty nodes are not part of a placement
    assert packed(20, 8) == (8, 8, 4)


def test_lookup_rules(truth: Truth) -> None:
    # 1. exact rows (bert `ga` on 8 GPUs of one node: 0.1577 s in the README)
    assert truth.iter_time("bert", "ga", (8,)) == pytest.approx(0.1577, abs=1e-3)
    # ... on any rotation or order of the same per-node counts
    assert truth.iter_time("bert", "ga", (2, 1, 1)) == truth.iter_time("bert", "ga", (1, 1, 2))
    # 2. a data-parallel plan not measured on a placement: that placement's `ga` row
    rows = truth._rows["vit"]
    missing = [pl for (c, pl) in rows if c == "ga" and ("zero-dp", pl) not in rows]
    assert missing, "every vit placement has a zero-dp row"
    g = tuple(int(c) for c in missing[0])
    assert truth.iter_time("vit", "zero-dp", g) == rows[("ga", missing[0])]
    # 3D plans are looked up as chosen (the artifact never matched them)
    assert truth.iter_time("llama30", "344", (8, 8, 8, 8, 8, 8)) == rows_of(truth, "llama30", "344", "888888")
    # 3./4. unmeasured shapes fall back to means / interpolation, never below the fastest row
    t = truth.iter_time("llama30", "344", (8, 8, 8, 8, 8, 4))
    assert t >= truth.fastest("llama30", 64)


def rows_of(truth: Truth, app: str, code: str, placement: str) -> float:
    return truth._rows[app][(code, placement)]


def test_plan_codes_round_trip(truth: Truth) -> None:
    for app in truth.apps():
        for n in truth.gpu_counts(app):
            for code in truth.plans_at(app, n):
                plan = plan_of(code, n, truth.global_batch(app))
                assert plan.num_gpus == n and code_of(plan) == code


def test_extrapolation_rules_outside_the_measured_counts() -> None:
    """Step 4 outside the measured GPU counts: llama30's `641` on 24 GPUs packed on 3 nodes (no
    3-node shape is measured; the nearest, 4 nodes, has only 32 GPUs)."""
    flat, linear, measured = (Truth(RUBICK, e) for e in ("flat", "linear", "measured"))
    four_nodes = flat._shape_means["llama30"][(4, 32)]
    on_six_nodes = flat._rows["llama30"][("641", "444444")]  # the same plan measured on 24 GPUs
    assert flat.iter_time("llama30", "641", (8, 8, 8)) == pytest.approx(four_nodes)  # 24 as fast as 32
    assert linear.iter_time("llama30", "641", (8, 8, 8)) == pytest.approx(four_nodes * 32 / 24)
    assert measured.iter_time("llama30", "641", (8, 8, 8)) == pytest.approx(on_six_nodes)
    assert on_six_nodes > four_nodes * 32 / 24 > four_nodes
    # inside the measured counts and on measured rows, the rules agree
    for t in (linear, measured):
        for app, code, g in (("llama30", "344", (8,) * 6), ("t5", "341", (8, 4))):
            assert t.iter_time(app, code, g) == flat.iter_time(app, code, g)
    with pytest.raises(ValueError, match=r"Truth\.extrapolation"):
        Truth(RUBICK, "cubic")  # type: ignore[arg-type]


def test_a_directory_without_the_tables_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"lacks bert-placements\.csv"):
        Truth(tmp_path)
