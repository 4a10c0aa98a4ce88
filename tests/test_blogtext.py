"""BlogText loading, the paper's filters and allocation, and the synthetic author corpus."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from fedray.data.authors import generate_corpus
from fedray.data.blogtext import (
    COLUMNS,
    gini,
    is_degenerate,
    load_authors,
    long_tail_allocation,
    prompt_and_reference,
    read_blogtext,
    sample_roster,
    take_words,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return generate_corpus(tmp_path_factory.mktemp("blog") / "blogtext.csv", num_authors=24,
                           seed=3, posts=(20, 40))


def test_generator_writes_the_blogtext_schema_reproducibly(corpus, tmp_path):
    with open(corpus, newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == COLUMNS
    assert len({r[0] for r in rows[1:]}) == 24 and len(rows) > 24 * 20
    again = generate_corpus(tmp_path / "b.csv", num_authors=24, seed=3, posts=(20, 40))
    assert open(again).read() == open(corpus).read()
    other = generate_corpus(tmp_path / "c.csv", num_authors=24, seed=4, posts=(20, 40))
    assert open(other).read() != open(corpus).read()


def test_loader_filters_by_tokens_and_splits_80_10_10(corpus):
    authors = load_authors(corpus, lambda t: len(t.split()), min_tokens=1)
    assert len(authors) == 24
    lengths = sorted(sum(len(t.split()) for t in a.train + a.val + a.test) for a in authors)
    cut = lengths[12]
    kept = load_authors(corpus, lambda t: len(t.split()), min_tokens=cut)
    assert len(kept) == 12
    raw = read_blogtext(corpus)
    for a in authors:
        n = len(raw[a.id]["posts"])
        assert len(a.val) == max(1, round(0.1 * n)) and len(a.test) == max(1, round(0.1 * n))
        assert sorted(a.train + a.val + a.test) == sorted(raw[a.id]["posts"])
    with pytest.raises(ValueError, match=r"data.root.*/nonexistent/blogtext.csv.*no such "
                                         r"file"):
        read_blogtext("/nonexistent/blogtext.csv")


def test_a_bad_csv_is_named_without_echoing_its_lines(tmp_path):
    """pyarrow's message quotes the offending row; for a path linked to another file that
    would print that file's line: only counts and positions are kept."""
    p = tmp_path / "x.csv"
    p.write_text("id,text,topic,gender,age,sign,date\n1,hello,a,b,1,c,d\n"
                 "alice:x:1000:1000:SECRET:/home/alice:/bin/bash,2\n")
    with pytest.raises(ValueError, match=r"data.root.*reading it failed: a row has 2 "
                                         r"columns where the header has 7") as err:
        read_blogtext(p)
    assert "SECRET" not in str(err.value)


def test_loader_rejects_a_csv_without_the_schema(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("id,text\n1,hello\n")
    with pytest.raises(ValueError, match=r"data.root.*BlogText CSV.*lacks \['gender'"):
        read_blogtext(p)


def test_roster_is_disjoint_from_excluded_authors(corpus):
    authors = load_authors(corpus, lambda t: 1, min_tokens=1)
    asce = sample_roster(authors, 8, seed=0, purpose="asce")
    roster = sample_roster(authors, 12, seed=0, exclude=[a.id for a in asce])
    assert not {a.id for a in asce} & {a.id for a in roster}
    assert roster == sample_roster(authors, 12, seed=0, exclude=[a.id for a in asce])
    with pytest.raises(ValueError, match="roster of 30"):
        sample_roster(authors, 30, seed=0)


def test_gini_and_long_tail_allocation():
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 4]) == pytest.approx(0.75)
    plenty = np.full(50, 10**6)
    budget, g = long_tail_allocation(plenty, 904_378, 0.25, seed=0)
    assert budget.sum() == 904_378 and g == pytest.approx(0.25, abs=0.005)
    tight = np.random.default_rng(0).integers(5_000, 40_000, 50)
    budget, g = long_tail_allocation(tight, int(tight.sum() * 0.7), 0.25, seed=0)
    assert budget.sum() == int(tight.sum() * 0.7) and (budget <= tight).all()
    assert 0 < g < 0.3
    with pytest.raises(ValueError, match="exceeds"):
        long_tail_allocation([10, 10], 30)


def test_take_words_degenerate_filter_and_prompts():
    posts = ["one two three four", "five six seven", "eight nine"]
    assert take_words(posts, 6) == ["one two three four", "five six"]
    assert take_words(posts, 100) == posts
    assert is_degenerate("too short")
    assert is_degenerate(" ".join(["la la"] * 30))  # 2 distinct bigrams of 59
    assert not is_degenerate(" ".join(f"w{i}" for i in range(25)))
    words = [f"t{i}" for i in range(400)]
    pr = prompt_and_reference(" ".join(words), lambda s: s.split(), " ".join)
    assert pr == (" ".join(words[:96]), " ".join(words[96:316]))
    assert prompt_and_reference("a b", lambda s: s.split(), " ".join) is None


def test_synthetic_authors_are_separable_by_style(corpus):
    """A bag of character n-grams and a linear classifier tell the authors apart on
    held-out posts far above chance (1/24), though every author writes on shared topics."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    authors = load_authors(corpus, lambda t: 1, min_tokens=1)
    xtr = [t for a in authors for t in a.train]
    ytr = [a.id for a in authors for _ in a.train]
    xte = [t for a in authors for t in a.test + a.val]
    yte = [a.id for a in authors for _ in a.test + a.val]
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), min_df=2, lowercase=False)
    clf = LogisticRegression(max_iter=2000, C=10).fit(vec.fit_transform(xtr), ytr)
    acc = float(np.mean(clf.predict(vec.transform(xte)) == np.array(yte)))
    assert acc > 0.6, acc
