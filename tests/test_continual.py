"""Continual-learning pieces: task streams, the reservoir buffer, the metrics, objectives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.core.config import ConfigError, load_config
from fedray.data import build_data
from fedray.methods.drod.continual.buffer import ReservoirBuffer
from fedray.methods.drod.continual.data import task_classes, task_of_round
from fedray.methods.drod.continual.metrics import (
    accuracy_matrix,
    average_accuracy,
    forgetting,
    summarize,
    task_accuracies,
)
from fedray.methods.drod.continual.objectives import fisher_diagonal, fit_bias
from fedray.models.training import random_crop_flip as augment


def cl_cfg(**extra):
    base = {"rounds": 10, "clients.num_clients": 4, "data.partition": "dirichlet",
            "data.alpha": 0.5,
            "model.name": "sliceable_resnet18", "model.width": 4, "algorithm.name": "drod",
            "continual.tasks": 5, "continual.rounds_per_task": 2, "continual.buffer_total": 20}
    base.update(extra)
    return load_config(None, [f"{k}={v}" for k, v in base.items()])


def test_split_digits_stream_redraws_the_split_per_task():
    cfg = cl_cfg()
    data = build_data(cfg)
    assert [c.tolist() for c in data.classes] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert [data.task_of(r) for r in range(1, 11)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    for r in (1, 2, 5, 10):
        for c in range(4):
            x, y = data.client_arrays(c, r)
            assert set(np.unique(y)) <= set(data.classes[data.task_of(r)].tolist())
            assert len(x) == len(y) > 0
    # every task's train samples are split among the clients, disjointly and completely
    for t in range(5):
        ids = np.concatenate(data.train_idx[t] + data.test_idx[t])
        pool = np.flatnonzero(np.isin(data.y, data.classes[t]))
        assert np.array_equal(np.sort(ids), pool)
    # the Dirichlet split differs between tasks (client shares are redrawn)
    shares = [np.array([len(i) for i in data.train_idx[t]]) / sum(map(len, data.train_idx[t]))
              for t in range(5)]
    assert any(not np.allclose(shares[0], s, atol=0.05) for s in shares[1:])
    again = build_data(cfg)
    assert all(np.array_equal(a, b) for a, b in zip(again.train_idx[3], data.train_idx[3],
                                                    strict=True))
    assert task_of_round(0, 2, 5) == 0 and task_of_round(99, 2, 5) == 4


def test_class_order_and_bad_continual_configs():
    data = build_data(cl_cfg(**{"continual.class_order": "[9,8,7,6,5,4,3,2,1,0]"}))
    assert data.classes[0].tolist() == [8, 9]
    with pytest.raises(ConfigError, match="continual.tasks.*divisor"):
        cl_cfg(**{"continual.tasks": 3})
    with pytest.raises(ConfigError, match="class_order"):
        cl_cfg(**{"continual.class_order": "[0,1,2]"})
    with pytest.raises(ConfigError, match="rounds"):
        cl_cfg(rounds=11)
    with pytest.raises(ConfigError, match="continual.tasks.*lacks the .continual. capability"):
        cl_cfg(**{"algorithm.name": "fedavg", "model.name": "mlp"})
    with pytest.raises(ConfigError, match="eval.every"):
        cl_cfg(**{"eval.every": 3})


@pytest.mark.parametrize("key,value,rule", [
    ("data.partition", "iid", "dirichlet with a task stream"),
    ("data.partition", "pathological", "dirichlet with a task stream"),
    ("data.feature_skew", 0.5, "does not read it"),
    ("data.drift_round", 3, "does not read it"),
])
def test_a_task_stream_refuses_the_data_knobs_it_does_not_read(key, value, rule):
    """Each task is split by Dirichlet(data.alpha): another partition, a feature skew or a
    label drift would change nothing, so the config names the key instead."""
    with pytest.raises(ConfigError) as e:
        cl_cfg(**{key: value})
    assert e.value.path == key and rule in str(e.value), str(e.value)


def test_a_stored_task_stream_with_the_old_default_partition_resumes_as_what_it_ran(tmp_path):
    """Until the partition was checked, a task stream stored data.partition iid (the
    default) and split its tasks by Dirichlet all the same: --resume reads it as
    dirichlet; a run without a task stream keeps its iid."""
    import yaml

    from fedray.core.config import migrate_stored
    from fedray.runtime.experiment import resume_config

    cfg = cl_cfg()
    stored = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    stored["data"]["partition"] = "iid"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stored))
    assert resume_config(str(tmp_path)).data.partition == "dirichlet"
    plain = dict(stored, continual=dict(stored["continual"], tasks=0))
    assert migrate_stored(plain)["data"]["partition"] == "iid"
    with pytest.raises(ConfigError, match="buffer_total"):
        cl_cfg(**{"continual.buffer_total": 2})
    with pytest.raises(ValueError):
        task_classes(10, 4)


def test_reservoir_keeps_every_offered_item_with_equal_probability():
    """Algorithm R: after n offers each item is in the buffer with probability k/n."""
    k, n, trials = 10, 100, 4000
    counts = np.zeros(n)
    gen = np.random.default_rng(0)
    for _ in range(trials):
        buf = ReservoirBuffer(k)
        for start in range(0, n, 7):  # offered in uneven batches
            ids = np.arange(start, min(start + 7, n))
            buf.add(ids[:, None].astype(np.float32), ids, gen)
        assert len(buf) == k and buf.seen == n
        assert len(set(buf.y.tolist())) == k
        counts[buf.y] += 1
    freq = counts / trials
    assert np.allclose(freq, k / n, atol=0.025)  # 4000 trials: sd ≈ 0.0047
    # the first k offers fill it in order; sample() returns distinct stored indices
    buf = ReservoirBuffer(5)
    buf.add(np.arange(3, dtype=np.float32)[:, None], np.arange(3), gen)
    assert buf.y[:3].tolist() == [0, 1, 2] and len(buf) == 3
    assert buf.sample(10, gen).tolist() == [0, 1, 2]
    s = buf.sample(2, gen)
    assert len(set(s.tolist())) == 2
    restored = ReservoirBuffer(5, buf.state())
    assert restored.seen == 3 and np.array_equal(restored.y[:3], buf.y[:3])
    with pytest.raises(ValueError):
        ReservoirBuffer(-1)


def test_metrics_on_a_hand_made_accuracy_matrix():
    R = np.array([[0.9, 0.0, 0.0],
                  [0.6, 0.8, 0.0],
                  [0.3, 0.5, 0.7]])
    assert average_accuracy(R) == pytest.approx(0.5)
    assert forgetting(R) == pytest.approx(((0.9 - 0.3) + (0.8 - 0.5)) / 2)
    assert forgetting(R[:1, :1]) == 0.0
    rows = [{"round": 2 * (t + 1), **{f"tier/a/task{i}/class_il": R[t, i] for i in range(3)},
             **{f"tier/b/task{i}/class_il": R[t, i] / 2 for i in range(3)},
             **{f"tier/{x}/task{i}/task_il": 1.0 for i in range(3) for x in "ab"}}
            for t in range(3)]
    assert np.array_equal(accuracy_matrix(rows, "a", "class_il", 3, 2), R)
    s = summarize(rows, ["a", "b"], 3, 2)
    assert s["a"]["class_il_acc"] == pytest.approx(0.5)
    assert s["b"]["class_il_acc"] == pytest.approx(0.25)
    assert s["fleet"]["class_il_acc"] == pytest.approx(0.375)  # unweighted over tiers
    assert s["fleet"]["task_il_acc"] == 1.0 and s["a"]["task_il_forgetting"] == 0.0
    partial = summarize(rows[:2], ["a"], 3, 2)
    assert partial["a"]["tasks_completed"] == 2 and partial["a"]["class_il_acc"] == 0.7


def test_class_il_and_task_il_from_the_same_logits():
    classes = [np.array([0, 1]), np.array([2, 3])]
    logits = np.array([[0.0, 1.0, 5.0, 0.0],   # y=1: class-IL says 2 (wrong), task-IL 1
                       [3.0, 1.0, 0.0, 0.0],   # y=0: right both ways
                       [0.0, 0.0, 1.0, 2.0],   # y=3: right
                       [9.0, 0.0, 1.0, 2.0]])  # y=2: class-IL 0 (wrong), task-IL 3 (wrong)
    y = np.array([1, 0, 3, 2])
    acc = task_accuracies(logits, y, classes)
    assert acc == {"task0/class_il": 0.5, "task0/task_il": 1.0,
                   "task1/class_il": 0.5, "task1/task_il": 0.5}


def test_augment_crops_and_flips_within_the_padded_image():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).view(2, 1, 4, 4) + 1
    out = augment(x, torch.Generator().manual_seed(0), pad=1)
    assert out.shape == x.shape
    for i in range(2):  # every kept pixel comes from the image (or the black border)
        vals = set(out[i].flatten().tolist()) - {0.0}
        assert vals <= set(x[i].flatten().tolist())
    same = augment(x, torch.Generator().manual_seed(0), pad=1)
    assert torch.equal(out, same)


def test_bias_correction_fits_a_biased_head():
    """BiC stage 2 recovers a down-scaling of over-confident new-class logits."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (400,), generator=gen)
    logits = torch.randn(400, 4, generator=gen) + 3 * torch.nn.functional.one_hot(y, 4)
    logits[:, 2:] += 4.0  # classes 2, 3 are the new task: biased upwards
    before = (logits.argmax(1) == y).float().mean()
    from fedray.methods.drod.continual.section import ContinualConfig

    d = ContinualConfig()
    a, b = fit_bias(logits, y, torch.tensor([2, 3]), 1.0, 0.0, d.bic_steps, d.bic_lr)
    fixed = logits.clone()
    fixed[:, 2:] = fixed[:, 2:] * a + b
    assert b < -1.0 and (fixed.argmax(1) == y).float().mean() > before + 0.2


def test_fisher_is_nonnegative_and_zero_where_no_gradient_flows():
    lin = torch.nn.Linear(3, 2)
    unused = torch.nn.Linear(3, 2)
    model = torch.nn.ModuleDict({"a": lin, "b": unused})
    f = fisher_diagonal(model, torch.randn(8, 3), torch.randint(0, 2, (8,)), lambda t: lin(t))
    assert all((v >= 0).all() for v in f.values())
    assert f["a.weight"].sum() > 0 and f["b.weight"].sum() == 0
