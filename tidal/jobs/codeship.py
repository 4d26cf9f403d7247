"""A job's code and dependencies on every node: Ray's `runtime_env`, kept with the job.

On submission (`ship`, in the client):

1. `JobSpec.runtime_env` is checked with Ray's own `RuntimeEnv` (a wrong type, a missing
   directory, an unknown field: a SpecError naming it, before anything reaches the scheduler);
2. each local directory in it (`working_dir`, `py_modules` entries) is zipped as Ray zips it
   (`.gitignore`, `excludes` and Ray's default excludes respected; the name is the content hash,
   `_ray_pkg_<hash>.zip`), sent to the scheduler, which keeps it in the runs' storage
   (`keep_package`), and replaced by its `file://` URI there;
3. the model factory, dataset and loss are sealed (`tidal.jobs.sealed`): the scheduler never
   unpickles the user's modules.

Why the runs' storage and not Ray's GCS, where `ray job submit` uploads: a GCS package lives as
long as something references it, and only 10 minutes after the uploading client exits
(`RAY_RUNTIME_ENV_TEMPORARY_REFERENCE_EXPIRATION_S`); a Tidal job can queue for hours, and a
restarted Ray keeps nothing. The storage is already every node's (checkpoints need it) and
outlives both; Ray reads `file://` packages like any remote one, once per node.

`tidal.launch`/`tidal.run` (no scheduler) ship the spec the same way, writing the packages
into the runs' storage from the driver (`keep_in_storage`): Ray Train's workers accept no local
directory in their runtime_env, only URIs.

Every process that runs the job's code then gets the shipped env: the dry run
(`dry_run_remote`, when the spec declares packages the client may lack), admission's sizing and
profiling tasks, and every Train worker (`RunConfig.worker_runtime_env`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidal.jobs.sealed import seal
from tidal.jobs.spec import JobSpec, SpecError

MAX_PACKAGE_MIB = 100  # a zipped directory larger than this is refused (Ray's GCS allows ~500)
PACKAGE_RE = re.compile(r"^_ray_pkg_[0-9a-f]{8,64}\.zip$")
# fields whose packages must be installed where the code runs: the client may not have them
PACKAGE_FIELDS = ("pip", "uv", "conda", "container", "image_uri", "py_executable")


def check_runtime_env(env: dict[str, Any] | None) -> dict[str, Any] | None:
    """`env` as Ray's `RuntimeEnv` validates it (pip lists normalised), or a SpecError naming
    `JobSpec.runtime_env` and what is wrong."""
    if not env:
        return None
    from ray.runtime_env import RuntimeEnv

    unknown = sorted(set(env) - set(RuntimeEnv.known_fields))
    if unknown:
        known = ", ".join(k for k in sorted(RuntimeEnv.known_fields) if not k.startswith("_"))
        raise SpecError("JobSpec.runtime_env", f"unknown field {unknown[0]!r} (Ray's fields: {known})")
    try:
        return dict(RuntimeEnv(**env))
    except (TypeError, ValueError) as e:
        line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise SpecError("JobSpec.runtime_env", line) from None


def declares_packages(spec: JobSpec) -> bool:
    """Whether the job's code needs packages installed by its runtime_env (pip, conda, ...),
    which the submitting machine may not have: its dry run then runs on the cluster."""
    return any(k in (spec.runtime_env or {}) for k in PACKAGE_FIELDS)


def check_here(spec: JobSpec) -> None:
    """What can be checked before any cluster is joined: the runtime_env's shape, and the dry run
    (`tidal.jobs.dryrun`) on this machine unless the job declares packages it may lack (those
    are dry-run on the cluster, in the job's env: `dry_run_remote`). The CLI and the SDK both
    call it."""
    from tidal.jobs.dryrun import dry_run

    check_runtime_env(spec.runtime_env)
    if not declares_packages(spec):
        dry_run(spec)


def package(directory: str, *, field: str, excludes: list[str], parent: bool) -> tuple[str, bytes]:
    """(name, zip bytes) of a local directory, as Ray packages a working_dir (`parent=False`) or a
    py_modules entry (`parent=True`: the directory itself is the zip's top level)."""
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import create_package, get_uri_for_directory

    path = Path(directory).expanduser().absolute()
    if not path.is_dir():
        raise SpecError(f"JobSpec.runtime_env[{field!r}]", f"{directory} is not a directory")
    excludes = ray_constants.get_runtime_env_default_excludes() + list(excludes)
    name = get_uri_for_directory(str(path), include_gitignore=True, excludes=excludes).split("://", 1)[1]
    with tempfile.TemporaryDirectory(prefix="tidal-pkg-") as tmp:
        target = Path(tmp) / name
        create_package(str(path), target, include_gitignore=True, include_parent_dir=parent,
                       excludes=excludes, logger=None)
        size = target.stat().st_size
        if size > MAX_PACKAGE_MIB << 20:
            raise SpecError(f"JobSpec.runtime_env[{field!r}]",
                            f"{path} is {size / 2**20:.0f} MiB zipped, over Tidal's {MAX_PACKAGE_MIB} MiB: "
                            "leave data and outputs out (runtime_env 'excludes', .gitignore)")
        return name, target.read_bytes()


def ship(spec: JobSpec, keep: Callable[[str, bytes], str]) -> JobSpec:
    """The spec as the cluster gets it (module docstring): runtime_env checked, its local
    directories kept by `keep(name, data) -> URI` (the scheduler's `keep_package`), its code
    sealed. Needs no cluster itself; `keep` is the only call that leaves this process."""
    env = check_runtime_env(spec.runtime_env)
    if env:
        excludes = list(env.pop("excludes", None) or [])
        wd = env.get("working_dir")
        if isinstance(wd, (str, os.PathLike)) and "://" not in str(wd):
            env["working_dir"] = keep(*package(str(wd), field="working_dir", excludes=excludes, parent=False))
        if isinstance(env.get("py_modules"), list):
            env["py_modules"] = [
                keep(*package(str(m), field="py_modules", excludes=excludes, parent=True))
                if isinstance(m, (str, os.PathLike)) and "://" not in str(m) and Path(m).is_dir() else m
                for m in env["py_modules"]]
    return seal(dataclasses.replace(spec, runtime_env=env))


def keep_package(root: Path, name: str, data: bytes) -> str:
    """Write a shipped package under `root/packages/` (content-addressed: an existing one is kept)
    and return its `file://` URI. Written to a temporary name and renamed, so a node never reads
    half a zip."""
    if not PACKAGE_RE.match(name):
        raise SpecError("JobSpec.runtime_env",
                        f"a package's name must be Ray's _ray_pkg_<hash>.zip, got {name!r}")
    folder = root / "packages"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.exists():
        tmp = folder / f".{name}.{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path.absolute().as_uri()


def keep_in_storage(name: str, data: bytes) -> str:
    """`keep_package` into this process's runs' storage (`$TIDAL_STORAGE`): the `keep` of a
    driver that ships a spec itself (`tidal.launch`)."""
    from tidal.jobs.storage import storage_root

    return keep_package(storage_root(), name, data)


def dry_run_remote(spec: JobSpec, timeout_s: float = 600.0) -> None:
    """The job's dry run (`tidal.jobs.dryrun`) as a Ray task in the job's runtime_env, for a spec
    whose packages the client may lack: a SpecError naming the field (a module the env does not
    ship included), or one naming `JobSpec.runtime_env` when Ray cannot build the env (a pip
    requirement that does not resolve). The first run of a pip env builds it on that node
    (~10 s here); later ones reuse it."""
    import ray
    from ray.exceptions import GetTimeoutError, RayTaskError, RuntimeEnvSetupError

    from tidal.jobs.dryrun import dry_run

    task = ray.remote(num_cpus=0, max_retries=0)(dry_run)
    ref = task.options(name=f"tidal-dry-run-{spec.name}", runtime_env=spec.runtime_env).remote(spec)
    try:
        ray.get(ref, timeout=timeout_s)
    except RuntimeEnvSetupError as e:
        raise SpecError("JobSpec.runtime_env", f"Ray could not set it up: {env_setup_line(e)}") from None
    except GetTimeoutError:
        ray.cancel(ref, force=True)
        raise SpecError("JobSpec.runtime_env", f"the dry run in the job's runtime_env took more than "
                                               f"{timeout_s:g} s (building the env included)") from None
    except RayTaskError as e:
        cause = e.cause if isinstance(e.cause, BaseException) else e
        if isinstance(cause, SpecError):
            raise cause from None
        raise SpecError("JobSpec", f"the dry run failed on the cluster: {type(cause).__name__}: "
                                   f"{(str(cause).strip().splitlines() or [''])[0]}") from None


def env_setup_line(e: BaseException) -> str:
    """The line of a RuntimeEnvSetupError that says why (pip's own `ERROR: ...` when there is one;
    Ray's message is a multi-line log)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ERROR:"):
            return ln[:300]
    return (lines[-1] if lines else type(e).__name__)[:300]
