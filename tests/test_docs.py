"""The README and the documentation site (issue #33): every code block a user would paste
runs, and the output a page shows still matches in substance; the site builds with
``--strict`` and that build really fails on a broken link; every config key is on the
generated reference page.

How pages mark their blocks (an HTML comment on the line before the fence)::

    <!-- example: skip gpu: why -->       not run here: needs a GPU (also ``cluster:``,
                                          ``server:`` for a command that never exits and
                                          ``long:`` naming the test that covers it)
    <!-- example: file PATH -->           the block is that repository file, verbatim
    <!-- example: tol=0.2 -->             numbers in its shown output within 20 %

Every other ``bash`` or ``python`` block runs — a page's blocks in order, in one fresh
directory holding links to the repository's ``configs/``, ``jobs/``, ``examples/`` and the
virtual environment (so ``runs/...`` paths land in that directory). A command's shown
output is the ``#   ...`` comment lines right after it, or a ``text`` block right after
the ``bash`` block (the last command's); each shown line must appear in what the command
printed with the same words, and each number within the tolerance (default 5 %, plus the
shown number's rounding), timings (``12.6s``, ``0.06 min``, ``00:14``) excepted.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import build_site

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARK = re.compile(r"<!-- example: (.*?) -->")
SKIP_KINDS = ("gpu:", "cluster:", "server:", "long:")
RUN_LANGS = ("bash", "python")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
TIMING = re.compile(r"\d+(?:\.\d+)?\s?(?:s|min|ms)\b|\d+:\d\d(?::\d\d)?|\d+(?:\.\d+)? elapsed")
LINKED = ("configs", "jobs", "examples", "fedray", "benchmarks", "cluster.yaml", ".venv")


WARM_RUNS = False  # conftest.warm_runs: the pages run as subprocesses on the session Ray


@dataclasses.dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    mark: str
    shown: list[str]  # a text block right after it: the last command's output
    end: int  # the line after its closing fence


def page_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        mark = MARK.search(prev)
        block = Block(str(path.relative_to(ROOT)), i + 1, m.group(1),
                      "\n".join(lines[i + 1:j]) + "\n", mark.group(1) if mark else "", [],
                      j + 1)
        if out and block.lang == "text" and out[-1].lang == "bash" and \
                all(not ln.strip() for ln in lines[out[-1].end:i]):
            out[-1].shown = block.text.splitlines()
        out.append(block)
        i = j + 1
    return out


def commands(text: str) -> list[tuple[str, list[str]]]:
    """A bash block as (command, its shown output lines): continuation lines joined,
    ``#   `` comment lines after a command are its output, other comments dropped."""
    out: list[tuple[str, list[str]]] = []
    pending = ""
    for raw in text.splitlines():
        if raw.startswith("#   ") and out and not pending:
            out[-1][1].append(raw[4:])
            continue
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        pending += raw[:-1] + " " if raw.endswith("\\") else raw
        if not raw.endswith("\\"):
            out.append((pending, []))
            pending = ""
    return out


def skeleton(line: str) -> str:
    return " ".join(NUMBER.sub("N", line).split())


def numbers(line: str) -> list[str]:
    spans = [m.span() for m in TIMING.finditer(line)]
    return [m.group() for m in NUMBER.finditer(line)
            if not any(a <= m.start() < b for a, b in spans)]


def check_shown(shown: list[str], printed: str, tol: float, where: str) -> None:
    """Each shown line appears in ``printed`` with the same words and close numbers."""
    actual = printed.splitlines()
    for want in shown:
        if not want.strip():
            continue
        same = [a for a in actual if skeleton(a) == skeleton(want)]
        assert same, (f"{where}: the page shows {want!r}, nothing printed reads like it:\n"
                      + printed[-3000:])
        w = numbers(want)
        problems = []
        for a in same:
            got = numbers(a)
            if len(got) != len(w):
                continue
            bad = [(x, y) for x, y in zip(w, got, strict=True) if not close(x, y, tol)]
            if not bad:
                break
            problems.append((a, bad))
        else:
            raise AssertionError(f"{where}: the page shows {want!r}; printed {problems} "
                                 f"(tolerance {tol:.0%})")


def close(shown: str, got: str, tol: float) -> bool:
    x, y = (float(s.replace(",", "")) for s in (shown, got))
    decimals = len(shown.split(".")[1]) if "." in shown and "e" not in shown else 0
    return abs(x - y) <= tol * abs(x) + 0.5 * 10 ** -decimals


def options(mark: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in mark.split() if "=" in p)


def test_every_skip_says_why_and_is_allowed():
    """Only a GPU, a cluster, a server that never exits or a long job (naming the test that
    covers it) may keep a block from running."""
    for page in PAGES:
        for b in page_blocks(page):
            if b.mark.startswith("skip"):
                reason = b.mark[len("skip"):].strip()
                assert reason.startswith(SKIP_KINDS) and len(reason) > 12, (b.page, b.line, b.mark)
                if reason.startswith("long:"):
                    assert "test" in reason, (b.page, b.line, "name the test that covers it")


def test_file_blocks_are_the_files_verbatim():
    found = 0
    for page in PAGES:
        for b in page_blocks(page):
            if b.mark.startswith("file "):
                path = ROOT / b.mark.split()[1]
                assert path.resolve().is_relative_to(ROOT), b.mark
                assert b.text == path.read_text(encoding="utf-8"), (b.page, b.line, path)
                found += 1
    assert found >= 2


def test_the_output_check_catches_drift():
    """The checker itself: a changed number or word fails, timings and rounding pass."""
    printed = "fedavg · mlp · 3 rounds in 12.6s\nglobal accuracy 66.02% (best 66.02%)\n"
    check_shown(["fedavg · mlp · 3 rounds in 4.0s", "global accuracy 66.0% (best 66.0%)"],
                printed, 0.05, "t")
    with pytest.raises(AssertionError):
        check_shown(["global accuracy 40.00% (best 66.02%)"], printed, 0.05, "t")
    with pytest.raises(AssertionError):
        check_shown(["personal accuracy 66.02% (best 66.02%)"], printed, 0.05, "t")
    assert commands("a \\\n  b\n#   out 1\n# note\nc\n") == [("a    b", ["out 1"]), ("c", [])]


def runnable(page: Path) -> list[Block]:
    return [b for b in page_blocks(page) if b.lang in RUN_LANGS and not b.mark.startswith(
        ("skip", "file "))]


def workdir(tmp: Path) -> Path:
    for name in LINKED:
        if (ROOT / name).exists():
            (tmp / name).symlink_to(ROOT / name)
    return tmp


def run_block(b: Block, cwd: Path, env: dict[str, str], state: Path) -> None:
    where = f"{b.page}:{b.line}"
    tol = float(options(b.mark).get("tol", 0.05))
    if b.lang == "python":
        res = subprocess.run([sys.executable, "-c", b.text], cwd=cwd, env=env, text=True,
                             capture_output=True, timeout=600)
        assert res.returncode == 0, f"{where}: exit {res.returncode}\n{res.stderr[-3000:]}"
        return
    cmds = commands(b.text)
    sentinel = "@@fedray-docs-command@@"
    script = ["set -eo pipefail", f"source {state}"]
    for i, (cmd, _) in enumerate(cmds):
        script += [f"echo {sentinel}{i}", f"echo {sentinel}{i} >&2", cmd]
    script.append(f"export -p > {state}")  # exports carry to the page's next block
    res = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    parts = re.split(re.escape(sentinel) + r"(\d+)\n", res.stdout)
    printed: dict[int, str] = {}
    for k in range(1, len(parts) - 1, 2):
        printed[int(parts[k])] = printed.get(int(parts[k]), "") + parts[k + 1]
    failed = max(printed, default=-1)
    assert res.returncode == 0, (f"{where}: `{cmds[failed][0] if cmds else ''}` exited "
                                 f"{res.returncode}:\n{res.stdout[-4000:]}")
    for i, (cmd, shown) in enumerate(cmds):
        if i == len(cmds) - 1:
            shown = shown + b.shown
        check_shown(shown, printed.get(i, ""), tol, f"{where} `{cmd[:60]}`")


RUN_PAGES = [p for p in PAGES if runnable(p)]


@pytest.mark.ray
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, ray_session):
    """Every runnable block of the page, in order, in one directory. The commands join the
    session's local Ray through ``RAY_ADDRESS`` (what ``runtime.ray_address`` defaults to;
    a fresh Ray per command would double the time, and the results are bitwise the same);
    a page marked ``<!-- examples: own-ray ... -->`` — one whose Ray workers must see the
    page's own environment, as a plugin on ``PYTHONPATH`` — starts its own, as a user's."""
    cwd = workdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "PYTEST"))}
    env.update(PATH=f"{ROOT / '.venv' / 'bin'}:{os.path.dirname(sys.executable)}:"
                    f"{env.get('PATH', '')}", OMP_NUM_THREADS="1", NO_COLOR="1",
               COLUMNS="160")
    if "<!-- examples: own-ray" not in page.read_text(encoding="utf-8"):
        env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    state = tmp_path / ".exports"
    state.write_text("")
    for b in runnable(page):
        run_block(b, cwd, env, state)


def test_site_builds_with_every_key_and_command(site: Path):
    from fedray.core.config import keys

    page = (site / "reference" / "config-keys.html").read_text(encoding="utf-8")
    missing = [k.key for k in keys() if f"<code>{k.key}</code>" not in page]
    assert not missing, missing
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    for command in ("fedray run", "fedray report", "fedray compare", "fedray tune",
                    "fedray drod ladder", "fedray fleet import-fedscale"):
        assert f"<code>{command}</code>" in cli, command
    api = (site / "reference" / "api" / "runtime.html").read_text(encoding="utf-8")
    assert "fedray.runtime.experiment.run_experiment" in api
    for page in PAGES[1:]:  # every page of docs/ became a page of the site
        rel = page.relative_to(ROOT / "docs").with_suffix(".html")
        assert (site / rel).is_file(), rel


def test_site_build_fails_on_a_broken_link(tmp_path: Path):
    """The strict settings of mkdocs.yml, on a two-page site with one broken link."""
    import yaml

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the other](other.md) and [gone](gone.md).\n")
    (docs / "other.md").write_text("# Other\n")
    real = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    cfg = {"site_name": "t", "docs_dir": str(docs), "strict": real["strict"],
           "validation": real["validation"], "theme": real["theme"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    res = build_site(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert res.returncode != 0 and "gone.md" in res.stderr, res.stderr
    (docs / "index.md").write_text("# Home\n\nSee [the other](other.md).\n")
    assert build_site(tmp_path / "site", tmp_path / "mkdocs.yml").returncode == 0


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make test" in text and "make demo" in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_the_tutorial_plugin_computes_fedexp_step():
    """The plugin tutorial's rule against hand-computed steps (in a subprocess: importing it
    registers ``fedexp``, which this session's registry must not gain)."""
    code = """
import sys
sys.path.insert(0, 'examples/fedexp_plugin')
import numpy as np
from fedray_fedexp import fedexp_step_size
e = np.eye(3)
units = [{'w': e[i]} for i in range(3)]
third = {'w': np.full(3, 1 / 3)}
a, minus_a, zero = {'w': e[0]}, {'w': -e[0]}, {'w': np.zeros(3)}
print(fedexp_step_size(units, third, 0.0), fedexp_step_size(units, third, 1e-3),
      fedexp_step_size([a, minus_a], zero, 1e-3), fedexp_step_size([a, a], a, 1e-3))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    # three orthogonal unit updates: Σ‖Δ_i‖² = 3, ‖Δ̄‖² = 1/3 → 3 / (2·3·1/3) = 1.5; with
    # ε = 1e-3: 3 / (6 (1/3 + 1e-3)); opposite ones: 2 / (2·2·ε) = 500; equal ones: max(1, ½)
    assert [float(x) for x in res.stdout.split()] == pytest.approx(
        [1.5, 3 / (6 * (1 / 3 + 1e-3)), 500.0, 1.0])
