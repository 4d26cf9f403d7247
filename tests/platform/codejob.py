"""A job whose code is not Tidal's: its model, data and loss in a module beside the job file,
and its model's width in a pip package the test builds (a wheel, by hand: PEP 427), so that
nothing but the job's runtime_env can bring either to a worker."""

from __future__ import annotations

import base64
import hashlib
import textwrap
import uuid
import zipfile
from pathlib import Path

MODULE = '''
import torch


class Regression(torch.utils.data.Dataset):
    """y = sum(x): a target every plan and worker count learns alike."""

    def __init__(self, n, width):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def width():
    {width}


def make_model():
    return torch.nn.Linear(width(), 1)


def make_data():
    return Regression(256, width())


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
'''

JOB = '''
from tidal.jobs.spec import JobSpec, PlanSpace
from {module} import loss, make_data, make_model

spec = JobSpec(name="{name}", model=make_model, dataset=make_data, loss=loss, global_batch=8,
               total_steps=20, min_gpus={gpus}, max_gpus={gpus}, checkpoint_every=10, lr=1e-2,
               plans=PlanSpace(zero_stages=(0,), offload_optimizer=(False,), offload_param=(False,),
                               activation_checkpointing=(False,)),
               runtime_env={env!r})
'''


def wheel(folder: Path, name: str, version: str = "0.1", body: str = "WIDTH = 6\n") -> Path:
    """A pure-Python wheel of one module `name` holding `body`."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tidal-tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = [f"{p},sha256={digest(t)},{len(t.encode())}" for p, t in files.items()]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def job_dir(root: Path, *, name: str = "shipped", gpus: int = 1, package: str | None = None,
            wheels: Path | None = None, env: dict[str, object] | None = None) -> tuple[Path, str]:
    """(job file, module name): `root/job.py` whose model lives in `root/<module>.py` (a name no
    test imported before: modules are cached per process). With `package`, the model's width comes
    from that pip package, imported only when the model or data is built, and the spec declares it
    (`pip`, found in `wheels` only); `env` is added to the spec's runtime_env."""
    module = f"shipped_model_{uuid.uuid4().hex[:8]}"
    body = f"import {package}\n    return {package}.WIDTH" if package else "return 6"
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(MODULE.replace("{width}", body))
    runtime_env: dict[str, object] = dict(env or {})
    if package:
        runtime_env["pip"] = {"packages": [package],
                              "pip_install_options": ["--no-index", "--find-links", str(wheels)]}
    job = root / "job.py"
    job.write_text(textwrap.dedent(JOB).format(module=module, name=name, gpus=gpus, env=runtime_env or None))
    return job, module
