"""A seeded synthetic multi-author blog corpus in BlogText's CSV schema (FAVoR's embedded
default: BlogText itself cannot be downloaded here).

Every author writes about topics shared across authors (the topic vocabulary is common)
but with habits of their own that a style encoder can pick up and a homogenized model
loses: preferred synonyms for common concepts (lexical preference), favourite function
words and fillers, sentence length, punctuation (exclamation marks, ellipses, dashes,
semicolons, comma density), casing (all-lowercase writers, SHOUTED emphasis), emoticons
and sign-offs. Everything is drawn from ``numpy.random.Generator`` streams derived from
(seed, author) so the same seed writes the same corpus.

Columns: ``id, gender, age, topic, sign, date, text`` as in the Kaggle ``blogtext.csv``
(``id`` is the author; ``topic`` the author's industry label, one per author as in the
original; posts also mix in the shared conversation topics).
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.seeding import rng

TOPICS = {
    "cooking": ["recipe", "oven", "garlic", "dinner", "sauce", "kitchen", "bread", "soup"],
    "travel": ["train", "airport", "hotel", "beach", "map", "ticket", "city", "suitcase"],
    "music": ["concert", "guitar", "album", "band", "song", "drums", "lyrics", "playlist"],
    "work": ["meeting", "boss", "deadline", "office", "email", "project", "coffee", "report"],
    "sports": ["match", "coach", "team", "goal", "training", "season", "stadium", "score"],
    "school": ["exam", "teacher", "homework", "class", "library", "essay", "campus", "grade"],
    "family": ["mom", "brother", "cousin", "weekend", "birthday", "dog", "garden", "house"],
    "movies": ["film", "actor", "trailer", "cinema", "sequel", "director", "scene", "popcorn"],
}
INDUSTRIES = ["Student", "Technology", "Arts", "Education", "Communications-Media",
              "Internet", "Non-Profit", "Engineering", "indUnk", "Science"]
SIGNS = ["Aries", "Taurus", "Gemini", "Cancer", "Leo", "Virgo", "Libra", "Scorpio",
         "Sagittarius", "Capricorn", "Aquarius", "Pisces"]
SYNONYMS = {
    "good": ["good", "great", "nice", "awesome", "lovely", "decent", "brilliant", "solid"],
    "bad": ["bad", "awful", "terrible", "lousy", "rough", "horrible", "crappy", "grim"],
    "big": ["big", "huge", "large", "massive", "enormous", "giant"],
    "small": ["small", "tiny", "little", "minor", "wee"],
    "think": ["think", "guess", "reckon", "believe", "suppose", "feel"],
    "went": ["went", "headed", "wandered", "drove", "walked", "popped over"],
    "friend": ["friend", "buddy", "mate", "pal", "friend of mine"],
    "happy": ["happy", "glad", "thrilled", "stoked", "pleased", "chuffed"],
    "tired": ["tired", "exhausted", "beat", "worn out", "sleepy", "drained"],
    "funny": ["funny", "hilarious", "amusing", "silly", "ridiculous"],
}
FILLERS = ["really", "just", "very", "actually", "basically", "totally", "kind of",
           "pretty", "literally", "honestly", "so", "quite", "seriously", "definitely"]
OPENERS = ["Today", "Yesterday", "This morning", "Last night", "Anyway", "So", "Well",
           "Honestly", "Okay", "Right", "Funny thing", "Guess what"]
EMOTICONS = [":)", ":(", ";)", ":D", ":P", "<3", "^_^", "xD"]
SIGNOFFS = ["Cheers.", "Peace out.", "More later.", "Ciao!", "Goodnight.", "That's all.",
            "Until next time.", "Over and out."]
TEMPLATES = [
    "{open}, I {went} to the {t0} with my {friend} and it was {fill} {good}",
    "I {think} the {t0} was {fill} {bad}, but the {t1} was {good}",
    "my {friend} says the {t0} is {big}, and I {think} {pron} is right",
    "the {t0} took forever and I was {fill} {tired} after the {t1}",
    "there was a {small} problem with the {t0}, which was {fill} {funny}",
    "I {think} I need a {big} {t0} and a {small} {t1}",
    "{open}, the {t0} and the {t1} made me {fill} {happy}",
    "nobody warned me that the {t0} would be this {bad}",
    "I keep thinking about the {t0}, it was {fill} {good}",
    "we talked about the {t0} for hours and nobody mentioned the {t1}",
]


@dataclass
class AuthorStyle:
    """One author's habits (all probabilities per sentence unless stated)."""

    author: int
    synonyms: dict[str, np.ndarray]  # concept -> preference weights over SYNONYMS[concept]
    fillers: np.ndarray  # weights over FILLERS
    filler_rate: float
    sentence_len: float  # mean sentences joined per sentence unit (clauses)
    exclaim: float
    ellipsis: float
    dash: float
    semicolon: float
    comma: float
    lowercase: bool
    shout: float
    emoticon: float
    emoticons: np.ndarray
    opener: np.ndarray
    signoff: int
    signoff_rate: float
    topics: np.ndarray  # weights over TOPICS
    industry: str
    gender: str
    age: int
    sign: str


def draw_style(seed: int, author: int) -> AuthorStyle:
    g = rng(seed, -1, author, "author-style")

    def peaked(n: int, conc: float = 0.3) -> np.ndarray:
        return g.dirichlet(np.full(n, conc))

    return AuthorStyle(
        author=author,
        synonyms={k: peaked(len(v)) for k, v in SYNONYMS.items()},
        fillers=peaked(len(FILLERS)), filler_rate=float(g.uniform(0.05, 0.8)),
        sentence_len=float(g.uniform(1.0, 2.6)),
        exclaim=float(g.beta(0.6, 3)), ellipsis=float(g.beta(0.5, 4)),
        dash=float(g.beta(0.5, 5)), semicolon=float(g.beta(0.4, 6)),
        comma=float(g.uniform(0.1, 0.9)), lowercase=bool(g.random() < 0.25),
        shout=float(g.beta(0.4, 8)), emoticon=float(g.beta(0.5, 4)),
        emoticons=peaked(len(EMOTICONS)), opener=peaked(len(OPENERS)),
        signoff=int(g.integers(len(SIGNOFFS))), signoff_rate=float(g.beta(1, 2)),
        topics=peaked(len(TOPICS), 0.8), industry=str(g.choice(INDUSTRIES)),
        gender=str(g.choice(["male", "female"])), age=int(g.integers(14, 48)),
        sign=str(g.choice(SIGNS)))


def _sentence(style: AuthorStyle, topic: str, g: np.random.Generator) -> str:
    words = TOPICS[topic]
    clauses = []
    for _ in range(max(1, int(g.poisson(style.sentence_len - 1) + 1))):
        tpl = TEMPLATES[int(g.integers(len(TEMPLATES)))]
        fill = FILLERS[int(g.choice(len(FILLERS), p=style.fillers))] \
            if g.random() < style.filler_rate else ""
        fields = {k: v[int(g.choice(len(v), p=style.synonyms[k]))] for k, v in SYNONYMS.items()}
        t0, t1 = g.choice(words, 2, replace=False)
        text = tpl.format(open=OPENERS[int(g.choice(len(OPENERS), p=style.opener))],
                          fill=fill, t0=t0, t1=t1, pron="she" if g.random() < 0.5 else "he",
                          **fields)
        clauses.append(" ".join(text.split()))
    joiner = "; " if g.random() < style.semicolon else (", and " if g.random() < style.comma
                                                         else " - " if g.random() < style.dash
                                                         else ". ")
    if joiner == ". ":
        clauses = [c[0].upper() + c[1:] for c in clauses]
    out = joiner.join(clauses)
    if g.random() < style.shout:
        ws = out.split()
        i = int(g.integers(len(ws)))
        ws[i] = ws[i].upper()
        out = " ".join(ws)
    end = "!" if g.random() < style.exclaim else ("..." if g.random() < style.ellipsis else ".")
    out = out[0].upper() + out[1:] + end
    if g.random() < style.emoticon:
        out += " " + EMOTICONS[int(g.choice(len(EMOTICONS), p=style.emoticons))]
    return out.lower() if style.lowercase else out


def write_post(style: AuthorStyle, g: np.random.Generator, sentences: int) -> tuple[str, str]:
    """One post: (conversation topic, text)."""
    topic = list(TOPICS)[int(g.choice(len(TOPICS), p=style.topics))]
    text = " ".join(_sentence(style, topic, g) for _ in range(sentences))
    if g.random() < style.signoff_rate:
        signoff = SIGNOFFS[style.signoff]
        text += " " + (signoff.lower() if style.lowercase else signoff)
    return topic, text


def generate_corpus(path: str | os.PathLike, num_authors: int = 120, seed: int = 0,
                    posts: tuple[int, int] = (30, 90), sentences: tuple[int, int] = (4, 12),
                    first_author: int = 0) -> str:
    """Write authors ``first_author .. first_author + num_authors − 1`` (ids 1000 + index)
    to ``path`` as a BlogText-schema CSV; posts per author are drawn log-uniformly from
    ``posts`` (a long tail). Disjoint ``first_author`` ranges give disjoint authors."""
    from fedray.core.storage import Storage

    text = io.StringIO(newline="")  # the csv module's own line ends, untranslated
    _write_authors(csv.writer(text), num_authors, seed, posts, sentences, first_author)
    where = os.path.abspath(path)
    Storage(os.path.dirname(where)).write_bytes(os.path.basename(where),
                                                text.getvalue().encode("utf-8"))
    return str(path)


def _write_authors(w: Any, num_authors: int, seed: int, posts: tuple[int, int],
                   sentences: tuple[int, int], first_author: int) -> None:
    w.writerow(["id", "gender", "age", "topic", "sign", "date", "text"])
    for a in range(first_author, first_author + num_authors):
        style = draw_style(seed, a)
        g = rng(seed, -1, a, "author-posts")
        n = int(np.exp(g.uniform(np.log(posts[0]), np.log(posts[1] + 1))))
        for p in range(n):
            _, text = write_post(style, g, int(g.integers(sentences[0], sentences[1] + 1)))
            day = 1 + (p % 28)
            w.writerow([1000 + a, style.gender, style.age, style.industry, style.sign,
                        f"{day:02d},{['May', 'June', 'July'][p // 28 % 3]},2004", text])
