"""The conformance suite every registered method inherits (``fedray/methods/``, plugins
included): a new method's own tests then cover only its own rule. The checks are
:mod:`fedray.testing`'s (a plugin's tests call them on its own method); here they run on
every registered one.

For each method, on its smallest config (:data:`SMALLEST`, which a new method must join):

- its capabilities are honoured: each setting that needs a capability it lacks is refused
  before any Ray work, naming that setting; each one it has is not refused for it; its
  policy is asynchronous exactly when it declares ``asynchronous``;
- its config round-trips: the stored ``config.yaml`` loads back to the same config;
- a run on two executors and a run on one executor stopped after round 1 then resumed end
  bitwise equal (global model and every checkpoint part: policy, optimizer, ledger, client
  manifest) with equal metrics rows;
- the bytes add up: each round's upload and download bytes are the sums over its clients
  and the cumulative columns and the summary totals are their running sums.

Shared keys mean one thing: two methods with the same ``algorithm.*`` key give it one type
and one help text (their defaults may differ).
"""

from __future__ import annotations

import numpy as np
import pytest

from fedray.core import registry
from fedray.core.config import keys, load_config
from fedray.testing import check_capabilities, check_resume, difference

MLP = ["model.hidden=[16]"]
HETERO = ["model.name=sliceable_resnet18", "model.width=4", "local.lr=0.05",
          "data.partition=dirichlet"]  # what a task stream splits each task by
FLITE_PRE = ["model.name=cnn", "model.channels=[8,16]", "model.hidden=32",
             "pretrain.epochs=1", "pretrain.batch_size=64", "pretrain.warmup_epochs=1",
             "data.split_seed=0", "pretrain.fraction=0.5"]


# method -> its smallest config beyond fedray.testing.TINY (``{base}``, ``{lm}``,
# ``{asce}``, ``{csv}`` are the module fixtures' paths)
SMALLEST: dict[str, list[str]] = {
    **{m: MLP for m in ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
                        "orders", "topk", "powersgd", "feddyn", "scaffold", "fednova",
                        "moon")},
    "fedbuff": MLP + ["algorithm.concurrency=2", "algorithm.buffer_size=2"],
    "fedasync": MLP + ["algorithm.concurrency=2"],
    "flite": FLITE_PRE + ["algorithm.base={base}", "algorithm.d=4", "algorithm.r=2"],
    **{m: HETERO for m in ("hetero", "drod", "fjord", "heterofl", "fedrolex", "fiarse",
                           "shortcut_fedavg", "shortcut_fjord")},
    **{m: HETERO + ["model.exits=true"] for m in ("depth_fedavg", "depth_fjord", "scalefl")},
    "favor": ["algorithm.base={lm}", "algorithm.asce={asce}", "algorithm.lora_rank=2",
              "algorithm.lora_alpha=4", "algorithm.micro_batch=2", "algorithm.accumulation=1",
              "algorithm.proj_hidden=8", "algorithm.max_steps=1", "algorithm.asce_authors=0",
              "algorithm.min_tokens=1", "algorithm.block_length=16", "algorithm.prompt_tokens=8",
              "algorithm.new_tokens=12", "algorithm.reference_texts=3",
              "algorithm.eval_prompts=2", "data.dataset=blogtext", "data.root={csv}",
              "eval.every=0"],
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """FLITE's pretrained base; FAVoR's tiny LM, tiny ASCE and a 4-author corpus."""
    from test_asce import tiny_backbone
    from test_favor import save_tiny_lm
    from transformers import AutoModel, AutoTokenizer

    from fedray.data.authors import generate_corpus
    from fedray.methods.favor.asce import StyleEncoder, save_asce
    from fedray.models.pretrain import pretrain

    root = tmp_path_factory.mktemp("conformance")
    pretrain(load_config(None, FLITE_PRE), str(root / "base"), progress=False)
    save_tiny_lm(root / "lm")
    bb = tiny_backbone(root / "bb")
    save_asce(StyleEncoder(AutoModel.from_pretrained(bb)), AutoTokenizer.from_pretrained(bb),
              str(root / "asce"), {})
    csv = generate_corpus(root / "blog.csv", num_authors=4, seed=0, posts=(10, 12))
    return {"base": str(root / "base"), "lm": str(root / "lm"), "asce": str(root / "asce"),
            "csv": str(csv)}


def smallest(name: str, paths: dict[str, str] | None = None) -> list[str]:
    return [o.format(**(paths or {})) for o in SMALLEST[name]]


def test_every_method_has_a_smallest_config():
    assert set(SMALLEST) == set(registry.methods()), \
        "a new method joins the conformance suite with its smallest config in SMALLEST"


def test_a_shared_key_means_one_thing():
    rows = [k for k in keys() if k.key.startswith(("algorithm.", "server."))]
    seen: dict[str, list[str]] = {}
    for k in rows:
        seen.setdefault(k.key, []).append(f"{k.type} / {k.help!r} for {k.applies_to}")
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


@pytest.fixture(scope="module", autouse=True)
def _release_warm_actors():
    yield
    from fedray.runtime import release_warm

    release_warm()


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_capabilities_are_honoured_before_any_ray_work(name, paths):
    check_capabilities(name, smallest(name, paths))


@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_resume_and_executor_count_change_no_bit(ray_session, paths, name, tmp_path):
    check_resume(name, smallest(name, paths), str(tmp_path))


def test_a_difference_names_the_part_and_key():
    """What a failing conformance check says: the dotted path and the values, not a dump."""
    a = {"policy": {"c": {"0.weight": np.zeros((2, 3), np.float32)}, "t": 3},
         "rows": [{"round": 1, "loss": float("nan")}]}
    b = {"policy": {"c": {"0.weight": np.zeros((2, 3), np.float32)}, "t": 3},
         "rows": [{"round": 1, "loss": float("nan")}]}
    assert difference(a, b) is None  # NaN equals NaN, arrays bit for bit
    b["policy"]["c"]["0.weight"][1, 2] = 1e-9
    assert difference(a, b) == "policy.c.0.weight[1, 2]: 0.0 against 1e-09"
    b["policy"]["c"]["0.weight"][1, 2] = 0.0
    b["rows"][0]["loss"] = 0.5
    assert difference(a, b) == "rows[0].loss: nan against 0.5"
    b["policy"]["extra"] = 1
    assert difference(a, b) == "policy: keys ['extra'] on one side only"
