"""A job's dry run before submission: build the model, read one sample, compute the loss of a
one-sample batch — on the CPU, in the submitting process, with a time limit.

It catches in seconds what otherwise surfaced after minutes of profiling on the cluster (an
empty dataset after 109 s, with a running job preempted for its reservation) or as a 51-line
traceback from the scheduler actor (a model factory that raises): each failure is a `SpecError`
naming the field, and nothing is reserved. The run happens in a daemon thread so that a factory
that hangs is reported at the limit; the thread itself cannot be killed and is left behind.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from tidal.jobs import actckpt
from tidal.jobs.spec import JobSpec, SpecError


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _run(spec: JobSpec) -> None:
    import torch
    from torch.utils.data import default_collate

    try:
        data = spec.dataset()
    except Exception as e:
        raise SpecError("JobSpec.dataset", f"the factory raised {_first_line(e)}") from None
    try:
        n = len(data)
    except Exception as e:
        raise SpecError("JobSpec.dataset",
                        f"must be a map-style dataset with len(): {_first_line(e)}") from None
    if n < 1:
        raise SpecError("JobSpec.dataset", "is empty (len 0): nothing to train on")
    try:
        batch = default_collate([data[0]])
    except Exception as e:
        raise SpecError("JobSpec.dataset", f"reading item 0 raised {_first_line(e)}") from None
    try:
        model = spec.model()
    except Exception as e:
        raise SpecError("JobSpec.model", f"the factory raised {_first_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise SpecError("JobSpec.model",
                        f"the factory returned {type(model).__name__}, not a torch.nn.Module")
    if actckpt.protocol(model) is None:
        cannot = f"model {type(model).__name__} can not checkpoint (see tidal.jobs.actckpt)"
        if spec.plan is not None and spec.plan.activation_checkpointing:
            raise SpecError("JobSpec.plan", f"activation_checkpointing=True, but {cannot}")
        if not any(not ac for ac in spec.plans.activation_checkpointing):
            raise SpecError("JobSpec.plans", f"allows only activation_checkpointing=True, but {cannot}")
    try:
        with torch.no_grad():
            loss = spec.loss(model, batch)
        value = float(loss)
    except Exception as e:
        raise SpecError("JobSpec.loss", f"loss(model, batch) raised {_first_line(e)}") from None
    if not math.isfinite(value):
        raise SpecError("JobSpec.loss", f"is {value} on the first sample of the dataset")


def dry_run(spec: JobSpec, timeout_s: float = 120.0) -> None:
    """Raise a SpecError naming the field if the job cannot build its model, read its data or
    compute its loss (module docstring); return None if it can."""
    out: list[BaseException | None] = []

    def target() -> None:
        try:
            _run(spec)
            out.append(None)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=target, name=f"tidal-dry-run-{spec.name}", daemon=True)
    t.start()
    t.join(timeout_s)
    if not out:
        raise SpecError("JobSpec", f"the dry run (model, one sample, loss) took more than {timeout_s:g} s")
    err: Any = out[0]
    if err is not None:
        if isinstance(err, SpecError):
            raise err
        raise SpecError("JobSpec", f"the dry run failed: {_first_line(err)}")
