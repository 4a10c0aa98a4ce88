"""LEAF's Sent140 (issue #31): tweet records in LEAF's JSON (``x`` = [id, date, query,
user, text, split tag], ``y`` 1 for a positive tweet) written here as LEAF's
``data_to_json.py`` writes them, read with LEAF's tokenizer (``split_line``: word runs
with apostrophes and . , ! ? ; as tokens, no lowercasing) and ``line_to_indices`` (the
first 25 tokens, unknown words and padding one id, len(vocabulary)), the vocabulary from
LEAF's ``embs.json``, a word list, or the train split's counts; LEAF's stacked LSTM; bad
vocabularies and records one error before Ray; a FedAvg run through Ray."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from test_leaf import assert_cache_empty

from fedray.core.config import load_config
from fedray.core.spec import ConfigError
from fedray.data.leaf import split_line
from fedray.data.population import build_client_data
from fedray.models import build_model, profile_model

TWEETS = {  # user: (train [(text, positive)], test [...])
    "zoe_k": ([("I can't believe it's Monday!!! ugh...", 0), ("love the sun today", 1),
               ("sun sun sun", 1)], [("Monday again; love it?", 1)]),
    "adam1": ([("love love LOVE this song", 1), ("worst day, ever.", 0)],
              [("the sun is out", 1)]),
    "mo": ([("ok", 1)], []),  # one tweet: below data.min_samples = 2
}


def write_sent140(root, tweets=TWEETS) -> None:
    """LEAF's Sent140 train/ and test/ shards (one each), records as data_to_json.py
    writes them."""
    for i, split in enumerate(("train", "test")):
        os.makedirs(root / split, exist_ok=True)
        doc = {"users": [], "num_samples": [], "user_data": {}}
        for user, parts in tweets.items():
            rows = parts[i]
            doc["users"].append(user)
            doc["num_samples"].append(len(rows))
            doc["user_data"][user] = {
                "x": [[str(1467810000 + k), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user,
                       text, "training" if split == "train" else "test"]
                      for k, (text, _) in enumerate(rows)],
                "y": [label for _, label in rows]}
        with open(root / split / f"all_data_niid_05_keep_0_{split}_9.json", "w") as f:
            json.dump(doc, f)


def cfg_of(root, tmp_path, *extra):
    return load_config(None, ["data.dataset=leaf", f"data.root={root}",
                              f"data.cache_dir={tmp_path / 'cache'}", "clients.num_clients=2",
                              "data.min_samples=2", *extra])


def test_leafs_tokenizer():
    assert split_line("I can't believe it's Monday!!! ugh...") == [
        "I", "can't", "believe", "it's", "Monday", "!", "!", "!", "ugh", ".", ".", "."]
    assert split_line("worst day, ever.") == ["worst", "day", ",", "ever", "."]


def test_rows_are_leafs_line_to_indices_with_embs_json(tmp_path):
    root = tmp_path / "sent140"
    write_sent140(root)
    vocab = ["love", "sun", "the", "!", ".", "Monday", "love"]  # a repeat keeps its place
    (root / "embs.json").write_text(json.dumps({"vocab": vocab, "emba": [[0.0]] * 8}))
    pop = build_client_data(cfg_of(root, tmp_path, "data.vocab=embs.json",
                                   "data.seq_len=6"))
    assert pop.natural_ids.tolist() == ["adam1", "zoe_k"]  # sorted; mo has 1 tweet
    assert pop.input_shape == (6,) and pop.num_classes == 2
    assert pop.info["vocabulary"] == vocab[:6] and pop.info["unknown_id"] == 6
    x, y = pop.client_arrays(1, 1, "train")  # zoe_k
    unk = 6
    # I can't believe it's Monday ! | ! ! ugh . . . cut at 6 tokens
    assert x[0].tolist() == [unk, unk, unk, unk, 5, 3]
    assert x[1].tolist() == [0, 2, 1, unk, unk, unk]  # love the sun today + padding
    assert y.tolist() == [0, 1, 1]
    xt, yt = pop.client_arrays(1, 1, "test")
    assert xt[0].tolist() == [5, unk, unk, 0, unk, unk] and yt.tolist() == [1]  # ; ? unknown
    assert x.dtype == np.float32


def test_without_a_vocabulary_the_train_split_counts(tmp_path):
    root = tmp_path / "sent140"
    write_sent140(root)
    pop = build_client_data(cfg_of(root, tmp_path, "data.vocab_size=4"))
    # train tokens: '.' 4 and sun 4, then '!' 3 and love 3 (LOVE is another word), ties in
    # first-seen order (zoe_k's tweets come first in the shard); the test split not counted
    assert pop.info["vocabulary"] == [".", "sun", "!", "love"]
    x, _ = pop.client_arrays(0, 1, "train")  # adam1
    assert x[0, :6].tolist() == [3, 3, 4, 4, 4, 4]  # love love LOVE this song + padding
    assert x[1, :6].tolist() == [4, 4, 4, 4, 0, 4]  # worst day , ever . + padding
    assert pop.input_shape == (25,)
    again = build_client_data(cfg_of(root, tmp_path, "data.vocab_size=4"))
    assert again.path == pop.path  # a cache hit


def test_a_vocabulary_file_edited_in_place_is_refused(tmp_path):
    root = tmp_path / "sent140"
    write_sent140(root)
    (root / "words.txt").write_text("love 9\nsun 3\n")
    pop = build_client_data(cfg_of(root, tmp_path, "data.vocab=words.txt"))
    assert pop.info["vocabulary"] == ["love", "sun"]
    st = os.stat(root / "words.txt")
    (root / "words.txt").write_text("sun 9\nlove 3\n")  # same size, same time
    os.utime(root / "words.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ConfigError, match="the vocabulary file the cache entry"):
        build_client_data(cfg_of(root, tmp_path, "data.vocab=words.txt"))


@pytest.mark.parametrize("setup, rule", [
    (lambda r: (r / "embs.json").write_text('{"emba": []}'), "LEAF's embs.json"),
    (lambda r: (r / "embs.json").write_text("[1, 2"), "LEAF's embs.json"),
    (lambda r: (r / "embs.json").write_text('{"vocab": []}'), "at least one word"),
])
def test_bad_vocabularies_are_one_error_before_ray(tmp_path, setup, rule):
    root = tmp_path / "sent140"
    write_sent140(root)
    setup(root)
    with pytest.raises(ConfigError) as e:
        build_client_data(cfg_of(root, tmp_path, "data.vocab=embs.json"))
    assert rule in str(e.value) and "embs.json" in str(e.value)
    assert_cache_empty(tmp_path)


def test_a_vocabulary_outside_the_root_is_refused(tmp_path):
    root = tmp_path / "sent140"
    write_sent140(root)
    (tmp_path / "embs.json").write_text(json.dumps({"vocab": ["love"]}))
    with pytest.raises(ConfigError, match="a regular file inside data.root"):
        build_client_data(cfg_of(root, tmp_path, "data.vocab=../embs.json"))
    assert_cache_empty(tmp_path)


def test_the_model_is_leafs_stacked_lstm():
    # LEAF: embedding (V + 1) x 100, two LSTM layers of 100, dense 128, dense 2
    tf = 400_001 * 100 + 2 * (4 * 100 * 200 + 4 * 100) + 100 * 128 + 128 + 128 * 2 + 2
    model = build_model("sent140_lstm", (25,), 2, vocab=400_001)
    assert profile_model(model, (25,))["parameters"] == tf + 2 * 4 * 100 == 40_174_886
    small = build_model("sent140_lstm", (25,), 2, vocab=11)
    ids = torch.tensor([[3.0] * 20 + [10.0] * 5, [3.0] * 20 + [5000.0] * 5])
    out = small(ids)  # an id beyond the table reads the unknown word's row
    assert out.shape == (2, 2) and torch.equal(out[0], out[1])


@pytest.mark.ray
def test_fedavg_runs_on_sent140(ray_session, tmp_path):
    from fedray.runtime import run_experiment

    root = tmp_path / "sent140"
    write_sent140(root)
    cfg = cfg_of(root, tmp_path, "model.name=sent140_lstm", "model.vocab=11",
                 "model.embed=8", "model.hidden=8", "model.dense=8", "data.vocab_size=10",
                 "rounds=2", "local.batch_size=2",
                 "runtime.tiers=[{name: default, executors: 1, num_cpus: 0.5}]")
    summary = run_experiment(cfg, str(tmp_path / "run"), progress=False)
    assert summary["rounds"] == 2 and summary["dataset"] == "leaf"
    assert 0 <= summary["final_global_accuracy"] <= 1
