"""The import-layer contract (README "Architecture"), read from the source itself. The
subpackages of ``fedray/`` are the layers:

ground — ``core`` (errors and specs, the registry, the config loader, storage, client
state, seeding, checkpoints), ``wire`` (payload and codecs, compression, the update
transform chain), ``services`` (fleet, privacy, server optimizers), ``observe`` (metrics,
tracking, progress, plots, console) → ``models``, ``data`` (with the torch training
helpers and pretraining) → ``methods`` → ``runtime`` → front ends: ``front`` (CLI, Tune,
reports), ``integrations``, ``jobs/``.

Every import of a fedray module — at module level or inside a function — points to the
same or a lower layer; no imports form a cycle, function-level ones included; the ground
floor loads no torch when imported (the seeding helpers import it when called) and every
server half (policies) is free of torch, transitively too; the runtime and the front ends
name no method. Methods are found through the registry, by name, never imported by the
layers that run them.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GROUND_PACKAGES = ("core", "wire", "services", "observe")
LAYERS = [("ground", lambda m: m == "fedray" or m.split(".")[1] in GROUND_PACKAGES),
          ("models/data", lambda m: m.split(".")[1] in ("models", "data")),
          ("methods", lambda m: m.split(".")[1] == "methods"),
          ("runtime", lambda m: m.split(".")[1] == "runtime"),
          ("top", lambda m: m.split(".")[1] in ("front", "integrations", "testing", "__main__")
           or m.startswith("jobs."))]
TORCH = ("torch", "torchvision", "transformers", "peft", "bitsandbytes")


def ground() -> set[str]:
    return {m for m in sources() if layer_of(m) == 0}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.cache
def sources() -> dict[str, Path]:
    files = sorted((ROOT / "fedray").rglob("*.py")) + sorted((ROOT / "jobs").glob("*.py"))
    return {module_name(p): p for p in files}


def imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, at module level?, line) for every import in ``path``; ``from a
    import b`` yields ``a.b`` when that is a module of ours, else ``a``."""
    tree = ast.parse(path.read_text(), str(path))
    known = sources()
    top = {id(n) for n in tree.body}
    guarded = {id(n) for node in tree.body if isinstance(node, ast.If)
               for n in ast.walk(node)}  # `if TYPE_CHECKING:` / version guards: still imports
    out = []
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        level = id(node) in top or id(node) in guarded
        if isinstance(node, ast.Import):
            out += [(a.name, level, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base
                                                                           else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                out.append((full if full in known else base, level, node.lineno))
    return out


def layer_of(module: str) -> int:
    for i, (_, test) in enumerate(LAYERS):
        if test(module):
            return i
    raise AssertionError(f"{module} belongs to no layer: add it to the contract in "
                         f"tests/test_layers.py (and the README's layout)")


def test_every_import_points_down_or_sideways():
    bad = []
    for mod, path in sources().items():
        mine = layer_of(mod)
        for target, _, line in imports(path):
            if target.split(".")[0] != "fedray" or target == "fedray":
                continue
            theirs = layer_of(target)
            if theirs > mine:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({LAYERS[mine][0]}) imports "
                           f"{target} ({LAYERS[theirs][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_module_level_imports_have_no_cycle():
    graph = {mod: {t for t, level, _ in imports(path) if level and t in sources() and t != mod}
             for mod, path in sources().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_at_all():
    """Function-level imports included: a module that needs another lazily still depends
    on it (a submodule reaching back into its own package's ``__init__`` is a cycle too)."""
    graph = {mod: {t for t, _, _ in imports(path) if t in sources() and t != mod}
             for mod, path in sources().items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not found, "import cycles:\n" + "\n".join(found)


def server_halves() -> list[str]:
    """Modules that define an aggregation policy (a class whose name ends in ``Policy``)."""
    return sorted(m for m, p in sources().items()
                  if any(isinstance(n, ast.ClassDef) and n.name.endswith("Policy")
                         for n in ast.walk(ast.parse(p.read_text()))))


def test_ground_floor_and_server_halves_are_torch_free():
    server = server_halves()
    assert {"fedray.methods.fedavg.policy", "fedray.methods.fedbuff",
            "fedray.methods.drod.slice_mean"} <= set(server)  # covers the real layout
    bad = [f"{m}:{line} imports {t}" for m in sorted(ground() | set(server))
           for t, level, line in imports(sources()[m]) if t.split(".")[0] in TORCH
           and (level or m in server)]  # the ground may build torch objects on request
    assert not bad, "torch below the line:\n" + "\n".join(bad)


def test_importing_the_ground_and_the_numpy_server_halves_loads_no_torch():
    """Transitively too: what the driver needs to aggregate (and every ground module) imports
    without torch in the process."""
    import subprocess
    import sys

    mods = sorted(ground() - {"fedray"}) + ["fedray.models.geometry",
                                          "fedray.methods.fedavg.policy",
                                          "fedray.methods.orders.policy",
                                          "fedray.methods.drod.slice_mean",
                                          "fedray.methods.fedopt"]
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + \
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {TORCH!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out == "[]", f"importing {mods} loaded {out}"


def test_runtime_and_front_ends_name_no_method():
    from fedray.core import registry

    names = sorted(registry.methods(), key=len, reverse=True)
    generic = [ROOT / "fedray" / "runtime", ROOT / "fedray" / "front",
               ROOT / "fedray" / "data" / "build.py"]
    words = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b", re.I)
    bad = []
    for p in generic:
        for f in [p] if p.is_file() else sorted(p.rglob("*.py")):
            tree = ast.parse(f.read_text())
            for node in ast.walk(tree):  # identifiers and string constants, not docstrings
                text = node.value if isinstance(node, ast.Constant) and isinstance(
                    node.value, str) and not _is_docstring(node, tree) else \
                    getattr(node, "id", None) or getattr(node, "attr", None)
                if isinstance(text, str) and (m := words.search(text)):
                    bad.append(f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', '?')} "
                               f"{m.group(0)!r}")
    assert not bad, "method names in generic code:\n" + "\n".join(bad)


def _is_docstring(node: ast.AST, tree: ast.Module) -> bool:
    for parent in ast.walk(tree):
        body = getattr(parent, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                body[0].value is node:
            return True
    return False


def test_loading_and_checking_configs_loads_no_torch():
    """Every shipped config, every method's defaults (valid or not), ``--keys`` and the
    ``fedray config`` command run without torch in the process (plugins found by metadata;
    model keywords read from source; DROD's tier ladder counted from the geometry)."""
    import subprocess
    import sys

    code = f"""
import glob, sys
from fedray.core import registry
from fedray.core.config import ConfigError, keys, load_config
loaded = 0
for path in sorted(glob.glob('configs/*.yaml')):
    try:  # flite_digits.yaml needs a `fedray pretrain` output first
        load_config(path)
        loaded += 1
    except ConfigError:
        pass
assert loaded >= 3, loaded
for name, cls in registry.methods().items():
    for extra in ([], ['model.name=sliceable_resnet18'], ['server.optimizer=adam']):
        try:
            load_config(None, [f'algorithm.name={{name}}', *extra])
        except ConfigError:
            pass
keys()
print(sorted(m for m in sys.modules if m.split('.')[0] in {TORCH!r}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out == "[]", out[:2000]
    cli = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedray", "config",
                          "configs/fedavg_digits.yaml"], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in cli.stderr.splitlines()
              if line.startswith("import time:")}
    assert not loaded & set(TORCH), sorted(loaded & set(TORCH))
