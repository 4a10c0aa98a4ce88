"""MkDocs hook: the generated parts of the site, made at build time from the code itself so
that they can never drift from it — every config key (the same rows as ``fedray config
--keys``), every command's ``--help``, the method and model registries, and the Python API
pages' module lists (rendered by mkdocstrings from the docstrings).

A page asks for a part with a marker comment on a line of its own::

    <!-- fedray:config-keys -->       <!-- fedray:cli -->
    <!-- fedray:methods -->           <!-- fedray:models -->
    <!-- fedray:api core wire -->     (one ``::: module`` block per module of those layers)
"""

from __future__ import annotations

import os
import pkgutil
import re
from typing import Any

MARKER = re.compile(r"^<!-- fedray:([a-z-]+)((?: [a-z_]+)*) -->$", re.M)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text.replace("|", "\\|").replace("\n", " ")


def config_keys() -> str:
    """One table per section: key, type, default, help, the methods it applies to."""
    import dataclasses

    from fedray.core.config import keys

    sections: dict[str, list[dict]] = {}
    for k in keys():
        row = dataclasses.asdict(k)
        sections.setdefault(row["key"].split(".")[0] if "." in row["key"] else "(top level)",
                            []).append(row)
    out = [f"{sum(len(v) for v in sections.values())} keys, generated from the config specs "
           "at build time (the same rows as `fedray config --keys`).\n"]
    for name, rows in sections.items():
        out.append(f"## `{name}`\n\n| key | type | default | help | applies to |\n"
                   "|---|---|---|---|---|")
        for r in rows:
            default = r["default"]
            if isinstance(default, dict) and r["applies_to"]:
                default = "; ".join(f"{v!r} ({o})" for o, v in default.items())
            out.append(f"| `{r['key']}` | {_cell(r['type'])} | `{_cell(default)}` | "
                       f"{_cell(r['help'])} | {_cell(', '.join(r['applies_to']))} |")
        out.append("")
    return "\n".join(out)


def _commands() -> list[list[str]]:
    import typer

    from fedray.front.cli import app

    root = typer.main.get_command(app)
    found = []

    def walk(cmd: Any, path: list[str]) -> None:
        found.append(path)
        for name in sorted(getattr(cmd, "commands", {}) or {}):
            walk(cmd.commands[name], path + [name])

    walk(root, [])
    return found


def _run(args: list[str]) -> str:
    from typer.testing import CliRunner

    from fedray.front.cli import app

    res = CliRunner().invoke(app, args, env={"COLUMNS": "100", "TERM": "dumb",
                                             "NO_COLOR": "1"}, terminal_width=100)
    if res.exit_code != 0:
        raise RuntimeError(f"fedray {' '.join(args)} exited {res.exit_code}: {res.output}")
    return res.output.rstrip()


def cli() -> str:
    """Every command's ``--help``, as the terminal shows it."""
    out = []
    for path in _commands():
        title = " ".join(["fedray", *path])
        out.append(f"## `{title}`\n\n```text\n{_run(path + ['--help'])}\n```\n")
    return "\n".join(out)


def methods() -> str:
    return f"```text\n{_run(['methods'])}\n```"


def models() -> str:
    return f"```text\n{_run(['models'])}\n```"


def api(layers: list[str]) -> str:
    """``::: module`` for every module of ``layers`` (mkdocstrings renders them)."""
    import fedray

    blocks = []
    for layer in layers:
        pkg = f"fedray.{layer}"
        path = os.path.join(os.path.dirname(fedray.__file__), layer)
        names = [pkg] + sorted(m.name for m in pkgutil.walk_packages([path], pkg + "."))
        blocks += [f"::: {name}\n" for name in names]
    return "\n".join(blocks)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def part(m: re.Match) -> str:
        kind, args = m.group(1), m.group(2).split()
        if kind == "config-keys":
            return config_keys()
        if kind == "cli":
            return cli()
        if kind == "methods":
            return methods()
        if kind == "models":
            return models()
        if kind == "api":
            return api(args)
        raise ValueError(f"{page.file.src_path}: unknown marker fedray:{kind}")

    return MARKER.sub(part, markdown)
