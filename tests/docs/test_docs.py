"""Docs that cannot rot: every command and code block a user would run from README.md and the
docs site (`docs/`, but the notebook `docs/log/`) is checked here against the code, no cluster.

- a `tidal ...` line parses with the CLI's own parser, and the repository files it names exist;
- a `python SCRIPT ...` line names a script that exists, and every `--flag` it passes is one
  the script's `--help` lists;
- `make X` names a Makefile target; `ray start --labels` values parse as Ray parses them;
  `serve run --app-dir D module:app` imports and finds the app;
- a Python block compiles, and every `tidal.X` it uses exists; one included from `examples/`
  (`--8<--`) is that file, which its own test runs (quickstart: test_quickstart.py, the
  Hugging Face job: test_hf_model.py, the Serve app: test_own_app.py); the README's quickstart
  is `examples/quickstart.py`.

What this cannot run here (a cluster of GPUs, `ray up`) is checked for its parts: the files, flags
and settings it names.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "log" not in p.parts)]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(lang: set[str]) -> list[tuple[str, str]]:
    """(page, code) of every fenced block whose language is in `lang`."""
    return [(p.relative_to(ROOT).as_posix(), m.group(2)) for p in PAGES
            for m in FENCE.finditer(p.read_text()) if m.group(1) in lang]


def commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every shell line, continuations joined, comments and `VAR=value ` prefixes
    dropped, `.venv/bin/` taken off the program."""
    out = []
    for page, code in blocks({"bash", "sh", "console"}):
        lines = re.sub(r"(^|\s)#.*$", "", code.replace("\\\n", " "), flags=re.M).splitlines()
        for line in (part.strip() for whole in lines for part in whole.split("&&")):
            if not line or line.startswith((". ", "source ", "export ", "cd ")):
                continue
            argv = shlex.split(line)
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                argv = argv[1:]
            if argv:
                argv[0] = argv[0].removeprefix(".venv/bin/")
                out.append((page, argv))
    return out


def test_the_pages_have_commands_to_check() -> None:
    programs = {argv[0] for _, argv in commands()}
    assert {"tidal", "python", "make", "ray", "serve"} <= programs, programs


def _repo_paths(args: list[str]) -> list[str]:
    return [a for a in args if re.match(r"^(examples|benchmarks|tests|tidal|docs)/\S+\.(py|yaml|csv)$", a)
            or a in ("cluster.yaml", "cluster-local.yaml")]


@pytest.mark.parametrize(("page", "argv"), [c for c in commands() if c[1][0] == "tidal"],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_tidal_command_parses_as_printed(page: str, argv: list[str]) -> None:
    from tidal.platform.cli import build_parser

    args = [a for a in argv[1:] if not (a.startswith("[") and a.endswith("]"))]  # [optional] args
    try:
        build_parser().parse_args(args)
    except SystemExit as e:
        pytest.fail(f"{page}: `{shlex.join(argv)}` does not parse (exit {e.code})")
    for path in _repo_paths(args):
        assert (ROOT / path).exists(), f"{page}: `{shlex.join(argv)}` names {path}, which does not exist"


@functools.cache
def _help(script: str) -> str:
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"{script} --help: {out.stderr[-500:]}"
    return out.stdout


@pytest.mark.parametrize(("page", "argv"), [c for c in commands() if c[1][0] == "python"],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_python_command_names_a_script_and_flags_it_has(page: str, argv: list[str]) -> None:
    script = argv[1]
    assert (ROOT / script).is_file(), f"{page}: `{shlex.join(argv)}`: no {script}"
    flags = {a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")}
    if flags:
        listed = set(re.findall(r"--[\w-]+", _help(script)))
        assert flags <= listed, f"{page}: {script} has no {sorted(flags - listed)}"
    for path in _repo_paths(argv[2:]):
        assert (ROOT / path).exists(), f"{page}: `{shlex.join(argv)}` names {path}"


def test_make_ray_and_serve_lines_name_what_exists() -> None:
    from ray._private.label_utils import parse_node_labels_string, validate_node_labels

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    seen = 0
    for page, argv in commands():
        line = f"{page}: `{shlex.join(argv)}`"
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, line
            seen += 1
        elif argv[0] == "ray" and "--labels" in argv:
            labels = parse_node_labels_string(argv[argv.index("--labels") + 1])
            validate_node_labels(labels)
            assert labels.get("tidal.io/pool") in ("training", "inference"), line
            seen += 1
        elif argv[0] == "ray" and argv[1:2] in (["up"], ["down"], ["dashboard"]):
            assert (ROOT / argv[2]).is_file(), line
            seen += 1
        elif argv[0] == "ray" and argv[1:3] == ["job", "submit"]:
            entry = argv[argv.index("--") + 1:]
            assert entry[0] == "python" and (ROOT / entry[1]).is_file(), line
            seen += 1
        elif argv[0] == "serve" and argv[1] == "run":
            app_dir = argv[argv.index("--app-dir") + 1]
            module, attr = argv[-1].split(":")
            spec = importlib.util.spec_from_file_location(module, ROOT / app_dir / f"{module}.py")
            assert spec is not None and spec.loader is not None, line
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            assert hasattr(loaded, attr), line
            seen += 1
    assert seen >= 6, seen


def _tidal_names(tree: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "tidal"}


@pytest.mark.parametrize(("page", "code"), blocks({"python"}), ids=lambda v: v if len(v) < 40 else "")
def test_a_python_block_compiles_and_uses_what_tidal_has(page: str, code: str) -> None:
    import tidal

    include = re.fullmatch(r'--8<-- "([^"]+)"\s*', code)
    if include:
        path = ROOT / include.group(1)
        assert path.is_file() and path.parts[-2] == "examples", f"{page} includes {include.group(1)}"
        code = path.read_text()
    tree = ast.parse(code)
    for name in _tidal_names(tree):
        assert hasattr(tidal, name), f"{page}: tidal.{name} does not exist"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tidal"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{page}: from {node.module} import {alias.name}"


def test_the_readmes_quickstart_is_the_example_a_test_runs() -> None:
    """The README's Python block, line by line, is examples/quickstart.py (which
    tests/platform/test_quickstart.py submits with `ray job submit`)."""
    readme = [c for p, c in blocks({"python"}) if p == "README.md"]
    assert len(readme) == 1
    example = {line.strip() for line in (ROOT / "examples" / "quickstart.py").read_text().splitlines()}
    missing = [line for line in readme[0].splitlines() if line.strip() and line.strip() not in example]
    assert not missing, f"README's quickstart differs from examples/quickstart.py: {missing}"


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a dated run in the README: it belongs in docs/"
    for link in re.findall(r"\]\(([^)#]+)", text):
        if not link.startswith("http"):
            assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    assert "../shared" not in text
