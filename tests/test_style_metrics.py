"""Style metrics on hand-made embeddings, checked against closed forms and scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.methods.favor.style_metrics import (
    FUNCTION_WORDS,
    PUNCTUATION,
    centroid_distance,
    equal_error_rate,
    macro_f1,
    prototype_accuracy,
    roc_auc,
    silhouette,
    stylometric_features,
    verification,
)


def test_auc_and_eer_by_hand():
    assert roc_auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert roc_auc([0.1], [0.9]) == 0.0
    assert roc_auc([0.5, 0.5], [0.5, 0.5]) == 0.5  # ties count half
    assert roc_auc([0.9, 0.3], [0.5, 0.1]) == 0.75  # 3 of 4 pairs ordered
    assert equal_error_rate([0.9, 0.8, 0.7], [0.1, 0.2, 0.3]) == 0.0
    assert equal_error_rate([0.9, 0.2], [0.8, 0.1]) == pytest.approx(0.5)


def test_auc_matches_sklearn_on_random_scores():
    from sklearn.metrics import roc_auc_score, roc_curve

    g = np.random.default_rng(0)
    pos, neg = g.normal(1, 1, 300), g.normal(0, 1, 500)
    y = np.r_[np.ones(300), np.zeros(500)]
    s = np.r_[pos, neg]
    assert roc_auc(pos, neg) == pytest.approx(roc_auc_score(y, s))
    fpr, tpr, _ = roc_curve(y, s)
    k = np.argmin(np.abs(fpr - (1 - tpr)))
    assert equal_error_rate(pos, neg) == pytest.approx((fpr[k] + 1 - tpr[k]) / 2, abs=0.01)


def test_prototype_accuracy_and_macro_f1():
    source = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]])
    src_y = ["a", "a", "b", "b"]
    gen = np.array([[1, 0.2], [0.2, 1], [1, 0.1]])  # third one is b's but looks like a
    res = prototype_accuracy(gen, ["a", "b", "b"], source, src_y)
    assert res["author_accuracy"] == pytest.approx(2 / 3)
    # a: tp 1, fp 1 -> F1 2/3; b: tp 1, fn 1 -> F1 2/3
    assert res["macro_f1"] == pytest.approx(2 / 3)
    assert macro_f1([0, 0, 1], [0, 0, 0], [0, 1, 2]) == pytest.approx((0.8 + 0 + 0) / 3)


def test_verification_gen_to_gen_and_gen_to_source():
    gen = np.array([[1, 0], [1, 0.1], [0, 1], [0.1, 1]])
    y = [0, 0, 1, 1]
    assert verification(gen, y) == {"auc": 1.0, "eer": 0.0}
    src = np.array([[1, 0.05], [0.05, 1]])
    res = verification(gen, y, src, [0, 1])
    assert res["auc"] == 1.0
    hard = np.array([[0, 1]])  # one explicit negative: generation 0 vs author 1's source
    assert verification(gen, y, src, [0, 1], negatives=hard)["auc"] == 1.0
    mixed = np.array([[1, 0], [0, 1], [1, 0], [0, 1]])  # style not separated
    assert verification(mixed, y)["auc"] < 0.6


def test_silhouette_matches_sklearn_and_centroids_separate():
    from sklearn.metrics import silhouette_score

    g = np.random.default_rng(1)
    emb = np.r_[g.normal([3, 0, 0], 0.5, (20, 3)), g.normal([0, 3, 0], 0.5, (20, 3))]
    y = np.r_[np.zeros(20), np.ones(20)]
    assert silhouette(emb, y) == pytest.approx(silhouette_score(emb, y, metric="cosine"))
    assert centroid_distance(emb, y) > 0.5
    same = g.normal(0, 1, (40, 3))
    assert centroid_distance(same, y) < centroid_distance(emb, y)


def test_equal_error_rate_matches_a_threshold_sweep():
    """The searchsorted EER equals the direct FAR/FRR sweep over every threshold."""
    gen = np.random.default_rng(3)
    pos, neg = gen.normal(1, 1, 300), gen.normal(0, 1, 500)
    t = np.unique(np.concatenate([pos, neg, [np.inf]]))
    far = np.array([np.mean(neg >= x) for x in t])
    frr = np.array([np.mean(pos < x) for x in t])
    k = int(np.argmin(np.abs(far - frr)))
    eer = equal_error_rate(pos, neg)
    assert min(far[k], frr[k]) - 1e-9 <= eer <= max(far[k], frr[k]) + 1e-9
    assert 0.25 < equal_error_rate(pos, neg) < 0.35  # two unit normals one sd apart: ≈ 0.31


def test_stylometric_features_separate_writing_habits():
    """Authors who differ only in habits (casing, punctuation, function words) verify well
    in the stylometric space; the features are deterministic and the blocks unit-norm."""
    shouty = ["WOW!!! the game was SO good!!! we won!!!", "OMG!!! the food is GREAT!!! yes!!!",
              "HUGE news!!! the band is BACK!!! go!!!", "NO WAY!!! the test was EASY!!! lol!!!"]
    calm = ["well, i think that the game was fine; perhaps we will win, however.",
            "i suppose that the food was fine; perhaps it is, however, a bit cold.",
            "well, i think that the band is back; perhaps they will play, however.",
            "i suppose that the test was fine; perhaps it was, however, long."]
    f = stylometric_features(shouty + calm)
    assert np.array_equal(f, stylometric_features(shouty + calm)) and f.shape[0] == 8
    blocks = np.split(f, [2048, 2048 + len(FUNCTION_WORDS)], axis=1)
    assert blocks[2].shape[1] == len(PUNCTUATION) + 5
    for b in blocks:
        assert np.allclose(np.linalg.norm(b, axis=1), 1.0)
    fit = stylometric_features(shouty + calm, fit_rows=4)  # scaled on the first four only
    k = 2048 + len(FUNCTION_WORDS)
    assert np.array_equal(fit[:, :k], f[:, :k]) and not np.allclose(fit[:, k:], f[:, k:])
    y = [0, 0, 0, 0, 1, 1, 1, 1]
    v = verification(f[[0, 1, 4, 5]], [0, 0, 1, 1], f[[2, 3, 6, 7]], [0, 0, 1, 1])
    assert v["auc"] == 1.0 and v["eer"] == 0.0
    assert silhouette(f, y) > 0.2
