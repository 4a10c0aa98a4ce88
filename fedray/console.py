"""What every ``fedray`` command shares, so a method's own sub-commands (registered with
:func:`fedray.registry.register_command`) behave like the built-in ones: ``--json`` prints
exactly one JSON object on stdout, errors are one line (or one ``{"error": ...}`` object)
and exit with status 2."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from fedray.metrics import json_text

JSON_OPT = typer.Option(False, "--json", help="Print one JSON object on stdout, nothing else.")
SET_OPT = typer.Option(None, "--set", "-s",
                       help="Override a config key, e.g. -s local.lr=0.1 -s clients.fraction=0.5"
                            " (repeatable; values are parsed as YAML).")

# per-sample input shapes assumed when a command is not told one
DEFAULT_SHAPES = {"mlp": (784,), "cnn": (1, 28, 28), "lstm": (1, 28, 28),
                  "resnet18": (3, 32, 32), "resnet34": (3, 32, 32)}


def emit(obj: Any, as_json: bool, text: str | None = None) -> None:
    if as_json:
        sys.stdout.write(json_text(obj) + "\n")
    else:
        typer.echo(text if text is not None else json_text(obj, indent=2))


def fail(msg: str, as_json: bool, code: int = 2) -> None:
    if as_json:
        sys.stdout.write(json.dumps({"error": msg}) + "\n")
    else:
        typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    return tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
