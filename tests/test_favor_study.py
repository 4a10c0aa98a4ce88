"""The FAVoR study's aggregation over seeds (the runs themselves are the job's, tested in
test_favor.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from favor_study import tables  # noqa: E402


def test_tables_aggregate_seeds_into_table_2_and_table_4():
    def row(method, seed, acc):
        return {"method": method, "seed": seed, "author_accuracy": acc, "macro_f1": acc / 2,
                "gen_gen_auc": 0.5, "gen_gen_eer": 0.5, "semsim": 0.4, "kept": 9,
                "generations": 10, "stylo_gen_source_auc": 0.6, "gen_source_auc": 0.7}

    rows = [row(m, s, a + s / 10) for s in (0, 1, 2)
            for m, a in (("fedavg", 0.1), ("favor", 0.3), ("favor_no_asce", 0.2))]
    rows.append({"method": "local", "seed": 0, "author_accuracy": 0.25, "macro_f1": None,
                 "kept": 5, "generations": 10})
    md = tables(rows, ["fedavg", "favor", "favor_no_asce", "local"], 0.02)
    t2, t4 = md.split("### Table 4")
    assert "| FedAvg | 0.200 ± 0.100 | 0.100 ± 0.050 |" in t2  # mean ± sample sd
    assert "| FAVoR | 0.400 ± 0.100 |" in t2 and "27 / 30 | 3 | 0.403 / 0.824 / 0.380 |" in t2
    assert "| Local-only | 0.250 | – |" in t2 and "FedAvg" not in t4  # a reference row
    assert "| FAVoR w/o ASCE | 0.300 ± 0.100 | 0.150 ± 0.050 | n/a | 0.600 ± 0.000 |" in t4
    assert t4.index("FAVoR w/o ASCE") < t4.index("| FAVoR |")  # the paper's row order


def test_lambda_table_aggregates_each_lambda_over_seeds_with_the_reference_last():
    """The λ_align sweep (issue #16): one row per λ (λ = 0 labelled w/o ASCE), mean ± sample
    sd over the seeds that have it, the never-sampled counts, then the reference rows."""
    from favor_study import lambda_table

    def row(method, lam, seed, acc, never=None):
        return {"method": method, "lambda_align": lam, "seed": seed, "author_accuracy": acc,
                "kept": 9, "generations": 10, "never_sampled": never}

    rows = [row("favor", lam, s, 0.1 + lam / 10 + s / 100, 10 + s)
            for lam in (0.0, 0.3) for s in (0, 1)]
    rows += [row("favor", 1.0, 0, 0.5, 12), row("fedavg", None, 0, 0.03),
             row("fedavg", None, 1, 0.05)]
    md = lambda_table(rows, [0.0, 0.1, 0.3, 1.0], ["fedavg"], 0.02).splitlines()
    body = [ln for ln in md if ln.startswith("| ") and "λ_align |" not in ln]
    assert [ln.split(" | ")[:2] for ln in body] == [
        ["| FAVoR w/o ASCE", "0"], ["| FAVoR", "0.3"], ["| FAVoR", "1"], ["| FedAvg", "–"]]
    assert body[0].split(" | ")[2] == "0.105 ± 0.007"  # seeds 0 and 1, sample sd
    assert body[1].endswith("| 18 / 20 | 10, 11 | 0, 1 |")
    assert body[2].split(" | ")[2] == "0.500" and body[2].endswith("| 12 | 0 |")
    assert body[3].split(" | ")[2] == "0.040 ± 0.014" and body[3].endswith("| – | 0, 1 |")


def test_rows_of_two_preparations_are_not_averaged(tmp_path):
    """A seed run on another preparation (other base LM or ASCE bits) is refused in one
    line; rows without a fingerprint (older files) pass; the fingerprint reads the bits."""
    import pytest
    from favor_study import prep_fingerprint

    for sub, name in (("base_lm", "model.safetensors"), ("asce", "asce.pt")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / name).write_bytes(b"weights")
    (tmp_path / "base_lm" / "config.json").write_text("{}")
    a = prep_fingerprint(tmp_path)
    (tmp_path / "base_lm" / "config.json").write_text('{"transformers_version": "x"}')
    assert prep_fingerprint(tmp_path) == a  # configs are not the bits
    (tmp_path / "asce" / "asce.pt").write_bytes(b"other weights")
    b = prep_fingerprint(tmp_path)
    assert b != a and len(a) == 16

    def row(seed, prep):
        return {"method": "favor", "seed": seed, "author_accuracy": 0.1, "kept": 9,
                "generations": 10, "prep": prep}

    assert "| FAVoR | 0.100 ± 0.000 |" in tables([row(0, a), row(1, a), row(2, None)],
                                                ["favor"], 0.02)
    with pytest.raises(SystemExit) as e:
        tables([row(0, a), row(1, b)], ["favor"], 0.02)
    assert "2 different preparations" in str(e.value) and "\n" not in str(e.value)



def test_the_study_names_the_commit_it_ran_from(tmp_path, monkeypatch):
    """``code`` in the study's JSON: the checkout's HEAD, with "+dirty" exactly when a
    tracked file differs from it (checked on a throwaway repository)."""
    import re
    import subprocess

    import favor_study
    import provenance

    def git(*a):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path,
                       check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-qm", "x")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    clean = favor_study.code_version()
    assert re.fullmatch(r"[0-9a-f]{40}", clean)
    (tmp_path / "untracked.txt").write_text("b")
    assert favor_study.code_version() == clean
    (tmp_path / "f.txt").write_text("changed")
    assert favor_study.code_version() == clean + "+dirty"
