"""OrdersStrategy (fedray.integrations.flower) in Flower's own simulation.

Flower pins its own ray, so the run happens in ``.venv-flower`` (conftest.flower_python:
made by ``benchmarks/setup_flower_venv.sh`` when missing) as a subprocess running
``tests/flower_orders_run.py``, which prints one JSON line with its checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import flower_process

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.flower
@pytest.mark.timeout(3600)
def test_orders_strategy_in_flower_simulation(flower_python):
    proc = flower_process(flower_python, "flower_orders_run.py", pythonpath=str(ROOT))
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-8000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no JSON output (rc {proc.returncode}); stderr tail:\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1])
    assert proc.returncode == 0, out
    assert out["ok"], out
    assert out["all_replies"] and out["replies_per_round"] == [6, 6, 6], out
    assert out["ranked_per_round"] == [6, 6, 6], out
    assert out["replay_equal"] and out["replay_max_abs_diff"] == 0.0, out
    assert out["sent_is_aggregated"], out
    assert out["model_moved"] and out["moved_l2"] > 0, out
