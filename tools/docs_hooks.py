"""MkDocs hooks: the reference pages that are written from the code when the site is built.

`<!-- tidal:cli -->` becomes every `tidal` subcommand's `--help` (from `tidal.platform.cli`'s
parser), `<!-- tidal:metrics -->` the table of the scheduler's Ray metrics (read from
`tidal/platform/metrics.py`'s source, so the build needs no Ray cluster).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cli_reference() -> str:
    from tidal.platform.cli import build_parser

    parser = build_parser()
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
    out = ["```text", parser.format_help().rstrip(), "```"]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        sub.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100)
        out += ["", f"## `tidal {name}`", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(out)


def metrics_reference() -> str:
    tree = ast.parse((ROOT / "tidal" / "platform" / "metrics.py").read_text())
    rows = ["| metric (as Prometheus shows it) | kind | tags | what |", "|---|---|---|---|"]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("Gauge", "Counter", "Histogram") and len(node.args) >= 2):
            name, what = (ast.literal_eval(a) for a in node.args[:2])
            tags: Any = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "tag_keys"), ())
            rows.append(f"| `ray_{name}` | {node.func.id.lower()} | {', '.join(tags) or '—'} | {what} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- tidal:cli -->" in markdown:
        markdown = markdown.replace("<!-- tidal:cli -->", cli_reference())
    if "<!-- tidal:metrics -->" in markdown:
        markdown = markdown.replace("<!-- tidal:metrics -->", metrics_reference())
    return markdown
