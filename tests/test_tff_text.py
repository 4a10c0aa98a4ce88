"""TFF's text tasks (issue #31): Shakespeare snippets and StackOverflow sentences in TFF's
``.h5`` layout (``examples/<client>/snippets`` / ``tokens``), written here with h5py, read
as TFF's next-token rows (its character table, its word vocabulary from a word-count file
or the train split's counts, its BOS/EOS/pad rules); per-token scores as TFF reports them;
the models' published sizes; batched cohorts equal to client-by-client training; bad
vocabularies one error before Ray with nothing written to the cache."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from test_leaf import assert_cache_empty
from torch import nn

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.population import build_client_data
from fedray.data.tff import CHAR_VOCAB
from fedray.models import build_model, profile_model
from fedray.models.training import IGNORE, evaluate_tokens, train_local

STRINGS = h5py.string_dtype()


def write_text(root, feature: str, clients: dict[str, tuple[list[str], list[str]]],
               name: str, fixed: bool = False) -> None:
    """TFF-layout train and test files of one text feature per client (variable-length
    UTF-8 strings, or with ``fixed`` NumPy ``S`` bytes as TFF's own HDF5 test wrote them)."""
    os.makedirs(root, exist_ok=True)
    for i, split in enumerate(("train", "test")):
        with h5py.File(os.path.join(root, f"{name}_{split}.h5"), "w") as f:
            for c, texts in clients.items():
                if fixed:
                    f.create_dataset(f"examples/{c}/{feature}",
                                     data=np.array([t.encode() for t in texts[i]], dtype="S"))
                else:
                    f.create_dataset(f"examples/{c}/{feature}",
                                     data=np.array(texts[i], dtype=object), dtype=STRINGS)
                if feature == "tokens":  # StackOverflow's other features are ignored
                    f.create_dataset(f"examples/{c}/tags",
                                     data=np.array(["py"] * len(texts[i]), dtype=object),
                                     dtype=STRINGS)


def cfg_of(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=tff", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=2",
                              "data.min_samples=2", *extra])


def char_id(ch: str) -> int:
    return CHAR_VOCAB.index(ch) + 1


def test_shakespeare_rows_are_tffs_framed_padded_windows(tmp_path):
    roles = {"ROLE_B": (["to be", "é"], ["ab"]), "ROLE_A": (["hi"] * 2, ["x", "y"]),
             "ROLE_C": (["q"], ["r"])}  # ROLE_C: 2 rows < 3
    write_text(tmp_path / "sh", "snippets", roles, "shakespeare")
    pop = build_client_data(cfg_of(tmp_path / "sh", tmp_path, "data.seq_len=4",
                                   "data.min_samples=3"))
    assert pop.natural_ids.tolist() == ["ROLE_A", "ROLE_B"]
    assert pop.num_classes == 90 and pop.input_shape == (4,)
    assert pop.info["classes"][0] == "<pad>" and pop.info["classes"][-3:] == [
        "<oov>", "<bos>", "<eos>"]
    oov, bos, eos = 87, 88, 89
    x, y = pop.client_arrays(1, 1)  # ROLE_B's train: "to be" → 7 ids, "é" → 2 bytes
    t, o, sp, b, e = (char_id(c) for c in "to be")
    want = np.array([[bos, t, o, sp, b], [e, eos, 0, 0, 0], [bos, oov, oov, eos, 0]])
    assert np.array_equal(x, want[:, :-1].astype(np.float32))
    targets = want[:, 1:].copy()
    targets[targets == 0] = IGNORE
    assert np.array_equal(y, targets) and y.dtype == np.int64
    xt, yt = pop.client_arrays(1, 1, "test")  # the same role's own test snippet
    assert xt.tolist() == [[bos, char_id("a"), char_id("b"), eos]]
    assert yt.tolist() == [[char_id("a"), char_id("b"), eos, IGNORE]]


SO = {"u2": (["how do i sort a list", "a b c d e f g"], ["sort list"]),
      "u1": (["python list", "zzz python"], ["python python", "list"])}


def test_stackoverflow_rows_follow_tffs_word_rules(tmp_path):
    root = tmp_path / "so"
    write_text(root, "tokens", SO, "stackoverflow")
    (root / "stackoverflow.word_count").write_text("list 90\npython 80\nsort 7\na 5\nb 1\n")
    pop = build_client_data(cfg_of(root, tmp_path, "data.vocab_size=4", "data.seq_len=5"))
    assert pop.info["classes"] == ["<pad>", "list", "python", "sort", "a", "<oov>", "<bos>",
                                   "<eos>"]
    assert pop.info["vocab_file"] == "stackoverflow.word_count"
    oov, bos, eos = 5, 6, 7
    x, y = pop.client_arrays(1, 1)  # u2: sorted ids u1, u2
    # six words: truncated to five, no EOS; seven one-letter words likewise
    assert x.tolist() == [[bos, oov, oov, oov, 3], [bos, 4, oov, oov, oov]]
    assert y.tolist() == [[oov, oov, oov, 3, 4], [4, oov, oov, oov, oov]]
    x, y = pop.client_arrays(0, 1, "test")  # shorter: EOS, then padding
    assert x.tolist() == [[bos, 2, 2, eos, 0], [bos, 1, eos, 0, 0]]
    assert y.tolist() == [[2, 2, eos, IGNORE, IGNORE], [1, eos, IGNORE, IGNORE, IGNORE]]
    assert pop.natural_ids.tolist() == ["u1", "u2"]  # the same client ids in both splits


def test_fixed_length_strings_read_as_the_variable_length_ones(tmp_path):
    write_text(tmp_path / "a", "tokens", SO, "stackoverflow")
    write_text(tmp_path / "b", "tokens", SO, "stackoverflow", fixed=True)
    a, b = (build_client_data(cfg_of(tmp_path / k, tmp_path)) for k in "ab")
    assert a.info["classes"] == b.info["classes"]
    for c in range(2):
        for split in ("train", "test"):
            assert all(np.array_equal(u, v) for u, v in zip(
                a.client_arrays(c, 1, split), b.client_arrays(c, 1, split), strict=True))


def test_without_a_word_count_file_the_train_split_counts(tmp_path):
    root = tmp_path / "so"
    write_text(root, "tokens", SO, "stackoverflow")
    pop = build_client_data(cfg_of(root, tmp_path, "data.vocab_size=2"))
    # users using a word (TFF's count): list 2 (u1, u2), then python first seen of the 1s
    assert pop.info["classes"][1:3] == ["list", "python"] and pop.num_classes == 6
    assert pop.input_shape == (20,)  # TFF's default sentence length
    x, _ = pop.client_arrays(0, 1)
    assert x[0, :4].tolist() == [4, 2, 1, 5]  # bos python list eos


def test_bad_vocabularies_are_one_error_before_ray(tmp_path):
    root = tmp_path / "so"
    write_text(root, "tokens", SO, "stackoverflow")
    vocab = root / "stackoverflow.word_count"
    vocab.write_text("list 90\npython\n")
    with pytest.raises(ConfigError) as e:
        build_client_data(cfg_of(root, tmp_path))
    msg = str(e.value)
    assert "stackoverflow.word_count" in msg and "line 2" in msg and "\n" not in msg
    assert_cache_empty(tmp_path)
    (tmp_path / "elsewhere.word_count").write_text("list 1\n")
    with pytest.raises(ConfigError, match="data.vocab.*inside data.root"):
        build_client_data(cfg_of(root, tmp_path, "data.vocab=../elsewhere.word_count"))
    assert_cache_empty(tmp_path)
    vocab.write_text("list 90\npython 80\n")
    build_client_data(cfg_of(root, tmp_path))
    stat = vocab.stat()
    vocab.write_text("sort 90\npython 80\n")  # edited in place: same size, same time
    os.utime(vocab, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ConfigError, match="the vocabulary file the cache entry .* was built"):
        build_client_data(cfg_of(root, tmp_path))


def test_a_feature_that_is_not_strings_is_refused(tmp_path):
    root = tmp_path / "so"
    write_text(root, "tokens", SO, "stackoverflow")
    with h5py.File(root / "stackoverflow_test.h5", "a") as f:
        del f["examples/u1/tokens"]
        f.create_dataset("examples/u1/tokens", data=np.zeros((2, 3)))
    with pytest.raises(ConfigError) as e:
        build_client_data(cfg_of(root, tmp_path))
    assert "stackoverflow_test.h5" in str(e.value) and "client u1" in str(e.value)
    assert "one string per example" in str(e.value)
    assert_cache_empty(tmp_path)


class Fixed(nn.Module):
    """Logits that put all mass on the given ids: (B, classes, steps)."""

    def __init__(self, predict: torch.Tensor, classes: int):
        super().__init__()
        self.predict, self.classes = predict, classes
        self.unscored_targets = (classes - 3, classes - 1)  # oov, eos

    def forward(self, x):
        out = torch.full((len(x), self.classes, self.predict.shape[1]), -1e4)
        return out.scatter(1, self.predict[: len(x)].unsqueeze(1), 0.0)


def test_token_scores_are_tffs_masked_accuracies_and_perplexity():
    classes = 8  # pad 0, words 1..4, oov 5, bos 6, eos 7
    y = np.array([[1, 2, 5, 7, IGNORE], [3, 5, 4, IGNORE, IGNORE]])
    predict = torch.tensor([[1, 3, 5, 7, 0], [3, 5, 2, 0, 0]])
    s = evaluate_tokens(Fixed(predict, classes), np.zeros((2, 5), np.float32), y)
    # scored targets (no pad, oov, eos): 1 2 | 3 4 → hits 1, 3 → 2 of 4
    assert s["accuracy"] == 0.5 and s["n"] == 4
    # every non-pad target (7 of them): hits 1, 5, 7, 3, 5 → 5 of 7
    assert s["accuracy_all_tokens"] == pytest.approx(5 / 7)
    # misses cost 1e4 nats each (2 of the 7 non-pad targets)
    assert s["loss"] == pytest.approx(2e4 / 7, rel=1e-5)
    uniform = evaluate_tokens(nn.Sequential(), np.zeros((2, classes, 5), np.float32), y)
    assert uniform["perplexity"] == pytest.approx(classes, rel=1e-6)  # ln 8 per token
    assert uniform["accuracy"] == uniform["accuracy_all_tokens"]  # no unscored targets


def test_models_have_tffs_published_sizes():
    # Keras: 4,050,748 and 820,522; PyTorch's LSTM has a second bias vector per gate
    word = profile_model(build_model("word_lstm", (20,), 10_004), (20,))["parameters"]
    assert word == 4_050_748 + 4 * 670
    assert build_model("word_lstm", (20,), 10_004).unscored_targets == (10_001, 10_003)
    char = build_model("next_char_lstm", (80,), 90)
    assert profile_model(char, (80,))["parameters"] == 820_522 + 2 * 4 * 256
    assert char.unscored_targets == ()  # TFF's Shakespeare accuracy masks padding only


def test_local_training_minimises_the_per_token_loss_and_cohorts_match(tmp_path):
    from fedray.models.cohort import train_cohort

    torch.manual_seed(0)
    model = build_model("word_lstm", (6,), 12, embed=8, hidden=12, project=8)
    g = np.random.default_rng(0)
    data = []
    for n in (3, 7, 1, 0):  # one client smaller than a batch, one with no steps
        x = g.integers(1, 12, (n, 6)).astype(np.float32)
        y = g.integers(0, 12, (n, 6))
        y[:, 4:] = IGNORE
        data.append((x, y))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cohort = train_cohort(model, data, [0, 1, 2, 3], epochs=2, batch_size=2, lr=0.5, seed=1,
                          round=1)
    for i, (x, y) in enumerate(data):
        model.load_state_dict(start)
        before = evaluate_tokens(model, x, y)["loss"] if len(x) else None
        metrics, _ = train_local(model, x, y, epochs=2, batch_size=2, lr=0.5, seed=1,
                                 round=1, client=i)
        assert metrics["steps"] == cohort[i].metrics["steps"]
        for name, p in model.named_parameters():
            assert np.allclose(cohort[i].params[name], p.detach().numpy(), rtol=1e-5,
                               atol=1e-6), (i, name)
        if before is not None and i == 1:
            assert evaluate_tokens(model, x, y)["loss"] < before


@pytest.mark.ray
def test_fedavg_runs_the_stackoverflow_task_end_to_end(ray_session, tmp_path):
    import pyarrow.parquet as pq

    from fedray.runtime import run_experiment

    root = tmp_path / "so"
    write_text(root, "tokens", SO, "stackoverflow")
    cfg = cfg_of(root, tmp_path, "data.vocab_size=8", "model.name=word_lstm",
                 "model.embed=8", "model.hidden=16", "model.project=8", "rounds=2",
                 "local.batch_size=2", "runtime.vectorize=on",
                 "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2 and 0 <= summary["final_global_accuracy"] <= 1
    last = pq.read_table(tmp_path / "run" / "rounds.parquet").to_pylist()[-1]
    assert last["global_perplexity"] == pytest.approx(np.exp(last["global_loss"]), rel=1e-6)
    assert 0 <= last["tier/default/accuracy_all_tokens"] <= 1
