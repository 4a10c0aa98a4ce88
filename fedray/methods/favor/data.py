"""FAVoR's federated text data: one client per roster author (FAVoR §4, B.7, B.8).

From a BlogText-schema CSV (the real ``blogtext.csv`` or the synthetic corpus): authors
with enough tokens (by the base LM's tokenizer), split 80/10/10; the style encoder's
authors and the roster drawn disjoint from (seed); each roster author's train text cut to
its long-tail word budget (Gini-controlled) and tokenized into fixed-length blocks (plain
causal-LM training on the author's posts: every token supervised — the paper does not say
how its training pairs are cut). Per client the executor also gets its style target q_i
(eq. 6, the ASCE embedding mean of its first reference posts); every source post's ASCE
embedding is kept for the evaluation's prototypes. Evaluation prompts are the
first ``prompt_tokens`` tokens of held-out test posts with the human continuation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.data.blogtext import (
    Author,
    load_authors,
    long_tail_allocation,
    prompt_and_reference,
    sample_roster,
    take_words,
)


def holdout_authors(csv: str, roster: int, seed: int, holdout_csv: str | None = None,
                    n: int = 10) -> list[Author]:
    """The cold-start authors: those of ``holdout_csv`` (the embedded corpus writes them
    apart), else the first ``n`` of ``csv`` in neither the FL roster nor the ASCE set."""
    from fedray.data.blogtext import load_authors

    if holdout_csv is not None:
        return load_authors(holdout_csv, lambda t: 1, min_tokens=1, seed=seed)
    everyone = load_authors(csv, lambda t: 1, min_tokens=1, seed=seed)
    asce, members = split_roles(everyone, roster, 50, seed)
    used = {a.id for a in asce + members}
    return [a for a in everyone if a.id not in used][:n]


def split_roles(authors: list[Author], roster: int, asce: int, seed: int
                ) -> tuple[list[Author], list[Author]]:
    """(ASCE training authors, FL roster), disjoint, both drawn from ``seed``."""
    asce_authors = sample_roster(authors, asce, seed, purpose="asce") if asce else []
    return asce_authors, sample_roster(authors, roster, seed,
                                       exclude=[a.id for a in asce_authors])


@dataclass
class TextData:
    authors: list[int]
    train: list[np.ndarray]  # per client: (blocks, length) token ids
    val: list[np.ndarray]
    targets: np.ndarray  # (clients, dim) q_i
    prompts: list[list[str]]
    references: list[list[str]]
    sources: list[list[str]]  # the authors' (allocated) train posts: prototypes
    source_z: list[np.ndarray]  # their ASCE embeddings (embedded once, reused by evaluation)
    topics: list[str]
    budgets: np.ndarray
    gini: float
    x_test: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int64))
    num_classes: int = 0

    def __post_init__(self):
        blocks = [v for v in self.val if len(v)]
        self.x_test = np.concatenate(blocks) if blocks else self.x_test
        self.y_test = self.x_test

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.train[0].shape[1],)

    @property
    def num_clients(self) -> int:
        return len(self.authors)

    def client_arrays(self, cid: int, round: int, split: str = "train"
                      ) -> tuple[np.ndarray, np.ndarray]:
        ids = (self.train if split == "train" else self.val)[cid]
        return ids, ids

    def client_extra(self, cid: int, round: int) -> dict[str, Any]:
        return {"target": self.targets[cid]}

    def summary(self) -> dict[str, Any]:
        return {"num_clients": self.num_clients, "authors": self.authors,
                "train_blocks": [int(len(t)) for t in self.train],
                "word_budgets": [int(b) for b in self.budgets], "gini": self.gini,
                "prompts": [len(p) for p in self.prompts], "topics": self.topics}


def build_text_data(cfg: Any) -> TextData:
    from transformers import AutoTokenizer

    from fedray.core.spec import ConfigError
    from fedray.methods.favor.asce import author_target, embed, load_asce
    from fedray.methods.favor.lm import blocks

    p = cfg.algorithm
    tok = AutoTokenizer.from_pretrained(p["base"])
    authors = load_authors(cfg.data.root, lambda t: len(tok(t)["input_ids"]),
                           p["min_tokens"], cfg.seed)
    need = cfg.clients.num_clients + p["asce_authors"]
    if len(authors) < need:
        raise ConfigError("clients.num_clients", cfg.clients.num_clients,
                          f"a roster the corpus can fill: {len(authors)} authors have >= "
                          f"{p['min_tokens']} tokens, {need} needed with the ASCE authors")
    _, roster = split_roles(authors, cfg.clients.num_clients, p["asce_authors"], cfg.seed)
    avail = [a.words("train") for a in roster]
    budgets, g = long_tail_allocation(avail, int(sum(avail) * p["allocation_fraction"]),
                                      p["gini"], cfg.seed)
    length = p["block_length"]
    train, val, sources, prompts, refs = [], [], [], [], []
    for a, b in zip(roster, budgets, strict=True):
        texts = take_words(a.train, int(b))
        tb = blocks(tok, texts, length)
        if not len(tb):
            raise ConfigError("algorithm.block_length", length,
                              f"at most author {a.id}'s allocated {int(b)} words in tokens")
        train.append(tb)
        val.append(blocks(tok, a.val, length))
        sources.append(texts)
        pr, rf = [], []
        for t in a.test:
            cut = prompt_and_reference(t, lambda s: tok(s)["input_ids"], tok.decode,
                                       p["prompt_tokens"], p["new_tokens"])
            if cut is not None:
                pr.append(cut[0])
                rf.append(cut[1])
            if len(pr) == p["eval_prompts"]:
                break
        prompts.append(pr)
        refs.append(rf)
    enc, etok = load_asce(p["asce"])
    flat = embed(enc, etok, [t for s in sources for t in s])
    source_z = np.split(flat, np.cumsum([len(s) for s in sources])[:-1])
    targets = np.stack([author_target(z[:p["reference_texts"]]) for z in source_z])
    return TextData([a.id for a in roster], train, val, targets, prompts, refs, sources,
                    source_z, [a.topic for a in roster], budgets, g)
