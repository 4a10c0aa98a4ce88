"""BlogText (the Blog Authorship Corpus, Kaggle ``blogtext.csv``) for FAVoR (§4, B.7, B.8).

Schema: ``id, gender, age, topic, sign, date, text``; one row per post, ``id`` the author.
The paper's pipeline: keep authors with at least 30K tokenizer tokens, split each author's
posts 80/10/10 into train/validation/test, sample a roster (50 or 100 authors; the style
encoder's authors are disjoint from it), allocate the train text with a long-tail
(Gini-controlled) split, evaluate on 96-token prompts with 220 new tokens, and drop
degenerate generations (< 20 whitespace tokens, or distinct-bigram ratio < 0.15).
The synthetic corpus of :mod:`fedray.data.authors` writes the same schema.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedray.core.seeding import rng

COLUMNS = ("id", "gender", "age", "topic", "sign", "date", "text")
WORD_RE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")  # the "English-word" unit (B.8; our regex)


@dataclass
class Author:
    """One author's posts, split 80/10/10 (document level)."""

    id: int
    topic: str
    train: list[str]
    val: list[str]
    test: list[str]
    meta: dict = field(default_factory=dict)

    def words(self, split: str = "train") -> int:
        return sum(len(WORD_RE.findall(t)) for t in getattr(self, split))


def read_blogtext(path: str | os.PathLike) -> dict[int, dict]:
    """Posts grouped by author: ``{id: {"topic", "gender", "age", "sign", "posts": [...]}}``
    (file order kept). Raises on a missing file or a CSV without BlogText's columns."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    from fedray.core.spec import ConfigError
    from fedray.core.storage import read_error

    rule = f"a BlogText CSV (UTF-8, header with {', '.join(COLUMNS)}; integer id)"
    if not os.path.isfile(path):
        raise ConfigError("data.root", str(path), f"{rule}; there is no such file")
    try:
        table = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            column_types={"id": "int64", "text": "string", "topic": "string"}))
        names = table.column_names
    except (pa.ArrowInvalid, UnicodeDecodeError, OSError) as e:
        raise ConfigError("data.root", str(path), f"{rule}; reading it failed: "
                                                  f"{read_error(e)}") from None
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise ConfigError("data.root", str(path), f"{rule}; it lacks {missing}")
    if table.num_rows == 0:
        raise ConfigError("data.root", str(path), f"{rule} with at least one post")
    from fedray.data.population import group_by_id

    cols = {c: table.column(c).to_pylist() for c in COLUMNS}
    natural, offsets, order = group_by_id(np.asarray(cols["id"], dtype=np.int64))
    out: dict[int, dict] = {}
    for g in np.argsort(order[offsets[:-1]], kind="stable"):  # authors in file order
        rows = order[offsets[g]:offsets[g + 1]]
        i = int(rows[0])
        texts = ((cols["text"][j] or "").strip() for j in rows.tolist())
        out[int(natural[g])] = {"topic": cols["topic"][i], "gender": cols["gender"][i],
                                "age": cols["age"][i], "sign": cols["sign"][i],
                                "posts": [" ".join(t.split()) for t in texts if t]}
    return out


def split_posts(posts: Sequence[str], seed: int, author: int,
                fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
                ) -> tuple[list[str], list[str], list[str]]:
    """Seeded document-level train/val/test split; val and test get at least one post each
    when the author has three or more."""
    n = len(posts)
    order = rng(seed, -1, author, "blogtext-split").permutation(n)
    n_val = max(1, round(fractions[1] * n)) if n >= 3 else 0
    n_test = max(1, round(fractions[2] * n)) if n >= 3 else 0
    n_train = n - n_val - n_test
    pick = [posts[i] for i in order]
    return pick[:n_train], pick[n_train:n_train + n_val], pick[n_train + n_val:]


def load_authors(path: str | os.PathLike, count_tokens: Callable[[str], int],
                 min_tokens: int = 30_000, seed: int = 0) -> list[Author]:
    """Authors with at least ``min_tokens`` tokens (by ``count_tokens``, e.g. the LM's
    tokenizer), each split 80/10/10, sorted by id."""
    out = []
    for a, rec in sorted(read_blogtext(path).items()):
        if sum(count_tokens(t) for t in rec["posts"]) < min_tokens:
            continue
        tr, va, te = split_posts(rec["posts"], seed, a)
        out.append(Author(a, rec["topic"], tr, va, te,
                          {k: rec[k] for k in ("gender", "age", "sign")}))
    return out


def sample_roster(authors: Sequence[Author], size: int, seed: int,
                  exclude: Sequence[int] = (), purpose: str = "roster") -> list[Author]:
    """``size`` authors drawn without replacement (never one of ``exclude``), by id order."""
    pool = [a for a in authors if a.id not in set(exclude)]
    if size > len(pool):
        raise ValueError(f"a roster of {size} needs {size} eligible authors, have {len(pool)}")
    idx = rng(seed, -1, -1, purpose).choice(len(pool), size, replace=False)
    return sorted((pool[i] for i in idx), key=lambda a: a.id)


def gini(x: Sequence[float]) -> float:
    """Gini coefficient of non-negative amounts (0 = equal, → 1 = concentrated)."""
    v = np.sort(np.asarray(x, dtype=np.float64))
    n = len(v)
    if n == 0 or v.sum() == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ v / (n * v.sum()))


def long_tail_allocation(available: Sequence[int], total: int, target_gini: float = 0.25,
                         seed: int = 0) -> tuple[np.ndarray, float]:
    """Word budgets per author summing to ``total``: shares ∝ rank^(−a) over a seeded
    random order, with ``a`` bisected so the uncapped shares have Gini = ``target_gini``;
    budgets are then capped at each author's available words and the excess redistributed
    to the others in proportion to their shares (the paper's "medium non-IID long tail",
    target 0.25; capping is why its realized Gini, 0.196, is lower). Returns (budgets,
    realized Gini)."""
    avail = np.asarray(available, dtype=np.int64)
    n = len(avail)
    if total > avail.sum():
        raise ValueError(f"total {total} exceeds the {int(avail.sum())} available words")
    if not 0 <= target_gini < 1:
        raise ValueError(f"target Gini must lie in [0, 1), got {target_gini}")
    order = rng(seed, -1, -1, "allocation").permutation(n)
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)

    def shares(a: float) -> np.ndarray:
        s = ranks ** -a
        return s / s.sum()

    lo, hi = 0.0, 8.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gini(shares(mid)) < target_gini else (lo, mid)
    share = shares((lo + hi) / 2)
    budget = np.zeros(n)
    free = np.ones(n, bool)
    left = float(total)
    for _ in range(n + 1):
        budget[free] = left * share[free] / share[free].sum()
        over = free & (budget > avail)
        if not over.any():
            break
        budget[over] = avail[over]
        free &= ~over
        left = total - budget[~free].sum()
    out = np.floor(budget).astype(np.int64)
    rest = total - int(out.sum())
    frac = np.where(out < avail, budget - out, -1.0)
    out[np.argsort(-frac, kind="stable")[:rest]] += 1
    return out, gini(out)


def take_words(posts: Sequence[str], budget: int) -> list[str]:
    """The leading posts holding ``budget`` word units (the last one cut at a word)."""
    out, used = [], 0
    for t in posts:
        words = list(WORD_RE.finditer(t))
        if used + len(words) <= budget:
            out.append(t)
            used += len(words)
            continue
        keep = budget - used
        if keep > 0:
            out.append(t[:words[keep - 1].end()])
        break
    return out


def is_degenerate(text: str, min_tokens: int = 20, min_distinct_bigrams: float = 0.15
                  ) -> bool:
    """The paper's filter: fewer than ``min_tokens`` whitespace tokens, or fewer than
    ``min_distinct_bigrams`` of its whitespace bigrams distinct (a text of one token, kept
    by ``min_tokens`` ≤ 1, has no bigram to repeat: not degenerate)."""
    toks = text.split()
    if len(toks) < min_tokens:
        return True
    bigrams = list(zip(toks, toks[1:], strict=False))
    return bool(bigrams) and len(set(bigrams)) / len(bigrams) < min_distinct_bigrams


def prompt_and_reference(text: str, encode: Callable[[str], list[int]],
                         decode: Callable[[list[int]], str], prompt_tokens: int = 96,
                         reference_tokens: int = 220) -> tuple[str, str] | None:
    """A held-out post cut into its first ``prompt_tokens`` tokens (the prompt) and the
    human continuation up to ``reference_tokens`` more; None when the post is too short."""
    ids = encode(text)
    if len(ids) <= prompt_tokens:
        return None
    return decode(ids[:prompt_tokens]), decode(ids[prompt_tokens:prompt_tokens
                                                       + reference_tokens])
