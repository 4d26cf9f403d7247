"""A job's code as an opaque payload: its factories and loss travel as bytes, opened only where
they are called.

The scheduler, the run host and Ray Train's controller read a JobSpec's header (name, batch,
steps, plans) but never call its model factory, dataset or loss. Pickled as they are, those
functions name the user's modules (`from mymodel import GPT`), and unpickling the spec would
import them in processes that have none of the job's code: the scheduler actor on the head node
knows nothing of a file that was submitted from a laptop. Sealed at submission, each is a
`Sealed` holding cloudpickle's bytes; a worker with the job's `runtime_env` (its working_dir on
`sys.path`, its pip packages installed) opens it on the first call. A worker without them gets a
SpecError naming the field and the module, not an unpickling traceback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tidal.jobs.spec import JobSpec, SpecError

FIELDS = ("model", "dataset", "loss", "eval_dataset")  # the JobSpec fields that are the job's code


class Sealed:
    """`fn` as cloudpickled bytes; calling it unpickles `fn` once, then calls it. Pickling a
    Sealed pickles the bytes only (never the opened function), and two Sealed are equal when
    their bytes are."""

    __slots__ = ("_fn", "blob", "field")

    def __init__(self, fn: Callable[..., Any], field: str) -> None:
        from ray import cloudpickle

        self.blob: bytes = cloudpickle.dumps(fn)
        self.field = field
        self._fn: Callable[..., Any] | None = None

    def open(self) -> Callable[..., Any]:
        """The function, unpickled here: a SpecError naming the field and the missing module if
        this process lacks the job's code or packages."""
        if self._fn is None:
            import pickle

            try:
                self._fn = pickle.loads(self.blob)
            except ImportError as e:  # ModuleNotFoundError included; kept short: a status line shows it
                raise SpecError(self.field, f"cannot be loaded on this worker: {e} (ship it with "
                                            "JobSpec.runtime_env: working_dir, pip)") from None
            except AttributeError as e:  # a module that is there but older: the name moved
                raise SpecError(self.field, f"cannot be loaded on this worker: {e} (this worker's copy "
                                            "of the job's code differs from the submitter's)") from None
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.open()(*args, **kwargs)

    def __getstate__(self) -> tuple[bytes, str]:
        return self.blob, self.field

    def __setstate__(self, state: tuple[bytes, str]) -> None:
        self.blob, self.field = state
        self._fn = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sealed) and other.blob == self.blob

    def __hash__(self) -> int:
        return hash(self.blob)

    def __repr__(self) -> str:
        return f"Sealed({self.field}, {len(self.blob)} bytes)"


def seal(spec: JobSpec) -> JobSpec:
    """`spec` with its code fields sealed (those already sealed, and a missing eval_dataset, as
    they are)."""
    changes: dict[str, Any] = {name: Sealed(fn, f"JobSpec.{name}") for name in FIELDS
               if (fn := getattr(spec, name)) is not None and not isinstance(fn, Sealed)}
    return dataclasses.replace(spec, **changes) if changes else spec


def opened(fn: Any) -> Any:
    """The function a Sealed holds (unpickled here), or `fn` itself: for code that reads a
    function's name or source (the profile cache's key), not only calls it."""
    return fn.open() if isinstance(fn, Sealed) else fn
