"""The attacks of issue #30 as free functions (:mod:`fedray.methods.robust.attacks`), each
on a case worked by hand or against its paper's defining property; and what they do to
the robust rules (:mod:`fedray.methods.robust.rules`): a scaled update moves the mean far,
the median and Multi-Krum barely."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from fedray.methods.robust import attacks, rules


def benign(n=8, d=5, seed=0):
    g = np.random.default_rng(seed)
    return 1.0 + 0.1 * g.normal(size=(n, d))


def test_sign_flip_scale_and_noise():
    own = np.array([1.0, -2.0])
    assert attacks.sign_flip(own).tolist() == [-1.0, 2.0]
    assert attacks.scale(own, 10).tolist() == [10.0, -20.0]
    a = attacks.gaussian((3,), 2.0, np.random.default_rng(5))
    assert np.array_equal(a, np.random.default_rng(5).normal(0, 2.0, size=3))


def test_alie_z_is_baruch_et_als():
    """n = 50, m = 10 (the paper's CIFAR setting): s = 26 − 10 = 16, z = Φ⁻¹(34 / 50)."""
    assert attacks.alie_z(50, 10) == pytest.approx(NormalDist().inv_cdf(34 / 50))
    assert attacks.alie_z(50, 10) == pytest.approx(0.4677, abs=1e-4)
    b = benign()
    got = attacks.alie(b, 10, 2)
    assert np.allclose(got, b.mean(0) - attacks.alie_z(10, 2) * b.std(0))


def test_ipm_points_against_the_benign_mean():
    b = benign()
    mal = attacks.ipm(b, 0.5)
    assert np.allclose(mal, -0.5 * b.mean(0)) and float(mal @ b.mean(0)) < 0


@pytest.mark.parametrize("kind", attacks.DIRECTIONS)
def test_min_max_and_min_sum_are_the_largest_gamma_that_stays_inside(kind):
    """The returned update meets its constraint; 1 % further along p breaks it."""
    b = benign()
    mu, p = b.mean(0), attacks.direction(b, kind)
    mm = attacks.min_max(b, kind)
    limit = max(np.linalg.norm(b[i] - b[j]) for i in range(len(b)) for j in range(len(b)))
    gamma = float(np.linalg.norm(mm - mu) / np.linalg.norm(p))
    assert gamma > 0 and np.linalg.norm(b - mm, axis=1).max() <= limit + 1e-12
    assert np.linalg.norm(b - (mu + 1.01 * gamma * p), axis=1).max() > limit
    ms = attacks.min_sum(b, kind)
    lim2 = max(sum(np.linalg.norm(b[i] - b[j]) ** 2 for j in range(len(b)))
               for i in range(len(b)))
    g2 = float(np.linalg.norm(ms - mu) / np.linalg.norm(p))
    assert (np.linalg.norm(b - ms, axis=1) ** 2).sum() <= lim2 + 1e-9
    assert (np.linalg.norm(b - (mu + 1.01 * g2 * p), axis=1) ** 2).sum() > lim2
    with pytest.raises(ValueError, match="perturbation"):
        attacks.direction(b, "bogus")


def test_label_flip_and_the_backdoor():
    y = np.array([0, 1, 2, 9])
    assert attacks.flip_labels(y, 10).tolist() == [9, 8, 7, 0]
    assert attacks.flip_labels(y, 10, [1, 0, *range(2, 10)]).tolist() == [1, 0, 2, 9]
    with pytest.raises(ValueError, match="permutation"):
        attacks.flip_labels(y, 10, [0] * 10)
    x = np.zeros((10, 1, 8, 8), np.float32)
    x[:, :, 0, 0] = 1.0
    px, py = attacks.backdoor(x, np.arange(10) % 3, 7, 0.3, np.random.default_rng(0))
    hit = np.flatnonzero(py == 7)
    assert len(hit) == 3 and (px[hit, :, -3:, -3:] == 1.0).all()
    assert (px[np.setdiff1d(np.arange(10), hit), :, -3:, -3:] == 0).all()
    assert np.array_equal(x[:, :, -3:, -3:], np.zeros((10, 1, 3, 3)))  # the input is kept


def test_a_scaling_attacker_moves_the_mean_not_the_robust_rules():
    b = benign(n=9)
    x = np.vstack([b, attacks.scale(b[0], 100.0)])  # 1 of 10 malicious
    honest = b.mean(0)
    err = {name: float(np.linalg.norm(out.aggregate - honest))
           for name, out in {"mean": rules.Robust(x.mean(0), np.ones(10)),
                             "median": rules.median(x),
                             "multi_krum": rules.multi_krum(x, 1),
                             "trimmed_mean": rules.trimmed_mean(x, 0.1)}.items()}
    assert err["mean"] > 10 and max(err["median"], err["multi_krum"],
                                    err["trimmed_mean"]) < 0.2
    assert rules.multi_krum(x, 1).kept[9] == 0  # and it was the one excluded
