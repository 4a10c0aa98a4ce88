"""Style evaluation of a finished FAVoR-family run (FAVoR appendix B.1).

Each roster author continues its held-out prompts with the adapter it would deploy: FAVoR
its shared endpoint + private residual, Ditto/pFedMe/local its personal adapter, FedDPA
the final global adapter mixed with its local one at its gate, FedAvg/FedProx/
Global ASCE the final global adapter. A roster author that no federated round trained
(never sampled in R rounds of K of N, or sampled but every attempt failed) has no personal
adapter: ``algorithm.unsampled`` decides (the paper's BlogText protocol leaves this case
open; its §3.4 (Inference) only says that clients not sampled *in a round* keep their latest
personalized endpoint): ``global`` (default) deploys the final global adapter for it and
scores it like everyone — what a deployed system would serve a silent author — while
``exclude`` neither generates for it nor scores it, so every score is about authors the
method actually trained; its source prototype stays in the attribution gallery (chance stays
1/N and a generation attributed to it is still an error) and macro-F1 averages over the
scored authors. The policy applies to every variant alike (FedAvg's never-trained authors
are the same authors, left out the same way), so methods stay comparable; the count,
``never_sampled``, is reported under both. Degenerate generations are
dropped (< 20 whitespace tokens or distinct-bigram ratio < 0.15). In ASCE space: author
accuracy and macro-F1 against source-train prototypes, generated-to-generated and
generated-to-source verification AUC/EER (same-author positives; negatives of the same
topic and another author when the corpus has such pairs, else any other author),
silhouette and centroid distance; the same generated-to-source verification with classical
stylometric features (ASCE-independent: our stand-in for the paper's StyleDistance column,
whose model is not available offline); SemSim is the MiniLM cosine between a generation and
its human continuation. BERTScore and MAUVE need models this machine cannot download: they are
reported as unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedray.core.seeding import derive_seed
from fedray.methods.favor import style_metrics as sm


def final_adapters(run_dir: str, variant: str, num_clients: int
                   ) -> tuple[dict[str, np.ndarray], dict[int, dict[str, np.ndarray]]]:
    """The final global adapter and each client's deployed personal adapter (if any)."""
    from fedray.core import checkpoint
    from fedray.core.state_store import ClientStateStore
    from fedray.core.storage import Storage

    storage = Storage(run_dir)
    ck = checkpoint.read(storage)
    if ck is None:
        raise FileNotFoundError(f"no checkpoint under {run_dir}")
    store = ClientStateStore(storage)
    personal = {}
    for cid, version in ck["clients"]["versions"].items():
        state = store.load(cid, version)
        if variant == "favor":
            personal[cid] = {k: state["shared"][k] + state["residual"][k]
                             for k in state["shared"]}
        elif variant in ("ditto", "local", "pfedme"):
            personal[cid] = state["personal"]
        elif variant == "feddpa":
            personal[cid] = _mixed(ck["server"]["params"], state["local"],
                                   1 / (1 + np.exp(-state["gate"])))
    glob = ck["server"]["params"]
    if variant == "feddpa":
        glob = _mixed(glob, {k: np.zeros_like(v) for k, v in glob.items()}, 0.0)
    return glob, personal


def never_trained(run_dir: str, num_clients: int) -> list[int]:
    """The roster clients with no completed round in the run's ``clients`` metrics (never
    sampled, or every attempt failed or was dropped): no federated update used their data."""
    from fedray.observe.metrics import read_metrics

    table = read_metrics(run_dir, "clients")
    if table is None or not table.num_rows:
        raise FileNotFoundError(f"no per-client metrics under {run_dir}")
    done = {int(c) for c, st in zip(table.column("client_id").to_pylist(),
                                    table.column("status").to_pylist(), strict=True)
            if st == "ok"}
    return [c for c in range(num_clients) if c not in done]


def _mixed(g: dict, local: dict, weight: float) -> dict[str, np.ndarray]:
    from fedray.methods.favor.train import mix, to_numpy, to_torch

    return to_numpy(mix(to_torch(g), to_torch(local), weight))


@torch.no_grad()
def generate(model: Any, tok: Any, adapter: dict[str, np.ndarray], prompts: list[str],
             max_new_tokens: int, seed: int, device: str = "cpu", sample: bool = True
             ) -> list[str]:
    """Sampled continuations (top-p 0.9, temperature 0.8: the paper does not give its
    sampling settings; greedy with ``sample=False``) of ``prompts`` with ``adapter`` loaded
    into the LoRA factors, as one left-padded batch sampled from ``seed``."""
    if not prompts:
        return []
    params = dict(model.named_parameters())
    for k, v in adapter.items():
        params[k].data.copy_(torch.as_tensor(v))
    model.eval()
    side, tok.padding_side = tok.padding_side, "left"
    try:
        ids = tok(prompts, return_tensors="pt", padding=True).to(device)
    finally:
        tok.padding_side = side
    torch.manual_seed(seed)
    how = {"do_sample": True, "top_p": 0.9, "temperature": 0.8} if sample else \
        {"do_sample": False, "top_p": None, "temperature": None}
    gen = model.generate(**ids, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                         **how)
    return tok.batch_decode(gen[:, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def semsim(gens: list[str], refs: list[str]) -> float:
    """Mean MiniLM cosine (mean-pooled, normalised) of each generation to its reference."""
    from fedray.methods.favor.asce import load_backbone, mean_pool

    if not gens:
        return float("nan")
    model, tok = load_backbone()
    model.eval()

    def emb(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state
        return torch.nn.functional.normalize(mean_pool(h, enc["attention_mask"]), dim=-1)

    return float((emb(gens) * emb(refs)).sum(1).mean())


def evaluate_style(run_dir: str | None, data: Any, params: Any, seed: int,
                   device: str = "cpu", min_tokens: int = 20,
                   adapter: dict[str, np.ndarray] | None = None,
                   archive: str | None = None,
                   progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Generate, filter, embed and score (see the module docstring); ``adapter`` replaces
    the run's adapters (one adapter for every author: the pooled reference, trained on
    every author, so none is never-trained). ``params.unsampled`` is the policy for
    authors no round trained (``global`` or ``exclude``); their count is
    ``never_sampled`` and, excluded, ``excluded_authors``. Every generation, kept or not,
    with its prompt and human continuation is written to ``archive``/generations.parquet
    (a directory or URI) for post-hoc rescoring. ``progress(generations done,
    generations)`` follows the generation, author by author."""
    from fedray.methods.favor.lm import load_lm, with_lora
    from fedray.methods.favor.method import lora_spec

    glob, personal = (adapter, {}) if adapter is not None else \
        final_adapters(run_dir, params.variant, data.num_clients)
    never = [] if adapter is not None else never_trained(run_dir, data.num_clients)
    policy = getattr(params, "unsampled", "global")
    if policy not in ("global", "exclude"):
        raise ValueError(f"unsampled policy must be 'global' or 'exclude', got {policy!r}")
    scored = [c for c in range(data.num_clients) if policy == "global" or c not in never]
    base, tok = load_lm(params.base, device)
    model = with_lora(base, lora_spec(params, dropout=0.0))
    made = _generate_kept(model, tok, data, scored, personal, glob, params, seed, device,
                          min_tokens, progress)
    if archive is not None:
        from fedray.core.storage import Storage

        Storage(archive).write_parquet("generations.parquet", made.archived)
    out: dict[str, Any] = {"generations": len(made.archived), "kept": len(made.texts),
                           "personalized_clients": len(personal), "unsampled": policy,
                           "never_sampled": len(never), "scored_authors": len(scored),
                           "excluded_authors": data.num_clients - len(scored)}
    if len(set(made.authors)) < 2:
        return out | {"error": "fewer than two authors have non-degenerate generations"}
    return out | _scores(made, data, params, device, None if policy == "global" else scored)


@dataclass
class _Generations:
    """The kept (non-degenerate) generations with their authors and human continuations,
    and every generation's archive row, kept or not."""

    texts: list[str] = field(default_factory=list)
    authors: list[int] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    archived: list[dict] = field(default_factory=list)


def _generate_kept(model: Any, tok: Any, data: Any, scored: list[int], personal: dict,
                   glob: dict, params: Any, seed: int, device: str, min_tokens: int,
                   progress: Callable[[int, int], None] | None) -> _Generations:
    """Each scored author continues its prompts with its deployed adapter (its personal
    one, else the global one), seeded by (seed, author); degenerate generations are
    archived but not kept."""
    from fedray.data.blogtext import is_degenerate

    made = _Generations()
    planned = sum(len(data.prompts[c]) for c in scored)
    for cid in scored:
        texts = generate(model, tok, personal.get(cid, glob), data.prompts[cid],
                         params.new_tokens, derive_seed(seed, -1, cid, "generate"), device)
        for g, p, r in zip(texts, data.prompts[cid], data.references[cid], strict=True):
            bad = is_degenerate(g, min_tokens)
            made.archived.append({"client": cid, "author": data.authors[cid], "prompt": p,
                                  "generation": g, "reference": r, "degenerate": bad})
            if not bad:
                made.texts.append(g)
                made.authors.append(cid)
                made.references.append(r)
        if progress is not None:
            progress(len(made.archived), planned)
    return made


def _scores(made: _Generations, data: Any, params: Any, device: str,
            classes: list[int] | None) -> dict[str, Any]:
    """The module docstring's scores of the kept generations against the authors' source
    texts: attribution (over ``classes``, else every author), verification in ASCE space
    and with stylometric features (same-topic negatives where the corpus has them),
    cluster separation and SemSim."""
    from fedray.methods.favor.asce import embed, load_asce

    gens, gen_y = made.texts, made.authors
    enc, etok = load_asce(params.asce, device)
    src = [t for s in data.sources for t in s]
    src_y = [c for c, s in enumerate(data.sources) for _ in s]
    zs = np.concatenate(data.source_z)
    zg = embed(enc, etok, gens, device=device)
    out = sm.prototype_accuracy(zg, gen_y, zs, src_y, classes=classes)
    gg = sm.verification(zg, gen_y)
    out |= {"gen_gen_auc": gg["auc"], "gen_gen_eer": gg["eer"]}
    topic = np.asarray(data.topics)
    gy, sy = np.asarray(gen_y), np.asarray(src_y)
    gi, si = np.meshgrid(np.arange(len(gy)), np.arange(len(sy)), indexing="ij")
    hard = (topic[gy][:, None] == topic[sy][None, :]) & (gy[:, None] != sy[None, :])
    negatives = np.stack([gi[hard], si[hard]], 1) if hard.any() else None
    gs = sm.verification(zg, gen_y, zs, src_y, negatives=negatives)
    f = sm.stylometric_features(src + gens, fit_rows=len(src))
    st = sm.verification(f[len(src):], gen_y, f[:len(src)], src_y, negatives=negatives)
    out |= {"gen_source_auc": gs["auc"], "gen_source_eer": gs["eer"],
            "stylo_gen_source_auc": st["auc"], "stylo_gen_source_eer": st["eer"],
            "gen_source_negatives": "same-topic" if negatives is not None else "any-author",
            "silhouette": sm.silhouette(zg, gen_y),
            "centroid_distance": sm.centroid_distance(zg, gen_y),
            "semsim": semsim(gens, made.references), "bertscore": None, "mauve": None}
    return out

