"""Cold-start transfer (FAVoR §4.3, appendix B.9): is the shared adapter a better start for a
new author's private residual than the base model or a random adapter?

Held-out authors (never in the federation) each adapt from K of their own posts; their
prototypes in ASCE space come only from those K posts, and they are scored on continuations
of their held-out prompts by nearest-prototype accuracy among the held-out authors
("Sep. Acc"), macro-F1, and "target similarity" (mean cosine of a generation to its own
author's prototype; the paper does not define it, this is our reading). Arms, with the
same private-stage budget (no ASCE, the paper's headline variant):

- ``shared_only``: the shared adapter as is;
- ``shared_init_private``: a private residual on top of the shared adapter (FAVoR);
- ``random_init_private``: the same residual on top of a freshly initialised adapter;
- ``local_from_base``: one LoRA from the initial adapter (the base model), K posts.

Authors too small for a K: an author needs K adaptation posts (the first K of its train
split) and at least one usable held-out prompt (its test split, disjoint from the shots).
At a K it lacks posts for, the author is skipped — not adapted, not generated for and not
in that K's prototype gallery, so every K is scored among the authors that have K shots —
and the row reports ``authors`` (scored) and ``skipped`` (the paper's 10 held-out authors all
have ≥ 24 shots, so it does not face this; padding a small author's shots or reusing its
test posts would change what "K-shot" means). A K with fewer than two eligible authors has
no attribution task: its rows carry NaN scores and no generations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ARMS = ("shared_only", "shared_init_private", "random_init_private", "local_from_base")


def cold_start_arms(cfg: Any, shared: dict[str, np.ndarray], authors: list[Any],
                    ks: list[int], seed: int, device: str = "cpu") -> list[dict[str, Any]]:
    """Every arm for ``authors`` from the FAVoR run ``cfg``'s final ``shared`` adapter, on
    ``device`` (a Ray task's, :func:`fedray.runtime.devices.run_on_device`). The base LM is
    loaded once; the initial adapter (``local_from_base``) is drawn from the seed exactly as
    the federation's was, the random one at the shared adapter's scale."""
    from fedray.core.registry import build_method
    from fedray.methods.favor.lm import load_lm, with_lora
    from fedray.methods.favor.method import lora_spec

    alg = build_method(cfg)
    base, tok = load_lm(alg.params.base, device)
    model = with_lora(base, lora_spec(alg.params, dropout=0.0))
    initial = alg.init_global_state({"model": model}, seed)
    gen = np.random.default_rng(seed)
    random_init = {k: gen.normal(0, float(v.std()) or 0.01, v.shape).astype(np.float32)
                   for k, v in shared.items()}
    return cold_start(alg.params, shared, initial, random_init, authors, ks, seed, device,
                      lm=(model, tok))


def cold_start(params: Any, shared: dict[str, np.ndarray], initial: dict[str, np.ndarray],
               random_init: dict[str, np.ndarray], authors: list[Any], ks: list[int],
               seed: int, device: str = "cpu", lm: tuple[Any, Any] | None = None
               ) -> list[dict[str, Any]]:
    """One row per (K, arm): accuracy, macro-F1 and target similarity over the ``authors``
    with K shots (the others are skipped and counted, see the module docstring; ``lm``:
    the LoRA-wrapped base and its tokenizer when the caller holds them)."""
    from fedray.core.seeding import derive_seed
    from fedray.data.blogtext import prompt_and_reference
    from fedray.methods.favor.asce import embed, load_asce
    from fedray.methods.favor.evaluate import generate
    from fedray.methods.favor.lm import load_lm, with_lora
    from fedray.methods.favor.method import lora_spec
    from fedray.methods.favor.train import StageConfig

    if lm is None:
        base, tok = load_lm(params.base, device)
        lm = with_lora(base, lora_spec(params, dropout=0.0)), tok
    model, tok = lm
    enc, etok = load_asce(params.asce, device)
    cfg = StageConfig(params.private_epochs, params.micro_batch, params.accumulation,
                      params.lora_lr, params.max_steps)
    prompts = []
    for a in authors:
        cuts = [prompt_and_reference(t, lambda s: tok(s)["input_ids"], tok.decode,
                                     params.prompt_tokens, params.new_tokens) for t in a.test]
        prompts.append([c[0] for c in cuts if c is not None][:params.eval_prompts])
    rows = []
    for k in ks:
        if k < 1:
            raise ValueError(f"cold-start shots K must be >= 1, got {k}")
        eligible = [i for i, a in enumerate(authors) if len(a.train) >= k and prompts[i]]
        count = {"authors": len(eligible), "skipped": len(authors) - len(eligible)}
        if len(eligible) < 2:  # no attribution among fewer than two authors
            rows += [{"K": k, "arm": arm, "sep_accuracy": float("nan"),
                      "macro_f1": float("nan"), "target_similarity": float("nan"),
                      "generations": 0, **count} for arm in ARMS]
            continue
        shots = {i: authors[i].train[:k] for i in eligible}
        protos = {i: embed(enc, etok, shots[i], device=device) for i in eligible}
        src = np.concatenate(list(protos.values()))
        src_y = [i for i, p in protos.items() for _ in p]
        starts = {"shared_init_private": shared, "random_init_private": random_init,
                  "local_from_base": initial}
        for arm in ARMS:
            gens, gen_y = [], []
            for i in eligible:
                adapter = shared if arm == "shared_only" else _private_from(
                    model, tok, starts[arm], shots[i], params, cfg, seed, k, i, device)
                texts = generate(model, tok, adapter, prompts[i], params.new_tokens,
                                 derive_seed(seed, k, i, "cold-start-generate"), device)
                gens += texts
                gen_y += [i] * len(texts)
            rows.append({"K": k, "arm": arm,
                         **_scores(embed(enc, etok, gens, device=device), gen_y, src, src_y),
                         "generations": len(gens), **count})
    return rows


def _private_from(model: Any, tok: Any, start: dict[str, np.ndarray], shots: list[str],
                  params: Any, cfg: Any, seed: int, k: int, author: int, device: str
                  ) -> dict[str, np.ndarray]:
    """``start`` plus a private residual trained on the author's ``shots`` with the
    private-stage budget (no ASCE); shots shorter than one block (K = 1) are repeated."""
    import torch

    from fedray.methods.favor.lm import blocks
    from fedray.methods.favor.train import compose, private_stage, to_numpy, to_torch

    ids = torch.from_numpy(blocks(tok, shots, params.block_length))
    reps = 1
    while not len(ids):
        reps *= 2
        ids = torch.from_numpy(blocks(tok, shots * reps, params.block_length))
    res, _ = private_stage(model, to_torch(start, device), ids.to(device), ids.to(device),
                           None, cfg, 0.0, seed, k, author, ramp=params.ramp)
    return to_numpy(compose(to_torch(start, device), res))


def _scores(zg: np.ndarray, gen_y: list[int], src: np.ndarray, src_y: list[int]
            ) -> dict[str, float]:
    """Separation accuracy and macro-F1 of the generations' embeddings ``zg`` against the
    shots' prototypes, and the target similarity: the mean cosine of a generation to its
    own author's prototype."""
    from fedray.methods.favor import style_metrics as sm

    acc = sm.prototype_accuracy(zg, gen_y, src, src_y)
    ids, proto = sm.prototypes(src, src_y)  # rows in sorted author order
    at = {int(a): j for j, a in enumerate(ids)}
    own = proto[[at[y] for y in gen_y]]
    return {"sep_accuracy": acc["author_accuracy"], "macro_f1": acc["macro_f1"],
            "target_similarity": float(np.mean(np.sum(sm.normalize(zg) * own, 1)))}
