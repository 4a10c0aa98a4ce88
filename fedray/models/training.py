"""Plain PyTorch helpers shared by the methods: move parameters in and out of a model,
run local SGD, evaluate. No Ray, no federated logic."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.core.seeding import rng, rngs, torch_seeded


def get_state(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters and buffers as float32 numpy arrays (copies)."""
    return {k: v.detach().to("cpu", torch.float32).numpy().copy()
            for k, v in model.state_dict().items()}


NOT_WRITABLE = "The given NumPy array is not writable"  # torch's warning, read-only arrays


def input_tensor(a: np.ndarray, device: Any) -> torch.Tensor:
    """``a`` as a tensor on ``device``, without a copy where it already lives. A client's
    arrays are views of the memory-mapped, read-only population cache, and the code that
    trains and scores on them only reads its inputs (batches are gathered copies), so
    torch's warning that such a tensor shares memory it may not write is silenced here, the
    one place these tensors are made."""
    if a.flags.writeable:
        return torch.from_numpy(a).to(device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WRITABLE)
        return torch.from_numpy(a).to(device)


def set_state(model: nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Copy ``state`` into the model in place (no re-allocation)."""
    own = model.state_dict()
    missing = set(own) - set(state)
    if missing:
        raise KeyError(f"state lacks {sorted(missing)[:5]}")
    with torch.no_grad(), warnings.catch_warnings():
        # a broadcast decoded from the object store is read-only; copy_ only reads it
        warnings.filterwarnings("ignore", NOT_WRITABLE)
        for k, v in own.items():
            v.copy_(torch.from_numpy(np.asarray(state[k])).reshape(v.shape))


class Adam:
    """Adam with L2 weight decay, the update of ``torch.optim.Adam`` (``g += λθ``;
    bias-corrected moments; ``θ -= lr m̂ / (√v̂ + ε)``), written out for the same reason as
    :class:`SGD`. ``clip`` rescales the gradients to at most that total L2 norm first
    (``torch.nn.utils.clip_grad_norm_``'s rule: factor max_norm / (norm + 1e-6), capped at 1).
    """

    def __init__(self, params: list[torch.Tensor], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip: float | None = None):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.weight_decay, self.clip, self.t = weight_decay, clip, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.clip is not None:
            total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
            factor = min(1.0, self.clip / (float(total) + 1e-6))
            grads = [g * factor for g in grads]
        self.t += 1
        b1, b2 = self.betas
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            if self.weight_decay:
                g = g.add(p, alpha=self.weight_decay)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / (1 - b2 ** self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))


def random_crop_flip(x: torch.Tensor, gen: torch.Generator, pad: int = 4) -> torch.Tensor:
    """The standard CIFAR augmentation, per image of an NCHW batch: a random ``H×W`` crop of
    the image zero-padded by ``pad`` and a horizontal flip with probability 1/2, all drawn
    from ``gen`` (a CPU generator, so the draw does not depend on the device)."""
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    rows = (dy[:, None] + torch.arange(h)[None]).to(x.device)
    cols = (dx[:, None] + torch.arange(w)[None]).to(x.device)
    cols = torch.where(flip[:, None].to(x.device), cols.flip(1), cols)
    idx = torch.arange(n, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]]
    # plain NCHW strides, also for one channel: ``.contiguous()`` would keep the permuted
    # (n·h·w, 1, w, 1) strides, which read as channels-last too, and oneDNN's channels-last
    # convolution backward corrupts the heap on such batches (torch 2.14, seen here)
    return out.permute(0, 3, 1, 2).clone(memory_format=torch.contiguous_format)


def batches(n: int, batch_size: int, epochs: int, seed: int, round: int, client: int,
            max_steps: int | None = None, purpose: str = "local"):
    """Index batches for local training: a fresh permutation per epoch from
    (seed, round, client, "{purpose}-shuffle-e{epoch}")."""
    steps = 0
    for epoch in range(epochs):
        perm = rng(seed, round, client, f"{purpose}-shuffle-e{epoch}").permutation(n)
        for start in range(0, n, batch_size):
            if max_steps is not None and steps >= max_steps:
                return
            yield perm[start:start + batch_size]
            steps += 1


def cohort_batches(sizes: Sequence[int], clients: Sequence[int], batch_size: int, epochs: int,
                   seed: int, round: int, max_steps: int | None = None,
                   purpose: str = "local") -> list[list[np.ndarray]]:
    """``[list(batches(n, batch_size, epochs, seed, round, c, max_steps, purpose)) for n, c
    in zip(sizes, clients)]``, the same batches, with each epoch's per-client generators
    seeded for the whole cohort at once (:func:`~fedray.core.seeding.rngs`)."""
    if len(sizes) != len(clients):
        raise ValueError(f"{len(sizes)} client sizes for {len(clients)} clients")
    out: list[list[np.ndarray]] = [[] for _ in sizes]
    for epoch in range(epochs):
        live = [i for i in range(len(sizes)) if max_steps is None or len(out[i]) < max_steps]
        if not live:
            break
        gens = rngs(seed, round, [clients[i] for i in live], f"{purpose}-shuffle-e{epoch}")
        for i, gen in zip(live, gens, strict=True):
            perm, got = gen.permutation(sizes[i]), out[i]
            for start in range(0, sizes[i], batch_size):
                if max_steps is not None and len(got) >= max_steps:
                    break
                got.append(perm[start:start + batch_size])
    return out


class SGD:
    """SGD with momentum and weight decay, the update of ``torch.optim.SGD`` (dampening 0,
    no Nesterov: ``b = μ b + (g + λ θ)``, first ``b = g + λ θ``; ``θ -= lr b``).

    Written out because constructing any ``torch.optim`` optimizer imports
    ``torch._dynamo`` (≈2.4 s per process here), which every new executor would pay.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad if not self.weight_decay else p.grad.add(p, alpha=self.weight_decay)
            if self.momentum:
                b = self.buffers[i]
                if b is None:
                    b = self.buffers[i] = g.detach().clone()
                else:
                    b.mul_(self.momentum).add_(g)
                g = b
            p.add_(g, alpha=-self.lr)

    def state_dict(self) -> dict:
        return {"momentum_buffers": [None if b is None else b.detach().cpu().numpy().copy()
                                     for b in self.buffers]}

    def load_state_dict(self, state: dict) -> None:
        bufs = state["momentum_buffers"]
        if len(bufs) != len(self.params):
            raise ValueError(f"optimizer state has {len(bufs)} buffers for "
                             f"{len(self.params)} parameters")
        self.buffers = [None if b is None else torch.from_numpy(np.array(b)).to(p.device)
                        for b, p in zip(bufs, self.params, strict=True)]


IGNORE = -100  # a padded target: nn.CrossEntropyLoss's ignore_index, out of every score


def task_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss the targets ask for, averaged over a batch: integer class ids —
    one per row, or per token (padding ``IGNORE`` left out) — take the cross-entropy;
    multi-hot float targets (multi-label, FLAIR) take the per-label binary cross-entropy
    on the logits, averaged over rows and labels (``nn.BCEWithLogitsLoss()``, the loss of
    pfl-research's FLAIR model)."""
    if y.is_floating_point():
        return nn.functional.binary_cross_entropy_with_logits(out, y)
    return nn.functional.cross_entropy(out, y, ignore_index=IGNORE)


def train_local(model: nn.Module, x: np.ndarray, y: np.ndarray, *, epochs: int,
                batch_size: int, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                seed: int, round: int, client: int, max_steps: int | None = None,
                device: str = "cpu",
                grad_hook: Callable[[list[torch.Tensor]], None] | None = None,
                optimizer_state: dict | None = None, bf16: bool = False,
                purpose: str = "local", optimizer: Any = None,
                dp_sgd: DPSGD | None = None,
                extra_loss: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> tuple[dict[str, float], dict | None]:
    """Local SGD on (x, y). ``grad_hook(params)`` may edit gradients before each step
    (FedProx adds its proximal gradient there); ``extra_loss(x)``, called right after each
    batch's forward pass, gives a per-row term whose batch mean is added to the loss
    (MOON's contrastive term). ``bf16`` autocasts the forward pass to
    bfloat16 (weights, gradients and the optimizer stay fp32). ``optimizer`` replaces the
    default :class:`SGD` (e.g. FLITE's :class:`Adam` on latents). ``dp_sgd`` trains with
    DP-SGD (:class:`DPSGD`). Returns (metrics, SGD momentum state)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if dp_sgd is not None:
        if optimizer is not None or optimizer_state is not None or extra_loss is not None:
            raise ValueError("DP-SGD trains with its own optimizer and loss, and keeps no "
                             "state")
        return dp_sgd.train(model, params, x, y, epochs=epochs, batch_size=batch_size, lr=lr,
                            momentum=momentum, weight_decay=weight_decay, seed=seed,
                            round=round, client=client, max_steps=max_steps, device=device,
                            grad_hook=grad_hook, bf16=bf16, purpose=purpose), None
    opt = optimizer or SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state)
    xt, yt = input_tensor(x, device), input_tensor(y, device)
    model.train()
    total, steps = 0.0, 0
    with torch_seeded(seed, round, client, f"{purpose}-torch"):
        for idx in batches(len(x), batch_size, epochs, seed, round, client, max_steps, purpose):
            opt.zero_grad()
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                enabled=bf16):
                xb = xt[idx]
                loss = task_loss(model(xb).float(), yt[idx])
                if extra_loss is not None:
                    loss = loss + extra_loss(xb).float().mean()
            loss.backward()
            if grad_hook is not None:
                grad_hook(params)
            opt.step()
            total += float(loss.detach())
            steps += 1
    state = opt.state_dict() if momentum > 0 and optimizer is None else None
    return {"train_loss": total / max(steps, 1), "steps": float(steps)}, state


def opacus_problems(model: nn.Module) -> list[str]:
    """Why Opacus cannot compute per-sample gradients of ``model`` (empty: it can), from its
    own ``ModuleValidator`` — e.g. BatchNorm mixes the samples of a batch."""
    from opacus.validators import ModuleValidator

    training = model.training
    model.train()  # Opacus checks the training-mode graph
    try:
        return [str(e) for e in ModuleValidator.validate(model, strict=False)]
    finally:
        model.train(training)


@dataclass(frozen=True)
class DPSGD:
    """Local DP-SGD (Abadi et al., CCS 2016) with Opacus: per-sample gradients from its
    ``GradSampleModule``, each clipped to ``max_grad_norm`` and Gaussian noise of std
    ``noise_multiplier · max_grad_norm`` added to their sum by its ``DPOptimizer`` (the noise
    drawn from a generator seeded by (seed, round, client)); then the step of
    ``torch.optim.SGD`` (FedProx's proximal gradient, data-independent, is added after the
    noise). The client's ε for the round comes from Opacus' RDP accountant with sampling
    rate q = B/n (B the batch size, n the client's samples): fedray's batches are a shuffled
    partition, not Poisson draws, so, as is customary, ε is that of Poisson sampling at the
    batch's share of the data. Opacus' own ``make_private`` engine sets q = 1/len(loader) =
    1/⌈n/B⌉ instead, which is smaller whenever B does not divide n: fedray's ε is the more
    conservative (n = 100, B = 32: q = 0.32 against 0.25, ε 6.42 against 5.32)."""

    noise_multiplier: float
    max_grad_norm: float = 1.0
    delta: float = 1e-5

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` reports under ``dp_sgd``: the settings and the accounting
        convention (per-client, per-round ε rows are ``dp_sgd_epsilon`` in clients.parquet)."""
        return {"noise_multiplier": self.noise_multiplier, "max_grad_norm": self.max_grad_norm,
                "delta": self.delta, "accountant": "opacus rdp",
                "sampling_rate": "B/n (Opacus' make_private: 1/ceil(n/B), a smaller ε)"}

    def train(self, model: nn.Module, params: list[torch.Tensor], x: np.ndarray,
              y: np.ndarray, *, epochs: int, batch_size: int, lr: float, momentum: float,
              weight_decay: float, seed: int, round: int, client: int,
              max_steps: int | None, device: str, grad_hook: Any, bf16: bool,
              purpose: str) -> dict[str, float]:
        from opacus import GradSampleModule
        from opacus.accountants import RDPAccountant
        from opacus.optimizers import DPOptimizer

        from fedray.core.seeding import torch_generator

        model.train()
        problems = opacus_problems(model)
        if problems:
            raise ValueError(f"local DP-SGD cannot wrap this model: {problems[0]}")
        n = len(x)
        expected = min(batch_size, n)
        sgd = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        opt = DPOptimizer(sgd, noise_multiplier=self.noise_multiplier,
                          max_grad_norm=self.max_grad_norm, expected_batch_size=expected,
                          generator=torch_generator(seed, round, client, f"{purpose}-dp-sgd",
                                                    torch.device(device).type))
        wrapped = GradSampleModule(model)
        xt, yt = input_tensor(x, device), input_tensor(y, device)
        model.train()
        total, steps = 0.0, 0
        try:
            with torch_seeded(seed, round, client, f"{purpose}-torch"):
                for idx in batches(n, batch_size, epochs, seed, round, client, max_steps,
                                   purpose):
                    opt.zero_grad()
                    with torch.autocast(device_type=torch.device(device).type,
                                        dtype=torch.bfloat16, enabled=bf16):
                        loss = task_loss(wrapped(xt[idx]).float(), yt[idx])
                    with warnings.catch_warnings():  # Opacus' hook on an input layer
                        warnings.filterwarnings("ignore", "Full backward hook is firing")
                        loss.backward()
                    if opt.pre_step():  # clip per sample, sum, add noise, scale
                        if grad_hook is not None:
                            grad_hook(params)
                        sgd.step()
                    total += float(loss.detach())
                    steps += 1
        finally:
            wrapped._close()  # the resident model serves the next client unwrapped
        accountant = RDPAccountant()
        if steps:
            accountant.history = [(self.noise_multiplier, expected / n, steps)]
        eps = accountant.get_epsilon(self.delta) if steps and self.noise_multiplier > 0 \
            else (0.0 if not steps else float("inf"))
        return {"train_loss": total / max(steps, 1), "steps": float(steps),
                "dp_sgd_epsilon": float(eps)}


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str = "cpu",
             batch_size: int = 1024) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` on (x, y); per-token targets (y of
    shape (N, steps)) are scored by :func:`evaluate_tokens`, multi-hot targets (float y of
    shape (N, labels)) by :func:`evaluate_multilabel`."""
    if y.dtype.kind == "f":
        return evaluate_multilabel(model, x, y, device, min(batch_size, 256))
    if y.ndim == 2:
        return evaluate_tokens(model, x, y, device, batch_size)
    model.eval()
    n = len(x)
    if n == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "n": 0.0}
    loss, correct = 0.0, 0
    for start in range(0, n, batch_size):
        xb = input_tensor(x[start:start + batch_size], device)
        yb = input_tensor(y[start:start + batch_size], device)
        out = model(xb)
        loss += float(nn.functional.cross_entropy(out, yb, reduction="sum"))
        correct += int((out.argmax(1) == yb).sum())
    return {"loss": loss / n, "accuracy": correct / n, "n": float(n)}


@torch.no_grad()
def evaluate_tokens(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str = "cpu",
                    batch_size: int = 256) -> dict[str, float]:
    """Next-token scores as TFF reports them, over the targets that are not padding
    (``IGNORE``): ``loss`` the mean cross-entropy per non-pad target (what local training
    minimises; Keras' ``mask_zero`` in TFF's models masks by the *input*, so it would also
    count the one pad target after each short sentence's EOS — left out here),
    ``perplexity`` its exponential, ``accuracy`` with the model's ``unscored_targets`` left
    out as well (StackOverflow: TFF's ``accuracy_no_oov_no_eos``; Shakespeare: none, TFF's
    ``accuracy``), ``accuracy_all_tokens`` every non-pad target (TFF's ``accuracy``), and
    ``n`` the tokens ``accuracy`` counts (what weighs a client in a mean over clients, as
    TFF's token-weighted metrics do)."""
    model.eval()
    unscored = torch.tensor(sorted(getattr(model, "unscored_targets", ())), dtype=torch.long,
                            device=device)
    loss, tokens, correct_all, correct, scored = 0.0, 0, 0, 0, 0
    for start in range(0, len(x), batch_size):
        xb = input_tensor(x[start:start + batch_size], device)
        yb = input_tensor(y[start:start + batch_size], device)
        out = model(xb).float()
        loss += float(nn.functional.cross_entropy(out, yb, ignore_index=IGNORE,
                                                  reduction="sum"))
        real = yb != IGNORE
        hit = (out.argmax(1) == yb) & real
        keep = real & ~torch.isin(yb, unscored)
        tokens += int(real.sum())
        correct_all += int(hit.sum())
        correct += int((hit & keep).sum())
        scored += int(keep.sum())
    if tokens == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "n": 0.0,
                "perplexity": float("nan"), "accuracy_all_tokens": float("nan")}
    mean = loss / tokens
    return {"loss": mean, "accuracy": correct / scored if scored else float("nan"),
            "n": float(scored), "perplexity": math.exp(min(mean, 700.0)),
            "accuracy_all_tokens": correct_all / tokens}


AP_THRESHOLDS = 200  # pfl-research's AveragedPrecision default (Keras' num_thresholds)


@torch.no_grad()
def evaluate_multilabel(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str = "cpu",
                        batch_size: int = 256) -> dict[str, float]:
    """Multi-label scores as pfl-research's FLAIR benchmark reports them (its
    ``MultiLabelCNN.metrics``): ``loss`` the binary cross-entropy on the logits averaged
    over images and labels (its "micro loss"), ``accuracy`` the share of (image, label)
    decisions right at a sigmoid of 0.5 (its "micro accuracy"), ``macro_ap`` and
    ``micro_ap`` the averaged precision (:func:`averaged_precision`) per label then
    averaged, and over every (image, label) pair; ``macro_ap_present`` the per-label mean
    over the labels the set has a positive of (with FLAIR's 1,628 fine labels a sampled
    test set misses many, each a 0 in ``macro_ap``); ``n`` the images. The confusion counts
    are taken over the whole set at once, as pfl sums them over its central evaluation
    set."""
    model.eval()
    y = np.asarray(y)  # the whole set's targets (a streamed test partition's too)
    if len(x) == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "n": 0.0,
                "macro_ap": float("nan"), "macro_ap_present": float("nan"),
                "micro_ap": float("nan")}
    loss, correct, scores = 0.0, 0, []
    for start in range(0, len(x), batch_size):
        xb = input_tensor(x[start:start + batch_size], device)
        yb = input_tensor(y[start:start + batch_size], device)
        out = model(xb).float()
        loss += float(nn.functional.binary_cross_entropy_with_logits(out, yb, reduction="sum"))
        p = torch.sigmoid(out)
        correct += int((torch.round(p) == yb).sum())
        scores.append(p.cpu().numpy())
    p = np.concatenate(scores)
    ap, positives = per_label_ap(y, p)  # once for both macro means
    return {"loss": loss / y.size, "accuracy": correct / y.size, "n": float(len(y)),
            "macro_ap": macro_ap(ap, positives),
            "macro_ap_present": macro_ap(ap, positives, present_only=True),
            "micro_ap": averaged_precision(y, p, multi_label=False)}


def bucket_counts(y: np.ndarray, scores: np.ndarray, thresholds: int = AP_THRESHOLDS
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True positives, false positives and false negatives at each of ``thresholds``
    thresholds per label (arrays (thresholds, labels)), Keras' and pfl-research's
    bucketing: a score s falls in bucket max(⌈s·(T−1)⌉ − 1, 0), and threshold i counts
    the scores in buckets ≥ i as predicted positive."""
    y = np.asarray(y, np.float64).reshape(len(y), -1)
    s = np.asarray(scores)  # bucketed in its own precision, as pfl does with float32 scores
    s = s.astype(np.float32) if s.dtype.kind != "f" else s
    bucket = np.maximum(np.ceil(s.reshape(y.shape) * s.dtype.type(thresholds - 1)) - 1,
                        0).astype(np.int64)
    labels = y.shape[1]
    flat = (bucket + np.arange(labels) * thresholds).T.reshape(-1)
    pos = np.bincount(flat, y.T.reshape(-1), labels * thresholds).reshape(labels, thresholds)
    neg = np.bincount(flat, 1 - y.T.reshape(-1), labels * thresholds).reshape(labels,
                                                                             thresholds)
    tp = np.cumsum(pos[:, ::-1], axis=1)[:, ::-1].T
    fp = np.cumsum(neg[:, ::-1], axis=1)[:, ::-1].T
    return tp, fp, y.sum(0)[None, :] - tp


def per_label_ap(y: np.ndarray, scores: np.ndarray, thresholds: int = AP_THRESHOLDS
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Each label's AP as pfl-research's ``AveragedPrecision`` computes it, and the label's
    positives in ``y``: from the counts of :func:`bucket_counts`, precision tp/(tp+fp) and
    recall tp/(tp+fn) (0 where undefined), AP = −Σ_i (r_{i+1} − r_i)·p_i over the
    thresholds (a label without positives scores 0, as in pfl)."""
    tp, fp, fn = bucket_counts(y, scores, thresholds)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.nan_to_num(tp / (tp + fp))
        recall = np.nan_to_num(tp / (tp + fn))
    return -np.sum(np.diff(recall, axis=0) * precision[:-1], axis=0), (tp + fn)[0]


def macro_ap(ap: np.ndarray, positives: np.ndarray, present_only: bool = False) -> float:
    """The mean of the per-label APs of :func:`per_label_ap` (pfl's macro mean), or with
    ``present_only`` over the labels with at least one positive only (NaN when none has)
    — not pfl's number, but the one that does not fall with the share of labels a finite
    test set happens to miss."""
    if present_only:
        ap = ap[positives > 0]
    return float(np.mean(ap)) if ap.size else float("nan")


def averaged_precision(y: np.ndarray, scores: np.ndarray, multi_label: bool,
                       thresholds: int = AP_THRESHOLDS, present_only: bool = False) -> float:
    """pfl-research's ``AveragedPrecision``: ``multi_label`` the :func:`macro_ap` of the
    per-label APs (``present_only`` as there), else the AP of every (row, label) pair
    pooled (micro)."""
    if not multi_label:
        y, scores = np.asarray(y).reshape(-1, 1), np.asarray(scores).reshape(-1, 1)
    return macro_ap(*per_label_ap(y, scores, thresholds), present_only)
