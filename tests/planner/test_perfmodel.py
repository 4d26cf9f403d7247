"""The performance model: formulas, fit and sample selection (the Rubick trace readers: test_traces)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.planner.perfmodel import (
    Breakdown,
    Hardware,
    PlanPoint,
    Sample,
    Theta,
    Workload,
    fit,
    informed,
    predict,
)
from tidal.planner.selection import crosses_network, family, select

HW = Hardware()
WORK = Workload(params=350e6, global_batch=32, seq_hid=1024 * 512 * 24)
TRUE = Theta(k_fwd=4e-3, k_fwd0=5e-3, k_bwd=2.1, gamma=3.0, k_opt=1e-10, k_cpu=3e-9, k_off=0.01,
             k_const=0.004, eta=0.3, eta_x=0.05, k_mp=1.3, k_tp=0.8, k_pp=0.004)


def _points() -> list[PlanPoint]:
    pts = []
    for shape in [(1,), (2,), (4,), (8,), (4, 4), (2, 2, 2, 2), (8, 8)]:
        n = sum(shape)
        pts += [PlanPoint(gpus_per_node=shape, dp=n),
                PlanPoint(gpus_per_node=shape, dp=n, act_ckpt=True),
                PlanPoint(gpus_per_node=shape, dp=n, zero_stage=2),
                PlanPoint(gpus_per_node=shape, dp=n, zero_stage=2, offload=True, cpu_threads=4)]
    pts += [PlanPoint(gpus_per_node=(8, 8), dp=2, tp=8, pp=1),
            PlanPoint(gpus_per_node=(8, 8), dp=1, tp=8, pp=2),
            PlanPoint(gpus_per_node=(4, 4), dp=2, tp=2, pp=2)]
    return pts


def _sample(p: PlanPoint) -> Sample:
    b = predict(TRUE, WORK, p, HW)
    return Sample(point=p, iter_s=b.iter, fwd_s=b.fwd or None, sync_s=b.sync, opt_s=b.opt)


def test_formulas_behave() -> None:
    one = predict(TRUE, WORK, PlanPoint(gpus_per_node=(1,), dp=1), HW)
    eight = predict(TRUE, WORK, PlanPoint(gpus_per_node=(8,), dp=8), HW)
    split = predict(TRUE, WORK, PlanPoint(gpus_per_node=(4, 4), dp=8), HW)
    ckpt = predict(TRUE, WORK, PlanPoint(gpus_per_node=(8,), dp=8, act_ckpt=True), HW)
    z2 = predict(TRUE, WORK, PlanPoint(gpus_per_node=(8,), dp=8, zero_stage=2), HW)
    assert eight.fwd == pytest.approx(TRUE.k_fwd * 4 + TRUE.k_fwd0)
    assert eight.iter < one.iter  # more GPUs, less per-GPU work
    assert split.iter > eight.iter  # crossing nodes costs bandwidth
    assert ckpt.iter > eight.iter  # recomputing the forward costs time
    assert z2.opt < eight.opt + 0.5 * eight.opt  # optimizer sharded, plus an all-gather
    with pytest.raises(ValueError):
        PlanPoint(gpus_per_node=(4,), dp=2)  # dp·tp·pp must equal the GPUs placed


def test_parameter_offload_costs_two_host_fetches_per_micro_batch() -> None:
    z3 = PlanPoint(gpus_per_node=(4,), dp=4, zero_stage=3, grad_accum=2)
    z3p = PlanPoint(gpus_per_node=(4,), dp=4, zero_stage=3, offload_param=True, grad_accum=2)
    fetch = 2 * WORK.grad_bytes * WORK.params * 2 / 4 / (HW.pcie_bw * TRUE.eta)
    assert predict(TRUE, WORK, z3p, HW).iter == pytest.approx(predict(TRUE, WORK, z3, HW).iter + fetch)
    with pytest.raises(ValueError, match="stage 3"):
        PlanPoint(gpus_per_node=(4,), dp=4, zero_stage=2, offload_param=True)


def test_zero3_gathers_once_per_forward_backward_and_recomputation() -> None:
    """ZeRO-3 gathers the parameters in each micro-batch's forward (the profiler's forward
    part), its backward, and again for a checkpointed recomputation."""
    th = Theta(k_fwd=4e-3, k_fwd0=5e-3, k_bwd=2.0, k_z3=0.05)

    def at(g: int, ac: bool = False) -> Breakdown:
        return predict(th, WORK, PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=3, act_ckpt=ac,
                                           grad_accum=g), HW)

    z1 = predict(th, WORK, PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, grad_accum=4), HW)
    assert at(4).fwd - z1.fwd == pytest.approx(4 * 0.05)
    assert at(4).sync - z1.sync == pytest.approx(4 * 0.05)
    comp = z1.fwd  # the forward's compute, recomputed under checkpointing
    assert at(4, ac=True).iter - at(4).iter == pytest.approx(comp + 4 * 0.05)
    assert at(8).iter - at(4).iter == pytest.approx(4 * (3 * th.k_fwd0 + 2 * 0.05))


def test_offloaded_gradients_cost_every_micro_batch() -> None:
    """Under optimizer offload each micro-batch's gradients go to the host (k_off each, and
    DeepSpeed's copies: s·Ψ/n out per micro-batch, s·Ψ/n back for every one after the first,
    4·Ψ/n of fp32 gradients at the boundary, s·Ψ/n of weights after the step); the CPU Adam
    step is paid once per step."""
    th = Theta(k_fwd=4e-3, k_fwd0=0.0, k_cpu=3e-9, k_off=0.02, eta=0.5)
    w = HW.pcie_bw * th.eta
    s, psi = WORK.grad_bytes, WORK.params

    def at(g: int) -> float:
        return predict(th, WORK, PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, offload=True,
                                           grad_accum=g, cpu_threads=4), HW).iter

    def plain(g: int) -> float:
        return predict(th, WORK, PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, grad_accum=g), HW).iter

    cpu = th.k_cpu * psi / 4
    assert at(1) - plain(1) == pytest.approx(0.02 + 4 * psi / w + s * psi / w + cpu - th.k_opt * psi)
    assert at(8) - at(1) == pytest.approx(7 * 0.02 + 15 * s * psi / w)
    assert at(2) - at(1) == pytest.approx(0.02 + 3 * s * psi / w)


def test_one_offload_sample_ties_its_gradient_traffic_to_the_adam_step() -> None:
    """Iteration times with one offload sample cannot split the per-micro-batch gradient
    traffic from the CPU Adam step: `fit` ties them at the host-bandwidth share; a second
    accumulation count frees k_off."""
    from tidal.planner.perfmodel import OFFLOAD_ACCUM_SHARE

    pts = [PlanPoint(gpus_per_node=(1,), dp=1, grad_accum=g) for g in (1, 8)]
    off = PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, offload=True, grad_accum=4, cpu_threads=2)
    times = [Sample(point=p, iter_s=predict(TRUE, WORK, p, HW).iter) for p in [*pts, off]]
    th = fit(times, WORK, HW).theta
    assert "k_off" not in informed(times)
    assert th.k_off == pytest.approx(OFFLOAD_ACCUM_SHARE * th.k_cpu * WORK.params / 2, rel=1e-6)
    two = [*times, Sample(point=(o := PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, offload=True,
                                                grad_accum=1, cpu_threads=2)),
                          iter_s=predict(TRUE, WORK, o, HW).iter)]
    assert "k_off" in informed(two)


def test_four_picks_fix_the_compute_curve_first() -> None:
    """With fewer picks than families, the first two are the plainest family at its fewest and
    most accumulation steps: on a GPU-shaped truth (most of a small micro-batch's time is fixed
    per micro-batch) the fit then predicts the other plain plans, which it never saw."""
    truth = Theta(k_fwd=1e-3, k_fwd0=0.03, k_bwd=2.0, k_z2=0.04, k_z3=0.06, k_cpu=2e-9, k_off=0.1,
                  k_const=0.01, k_opt=1e-10)
    pts = [PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=z, offload=o, act_ckpt=a, grad_accum=g,
                     cpu_threads=1)
           for z in (0, 1, 2, 3) for o in (False, True) if not o or z >= 2
           for a in (False, True) for g in (1, 8)]
    chosen = select(pts, lambda p: p, 4)
    assert (family(chosen[0]), family(chosen[1])) == ("z0", "z0")
    assert (chosen[0].grad_accum, chosen[1].grad_accum) == (1, 8)
    f = fit([Sample(point=p, iter_s=predict(truth, WORK, p, HW).iter) for p in chosen], WORK, HW)
    for g in (1, 8):
        p = PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=1, grad_accum=g)
        want = predict(truth, WORK, p, HW).iter
        assert f.predict(WORK, p, HW).iter == pytest.approx(want, rel=0.05)


def test_3d_data_parallel_groups_drive_only_their_rails() -> None:
    # pp1·tp4·dp4: on 8+8 GPUs each dp group has 2 members per node (2 of 8 NICs); on 4×4
    # GPUs 1 per node, over 4 nodes: its gradient all-reduce takes longer (Rubick llama7:
    # 1.19 s against 1.72 s)
    two = predict(TRUE, WORK, PlanPoint(gpus_per_node=(8, 8), dp=4, tp=4), HW)
    four = predict(TRUE, WORK, PlanPoint(gpus_per_node=(4, 4, 4, 4), dp=4, tp=4), HW)
    shared = Hardware(rails=0)  # one link per node: only the ring's (k−1)/k differs
    two_s = predict(TRUE, WORK, PlanPoint(gpus_per_node=(8, 8), dp=4, tp=4), shared)
    four_s = predict(TRUE, WORK, PlanPoint(gpus_per_node=(4, 4, 4, 4), dp=4, tp=4), shared)
    assert four.iter - two.iter > four_s.iter - two_s.iter > 0
    # a dp=1 pipeline whose tensor groups fit a node moves only small hand-offs across nodes
    assert not crosses_network(PlanPoint(gpus_per_node=(5, 5), dp=1, tp=5, pp=2))
    assert crosses_network(PlanPoint(gpus_per_node=(4, 4, 4, 4), dp=4, tp=4))
    assert crosses_network(PlanPoint(gpus_per_node=(2, 2), dp=4))
    assert not crosses_network(PlanPoint(gpus_per_node=(8,), dp=8))


def test_uneven_placements_slow_the_inside_node_phase() -> None:
    """η_odd slows the inside-node ring of placements with unequal GPU counts, one odd (Rubick
    vit: 17 and 233 far slower than 26 and 224); one GPU per node has no inside-node phase."""
    assert PlanPoint(gpus_per_node=(1, 7), dp=8).odd and PlanPoint(gpus_per_node=(2, 3, 3), dp=8).odd
    assert not PlanPoint(gpus_per_node=(1,) * 8, dp=8).odd  # equal counts
    assert not PlanPoint(gpus_per_node=(2, 2, 4), dp=8).odd  # unequal but all even
    assert not PlanPoint(gpus_per_node=(3,), dp=3).odd  # one node
    slow = Theta(**{**TRUE.__dict__, "eta_odd": 0.1})

    def extra(shape: tuple[int, ...]) -> float:
        p = PlanPoint(gpus_per_node=shape, dp=sum(shape))
        return predict(slow, WORK, p, HW).iter - predict(TRUE, WORK, p, HW).iter

    assert extra((1, 7)) > extra((2, 3, 3)) > 0  # grows with the largest node's (G−1)/G
    assert extra((1,) * 8) == extra((2, 2, 4)) == extra((8,)) == 0.0
    assert "eta_odd" not in informed([Sample(point=PlanPoint(gpus_per_node=(2, 2, 4), dp=8), iter_s=1.0)])
    assert "eta_odd" in informed([Sample(point=PlanPoint(gpus_per_node=(1, 7), dp=8), iter_s=1.0)])


def test_fit_recovers_predictions_from_eight_samples() -> None:
    pts = _points()
    chosen = select(pts, lambda p: p, 8)
    assert len(chosen) == 8
    f = fit([_sample(p) for p in chosen], WORK, HW)
    assert f.mape < 0.02
    held_out = [p for p in pts if p not in chosen]
    errs = [abs(f.predict(WORK, p, HW).iter - predict(TRUE, WORK, p, HW).iter)
            / predict(TRUE, WORK, p, HW).iter for p in held_out]
    assert sum(errs) / len(errs) < 0.05, max(errs)


def test_confounded_constants_stay_fixed_on_iteration_times_of_one_gpu() -> None:
    """On one GPU with iteration times only, k_opt·Ψ is one more constant like k_const, and
    k_off like k_cpu·Ψ/t: fitting both of a pair only lets them wander. Parts or a second GPU
    count separate them."""
    one = [PlanPoint(gpus_per_node=(1,), dp=1, grad_accum=8),
           PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=2, offload=True, act_ckpt=True, grad_accum=8),
           PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=3, grad_accum=1)]
    times = [Sample(point=p, iter_s=predict(TRUE, WORK, p, HW).iter) for p in one]
    names = informed(times)
    assert "k_opt" not in names and "k_off" not in names
    assert {"k_fwd", "k_fwd0", "k_bwd", "k_const", "k_cpu", "k_z2", "k_z3"} <= set(names)
    assert {"k_opt", "k_off"} <= set(informed([_sample(p) for p in one]))  # with parts
    two = [*one, PlanPoint(gpus_per_node=(2,), dp=2, zero_stage=2, offload=True, grad_accum=4)]
    assert {"k_opt", "k_off"} <= set(informed([Sample(point=p, iter_s=1.0) for p in two]))


def test_selection_covers_every_family_first() -> None:
    pts = _points()
    chosen = select(pts, lambda p: p, 5)
    assert {family(p) for p in chosen} == {family(p) for p in pts}
    assert len({p.n for p in chosen}) >= 3  # and spreads the sizes


def test_selection_covers_terms_when_families_outnumber_picks() -> None:
    """Three picks among the twelve single-GPU families: each pick covers as many of the
    model's terms as it can, so the fit frees the CPU optimizer, ZeRO-3 and k_bwd constants
    (family by family, three picks would leave most of them at their rough start values)."""
    pts = [PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=z, offload=o, act_ckpt=a, grad_accum=g,
                     cpu_threads=1)
           for z in (0, 1, 2, 3) for o in (False, True) if not o or z >= 2
           for a in (False, True) for g in (1, 8)]
    assert len({family(p) for p in pts}) == 12
    chosen = select(pts, lambda p: p, 3)
    assert any(p.offload for p in chosen) and any(p.zero_stage == 3 for p in chosen)
    assert {p.act_ckpt for p in chosen} == {False, True}
    assert {"k_cpu", "k_z3", "k_bwd"} <= set(informed([Sample(point=p, iter_s=1.0) for p in chosen]))


def test_host_work_overlaps_the_device_on_a_gpu_only() -> None:
    """Per pass, the host's fixed work (launches, ZeRO hooks) hides under the device's compute
    on a GPU: ZeRO-2's hooks cost a whole k_z2 per micro-batch at a small micro-batch and far
    less at a large one. Fitted from profiles with parts whose compute curve bends (three
    accumulation counts), the overlap predicts ZeRO-2 at the size it was not profiled at; a CPU
    (host and device the same cores) keeps the sum and never frees p."""
    truth = Theta(k_fwd=2e-3, k_fwd0=6e-3, k_bwd=2.0, k_z2=0.02, k_z3=0.03, p_host=6.0, k_cpu=2e-9,
                  k_off=0.05, k_const=0.01, k_opt=1e-10)
    gpu, cpu = Hardware(cpu_threads_per_gpu=1), Hardware(cpu_threads_per_gpu=1, async_device=False)

    def pt(z: int, g: int, off: bool = False, ac: bool = False) -> PlanPoint:
        return PlanPoint(gpus_per_node=(1,), dp=1, zero_stage=z, offload=off, act_ckpt=ac, grad_accum=g,
                         cpu_threads=1)

    def z2_cost(th: Theta, g: int, hw: Hardware) -> float:
        return predict(th, WORK, pt(2, g), hw).iter - predict(th, WORK, pt(1, g), hw).iter

    # the truth: ZeRO-2's hooks add ~k_z2 per micro-batch at 32 micro-batches of 1 sample, and
    # under a tenth of that, once, at 1 micro-batch of 32
    assert z2_cost(truth, 32, gpu) == pytest.approx(32 * truth.k_z2, rel=0.1)
    assert z2_cost(truth, 1, gpu) < 0.1 * truth.k_z2
    assert z2_cost(truth, 1, cpu) == pytest.approx(truth.k_z2)  # a CPU adds it whole

    fit_pts = [pt(0, 32), pt(0, 4), pt(0, 1), pt(2, 32)]
    samples = []
    for p in fit_pts:
        b = predict(truth, WORK, p, gpu)
        samples.append(Sample(point=p, iter_s=b.iter, fwd_s=b.fwd, sync_s=b.sync, opt_s=b.opt))
    assert "p_host" in informed(samples)
    got = fit(samples, WORK, gpu).theta
    assert got.p_host > 2.0
    for g in (1, 8):  # ZeRO-2 at sizes never profiled
        want = predict(truth, WORK, pt(2, g), gpu).iter
        assert predict(got, WORK, pt(2, g), gpu).iter == pytest.approx(want, rel=0.05)
    assert fit(samples, WORK, cpu).theta.p_host == 1.0  # never freed on a CPU
    times = [Sample(point=s.point, iter_s=s.iter_s) for s in samples]
    assert "p_host" not in informed(times)  # step times alone cannot separate it from k_fwd0


@pytest.mark.parametrize(("column", "value", "says"), [
    ("micro_batch", "lots", "column micro_batch must be an integer, got 'lots'"),
    ("micro_batch", "2.5", "column micro_batch must be an integer, got '2.5'"),
    ("step_s", "fast", "column step_s must be a number, got 'fast'"),
    ("peak_alloc_gib", "nan", "column peak_alloc_gib must be a number, got 'nan'"),
])
def test_the_accuracy_benchmark_names_the_line_and_column_of_a_bad_measurement(
        tmp_path: Path, column: str, value: str, says: str) -> None:
    """benchmarks/perfmodel_accuracy.py --measurements on a table someone measured by hand: a bad
    cell stops it with one line naming the file, line, column and value, before any fitting."""
    import csv
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    with (root / "benchmarks" / "data" / "gpt2-h100-measurements.csv").open() as f:
        rows = list(csv.DictReader(f))
    rows[1][column] = value
    bad = tmp_path / "m.csv"
    with bad.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    r = subprocess.run([sys.executable, "benchmarks/perfmodel_accuracy.py", "--measurements", str(bad)],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == f"{bad}, line 3: {says}", r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_the_accuracy_benchmark_names_a_table_with_no_rows(tmp_path: Path) -> None:
    """A header and nothing under it (a measurement run cut before its first row) is said as
    such, not as a table whose models have too few rows."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    empty = tmp_path / "empty.csv"
    empty.write_text((root / "benchmarks" / "data" / "gpt2-h100-grid.csv").read_text().splitlines()[0] + "\n")
    r = subprocess.run([sys.executable, "benchmarks/perfmodel_accuracy.py", "--measurements", str(empty)],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == f"{empty}: no rows under the header", r.stderr[-2000:]


def test_the_accuracy_benchmark_reads_a_larger_gpus_table_as_a_smaller_ones(tmp_path: Path) -> None:
    """--oom-above GIB: the rows of the H200 table whose allocator peak is above an 80-GB H100's
    79.2 GiB count as oom (not scored for time; their feasibility is checked), every other row
    as it was."""
    import csv
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    table = root / "benchmarks" / "data" / "gpt2-h200-profiler.csv"
    with table.open() as f:
        rows = list(csv.DictReader(f))
    above = sum(float(r["peak_alloc_gib"]) > 79.2 for r in rows)
    assert 0 < above < len(rows)

    def scored(*flags: str) -> tuple[int, int]:  # (oom rows, rows scored for time) in the -v listing
        r = subprocess.run([sys.executable, "benchmarks/perfmodel_accuracy.py", "--measurements", str(table),
                            "-v", *flags], capture_output=True, text=True, timeout=300, cwd=root)
        assert r.returncode == 0, r.stderr[-2000:]
        listing = [line for line in r.stdout.splitlines() if line.startswith("  dp1-")]
        assert len(listing) == len(rows), r.stdout
        assert r.stdout.splitlines()[-1].startswith("feasibility_accuracy: ")
        return sum(" oom " in line for line in listing), sum(line.count(" s ") >= 2 for line in listing)

    assert scored("--device-mem-gib", "139") == (0, len(rows))
    assert scored("--device-mem-gib", "79.2", "--oom-above", "79.2") == (above, len(rows) - above)
