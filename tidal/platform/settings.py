"""The scheduler's settings from a file, for operators who do not write Python:
`tidal start --config tidal.yaml`.

The file is YAML: a mapping whose keys are `SchedulerConfig`'s fields, with `policy`, `loans`
and `correction` as mappings of the nested configs' fields (`PolicyConfig`, `LoanConfig`,
`CorrectionConfig`). What the file leaves out keeps its default; `correction: null` turns the
online correction off. For example:

    tick_s: 2
    cpus_per_worker: 4
    policy: {aging_s: 600, admission_preempts: later}
    loans: {risk: 0.05, lead_s: 30}

It is checked in three steps, before anything starts, and the first problem is one line naming
the setting and its value: a key that is no setting (the known ones listed); a value of the
wrong type (pydantic, validating against the dataclasses themselves, so there is no second
schema to drift); a value out of range (each dataclass's own `__post_init__`).

`reference()` writes the settings reference (docs/reference/settings.md) from the same dataclasses: each
setting's type and default, and the comment written beside it in the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from pathlib import Path
from typing import Any

from tidal.platform.config import SchedulerConfig


class SettingsError(ValueError):
    """A settings file the scheduler cannot start with; the message is one line."""


def load_settings(path: str | Path, base: SchedulerConfig | None = None) -> SchedulerConfig:
    """`SchedulerConfig` from YAML file `path`, over `base` (default: the defaults)."""
    import yaml

    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise SettingsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path}: cannot be read ({e})") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise SettingsError(f"{path}: not YAML{at} ({getattr(e, 'problem', None) or e})") from None
    return from_mapping({} if data is None else data, str(path), base)


def from_mapping(data: Any, source: str, base: SchedulerConfig | None = None) -> SchedulerConfig:
    """`SchedulerConfig` from a mapping as the file gives it (`source` names it in errors)."""
    from pydantic import TypeAdapter, ValidationError

    base = base or SchedulerConfig()
    merged = _merge(dataclasses.asdict(base), base, data, source, "")
    try:
        cfg: SchedulerConfig = TypeAdapter(SchedulerConfig).validate_python(merged)
    except ValidationError as e:
        raise SettingsError(f"{source}: {_one_line(e, merged)}") from None
    return cfg


def _merge(into: dict[str, Any], default: Any, data: Any, source: str, prefix: str) -> dict[str, Any]:
    """`into` (the defaults as a dict) with the file's mapping `data` laid over it, nested
    configs merged key by key. A key that is no setting is a SettingsError listing the known."""
    if not isinstance(data, dict):
        what = f"{prefix.rstrip('.')} must be" if prefix else "the file must be"
        raise SettingsError(f"{source}: {what} a mapping of settings, got {type(data).__name__} {data!r}")
    for key, value in data.items():
        if key not in into:
            known = ", ".join(sorted(into))
            raise SettingsError(f"{source}: unknown setting {prefix}{key!s} (known: {known})")
        nested = getattr(default, str(key))
        if dataclasses.is_dataclass(nested) and value is not None:
            into[key] = _merge(dict(into[key]), nested, value, source, f"{prefix}{key}.")
        else:
            into[key] = value
    return into


def _one_line(e: Any, merged: dict[str, Any]) -> str:
    """pydantic's first error as `setting = value: why`; a dataclass's own range check (a
    ValueError from its `__post_init__`) already names its setting."""
    err = e.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(x) for x in err["loc"])
    if err["type"] == "value_error":
        return f"{loc}: {msg}" if loc and not msg.startswith(("SchedulerConfig", "PolicyConfig",
                                                               "CorrectionConfig")) else msg
    return f"{loc} = {err['input']!r}: {msg}"


# -- the reference -------------------------------------------------------------------------

NESTED = {"policy": "PolicyConfig", "loans": "LoanConfig", "correction": "CorrectionConfig"}


def reference() -> str:
    """docs/reference/settings.md: every setting of the file, with its type, default and the comment
    beside it in the code (tests/platform/test_settings.py keeps the page equal to this)."""
    base = SchedulerConfig()
    out = ["# Settings reference", "",
           "<!-- written by `python -m tidal.platform.settings`; do not edit by hand -->", "",
           "`tidal start --config tidal.yaml` reads these (`tidal/platform/settings.py`): a YAML",
           "mapping of the keys below, nested mappings for `policy`, `loans` and `correction`.",
           "What the file leaves out keeps its default. A bad file is one line naming the setting",
           "and its value, before anything starts.", ""]
    out += _table(type(base), base, "")
    for key in NESTED:
        value = getattr(base, key)
        if dataclasses.is_dataclass(value):
            out += ["", f"## `{key}` ({type(value).__name__})", ""]
            out += _table(type(value), value, f"{key}.")
    return "\n".join(out) + "\n"


def _table(cls: type, default: Any, prefix: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    notes = _comments(cls)
    rows = ["| setting | type | default | what |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        shown = f"`{NESTED[f.name]}` (below)" if f.name in NESTED and dataclasses.is_dataclass(value) \
            else f"`{value!r}`"
        kind = _type_name(hints[f.name])
        rows.append(f"| `{prefix}{f.name}` | {kind} | {shown} | {notes.get(f.name, '')} |")
    return rows


def _type_name(t: Any) -> str:
    name = str(t).replace("typing.", "")
    for short in ("tidal.core.policy.types.", "tidal.serving.loans.", "tidal.core.correction."):
        name = name.replace(short, "")
    name = name.replace("<class '", "").replace("'>", "")
    return name.replace("|", "or")


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: the `#` lines right above it and the one at its line's end."""
    lines, _ = inspect.getsourcelines(cls)
    src = textwrap.dedent("".join(lines))
    body = src.splitlines()
    out: dict[str, str] = {}
    cls_node = ast.parse(src).body[0]
    assert isinstance(cls_node, ast.ClassDef)
    for node in cls_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        i = node.lineno - 1
        above: list[str] = []
        j = i - 1
        while j >= 0 and body[j].strip().startswith("#"):
            above.insert(0, body[j].strip().lstrip("#").strip())
            j -= 1
        end = body[node.end_lineno - 1 if node.end_lineno else i]
        inline = end.split("  # ", 1)[1].strip() if "  # " in end else ""
        out[node.target.id] = " ".join([*above, inline]).strip().replace("|", "\\|")
    return out


if __name__ == "__main__":
    print(reference(), end="")
