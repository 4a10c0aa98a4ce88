"""The "what reproduces" tables are generated from the stored study outputs: RESULTS.md holds
exactly what the script renders, every verdict is one of the rule's, and a missing output
reads "not measured" instead of failing or guessing."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import reproduces  # noqa: E402

VERDICTS = {"reproduces", "reproduces in direction", "does not reproduce", "not measured"}


def verdicts(text: str) -> list[str]:
    return re.findall(r"\| \*\*([^*]+)\*\* \|$", text, flags=re.M)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return reproduces.evaluate()


@pytest.fixture(scope="module")
def rendered(rows) -> str:
    return reproduces.render(rows, {}, "now")


def tables(text: str) -> str:
    return text[text.index("\n### "):].strip()


def test_results_md_holds_the_generated_tables_and_their_tally(rendered, rows):
    """The tables are today's; the tally at their top counts their verdicts, and the record
    the next generation compares against (reproduces.json) holds the same verdicts."""
    body = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    block = body[body.index(reproduces.BEGIN) + len(reproduces.BEGIN):
                 body.index(reproduces.END)].strip()
    assert tables(block) == tables(rendered), "re-run benchmarks/reproduces.py"
    shown = verdicts(block)
    m = re.search(r"\*\*Tally \((\d{4}-\d\d-\d\d), commit ([0-9a-f]{7,})[^)]*\): (\d+) "
                  r"claims — ([^*]+)\.\*\*", block)
    assert m and int(m.group(3)) == len(shown) == len(rows), block[:600]
    for part in m.group(4).split(", "):
        n, verdict = part.split(" ", 1)
        assert shown.count(verdict) == int(n), part
    record = reproduces.load_json(reproduces.RES / "reproduces.json")
    assert [r["verdict"] for r in record["rows"]] == shown
    assert record["produced"].startswith(m.group(1))


def test_the_tally_says_which_verdicts_changed(rows):
    claim = rows[0]["claim"]
    other = next(v for v in reproduces.VERDICTS if v != rows[0]["verdict"])
    before = {r["claim"]: r["verdict"] for r in rows} | {claim: other}
    text = "\n".join(reproduces.tally(rows, before, "2026-12-02, commit abc"))
    assert f"{claim}: {other} → **{rows[0]['verdict']}**" in text
    same = "\n".join(reproduces.tally(rows, {r["claim"]: r["verdict"] for r in rows}, "x"))
    assert "no verdict" in same
    assert f"{len(rows)} claims" in same


def test_one_table_per_paper_with_a_rule_verdict_per_claim(rendered):
    for title, claims in reproduces.PAPERS:
        section = rendered.split(f"### {title}")[1].split("\n### ")[0]
        assert len(verdicts(section)) == len(claims), title
    assert set(verdicts(rendered)) <= VERDICTS
    assert "not measured" not in verdicts(rendered), "a study output is missing"


def test_missing_outputs_read_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduces, "RES", tmp_path)
    text = reproduces.render(reproduces.evaluate(), {}, "now")
    got = verdicts(text)
    assert len(got) == sum(len(c) for _, c in reproduces.PAPERS)
    # the exact-arithmetic claims need no study output; every other one is not measured
    assert got.count("not measured") == len(got) - 3
    assert "missing: " in text
