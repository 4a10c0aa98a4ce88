"""Author-style metrics in a style-embedding space (FAVoR appendix B.1).

All functions take ℓ2-normalisable embeddings (rows) and author labels:

- :func:`prototype_accuracy`: each author's prototype is the normalised mean of its
  normalised *source* embeddings; a generation is assigned to the prototype of highest
  cosine; returns accuracy and macro-F1 over the roster.
- :func:`verification`: ROC AUC and equal error rate of cosine scores of positive
  (same-author) against negative pairs — generated-to-generated (all pairs) or
  generated-to-source with explicit negatives (e.g. same topic, different author).
- :func:`silhouette` (cosine distance) and :func:`centroid_distance` (mean cosine distance
  between author centroids) of generated embeddings labelled by author.
- :func:`stylometric_features`: classical stylometry (FAVoR Table 3's "Stylom."), an
  embedding that owes nothing to ASCE, so a verification in it is a check on ASCE-trained
  methods that cannot be explained by optimising toward the evaluator.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

FUNCTION_WORDS = (
    "the a an and or but if of to in on at by for with from as that this these those it "
    "its i me my we our you your he she they them their is are was were be been not no so "
    "very just really too also then than there here what which who when while because").split()
PUNCTUATION = ".,;:!?-'\"()…*"


def normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def prototypes(emb: np.ndarray, labels: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """(authors, prototype matrix): normalised means of each author's normalised rows."""
    labels = np.asarray(labels)
    authors = np.unique(labels)
    z = normalize(emb)
    return authors, normalize(np.stack([z[labels == a].mean(0) for a in authors]))


def macro_f1(y_true: Sequence, y_pred: Sequence, classes: Sequence) -> float:
    """Unweighted mean over ``classes`` of per-class F1 (0 for a class never predicted
    nor present)."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    f1 = []
    for c in classes:
        tp = np.sum((p == c) & (t == c))
        fp = np.sum((p == c) & (t != c))
        fn = np.sum((p != c) & (t == c))
        f1.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1))


def prototype_accuracy(gen: np.ndarray, gen_labels: Sequence, source: np.ndarray,
                       source_labels: Sequence, classes: Sequence | None = None
                       ) -> dict[str, float]:
    """Nearest-prototype attribution of ``gen`` among every source author; macro-F1 is
    averaged over ``classes`` (default: every source author)."""
    authors, protos = prototypes(source, source_labels)
    pred = authors[np.argmax(normalize(gen) @ protos.T, axis=1)]
    y = np.asarray(gen_labels)
    return {"author_accuracy": float(np.mean(pred == y)),
            "macro_f1": macro_f1(y, pred, authors if classes is None else classes)}


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score_pos > score_neg) + ½ P(tie) — the Mann-Whitney form of ROC AUC."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    allv = np.concatenate([pos, neg])
    order = np.argsort(allv, kind="mergesort")
    ranks = np.empty(len(allv))
    sorted_v = allv[order]
    i = 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j + 1 < len(allv) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    r_pos = ranks[:len(pos)].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def equal_error_rate(pos: np.ndarray, neg: np.ndarray) -> float:
    """The error rate where the false-accept rate (negatives ≥ t) equals the false-reject
    rate (positives < t), interpolated between the two closest thresholds."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    thresholds = np.unique(np.concatenate([pos, neg, [np.inf]]))
    far = 1 - np.searchsorted(np.sort(neg), thresholds, side="left") / len(neg)
    frr = np.searchsorted(np.sort(pos), thresholds, side="left") / len(pos)
    k = int(np.argmin(np.abs(far - frr)))
    if far[k] == frr[k] or k == 0:
        return float((far[k] + frr[k]) / 2)
    a, b = k - 1, k  # far decreases, frr increases along the thresholds
    da, db = far[a] - frr[a], far[b] - frr[b]
    w = da / (da - db) if da != db else 0.5
    return float(far[a] + w * (far[b] - far[a]))


def pair_scores(a: np.ndarray, b: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return np.sum(normalize(a)[pairs[:, 0]] * normalize(b)[pairs[:, 1]], axis=1)


def verification(gen: np.ndarray, gen_labels: Sequence, source: np.ndarray | None = None,
                 source_labels: Sequence | None = None,
                 negatives: np.ndarray | None = None) -> dict[str, float]:
    """AUC/EER of cosine scores. Without ``source``: every generated pair, same author =
    positive. With ``source``: generated-vs-source pairs of the same author are positives;
    ``negatives`` (rows of (generated index, source index), e.g. same-topic different-
    author pairs) are the negatives (default: every different-author pair)."""
    y = np.asarray(gen_labels)
    if source is None:
        i, j = np.triu_indices(len(y), 1)
        s = pair_scores(gen, gen, np.stack([i, j], 1))
        same = y[i] == y[j]
        pos, neg = s[same], s[~same]
    else:
        ys = np.asarray(source_labels)
        gi, si = np.meshgrid(np.arange(len(y)), np.arange(len(ys)), indexing="ij")
        gi, si = gi.ravel(), si.ravel()
        same = y[gi] == ys[si]
        pos = pair_scores(gen, source, np.stack([gi[same], si[same]], 1))
        neg_pairs = negatives if negatives is not None else np.stack([gi[~same], si[~same]], 1)
        neg = pair_scores(gen, source, np.asarray(neg_pairs))
    if not len(pos) or not len(neg):
        return {"auc": float("nan"), "eer": float("nan")}
    return {"auc": roc_auc(pos, neg), "eer": equal_error_rate(pos, neg)}


def silhouette(emb: np.ndarray, labels: Sequence) -> float:
    """Mean silhouette with cosine distance (samples of singleton authors score 0)."""
    z = normalize(emb)
    y = np.asarray(labels)
    d = 1 - z @ z.T
    scores = []
    for i in range(len(y)):
        own = (y == y[i])
        own[i] = False
        if not own.any():
            scores.append(0.0)
            continue
        a = d[i, own].mean()
        b = min(d[i, y == c].mean() for c in np.unique(y) if c != y[i])
        scores.append((b - a) / max(a, b) if max(a, b) > 0 else 0.0)
    return float(np.mean(scores))


def centroid_distance(emb: np.ndarray, labels: Sequence) -> float:
    """Mean pairwise cosine distance between the authors' normalised centroids (how far
    apart the authors' generations sit; homogenization drives it to 0)."""
    _, c = prototypes(emb, labels)
    i, j = np.triu_indices(len(c), 1)
    return float(np.mean(1 - np.sum(c[i] * c[j], 1))) if len(i) else 0.0


def stylometric_features(texts: Sequence[str], fit_rows: int | None = None,
                         ngram_buckets: int = 2048) -> np.ndarray:
    """Per text, three ℓ2-normalised blocks side by side (each weighs the same in a cosine):
    hashed character-3-gram frequencies (CRC32 into ``ngram_buckets``: deterministic across
    processes), function-word frequencies per word, and structure rates — each punctuation
    mark per character, uppercase, digit and whitespace shares, mean word and sentence
    length — centred and scaled by their mean and spread over the first ``fit_rows`` texts
    (all when None; the human sources in an evaluation, so every method's generations are
    scored on the same scale)."""
    grams = np.zeros((len(texts), ngram_buckets))
    fw = np.zeros((len(texts), len(FUNCTION_WORDS)))
    stats = np.zeros((len(texts), len(PUNCTUATION) + 5))
    index = {w: i for i, w in enumerate(FUNCTION_WORDS)}
    for r, t in enumerate(texts):
        for k in range(len(t) - 2):
            grams[r, zlib.crc32(t[k:k + 3].encode()) % ngram_buckets] += 1
        words = re.findall(r"[A-Za-z']+", t)
        for w in words:
            if (i := index.get(w.lower())) is not None:
                fw[r, i] += 1
        fw[r] /= max(len(words), 1)
        n = max(len(t), 1)
        sentences = [x for x in re.split(r"[.!?]+", t) if x.strip()]
        stats[r] = [t.count(c) / n for c in PUNCTUATION] + [
            sum(c.isupper() for c in t) / n, sum(c.isdigit() for c in t) / n,
            sum(c.isspace() for c in t) / n,
            np.mean([len(w) for w in words]) if words else 0.0,
            len(words) / max(len(sentences), 1)]
    fit = stats[:fit_rows]
    stats = (stats - fit.mean(0)) / np.maximum(fit.std(0), 1e-9)
    return np.concatenate([normalize(grams), normalize(fw), normalize(stats)], axis=1)
