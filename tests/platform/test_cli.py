from __future__ import annotations

import json
import re
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
    bad.write_text("from tests.conftest import tiny_gpt_spec\n"
                   "spec = tiny_gpt_spec(min_gpus=100, max_gpus=100)\n")
    one_line = (r"^tidal: .*bad\.py: SpecError: JobSpec\.min_gpus: "
                r"min_gpus \(100\) > global_batch \(8\)[^\n]*$")
    with pytest.raises(SystemExit, match=one_line):
        load_spec(bad)
    bad.write_text("def broken(:\n")
    with pytest.raises(SystemExit, match=r"bad\.py:1: "):
        load_spec(bad)


def test_plan_rejects_gpu_count_outside_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="outside the job"):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "9"])
    with pytest.raises(SystemExit, match="does not divide the job's global batch 32"):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "3"])
    with pytest.raises(SystemExit):
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "2", "--samples", "9"])


def test_plan_refuses_a_config_path_it_could_not_write_before_profiling(tmp_path: Path) -> None:
    job = str(REPO / "examples" / "shakespeare_job.py")
    with pytest.raises(SystemExit, match=r"^tidal: --write-config .*/nope/x\.json: no directory .*/nope$"):
        main(["plan", job, "--gpus", "2", "--write-config", str(tmp_path / "nope" / "x.json")])
    with pytest.raises(SystemExit, match=r"^tidal: --write-config .*: is a directory$"):
        main(["plan", job, "--gpus", "2", "--write-config", str(tmp_path)])


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--steps", "0", "must be an integer >= 1, got 0"),
    ("--top", "-1", "must be an integer >= 1, got -1"),
    ("--gpus-per-node", "0", "must be an integer >= 1, got 0"),
    ("--gpus-per-node", "two", "expected an integer, got 'two'"),
    ("--gpu-mem-gib", "-1", "must be a finite number > 0, got -1"),
    ("--host-mem-gib", "nan", "must be a finite number > 0, got nan"),
])
def test_plan_refuses_numbers_out_of_range_before_any_profile(option: str, value: str, says: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`tidal plan`'s numeric options, said by argparse (exit 2) in one line before Ray starts:
    `--steps 0` had profiled six plans into six worker tracebacks, `--gpus-per-node 0` ended in a
    ZeroDivisionError, a negative `--gpu-mem-gib` ranked every plan infeasible after profiling."""
    with pytest.raises(SystemExit) as e:
        main(["plan", str(REPO / "examples" / "shakespeare_job.py"), "--gpus", "2", option, value])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"tidal plan: error: argument {option}: {says}"


@pytest.mark.parametrize("every", ["0", "-1", "nan", "inf"])
def test_status_watch_refuses_a_period_that_is_not_seconds(every: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`tidal status --watch S`: S > 0 seconds, said by argparse (exit 2) before joining Ray
    (none runs here); it was a ValueError from time.sleep after the first table."""
    with pytest.raises(SystemExit) as e:
        main(["status", "--watch", every])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: --watch must be a number of seconds > 0, got {float(every):g}")


def test_status_table_fits_long_ids_and_shows_progress() -> None:
    from tidal.platform.cli import format_status

    long_id = "a-job-with-a-rather-long-name-0123456789-abcdef"
    rows = [
        {"job_id": long_id, "state": "RUNNING", "plan": "dp2-z1-mb4x1", "gpus": 2, "nodes": ["abcdef123"],
         "predicted_sps": 300.0, "measured_sps": 250.0, "step": 50, "total_steps": 200, "eta_s": 754.0,
         "restarts": 1, "error": None, "error_line": "", "reason": "",
         "sps_ratios": [[1, 0.312], [2, 0.281]]},
        {"job_id": "q", "state": "QUEUED", "plan": "", "gpus": 0, "nodes": [], "predicted_sps": 0.0,
         "measured_sps": 0.0, "step": 0, "total_steps": 100, "eta_s": None, "restarts": 0, "error": None,
         "error_line": "", "reason": "waiting: needs 4 GPUs, others use them better"},
    ]
    lines = format_status(rows).splitlines()
    header, running = lines[0], lines[1]
    assert running.startswith(long_id + " ") and running.index("RUNNING") == header.index("state")
    assert "50/200" in running and "25%" in running and "12m34s" in running
    assert lines[2].strip() == "correction (measured ÷ model, smoothed): 0.31 on 1 GPU, 0.28 on 2 GPUs"
    assert lines[4].strip() == "waiting: needs 4 GPUs, others use them better"
    failed = dict(rows[1], state="FAILED", reason="", error="ControllerError: Training failed due to "
                  "controller error:\n[Errno 28] No space left on device",
                  error_line="ControllerError: Training failed due to controller error: [Errno 28] No space "
                             "left on device")
    assert format_status([failed]).splitlines()[2] == f"    error: {failed['error_line']}"  # the event's note


def test_an_autolrs_jobs_progress_counts_the_budgets_steps() -> None:
    """An AutoLRS job's budget counts its losing probes' steps too: done is 50 of 200 steps run
    although 40 are in the model."""
    from tidal.platform.cli import format_status, progress_line

    row = {"job_id": "t", "state": "RUNNING", "plan": "dp1-z0-mb8x1", "gpus": 1, "nodes": ["n"],
           "predicted_sps": 10.0, "measured_sps": 10.0, "step": 40, "compute_steps": 50,
           "total_steps": 200, "eta_s": 60.0, "restarts": 0, "error": None, "reason": ""}
    assert "step 40/200 (25%, 50 steps run)" in progress_line(row)
    assert "25%" in format_status([row]).splitlines()[1]


def test_events_are_one_line_each_with_why() -> None:
    from tidal.platform.cli import format_events

    text = format_events([
        {"t": 1.0e9, "from": None, "to": "PROFILING", "note": "submitted"},
        {"t": 1.0e9 + 12.5, "from": "PROFILING", "to": "REJECTED", "note": "fits no plan: 3 GiB > 1 GiB"},
    ])
    first, second = text.splitlines()
    assert "- → PROFILING" in first and first.endswith("submitted")
    assert "PROFILING → REJECTED" in second and second.endswith("fits no plan: 3 GiB > 1 GiB")


def test_start_refuses_a_bad_autoscaling_config_before_joining_ray(tmp_path: Path) -> None:
    """One line naming the flag and what is wrong, before any Ray call (no cluster here)."""
    with pytest.raises(SystemExit, match=r"--autoscaling-config .*No such file"):
        main(["start", "--autoscaling-config", str(tmp_path / "missing.yaml")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: x\n")
    with pytest.raises(SystemExit, match="no available_node_types"):
        main(["start", "--autoscaling-config", str(bad)])


@pytest.mark.parametrize(("flags", "says"), [
    (["--serve-model", "{d_model: 64"],
     r"^tidal: --serve-model is not JSON \(.*\): e\.g\. '\{\"d_model\": 64\}'$"),
    (["--serve-model", "[64]"],
     r"^tidal: --serve-model expected a mapping of seq_len, d_model, .*got \[64\]$"),
    (["--serve-model", '{"d_modle": 64}'], r"^tidal: --serve-model unknown field\(s\) d_modle \(known: "),
    (["--serve-model", '{"d_model": "64"}'], r"^tidal: --serve-model d_model must be an integer, got '64'$"),
    (["--serve-model", '{"d_model": 66, "n_head": 4}'],
     r"^tidal: --serve-model d_model \(66\) must be divisible by n_head \(4\)$"),
    (["--serve-checkpoint", "MISSING"],
     r"^tidal: --serve-checkpoint .*tidal_meta\.json does not exist: not a Tidal checkpoint$"),
])
def test_start_refuses_a_bad_serving_flag_before_joining_ray(tmp_path: Path, flags: list[str],
                                                             says: str) -> None:
    """`tidal start --serve-checkpoint/--serve-model`: one line naming the flag, before any Ray call
    (no cluster here); a replica that cannot load would otherwise retry in Serve's logs."""
    flags = [str(tmp_path / "none") if f == "MISSING" else f for f in flags]
    with pytest.raises(SystemExit, match=says):
        main(["start", *flags])


def test_resume_refuses_a_spec_file_it_cannot_load_before_joining_ray(tmp_path: Path) -> None:
    """`tidal resume JOB FILE.py`: FILE.py is loaded (one line if it cannot be) before any Ray
    call (no cluster here), as `submit` loads its own."""
    (tmp_path / "broken.py").write_text("spec = 1 / 0\n")
    for name, says in (("nope.py", "no such file"), ("broken.py", "ZeroDivisionError: division by zero")):
        with pytest.raises(SystemExit, match=rf"^tidal: {tmp_path / name}: {says}$"):
            main(["resume", "gpt-1a2b3c", str(tmp_path / name)])


def _tiny_checkpoint(d: Path, meta: bool = False, **shape: int) -> None:
    """A Tidal checkpoint of a TinyGPT; with `meta`, its meta records the shape (as every run's
    does since 2026-11-29: `tidal.jobs.checkpoint.model_config`), without it, as older ones."""
    from tidal.jobs.checkpoint import TrainState, model_config
    from tidal.jobs.models import GPTConfig, TinyGPT

    model = TinyGPT(GPTConfig(vocab_size=65, **shape))
    params = model.state_dict()
    TrainState(step=10, seed=0, adam_step=10, params={k: v.clone() for k, v in params.items()},
               meta={"model": model_config(model)} if meta else {}).save(d)


def test_a_served_checkpoint_is_checked_whole(tmp_path: Path) -> None:
    from tidal.serving.app import check_serving

    d = tmp_path / "step_00000010"
    shape = dict(seq_len=32, d_model=64, n_layer=2, n_head=4)
    _tiny_checkpoint(d, **shape)
    home = Path.home()
    assert check_serving(str(d), shape) == (str(d), shape)
    if d.is_relative_to(home):  # "~" is expanded on this machine, as a replica would need
        assert check_serving("~/" + str(d.relative_to(home)), shape)[0] == str(d)
    state = d / "tidal_state.pt"
    whole = state.read_bytes()
    state.write_bytes(whole[:10])  # a copy cut short
    with pytest.raises(ValueError, match=r"^checkpoint: .*has 10 bytes, its meta says \d+: half-written$"):
        check_serving(str(d), shape)
    state.write_bytes(bytes(len(whole)))  # whole in size, not a state file
    with pytest.raises(ValueError, match=r"^checkpoint: .+"):
        check_serving(str(d), shape)
    assert check_serving("s3://bucket/run/step_00000010", None)[0] == "s3://bucket/run/step_00000010"


@pytest.mark.parametrize(("served", "says"), [
    (None, r"holds a GPT of seq_len 32, d_model 64, n_layer 2, vocab_size 65, the served one is "
           r"seq_len 64, d_model 128, n_layer 4, vocab_size 65 \(no weight 'blocks\.2\..*'\)"),
    (dict(d_model=64, n_layer=2), r"the served one is seq_len 64, d_model 64, n_layer 2, vocab_size 65 "
                                  r"\(weight 'pos\.weight' is \[32, 64\], the served GPT's \[64, 64\]\)"),
    (dict(seq_len=32, d_model=64, n_layer=1), r"n_layer 1, vocab_size 65 \(weight 'blocks\.1\..*' is not "),
    (dict(seq_len=32, d_model=64, n_layer=2, vocab_size=100), r"\(weight 'tok\.weight' is \[65, 64\], "),
])
def test_a_served_checkpoint_must_fit_the_served_shape(tmp_path: Path, served: dict[str, int] | None,
                                                       says: str) -> None:
    """A replica loads the checkpoint into `shakespeare_gpt(**model)` (its defaults: d_model 128,
    4 layers); weights of another shape would fail in every replica, in Serve's logs. `tidal
    start` says so in one line naming both shapes, before joining Ray (none runs here)."""
    d = tmp_path / "step_00000010"
    _tiny_checkpoint(d, seq_len=32, d_model=64, n_layer=2, n_head=4)
    flags = ["--serve-model", json.dumps(served)] if served else []
    says = (rf"^tidal: --serve-checkpoint {re.escape(str(d))} .*{says}.*: "
            r"serve it at the shape it was trained with \(--serve-model, gpt_app's model=\)$")
    with pytest.raises(SystemExit, match=says):
        main(["start", "--serve-checkpoint", str(d), *flags])


def test_a_checkpoint_is_served_at_the_shape_its_meta_records(tmp_path: Path) -> None:
    """A run's checkpoint records the shape it was trained at: served without a shape, it gets
    that one (not `shakespeare_gpt`'s defaults), and a shape that contradicts it is one line
    naming the field, n_head included (which no weight's shape shows)."""
    from tidal.serving.app import check_serving

    d = tmp_path / "step_00000010"
    _tiny_checkpoint(d, meta=True, seq_len=32, d_model=64, n_layer=2, n_head=8)
    trained = dict(seq_len=32, d_model=64, n_layer=2, n_head=8, vocab_size=65)
    assert check_serving(str(d), None) == (str(d), trained)
    assert check_serving(str(d), {"d_model": 64})[1] == trained
    says = (rf"^tidal: --serve-model n_head 4 is not the shape {re.escape(str(d))} was trained at "
            r"\(n_head 8\): leave it out, a checkpoint is served at its own shape$")
    with pytest.raises(SystemExit, match=says):
        main(["start", "--serve-checkpoint", str(d), "--serve-model", '{"n_head": 4, "d_model": 64}'])


@pytest.mark.parametrize(("steps", "says"), [
    ("abc", "argument steps: invalid int value: 'abc'"),
    ("-5", "STEPS: JobSpec.total_steps: must be an integer >= 1, got -5"),
])
def test_the_ray_job_submit_example_refuses_bad_steps_before_joining_ray(steps: str, says: str) -> None:
    """examples/submit_job.py (README's `ray job submit` entry point): one line, exit code 2, and
    no cluster (none runs here: a Ray call would fail differently)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "examples/submit_job.py", steps], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == f"submit_job.py: error: {says}", r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_a_state_file_that_refuses_a_write_is_one_line(tmp_path: Path) -> None:
    """What the scheduler raises when its state file refuses a write (here a lock another
    connection holds, as a `sqlite3` shell in a transaction would) reaches the user as one line
    naming the file, as `tidal submit` prints it (`_one_line_errors`), not a traceback."""
    import sqlite3

    from tidal.platform.cli import _one_line_errors
    from tidal.platform.store import JobRecord, Store

    path = tmp_path / "tidal.sqlite"
    store = Store(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(SystemExit) as e, _one_line_errors():
        store.add(JobRecord(job_id="a", name="a", spec=b"spec"))
    other.execute("ROLLBACK")
    said = str(e.value.code)
    assert said.startswith(f"tidal: the Tidal state file {path} could not be written (OperationalError: "
                           "database is locked)") and "\n" not in said, said


def test_files_that_are_not_python_jobs_are_one_line(tmp_path: Path) -> None:
    """A YAML file given as a job ran as Python (`NameError: name 'my' is not defined`); a binary
    one said `source code string cannot contain null bytes`."""
    yaml_file, binary, null_py = tmp_path / "job.yaml", tmp_path / "job.bin", tmp_path / "nul.py"
    yaml_file.write_text("my: job\nname: x\n")
    binary.write_bytes(bytes(range(256)))
    null_py.write_bytes(b"spec = 1\0\n")
    for f in (yaml_file, binary, null_py):
        not_python = rf"^tidal: {re.escape(str(f))} is not a Python file: a job file is"
        with pytest.raises(SystemExit, match=not_python):
            load_spec(f)


@pytest.mark.parametrize("address,says", [
    ("http://127.0.0.1:1", r"is an HTTP address \(the dashboard's, for `ray job submit`\)"),
    ("127.0.0.1:1", r"no Ray cluster at RAY_ADDRESS=127\.0\.0\.1:1 \(Connection refused\)"),
    ("nohost", r"RAY_ADDRESS=nohost is not host:port"),
])
def test_an_address_no_cluster_answers_is_one_line_in_seconds(address: str, says: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`RAY_ADDRESS=127.0.0.1:1 tidal status` waited over 90 s on Ray's GCS retries; an HTTP
    address was a 25-line ValueError. Both are refused before Ray is asked. (As from a fresh
    shell: this test process may have joined the session's cluster already.)"""
    import time

    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", address)
    t = time.monotonic()
    for command in (["status"], ["cancel", "some-job"], ["events", "some-job"]):
        with pytest.raises(SystemExit, match=f"^tidal: .*{says}"):
            main(command)
    assert time.monotonic() - t < 10


def test_with_two_clusters_on_the_machine_the_address_must_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without RAY_ADDRESS Ray joins the last `ray start`'s cluster, or any it finds, and with
    several only warns. Two GCS processes found here (Ray's own discovery, given two): every
    command that joins says so in one line and joins neither."""
    import ray
    import ray._private.services as services

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: {"10.0.0.2:6379", "10.0.0.1:6379"})
    for command in (["status"], ["cancel", "some-job"], ["start"]):
        with pytest.raises(SystemExit, match=r"^tidal: 2 Ray clusters run on this machine "
                                             r"\(10\.0\.0\.1:6379, 10\.0\.0\.2:6379\): set RAY_ADDRESS to "
                                             r"the one you mean$"):
            main(command)


def test_a_job_whose_model_raises_is_one_line_before_any_cluster(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`tidal plan` of a spec whose model factory raises was a 40-line traceback; `tidal submit`
    of it with no cluster said "no Ray cluster to join" and hid the spec's own error, and so did
    `tidal resume JOB FILE` (its dry run came after the join)."""
    job = tmp_path / "broken_model.py"
    job.write_text("import dataclasses\n"
                   "from tests.conftest import tiny_gpt_spec\n"
                   "def boom():\n    raise RuntimeError('the factory is broken')\n"
                   "spec = dataclasses.replace(tiny_gpt_spec(), model=boom)\n")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # joining would fail: the spec's error comes first
    for command in (["plan", str(job), "--gpus", "1"], ["submit", str(job)],
                    ["resume", "some-job", str(job)]):
        with pytest.raises(SystemExit, match=r"^tidal: JobSpec\.model: the factory raised RuntimeError: "
                                             r"the factory is broken$"):
            main(command)


def test_the_status_rows_prediction_agrees_with_the_correction_under_it() -> None:
    """The issue's case: a model that said 650 samples/s on 2 GPUs for a job measured at 278, its
    correction 0.43 there. The row's prediction is what the policy expects now (650 × 0.43), not
    the model's 650 (or a figure from another GPU count), so pred/meas reads 280/278 above
    "0.43 on 2 GPUs"; a job not measured yet shows the model's figure."""
    from tidal.platform.cli import format_status
    from tidal.platform.snapshots import believed_sps
    from tidal.platform.store import JobRecord

    rec = JobRecord(job_id="j", name="j", spec=b"", predicted_sps=650.0, sps_ratios=[[1, 0.9], [2, 0.43]])
    assert believed_sps(rec, 2) == pytest.approx(279.5)
    assert believed_sps(rec, 1) == pytest.approx(585.0)
    assert believed_sps(JobRecord(job_id="k", name="k", spec=b"", predicted_sps=650.0), 2) == 650.0
    row = {"job_id": "j", "state": "RUNNING", "plan": "dp2-z0-mb8x1", "gpus": 2, "nodes": ["n"],
           "predicted_sps": believed_sps(rec, 2), "measured_sps": 278.0, "step": 5, "total_steps": 10,
           "eta_s": 1.0, "restarts": 0, "error": None, "reason": "", "sps_ratios": rec.sps_ratios}
    table = format_status([row]).splitlines()
    pred, meas = (float(x) for x in table[1].split()[-2].split("/"))
    ratio = float(table[2].split(": ")[1].split(", ")[1].split()[0])  # "0.43 on 2 GPUs"
    assert abs(meas / pred - 1) < 0.02 and ratio == 0.43, table
