"""A job's code and packages reach its workers through Ray's runtime_env, kept with the job
(`tidal.jobs.codeship`, used by the CLI, the SDK and the scheduler).

Unit tests here need no cluster; the integration test runs a job whose model lives in a module
beside its file, with a declared pip requirement, on the session's two-node cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.conftest import tiny_gpt_spec
from tests.platform.codejob import job_dir, wheel
from tidal.jobs.codeship import check_runtime_env, declares_packages, keep_package, ship
from tidal.jobs.sealed import Sealed
from tidal.jobs.spec import SpecError
from tidal.platform.cli import load_spec


@pytest.mark.parametrize(("env", "says"), [
    ({"pipp": ["x"]}, r"unknown field 'pipp' \(Ray's fields: conda, .*pip, .*working_dir\)"),
    ({"pip": 3}, r"runtime_env\['pip'\] must be of type str or List\[str\]"),
    ({"working_dir": "/nonexistent/tidal"}, r"/nonexistent/tidal is not a valid path"),
    ({"env_vars": {"A": 1}}, r"runtime_env\[.env_vars.\] must be of type Dict\[str, str\]"),
])
def test_a_bad_runtime_env_is_one_line_naming_it(env: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError, match=rf"^JobSpec\.runtime_env: {says}[^\n]*$"):
        check_runtime_env(env)


def test_a_runtime_env_that_is_not_a_dict_is_refused_when_the_spec_is_built() -> None:
    with pytest.raises(SpecError, match=r"^JobSpec\.runtime_env: must be a Ray runtime_env dict"):
        tiny_gpt_spec(runtime_env=["pip"])


def test_ship_keeps_local_directories_and_seals_the_code(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "mymodel.py").write_text("X = 1\n")
    (code / "big.bin").write_bytes(b"\0" * 1000)
    (code / ".gitignore").write_text("*.bin\n")
    (code / "lib").mkdir()
    (code / "lib" / "__init__.py").write_text("Y = 2\n")
    kept: dict[str, bytes] = {}

    def keep(name: str, data: bytes) -> str:
        kept[name] = data
        return keep_package(tmp_path / "storage", name, data)

    spec = tiny_gpt_spec(runtime_env={"working_dir": str(code), "py_modules": [str(code / "lib"), "s3://b/m.zip"],
                                      "env_vars": {"A": "1"}, "excludes": ["lib/"]})
    shipped = ship(spec, keep)
    env = shipped.runtime_env
    assert env is not None and env["env_vars"] == {"A": "1"} and "excludes" not in env
    wd, (lib, remote) = env["working_dir"], env["py_modules"]
    assert wd.startswith("file://") and lib.startswith("file://") and remote == "s3://b/m.zip"
    with zipfile.ZipFile(urlparse(wd).path) as z:  # .gitignore and excludes respected, as Ray's own
        assert sorted(z.namelist()) == [".gitignore", "mymodel.py"]
    with zipfile.ZipFile(urlparse(lib).path) as z:  # a py_modules entry keeps its directory's name
        assert "lib/__init__.py" in z.namelist()
    assert len(kept) == 2
    assert all(isinstance(getattr(shipped, f), Sealed) for f in ("model", "dataset", "loss"))
    assert ship(spec, keep).runtime_env == env  # content-addressed: the same code, the same URIs
    assert ship(tiny_gpt_spec(), keep).runtime_env is None


def test_a_kept_package_is_written_whole_once_and_named_as_ray_names_it(tmp_path: Path) -> None:
    uri = keep_package(tmp_path, "_ray_pkg_0123456789abcdef.zip", b"zip")
    path = Path(urlparse(uri).path)
    assert path.read_bytes() == b"zip" and path.parent == tmp_path / "packages"
    assert keep_package(tmp_path, "_ray_pkg_0123456789abcdef.zip", b"other") == uri
    assert path.read_bytes() == b"zip" and os.listdir(path.parent) == [path.name]
    with pytest.raises(SpecError, match=r"must be Ray's _ray_pkg_<hash>\.zip, got '\.\./x\.zip'"):
        keep_package(tmp_path, "../x.zip", b"")


def test_a_job_file_imports_the_module_beside_it_and_ships_its_directory(tmp_path: Path) -> None:
    job, module = job_dir(tmp_path / "job")
    spec = load_spec(job)
    assert spec.runtime_env == {"working_dir": str((tmp_path / "job").resolve())}
    assert spec.model.__module__ == module and not declares_packages(spec)
    named = job_dir(tmp_path / "named", env={"working_dir": str(tmp_path)})[0]
    assert load_spec(named).runtime_env == {"working_dir": str(tmp_path)}  # the spec's own wins
    assert load_spec(job, working_dir=False).runtime_env is None


def test_a_declared_package_is_dry_run_on_the_cluster_not_here(tmp_path: Path) -> None:
    """The job imports its pip package only when the model is built: the file loads here, where
    the package is not installed, and `tidal submit` leaves the dry run to the cluster (with no
    cluster, it says so in one line instead of the model's ImportError)."""
    job, _ = job_dir(tmp_path / "job", package="tidal_absent_pkg", wheels=tmp_path / "wheels")
    spec = load_spec(job)
    assert declares_packages(spec)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_ADDRESS"] = "127.0.0.1:1"
    out = subprocess.run([sys.executable, "-m", "tidal.platform.cli", "submit", str(job)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "tidal: no Ray cluster at RAY_ADDRESS=127.0.0.1:1 (Connection refused)"], out.stderr


@pytest.mark.integration
def test_a_jobs_own_code_and_pip_package_reach_a_node_that_never_saw_them(
        ray_cluster: Any, scheduler_one_profile: Any, tmp_path: Path) -> None:
    """A job whose model lives in a module beside its file and takes its width from a pip package
    the test builds, submitted with `tidal submit` (its directory as working_dir): it runs on all
    four GPUs of the two-node cluster, so on the second node too, where neither the module nor
    the package exists, and ends SUCCEEDED. The same job whose runtime_env leaves the module out
    is REJECTED by admission in one line naming the module; a pip requirement that does not
    resolve is refused at submission in one line naming the runtime_env."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tests.platform.conftest import wait
    from tidal.platform import sdk

    wheels = tmp_path / "wheels"
    wheel(wheels, "tidaldep")
    job, module = job_dir(tmp_path / "job", name="shipped", gpus=4, package="tidaldep", wheels=wheels)

    second = ray_cluster.node_ids[1]

    @ray.remote(num_cpus=0)
    def imports(name: str) -> str:
        try:
            __import__(name)
            return "imported"
        except ImportError as e:
            return f"{type(e).__name__}: {e}"

    on_second = imports.options(scheduling_strategy=NodeAffinitySchedulingStrategy(second, soft=False))
    assert ray.get([on_second.remote(module), on_second.remote("tidaldep")]) == [
        f"ModuleNotFoundError: No module named '{module}'", "ModuleNotFoundError: No module named 'tidaldep'"]

    t = time.monotonic()
    out = _tidal("submit", str(job))
    print(f"tidal submit (pip env built for the dry run): {time.monotonic() - t:.1f} s: {out.stdout.strip()}")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split()[-1]
    scheduler = scheduler_one_profile
    handle = sdk.JobHandle(job_id, scheduler)
    seen: set[str] = set()

    def running() -> bool:
        st = handle.status()
        seen.update(n for n, _ in st.get("allocation") or [])
        return st["state"] in ("RUNNING", "SUCCEEDED", "FAILED", "REJECTED")

    wait(running, "the shipped job to run", 600)
    print(f"admitted (sized and profiled in its env) and running at {time.monotonic() - t:.1f} s")
    final = handle.wait(timeout=600, poll_s=1)
    print(f"{final['state']} at {time.monotonic() - t:.1f} s")
    assert final["state"] == "SUCCEEDED", final
    assert seen == set(ray_cluster.node_ids), seen  # four workers: two on each node
    assert [m["step"] for m in handle.logs()][-1] == 20

    missing, _ = job_dir(tmp_path / "missing", name="shipped-missing", gpus=1,
                         env={"excludes": ["shipped_model_*.py"]})
    out = _tidal("submit", str(missing))
    assert out.returncode == 0, out.stderr
    refused = sdk.JobHandle(out.stdout.split()[-1], scheduler).wait(timeout=300, poll_s=1)
    assert refused["state"] == "REJECTED", refused
    assert refused["error_line"].endswith("(ship it with JobSpec.runtime_env: working_dir, pip)"), refused
    assert "No module named 'shipped_model_" in refused["error_line"] and "\n" not in refused["error_line"]
    print(f"admission without the module: {refused['error_line']}")

    bad, _ = job_dir(tmp_path / "bad", name="shipped-bad", package="tidal_no_such_pkg", wheels=wheels)
    out = _tidal("submit", str(bad))
    print(f"an unresolvable requirement: exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tidal: JobSpec.runtime_env: Ray could not set it up: "), out.stderr


def _tidal(*args: str) -> subprocess.CompletedProcess[str]:
    import ray

    env = {k: v for k, v in os.environ.items() if k != "TIDAL_STATE"}
    env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return subprocess.run([sys.executable, "-m", "tidal.platform.cli", *args], env=env, capture_output=True,
                          text=True, timeout=600)
