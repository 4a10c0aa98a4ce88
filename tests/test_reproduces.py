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
def rendered() -> str:
    return reproduces.render()


def test_results_md_holds_the_generated_tables(rendered):
    body = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    block = body[body.index(reproduces.BEGIN) + len(reproduces.BEGIN):
                 body.index(reproduces.END)].strip()
    assert block == rendered.strip(), "re-run benchmarks/reproduces.py"


def test_one_table_per_paper_with_a_rule_verdict_per_claim(rendered):
    for title, claims in reproduces.PAPERS:
        section = rendered.split(f"### {title}")[1].split("\n### ")[0]
        assert len(verdicts(section)) == len(claims), title
    assert set(verdicts(rendered)) <= VERDICTS
    assert "not measured" not in verdicts(rendered), "a study output is missing"


def test_missing_outputs_read_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduces, "RES", tmp_path)
    text = reproduces.render()
    got = verdicts(text)
    assert len(got) == sum(len(c) for _, c in reproduces.PAPERS)
    # the exact-arithmetic claims need no study output; every other one is not measured
    assert got.count("not measured") == len(got) - 3
    assert "missing: " in text
