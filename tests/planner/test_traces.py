"""Readers of the Rubick artifact tables (`tidal.planner.traces`): the codes, the units, and the
shared tables themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.planner import traces

RUBICK = Path(__file__).resolve().parents[3] / "shared" / "traces" / "rubick"
HEADER = "exec_plan,placement,forward,overlap_sync,optimize,iter_time\n"


@pytest.mark.parametrize("code", ["", "0", "120", "2a", "-1"])
def test_a_bad_placement_code_is_refused_naming_it(code: str) -> None:
    with pytest.raises(ValueError, match="bad placement code"):
        traces.decode_placement(code)


@pytest.mark.parametrize(("code", "zero", "offload", "ckpt"), [
    ("ga", 0, False, False), ("gc", 0, False, True), ("zero-dp", 2, False, False),
    ("zero-offload", 2, True, False), ("zero-offload+gc", 2, True, True)])
def test_data_parallel_codes(code: str, zero: int, offload: bool, ckpt: bool) -> None:
    p = traces.decode_plan(code, (4, 4), cpu_threads=6)
    assert (p.dp, p.tp, p.pp, p.gpus_per_node) == (8, 1, 1, (4, 4))
    assert (p.zero_stage, p.offload, p.act_ckpt) == (zero, offload, ckpt)
    assert p.cpu_threads == (6 if offload else None)  # threads matter to the CPU optimizer only


def test_3d_codes_are_pipeline_tensor_data_degrees() -> None:
    p = traces.decode_plan("241", (4, 4))
    assert (p.pp, p.tp, p.dp) == (2, 4, 1)
    with pytest.raises(ValueError, match="needs 8 GPUs, placement has 9"):
        traces.decode_plan("241", (4, 5))
    with pytest.raises(ValueError, match="unknown exec_plan code 'fsdp'"):
        traces.decode_plan("fsdp", (4,))


@pytest.mark.parametrize(("model", "plan", "scale"), [
    ("bert", "ga", 1e-3), ("gpt2", "zero-offload", 1e-3),  # milliseconds
    ("roberta", "ga", 1.0), ("vit", "zero-dp", 1.0),  # seconds
    ("llama7", "zero-offload", 1.0), ("llama7", "241", 1e-3)])  # llama7: seconds on its ZeRO rows only
def test_component_times_come_out_in_seconds(tmp_path: Path, model: str, plan: str, scale: float) -> None:
    placement = "44"
    (tmp_path / f"{model}-placements.csv").write_text(HEADER + f"{plan},{placement},12.5,30,4,0.25\n")
    [row] = traces.placements(tmp_path, model)
    assert (row.exec_plan, row.placement) == (plan, placement)
    s = row.sample
    assert s.iter_s == 0.25  # seconds everywhere
    assert (s.fwd_s, s.sync_s, s.opt_s) == pytest.approx((12.5 * scale, 30 * scale, 4 * scale))


def test_a_zero_forward_is_not_a_measurement(tmp_path: Path) -> None:
    (tmp_path / "bert-placements.csv").write_text(HEADER + "ga,8,0,30,4,0.25\n")
    assert traces.placements(tmp_path, "bert")[0].sample.fwd_s is None


def test_rubick_tables_decode() -> None:
    assert RUBICK.exists(), f"{RUBICK}: the shared traces lie beside the checkout"
    rows = traces.placements(RUBICK, "gpt2")
    assert len(rows) == 74
    r = next(r for r in rows if r.exec_plan == "251")
    assert (r.sample.point.pp, r.sample.point.tp, r.sample.point.dp) == (2, 5, 1)
    assert r.sample.point.gpus_per_node == (5, 5)
    ga8 = next(r for r in rows if r.exec_plan == "ga" and r.placement == "8")
    assert ga8.sample.fwd_s == pytest.approx(0.1459, rel=1e-3)  # milliseconds → seconds
    vit = traces.placements(RUBICK, "vit")
    assert all(r.sample.opt_s is not None and r.sample.opt_s < 1.0 for r in vit)  # seconds already
    assert len(traces.profile_rows(RUBICK, "bert")) == 7
    assert traces.profile_rows(RUBICK, "llama30") == []  # its profile files hold LLaMA-2-7B data
    assert traces.workload(RUBICK, "bert").params == pytest.approx(336_297_858, rel=1e-6)
    assert traces.workload(RUBICK, "llama30").params == traces.LLAMA30_PARAMS
    with pytest.raises(ValueError):
        traces.decode_plan("251", (5, 4))
