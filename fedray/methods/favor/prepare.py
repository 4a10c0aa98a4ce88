"""Everything FAVoR's FL runs need before round one, cached on disk: the corpus, the base LM
and the style encoder, each from authors disjoint from the roster.

Embedded default (offline): a synthetic roster corpus and, from a disjoint author range, a
pretraining corpus on which the tiny Qwen2 LM (tokenizer included) and the ASCE (on the
shipped MiniLM) are trained. With a real ``blogtext.csv`` the base is a hub LM (Qwen2.5)
and ASCE is trained on the 50 authors :func:`fedray.methods.favor.data.split_roles` holds out.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from fedray.core.spec import ConfigError
from fedray.core.storage import read_marker, write_marker
from fedray.methods.favor.lm import TinyLM
from fedray.observe.progress import Progress


def train_style_encoder(texts: list[str], labels: list[int], out_dir: str, *,
                        backbone: str | None = None, epochs: int = 1, max_length: int = 96,
                        batch_size: int = 16, lr: float = 5e-5, seed: int = 0,
                        progress: Callable[[int, int], None] | None = None) -> str:
    """Train ASCE on (text, author) and save it to ``out_dir`` (cached by its settings);
    ``progress(batches done, batches)`` follows the training."""
    from fedray.methods.favor.asce import save_asce, train_asce

    corpus = hashlib.sha256(json.dumps([list(texts), [str(y) for y in labels]]).encode())
    key = json.dumps({"corpus": corpus.hexdigest(), "backbone": backbone, "epochs": epochs,
                      "max_length": max_length, "lr": lr, "seed": seed})
    marker = os.path.join(out_dir, "asce.json")
    if (read_marker(marker) or {}).get("key") == key:
        return out_dir
    enc, tok, metrics = train_asce(texts, labels, backbone, epochs=epochs, lr=lr,
                                   batch_size=batch_size, max_length=max_length, seed=seed,
                                   progress=progress)
    save_asce(enc, tok, out_dir, {"key": key, **metrics})
    return out_dir


def prepare_embedded(work_dir: str, roster: int = 50, seed: int = 0,
                     pretrain_authors: int = 24, lm: TinyLM | None = None,
                     roster_posts: tuple[int, int] = (30, 80), asce_epochs: int = 1,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Generate the corpora, pretrain the tiny LM and train ASCE; returns their paths.
    Cached in ``work_dir``: a cache prepared with other arguments is rebuilt. These are
    three stages of ``progress``: corpus, base LM, ASCE."""
    from fedray.data.authors import generate_corpus
    from fedray.data.blogtext import load_authors

    lm = lm or TinyLM(seed=seed)
    progress = progress or Progress(enabled=False)
    key = json.dumps({"roster": roster, "seed": seed, "pretrain_authors": pretrain_authors,
                      "lm": lm.key(), "roster_posts": list(roster_posts),
                      "asce_epochs": asce_epochs})
    marker = os.path.join(work_dir, "prepared.json")
    csv = os.path.join(work_dir, "authors.csv")
    pre_csv = os.path.join(work_dir, "pretrain_authors.csv")
    holdout = os.path.join(work_dir, "holdout_authors.csv")  # cold-start authors
    stamp = read_marker(marker)
    if stamp is None:  # only files fedray generated, under its marker, are ever replaced
        found = [p for p in (csv, pre_csv, holdout) if os.path.lexists(p)]
        if found:
            why = ("a prepared.json that is not fedray's JSON" if os.path.lexists(marker)
                   else "no prepared.json")
            raise ConfigError("--cache", work_dir, f"a directory for fedray's prepared corpus "
                                                   f"(it holds {os.path.basename(found[0])} "
                                                   f"but {why}, so it is not known to be "
                                                   f"fedray's: choose another --cache, or "
                                                   f"remove the file if fedray wrote it)")
    elif stamp.get("key") != key:
        for path in (csv, pre_csv, holdout):  # other corpora (the LM and ASCE caches are
            if os.path.lexists(path):          # keyed by their texts)
                os.remove(path)
    os.makedirs(work_dir, exist_ok=True)
    write_marker(marker, {"key": key})  # before the corpora: each is written atomically
    with progress.stage("corpus"):
        if not os.path.exists(csv):
            generate_corpus(csv, roster, seed, posts=roster_posts)
        if not os.path.exists(pre_csv):
            generate_corpus(pre_csv, pretrain_authors, seed, posts=(30, 40),
                            first_author=100_000)
        if not os.path.exists(holdout):
            generate_corpus(holdout, 10, seed, posts=roster_posts, first_author=50_000)
        pre = load_authors(pre_csv, lambda t: 1, min_tokens=1, seed=seed)
    texts = [t for a in pre for t in a.train]
    labels = [a.id for a in pre for _ in a.train]
    from fedray.methods.favor.lm import pretrain_tiny

    with progress.stage("base LM", unit="steps") as stage:
        base = pretrain_tiny(texts, os.path.join(work_dir, "base_lm"), lm,
                             progress=stage.report)
    with progress.stage("ASCE", unit="batches") as stage:
        asce = train_style_encoder(texts, labels, os.path.join(work_dir, "asce"),
                                   epochs=asce_epochs, seed=seed, progress=stage.report)
    return {"csv": csv, "base": base, "asce": asce, "holdout": holdout}


def embedded_overrides(prep: dict[str, Any]) -> list[str]:
    """Config overrides that run FAVoR on the prepared embedded default (small LM: larger
    learning rate, short blocks, prompts and continuations). The adapter is the paper's
    (App. B.19 / Table 32): LoRA r 16, α 32, dropout 0.05 on q, k, v, o, gate, up and down,
    i.e. :class:`~fedray.methods.favor.method.FavorParams`' own defaults, stated here so the
    embedded study's adapter is explicit (until #16 it was r 8 / α 16)."""
    return ["algorithm.name=favor", "data.dataset=blogtext", f"data.root={prep['csv']}",
            f"algorithm.base={prep['base']}", f"algorithm.asce={prep['asce']}",
            "algorithm.asce_authors=0", "algorithm.min_tokens=1", "algorithm.block_length=64",
            "algorithm.prompt_tokens=24", "algorithm.new_tokens=40", "algorithm.lora_lr=0.002",
            "algorithm.lora_rank=16", "algorithm.lora_alpha=32", "algorithm.micro_batch=4",
            "algorithm.accumulation=2", "algorithm.reference_texts=8",
            "algorithm.proj_hidden=64"]
