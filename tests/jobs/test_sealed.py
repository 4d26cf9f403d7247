"""A sealed job's code travels as bytes and opens only where it is called."""

from __future__ import annotations

import dataclasses
import functools
import pickle
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import tiny_gpt_spec
from tidal.jobs.sealed import Sealed, opened, seal
from tidal.jobs.spec import SpecError


def _module(tmp_path: Path) -> str:
    name = f"sealed_mod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def width():\n    return 7\n\nclass Box:\n    size = 3\n")
    return name


def test_a_sealed_function_pickles_as_bytes_and_opens_on_its_first_call() -> None:
    s = Sealed(functools.partial(pow, 2), "JobSpec.model")
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == hash(s) and copy(10) == 1024
    assert opened(copy).func is pow and opened(len) is len
    assert pickle.dumps(copy) == pickle.dumps(s)  # the opened function is never pickled with it


def test_seal_seals_the_code_fields_and_keeps_the_rest() -> None:
    spec = tiny_gpt_spec()
    sealed = seal(spec)
    assert all(isinstance(getattr(sealed, f), Sealed) for f in ("model", "dataset", "loss", "eval_dataset"))
    assert sealed.global_batch == spec.global_batch and sealed.plans == spec.plans
    assert seal(dataclasses.replace(spec, eval_dataset=None)).eval_dataset is None
    assert seal(sealed) is sealed  # nothing left to seal
    assert opened(sealed.loss) is spec.loss  # an importable function travels by name
    assert type(sealed.model()) is type(spec.model())


def test_code_this_process_cannot_import_is_a_spec_error_naming_the_module(tmp_path: Path) -> None:
    name = _module(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
        blob = pickle.dumps(Sealed(module.width, "JobSpec.model"))
        box = pickle.dumps(Sealed(module.Box, "JobSpec.dataset"))
    finally:
        sys.path.remove(str(tmp_path))
        del sys.modules[name]
    (tmp_path / f"{name}.py").unlink()
    s = pickle.loads(blob)  # unpickling the spec's header imports nothing of the job's code
    says = (rf"^JobSpec\.model: cannot be loaded on this worker: No module named '{name}' "
            rf"\(ship it with JobSpec\.runtime_env: working_dir, pip\)$")
    with pytest.raises(SpecError, match=says):
        s()
    (tmp_path / f"{name}.py").write_text("def width():\n    return 8\n")  # a copy where Box moved
    sys.path.insert(0, str(tmp_path))
    try:
        assert pickle.loads(blob)() == 8
        with pytest.raises(SpecError, match=r"^JobSpec\.dataset: cannot be loaded on this worker: .*Box.*"
                                            r"differs from the submitter's\)$"):
            pickle.loads(box)()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
