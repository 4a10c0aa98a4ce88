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
