"""Typed, validated experiment configuration.

One loader for every method: a YAML or TOML file plus ``a.b=c`` command-line overrides
become an :class:`ExperimentConfig`. Every check runs before any Ray work, and every failure
is a :class:`ConfigError` naming the field, the value and what is allowed.

The ``model`` and ``algorithm`` sections are open-ended: ``name`` picks an entry of the
model or method registry (:mod:`fedray.core.registry`) and the remaining keys are checked against
that entry's typed parameters (a dataclass for methods, the builder's keyword arguments for
models). A method package may add a top-level section of its own
(:func:`fedray.core.registry.register_section`): it is read, validated, listed by ``fedray config
--keys`` and stored in ``config.yaml`` like the core ones.

Layering: this module sits on the ground floor (it imports :mod:`fedray.core.spec`,
:mod:`fedray.core.registry` and :mod:`fedray.wire.transforms` only); the registry finds the plugins
by name.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import os
import re
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from fedray.core import registry
from fedray.core.spec import (
    ConfigError,
    Knob,
    build_dataclass,
    check_bounds,
    check_kwargs,
    coerce,
    keyword_knobs,
    knobs,
    redact,
    short_repr,
    spec,
)
from fedray.wire.transforms import parse_transforms

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


DEFAULT_METHOD = registry.DEFAULT_METHOD  # the method of a config that names none
EVAL_ALL_MAX = 100_000  # eval.clients=all beyond this is refused (every client, every round)

# ----------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    dataset: str = spec(
        "digits", help="a registered dataset (fedray.data.catalog): "
                       "digits ships with scikit-learn; cifar* read a local torchvision root; "
                       "blogtext reads a BlogText-schema CSV (FAVoR); parquet (a file or "
                       "directory) and hf (a Hugging Face `datasets` save_to_disk directory) "
                       "are split by data.client_column, one client per natural id; leaf "
                       "reads LEAF's JSON shards (train/ and test/), one client per user; tff "
                       "reads TensorFlow Federated's train/test .h5 files, one client per "
                       "client id; flair reads pfl-research's FLAIR HDF5 file, one client "
                       "per train user (multi-label)")
    root: str | None = spec(None, help="local directory of a torchvision dataset (cifar*), "
                                       "the CSV file (blogtext), the Parquet file or "
                                       "directory (parquet), the save_to_disk directory (hf), "
                                       "the dataset directory (leaf, tff), FLAIR's .hdf5 "
                                       "file or its directory (flair)")
    hf_id: str | None = spec(None, help="hf: a Hugging Face dataset id (flwrlabs/femnist, "
                                        "sentiment140, ...) read from the local hub cache "
                                        "(HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/"
                                        "hub) instead of data.root; fetched only with "
                                        "data.download=true")
    hf_split: str = spec("train", help="hf with hf_id: the split whose Parquet files are read")
    hf_revision: str = spec("main", help="hf with hf_id: the ref or commit of the snapshot "
                                         "(refs/convert/parquet: the hub's Parquet "
                                         "conversion)")
    hf_config: str | None = spec(None, help="hf with hf_id: the configuration (top-level "
                                            "folder) when the split has files in several")
    client_column: str | None = spec(None, help="parquet/hf: the column naming each row's "
                                                "client (author, writer, device)")
    label_column: str = spec("label", help="parquet/hf: the integer class column; tff: the "
                                           "label dataset of each client; flair: the label "
                                           "set, labels (17 coarse, the default) or "
                                           "fine_grained_labels (1,628)")
    max_client_samples: int | None = spec(
        None, ge=1, help="flair: a user's first images kept (default pfl-research's "
                         "max_num_user_images, 512)")
    feature_columns: list[str] | None = spec(
        None, help="parquet/hf: numeric feature columns, or one fixed-size list column "
                   "(default: every numeric column but the client and label ones)")
    vocab: str | None = spec(
        None, help="word vocabularies (tff StackOverflow tokens, leaf Sent140): a file "
                   "inside data.root whose first data.vocab_size words are the vocabulary, "
                   "most frequent first: TFF's stackoverflow.word_count ('word count' a "
                   "line); for Sent140 also LEAF's embs.json (its vocab list) or GloVe's "
                   ".txt (the first token of each line). Default: the one *.word_count file "
                   "of data.root, else the train split's own counts (TFF: users using each "
                   "word; Sent140: occurrences; ties in first-seen order)")
    vocab_size: int = spec(10_000, ge=1, le=1_000_000,
                           help="words in the vocabulary (tff StackOverflow, TFF's 10,000: "
                                "ids pad 0, words 1..V, OOV V+1, BOS V+2, EOS V+3; leaf "
                                "Sent140: words 0..V-1, one id V for unknown words and "
                                "padding, as LEAF's line_to_indices; model.vocab = V + 1)")
    seq_len: int | None = spec(
        None, ge=1, le=4096, help="text: steps per example (default the source's: TFF's 20 "
                                  "words a StackOverflow sentence and 80 characters a "
                                  "Shakespeare window, LEAF's 25 words a tweet)")
    cache_dir: str | None = spec(
        None, help="parquet/hf/leaf: where the memory-mapped Arrow copy is kept (default "
                   "$FEDRAY_CACHE or ~/.cache/fedray)")
    synthetic_per_client: int | None = spec(
        None, ge=2, help="synthetic: draw each client's samples on demand from (seed, client)"
                         ", this many per client (memory and setup independent of "
                         "clients.num_clients); default: one pooled synthetic set, split")
    split_seed: int | None = spec(
        None, ge=0, help="seed of an array dataset's train/test split (digits; the pooled "
                         "synthetic set: also its draw); default: the run's seed. Fix it "
                         "to keep one test set across seeds, e.g. to share one pretrained "
                         "base (a base must never have seen the run's test samples: "
                         "checked before Ray starts)")
    download: bool = spec(False, help="let torchvision download cifar* into root; hf: let "
                                      "huggingface_hub fetch data.hf_id's Parquet files "
                                      "into its cache")
    image_size: int | None = spec(None, ge=8, help="upsample digits to this square size; "
                                                   "flair: resize the photos to it (Pillow "
                                                   "bilinear; default the file's 256)")
    channels: int = spec(1, ge=1, le=3, help="digits channels (3 replicates the grey image)")
    partition: Literal["iid", "dirichlet", "pathological", "shard", "inner_dirichlet",
                       "quantity", "linear", "square", "exponential"] = spec(
        "iid", help="iid; dirichlet (label skew, alpha); pathological (classes_per_client); "
                    "shard (McMahan et al. 2017: label-sorted shards, shards_per_client each); "
                    "inner_dirichlet (Flower's: inner_sizes samples each, classes ~ "
                    "Dirichlet(alpha) per client); quantity (sizes ~ Dirichlet(quantity_alpha)"
                    "); linear / square / exponential: Flower Datasets' size partitions, "
                    "client i of N gets a share i, i^2 or e^i of the samples (labels iid)")
    alpha: float = spec(0.5, gt=0, help="Dirichlet label-skew concentration")
    classes_per_client: int = spec(2, ge=1, help="pathological skew: classes per client")
    shards_per_client: int = spec(2, ge=1, help="shard: label-sorted shards per client (Flower's "
                                                "num_shards_per_partition)")
    inner_sizes: Literal["equal", "quantity", "linear", "square", "exponential"] = spec(
        "equal", help="inner_dirichlet: each client's size (equal, quantity ~ "
                      "Dirichlet(quantity_alpha), or a Flower size partition)")
    quantity_alpha: float = spec(0.5, gt=0, help="quantity skew: Dirichlet over client sizes")
    min_samples: int = spec(4, ge=1, help="minimum samples per client (train + test; Flower "
                                          "Datasets' min_partition_size): dirichlet redraws "
                                          "up to 100 times until every client has it, the "
                                          "other partitions refuse a split that misses it; "
                                          "the natural splits (leaf, tff, flair) keep the "
                                          "users that have it, the others at least 2")
    local_test_fraction: float = spec(0.2, gt=0, lt=1, help="share of a shard held out locally")
    feature_skew: float = spec(0.0, ge=0, help="strength of the per-client input transform")
    drift_round: int | None = spec(None, ge=1, help="round from which drifted labels apply")
    drift_fraction: float = spec(0.5, ge=0, le=1, help="share of clients whose labels drift")
    synthetic_samples: int = spec(6000, ge=10, help="dataset=synthetic: samples drawn in "
                                                    "all (train and test)")
    synthetic_features: int = spec(784, ge=1, help="dataset=synthetic: input features")
    synthetic_classes: int = spec(10, ge=2, help="dataset=synthetic: label classes")
    synthetic_test_fraction: float = spec(0.2, gt=0, lt=1, help="dataset=synthetic: share "
                                                                "held out as the global test "
                                                                "set")


@dataclass
class ClientsConfig:
    num_clients: int = spec(10, ge=1, help="clients in the population (the data is "
                                           "partitioned among them)")
    fraction: float = spec(1.0, gt=0, le=1, help="share of clients sampled each round")
    per_round: int | None = spec(None, ge=1, help="clients sampled each round (wins over fraction)")
    tiers: list[str] | None = spec(None, help="tier name per client; default round-robin")
    tier_fractions: list[float] | None = spec(
        None, help="share of the clients in each runtime tier, in tier order (a client's tier "
                   "is a pure function of (seed, client): no per-client list)")

    def sampled_count(self) -> int:
        if self.per_round is not None:
            return self.per_round
        return max(1, int(round(self.fraction * self.num_clients)))


@dataclass
class LocalConfig:
    epochs: int = spec(1, ge=1, help="passes over a client's training data per round")
    batch_size: int = spec(32, ge=1, help="a client's minibatch size")
    lr: float = spec(0.05, gt=0, help="the clients' SGD learning rate")
    momentum: float = spec(0.0, ge=0, lt=1, help="the clients' SGD momentum (its buffer "
                                                 "starts at zero each round unless "
                                                 "keep_optimizer_state)")
    weight_decay: float = spec(0.0, ge=0, help="the clients' SGD weight decay (L2, added to "
                                               "the gradient)")
    max_steps: int | None = spec(None, ge=1, help="cap on local steps per round")
    keep_optimizer_state: bool = spec(
        False, help="keep each client's momentum buffer between rounds (client state store)")
    bf16: bool = spec(False, help="autocast forward passes to bfloat16 (fp32 master weights)")
    dp_noise_multiplier: float | None = spec(
        None, ge=0, help="local DP-SGD with Opacus (per-sample clipping, Gaussian noise of this "
                         "multiplier on each batch's gradient sum); None: off")
    dp_max_grad_norm: float = spec(1.0, gt=0, help="local DP-SGD: per-sample gradient clip norm")
    dp_delta: float = spec(1e-5, gt=0, lt=1, help="local DP-SGD: δ of the per-client, "
                                                  "per-round ε reported by Opacus' RDP "
                                                  "accountant at q = batch_size / the "
                                                  "client's samples (Opacus' make_private "
                                                  "uses 1/len(loader): a smaller ε)")


@dataclass
class PayloadConfig:
    upload: str = spec("fp32", help="wire codec of every uploaded float tensor: a registered "
                                    "codec (fedray.wire.payload: fp32, bf16, int8, int4)")
    download: str = spec("fp32", help="wire codec of the broadcast: a registered codec "
                                      "marked for broadcasts (fp32, bf16)")
    transforms: list[str | dict[str, Any]] = spec(
        default_factory=list, help="update transforms each upload passes through, in order "
                                   "(fedray.wire.transforms): topk, powersgd, int8, int4, bf16, as "
                                   "a name or {name: topk, density: 0.1}; 'weights' first "
                                   "sends weights θ_t+Δ instead of Δ ([weights, int4]: int4 "
                                   "FedAvg of weights); for methods whose upload has the "
                                   "broadcast's shapes (FedAvg family, ORDERS)")
    error_feedback: bool = spec(True, help="feed what the transform chain dropped back into "
                                           "the client's next upload")


@dataclass
class EvalConfig:
    every: int = spec(1, ge=0, help="evaluate every k rounds (0: only after the last round)")
    clients: Literal["all", "sampled", "none"] = spec(
        "all", help="whose local test split the global model is evaluated on")
    global_test: bool = spec(True, help="evaluate the global model on the global test set "
                                        "(global_accuracy)")
    global_test_set: Literal["sample", "all"] = spec(
        "sample", help="what the global test set is: sample, a seeded draw held in memory (at "
                       "most 10,000 rows and 512 MB of inputs, e.g. 682 FLAIR images at 256 "
                       "px); all, every row of the dataset's stored test partition (a natural "
                       "or table dataset's kept clients' test rows, FLAIR's test users' "
                       "images), streamed from the cache batch by batch in the scoring "
                       "executor. Datasets held in memory (digits, CIFAR, synthetic) score "
                       "their whole test set either way")
    local_before_after: bool = spec(
        False, help="clients report local test accuracy before and after their update")
    finetune_epochs: int = spec(0, ge=0, help="also report personalized accuracy after this "
                                              "many local fine-tuning epochs (0: off)")


@dataclass
class TierConfig:
    name: str = spec("default", help="tier name (clients.tiers refers to it)")
    executors: int = spec(2, ge=1, help="executor actors of this tier")
    num_cpus: float = spec(1.0, ge=0, help="CPUs per executor")
    num_gpus: float = spec(0.0, ge=0, le=1, help="fraction of one GPU per executor")
    capacity: float = spec(
        1.0, gt=0, le=1, help="budget ρ: the share of the full model's parameters (or FLOPs) "
                              "this tier's sub-model holds (sub-model methods)")
    resources: dict[str, float] = spec(
        default_factory=dict, help="custom Ray resources per executor (maps tiers to node "
                                   "types, e.g. {tier_full: 0.25})")
    accelerator_type: str | None = spec(
        None, help="pin the tier's executors to one GPU type (Ray's accelerator_type, e.g. "
                   "A100, A10G, H100): one GPU type per tier, required by "
                   "runtime.deterministic on GPU tiers")


@dataclass
class RuntimeConfig:
    tiers: list[TierConfig] = spec(default_factory=lambda: [TierConfig()],
                                   help="capacity tiers: executors of one resource shape each")
    device: Literal["auto", "cpu", "cuda"] = spec(
        "auto", help="cpu: no GPU anywhere; cuda: every tier asks for its num_gpus (> 0); "
                     "auto: each tier's num_gpus as written, except on a local Ray started by "
                     "this run without GPUs (then cpu). An executor uses CUDA only when Ray "
                     "granted it a GPU share")
    deterministic: bool = spec(
        False, help="deterministic GPU kernels (cuDNN/cuBLAS, no TF32) in every executor: "
                    "bitwise-repeatable GPU runs on one GPU type (CPU runs always are)")
    threads_per_executor: int = spec(1, ge=1, help="torch threads in each executor")
    max_client_retries: int = spec(2, ge=0, help="re-runs of a failing client within a round")
    min_accepted: int = spec(
        1, ge=0, help="fewest accepted uploads a round needs; a round with fewer stops the "
                      "run with an error naming the round and the clients' errors")
    max_executor_restarts: int = spec(5, ge=0, help="executor deaths (and timeouts) a run "
                                                    "survives; one more stops it")
    call_timeout_s: float | None = spec(
        None, gt=0, help="an executor busy this many seconds without returning a result is "
                         "killed and replaced; its clients count a failed attempt (default: "
                         "no limit)")
    placement_timeout_s: float | None = spec(
        None, gt=0, help="fail if executors cannot be placed within this many seconds "
                         "(default 60 on a local Ray, 1800 on a cluster whose GPU nodes may "
                         "still be booting)")
    checkpoint_every: int = spec(1, ge=1, help="write a resumable checkpoint every k rounds "
                                               "(and after the last)")
    chunk_size: int | None = spec(None, ge=1, help="clients per executor call (default: two "
                                                   "calls per executor; with reduce=executors "
                                                   "8 near-equal calls per tier, so a tier "
                                                   "with more executors needs this set, and "
                                                   "with cohorts min(8, ceil(K / C)) "
                                                   "calls for cohorts of C "
                                                   "(runtime.cohort_size), each about a "
                                                   "cohort or more; "
                                                   "with cohorts and reduce=driver one "
                                                   "cohort a call)")
    reduce: Literal["driver", "executors"] = spec(
        "driver", help="where a linear rule's (FedAvg, FedProx, FedAvgM, FAVoR) uploads are "
                       "summed. driver: every upload goes to the driver, which sums them in "
                       "client-id order; executors: each executor call sums its clients' "
                       "weighted uploads in float64 and sends one partial sum, and the driver "
                       "adds the partials in client order — far fewer bytes through the object "
                       "store, the same result for any executor count, equal to driver's up "
                       "to float64 rounding. Not with central DP, update transforms, an "
                       "asynchronous rule or fleet participation rules (availability, "
                       "deadline, over-commitment)")
    vectorize: Literal["auto", "on", "off"] = spec(
        "off", help="train each executor call's clients of one tier in cohorts (see "
                    "runtime.cohort_size), each one batched computation (torch.func vmap over "
                    "stacked parameters) instead of one after another; each client's update "
                    "equals the sequential one up to float32 rounding, and a run is bitwise "
                    "the same for any executor count and across --resume. on: always (an "
                    "error where the method or model cannot); auto: where they can, the model "
                    "is dense (linear layers, activations) and one client's local step is at "
                    "most 1M multiply-adds (trainable parameters x local.batch_size), where "
                    "batching measured faster on a CPU (FLITE: where its factor products are "
                    "at least 1/20 of its network's multiply-adds per step); off: one client "
                    "at a time. Methods: the FedAvg family (FedAvg, FedProx, FedAvgM, FedOpt, "
                    "ORDERS, top-k, PowerSGD), FAVoR's favor, fedavg and fedprox "
                    "variants (authors through one base LM), FLITE (stacked latents "
                    "through one mapped base) and DROD and its sub-model baselines (one "
                    "tier's clients, grouped per step by the sub-model drawn; not with "
                    "continual.method er, derpp, bic)")
    cohort_size: int | None = spec(
        None, ge=1, help="most clients per cohort with runtime.vectorize (default: sized by "
                         "the round, max(256, ceil(K / 16)) for a tier's K clients, past 256 "
                         "only as far as 256 MB of the cohort's stacked training state "
                         "holds). A "
                         "tier's sorted clients of a round are cut into near-equal cohorts, "
                         "one executor call each (with reduce=executors: near-equal cohorts "
                         "within each summation group)")
    ray_address: str | None = spec(None, help="Ray cluster; default RAY_ADDRESS or local")
    keep_warm: bool = spec(
        False, help="keep Ray, the driver and the executors up after the run, emptied, for "
                    "the next run of this Python process with the same executor shapes (a "
                    "job comparing methods, a notebook): it skips Ray's start and the "
                    "actors' torch import, with the bits of a cold run "
                    "(fedray.runtime.release_warm() frees them)")
    include_dashboard: bool = spec(False, help="start Ray's dashboard with a local Ray "
                                               "(listens on 127.0.0.1)")


@dataclass
class FleetConfig:
    """Device speed, network and availability of the clients, and how rounds treat them
    (:mod:`fedray.services.fleet`). The clock always runs (``sim_seconds`` in every round row); the
    participation rules are off by default."""

    trace: str | None = spec(None, help="device-capacity CSV/Parquet: client_id, "
                                        "compute_ms_per_sample, down_kbps, up_kbps[, "
                                        "latency_ms] (clients it lacks are drawn)")
    availability: str | None = spec(None, help="availability CSV/Parquet: client_id, start_s, "
                                               "end_s (online intervals; clients it lacks "
                                               "are always online)")
    availability_period_s: float | None = spec(None, gt=0, help="repeat the availability "
                                                                "trace with this period")
    compute_ms_per_sample: float = spec(5.0, gt=0, help="median compute time per sample of "
                                                        "the full model (drawn profiles)")
    compute_sigma: float = spec(0.5, ge=0, help="log-normal spread of compute speed")
    down_kbps: float = spec(20_000.0, gt=0, help="median download bandwidth (drawn profiles)")
    up_kbps: float = spec(5_000.0, gt=0, help="median upload bandwidth (drawn profiles)")
    bandwidth_sigma: float = spec(0.5, ge=0, help="log-normal spread of bandwidth")
    latency_ms: float = spec(50.0, ge=0, help="per-round latency (drawn profiles)")
    tier_speed: dict[str, float] = spec(
        default_factory=dict, help="compute speed multiplier per tier (e.g. {full: 4, "
                                   "half: 2, quarter: 1}); default 1")
    dropout: float = spec(0.0, ge=0, lt=1, help="probability a sampled client drops out "
                                                "mid-round (no upload)")
    deadline_s: float | None = spec(None, gt=0, help="round deadline in simulated seconds: "
                                                     "later clients are dropped")
    overcommit: float = spec(0.0, ge=0, help="sample ceil((1+o)K) clients, aggregate the "
                                             "first K to finish in simulated time")
    min_reports: int = spec(0, ge=0, help="a round with fewer aggregated reports is logged as "
                                          "failed and leaves the model unchanged")

    def validate(self, cfg: Any) -> None:
        names = [t.name for t in cfg.runtime.tiers]
        for tier, v in self.tier_speed.items():
            if tier not in names:
                raise ConfigError(f"fleet.tier_speed.{tier}", v, f"a tier of {names}")
            if not v > 0:
                raise ConfigError(f"fleet.tier_speed.{tier}", v, "a speed > 0")
        if self.min_reports > cfg.clients.sampled_count():
            raise ConfigError("fleet.min_reports", self.min_reports,
                              f"at most the {cfg.clients.sampled_count()} clients per round")
        from fedray.core.storage import absolute
        from fedray.services.fleet import Fleet

        for key in ("trace", "availability"):  # the driver actor may run elsewhere
            if getattr(self, key):
                setattr(self, key, absolute(getattr(self, key)))
        fleet = Fleet.of(cfg)  # reads and checks the trace files
        tr = fleet.trace
        if self.deadline_s is not None and tr is not None and tr.known.all():
            latency = np.where(np.isnan(tr.latency_ms), self.latency_ms, tr.latency_ms)
            fastest = float(np.min(latency + tr.compute_ms)) / 1000  # one sample, no bytes
            if fastest > self.deadline_s:
                raise ConfigError("fleet.deadline_s", self.deadline_s,
                                  f"a deadline some client can meet (the fastest device in "
                                  f"{self.trace} needs {fastest:g} s for its latency and one "
                                  f"sample alone)")


@dataclass
class DPConfig:
    """Central, client-level differential privacy: DP-FedAvg (McMahan et al., ICLR 2018) with
    an accountant from Google's ``dp-accounting`` (:mod:`fedray.services.privacy`)."""

    enabled: bool = spec(False, help="clip every client's update and add Gaussian noise to "
                                     "their sum (needs noise_multiplier or target_epsilon)")
    clip_norm: float = spec(1.0, gt=0, help="C: L2 bound of one client's update (the initial "
                                            "bound with adaptive_clip)")
    noise_multiplier: float | None = spec(None, ge=0, help="σ: the noise on the sum has std "
                                                           "σ·C (0 needs allow_no_noise)")
    allow_no_noise: bool = spec(False, help="accept dp.noise_multiplier=0: clipping only, "
                                            "ε = ∞ (no privacy; a baseline)")
    target_epsilon: float | None = spec(None, gt=0, help="calibrate σ before the run so that "
                                                         "ε after all rounds is at most this")
    delta: float | None = spec(None, gt=0, lt=1, help="δ of the reported ε (default "
                                                      "min(1/N^1.1, 1e-5) for N clients)")
    accountant: Literal["auto", "rdp", "pld"] = spec(
        "auto", help="privacy accountant (dp-accounting): rdp (Rényi DP), pld (privacy loss "
                     "distributions; Poisson sampling, or releases without sampling, where "
                     "it is exact), auto: pld without sampling (K = N, FedBuff/FedAsync "
                     "buffers), rdp otherwise")
    sampling: Literal["fixed", "poisson"] = spec(
        "fixed", help="fixed: clients.per_round drawn without replacement; poisson: every "
                      "client joins with q = per_round / N")
    adaptive_clip: bool = spec(False, help="adapt C to a quantile of the update norms "
                                           "(Andrew et al., NeurIPS 2021)")
    target_quantile: float = spec(0.5, gt=0, lt=1, help="adaptive_clip: γ, the share of "
                                                        "updates C should bound")
    clip_lr: float = spec(0.2, gt=0, help="adaptive_clip: η_C of C ← C·exp(−η_C (b̄ − γ))")
    count_noise: float | None = spec(None, gt=0, help="adaptive_clip: σ_b, std of the noise on "
                                                      "the clipped count (default K/20)")

    def validate(self, cfg: Any) -> None:
        if not self.enabled:
            return
        from fedray.services.privacy import check_config

        check_config(cfg)


@dataclass
class TrackingConfig:
    """Experiment tracking through the libraries themselves (:mod:`fedray.observe.tracking`)."""

    tensorboard: bool = spec(False, help="write every round's metrics and the config with "
                                         "TensorBoard's SummaryWriter to RUN_DIR/tensorboard")
    mlflow: str | None = spec(None, help="log to MLflow at this tracking URI (a local path or "
                                         "file: URI is a file store: no server needed)")
    mlflow_experiment: str | None = spec(None, help="MLflow experiment name (default: the "
                                                    "config's name)")

    def validate(self, cfg: Any) -> None:
        from fedray.observe.tracking import check_config

        check_config(cfg)


@dataclass
class PretrainConfig:
    """Central pretraining of a shared base (``fedray pretrain``); the FLITE paper's recipe
    (App. 0.C): SGD momentum 0.9, lr 0.05 with a 3-epoch linear warmup then cosine decay,
    weight decay 5e-4, batch 128, 100 epochs. Two parts of that recipe are opt-in here, not
    defaults: its crop+flip augmentation (``augment``, images only) and its GroupNorm with 32
    groups (``model.groups``; the ResNets' default of 8 is DROD's rule).
    ``jobs/flite_cifar100.py`` sets both, as the paper does."""

    epochs: int = spec(100, ge=1, help="epochs of central training")
    lr: float = spec(0.05, gt=0, help="peak SGD learning rate (after the warmup; cosine decay "
                                      "to 0)")
    momentum: float = spec(0.9, ge=0, lt=1, help="SGD momentum")
    weight_decay: float = spec(5e-4, ge=0, help="SGD weight decay")
    batch_size: int = spec(128, ge=1, help="minibatch size")
    warmup_epochs: int = spec(3, ge=0, help="epochs of linear learning-rate warmup")
    head: Literal["orthogonal", "kaiming", "trainable"] = spec(
        "orthogonal", help="classifier head: frozen orthogonal (FLITE), frozen Kaiming, trainable")
    classes: list[int] | None = spec(None, help="pretrain on these classes only (default all)")
    fraction: float = spec(1.0, gt=0, le=1, help="share of the (selected) train set used")
    threads: int | None = spec(
        None, ge=1, help="torch intra-op threads while pretraining on the CPU (default: "
                         "torch's, the cores); a base's bits depend on it (the order of "
                         "float sums), so fix it to reproduce a base on another machine "
                         "(base.json records it)")
    augment: bool = spec(False, help="random crop (zero pad 4) + horizontal flip of each "
                                     "image, drawn from (seed, epoch): FLITE App. 0.C's "
                                     "'standard crop+flip' (images only)")


def _redacted(value: Any) -> Any:
    """``value`` with :func:`redact` applied to every string in it (dicts and lists walked)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    return value


@dataclass
class ExperimentConfig:
    name: str = spec("experiment", help="the run's name: letters, digits, '.', '_', '-' "
                                        "(the default run directory is runs/NAME-TIMESTAMP)")
    seed: int = spec(0, ge=0, help="the one seed: data, partition, sampling, initial model "
                                   "and every client's draws derive from it")
    rounds: int = spec(10, ge=1, help="federated rounds (server steps); --resume may raise it")
    run_dir: str | None = spec(None, help="local path or pyarrow.fs URI; default "
                                          "runs/NAME-TIMESTAMP")
    data: DataConfig = spec(default_factory=DataConfig)
    clients: ClientsConfig = spec(default_factory=ClientsConfig)
    model: dict[str, Any] = spec(default_factory=lambda: {"name": "mlp"})
    algorithm: dict[str, Any] = spec(default_factory=lambda: {"name": DEFAULT_METHOD})
    server: dict[str, Any] = spec(default_factory=lambda: {"optimizer": None},
                                  help="the server optimizer (server.optimizer) and its "
                                       "hyperparameters")
    local: LocalConfig = spec(default_factory=LocalConfig)
    payload: PayloadConfig = spec(default_factory=PayloadConfig)
    eval: EvalConfig = spec(default_factory=EvalConfig)
    runtime: RuntimeConfig = spec(default_factory=RuntimeConfig)
    fleet: FleetConfig = spec(default_factory=FleetConfig)
    dp: DPConfig = spec(default_factory=DPConfig)
    tracking: TrackingConfig = spec(default_factory=TrackingConfig)
    pretrain: PretrainConfig = spec(default_factory=PretrainConfig)
    smoke: dict[str, Any] = spec(
        default_factory=dict, help="a CPU-sized version of this setup: 'key: value' "
                                   "overrides (dotted keys) that `fedray run --smoke` "
                                   "applies before -s (configs/benchmarks/ has them)")
    sections: dict[str, Any] = field(default_factory=lambda: default_sections(), repr=False,
                                     metadata={"internal": True})

    def __getattr__(self, name: str) -> Any:
        """A section a method package registered (e.g. ``cfg.continual``)."""
        found = self.__dict__.get("sections") or {}
        if name in found:
            return found[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Every field, registered sections at the top level; the credentials in any URI
        (``runtime.ray_address``, ``run_dir``, ``data.root``: user info and secret query
        values) redacted — this is what config.yaml stores."""
        out = dataclasses.asdict(self)
        out.update(out.pop("sections"))
        return _redacted(out)

    def tier_of(self, client_id: int) -> str:
        """The tier of a client (:meth:`tiers_of`)."""
        return self.tiers_of([client_id])[0]

    def tiers_of(self, clients: Any) -> list[str]:
        """The tiers of ``clients``: ``clients.tiers[c]``, else by ``clients.tier_fractions``
        (a uniform draw from (seed, client) against the cumulative shares, vectorised), else
        round-robin over ``runtime.tiers``."""
        ids = np.asarray(clients, dtype=np.int64)
        if self.clients.tiers is not None:
            return [self.clients.tiers[c] for c in ids.tolist()]
        names = [t.name for t in self.runtime.tiers]
        fractions = self.clients.tier_fractions
        if fractions is not None:
            from fedray.core.seeding import uniform

            edges = np.cumsum(fractions) / float(np.sum(fractions))
            idx = np.minimum(np.searchsorted(edges, uniform(self.seed, -1, ids, "tier"),
                                             side="right"), len(names) - 1)
        else:
            idx = ids % len(names)
        return [names[i] for i in idx.tolist()]


# ----------------------------------------------------------------------------- loading


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader (no Python tags) reading numbers and booleans as YAML 1.2 does:
    ``1e-3`` and ``1E5`` are floats (YAML 1.1 wants ``1.0e-3``, and PyYAML reads ``1e-3`` as
    a string), and only ``true`` / ``false`` are booleans (YAML 1.1 also reads ``on``,
    ``off``, ``yes``, ``no`` as booleans, which would turn ``runtime.vectorize=on`` into
    ``True``), so a value means the same in a config file, in ``-s key=value`` and in the
    CLI option that mirrors the key."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag != "tag:yaml.org,2002:bool"]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """A mapping that names a key twice is refused (PyYAML keeps the last silently, so
        ``local:`` written twice would drop the first section); keys a merge (``<<``)
        brings in may still be overridden."""
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != \
                    "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found the key {key_node.value!r} twice", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"))
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """A YAML document through :class:`ConfigLoader`."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 — a SafeLoader subclass


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], c) with ``c`` parsed as a YAML scalar/list."""
    if "=" not in text:
        raise ConfigError(text, text, "overrides of the form key.sub=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(key or text, text, "a dotted key such as local.lr")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ValueError as e:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(key, raw[:40] + "...", f"a value YAML can read ({e})"[:200]) \
            from None
    except RecursionError:
        raise ConfigError(key, raw[:40] + "...", f"a value nested at most {MAX_CONFIG_DEPTH} "
                                                 f"levels deep") from None
    check_size(value, text[:80], key)
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    for text in overrides:
        keys, value = parse_override(text)
        set_key(data, keys, value, text)
    return data


def set_key(data: dict[str, Any], keys: list[str], value: Any, text: str) -> None:
    """Set the dotted ``keys`` of ``data`` to ``value`` (``text``: what to name in an
    error), creating sections on the way; list entries by index."""
    node = data
    for i, k in enumerate(keys[:-1]):
        if isinstance(node, list):  # e.g. runtime.tiers.0.executors
            entry = node[int(k)] if k.isdigit() and int(k) < len(node) else None
            if not isinstance(entry, dict):
                raise ConfigError(".".join(keys[: i + 1]), text,
                                  f"an index below {len(node)} of a list of sections")
            node = entry
            continue
        nxt = node.get(k)
        if nxt is None and keys[i + 1].isdigit():
            raise ConfigError(".".join(keys[: i + 2]), text,
                              f"an index into a list the config sets; this config has no "
                              f"{'.'.join(keys[: i + 1])} list: give it whole, e.g. "
                              f"-s '{'.'.join(keys[: i + 1])}=[{{...}}]'")
        if nxt is None:
            nxt = node[k] = {}
        if isinstance(nxt, list) and keys[i + 1].isdigit():
            node = nxt
            continue
        if not isinstance(nxt, (dict, list)):
            raise ConfigError(".".join(keys[: i + 1]), nxt, "a section to set keys in")
        node = nxt
    last = keys[-1]
    if isinstance(node, list):
        idx = int(last)
        if idx >= len(node):
            raise ConfigError(".".join(keys), value, f"an index below {len(node)}")
        node[idx] = value
    else:
        node[last] = value


MAX_CONFIG_BYTES = 1 << 20  # a config is a page of text, not a dataset
MAX_CONFIG_NODES = 100_000  # values after YAML aliases are expanded
MAX_CONFIG_DEPTH = 32


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object that names a key twice is refused (``json`` keeps the last)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k!r} appears twice in one object")
        out[k] = v
    return out


def parse_text(data: bytes, fmt: str, where: str, field: str = "config file") -> dict[str, Any]:
    """A config document (``fmt``: yaml, toml or json) as a mapping, through the guards every
    config read back goes through — a file given on the command line and the
    ``config.yaml`` a run directory stores alike: at most 1 MiB, UTF-8, nesting at most 32
    deep, at most 100,000 values once YAML aliases are expanded (an alias bomb is refused,
    not expanded), a mapping at the top. Safe loaders only (no Python tags)."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(field, where, f"a config of at most {MAX_CONFIG_BYTES:,} bytes "
                                        f"(this one has {len(data):,})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, where, f"UTF-8 text (byte {e.start} is not)") from None
    try:
        if fmt == "toml":
            out = tomllib.loads(text)
        elif fmt == "json":
            out = json.loads(text, object_pairs_hook=_unique_keys)
        else:
            out = load_yaml(text)
    except (yaml.YAMLError, ValueError) as e:  # TOML's and JSON's errors are ValueErrors,
        # as is an integer past Python's 4,300-digit conversion limit
        reason = " ".join(str(e).split())[:200]  # one line, bounded
        raise ConfigError(field, where, f"valid {fmt}: {reason}") from None
    except RecursionError:
        raise ConfigError(field, where, f"nesting at most {MAX_CONFIG_DEPTH} levels deep") \
            from None
    check_size(out, where, field)
    if out is None:
        out = {}
    if not isinstance(out, dict):
        raise ConfigError(field, where, f"a mapping at the top level (got a "
                                        f"{type(out).__name__})")
    return out


def check_size(data: Any, where: str, field: str = "config file") -> None:
    """Refuse a parsed document nested deeper than :data:`MAX_CONFIG_DEPTH` or holding more
    than :data:`MAX_CONFIG_NODES` values counted as if expanded (shared YAML aliases count
    once per use), walking it without recursion and without expanding it."""
    stack, nodes = [(data, 0)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_CONFIG_NODES:
            raise ConfigError(field, where, f"at most {MAX_CONFIG_NODES:,} values (YAML "
                                            f"aliases counted expanded)")
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(field, where, f"nesting at most {MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            stack.extend((k, depth + 1) for k in node if isinstance(k, (tuple, dict, list)))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config file", str(path), "an existing .yaml, .yml, .toml or .json file")
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError("config file", str(path), f"a readable file ({e.strerror})") \
            from None
    fmt = {".toml": "toml", ".json": "json"}.get(p.suffix, "yaml")
    return parse_text(data, fmt, str(path))


def default_sections() -> dict[str, Any]:
    """Every registered section at its defaults."""
    return {name: cls() for name, cls in registry.sections().items()}


def build_config(data: dict[str, Any]) -> ExperimentConfig:
    """The typed config of a mapping: core fields and registered sections, unknown keys
    rejected (the message lists both)."""
    if not isinstance(data, dict):
        raise ConfigError("<root>", data, "a mapping")
    extra = registry.sections()
    core = {f.name for f in dataclasses.fields(ExperimentConfig)} - {"sections"}
    for key in data:
        if key not in core and key not in extra:
            raise ConfigError(str(key), data[key], "known keys of 'config': "
                              + ", ".join(sorted(core | set(extra))))
    found = {name: build_dataclass(cls, data.get(name), name) for name, cls in extra.items()}
    cfg = build_dataclass(ExperimentConfig, {k: v for k, v in data.items() if k in core})
    cfg.sections = found
    return cfg


def load_config(path: str | os.PathLike | None = None, overrides: typing.Iterable[str] = (),
                base: dict[str, Any] | None = None, smoke: bool = False) -> ExperimentConfig:
    """Read ``path`` (YAML/TOML/JSON), apply overrides — with ``smoke`` first the file's own
    ``smoke`` overrides — and validate everything."""
    data: dict[str, Any] = json.loads(json.dumps(base)) if base else {}
    if path is not None:
        data = _merge(data, read_file(path))
    if smoke:
        found = data.get("smoke")
        if not isinstance(found, dict) or not found:
            raise ConfigError("smoke", found, "a mapping of 'key: value' overrides in the "
                                              "config (--smoke runs a config's smoke size)")
        for key, value in found.items():
            set_key(data, str(key).split("."), value, f"smoke.{key}")
    data = apply_overrides(data, overrides)
    cfg = build_config(data)
    validate(cfg)
    return cfg


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dataset_shape(data: DataConfig) -> tuple[tuple[int, ...], int]:
    """Input shape (without batch) and class count of the configured dataset, without
    loading it (its registry entry says). BlogText has neither and a table's are read at
    run time: a :class:`ConfigError`."""
    entry = registry.dataset(data.dataset)
    if entry.shape is None:
        raise ConfigError("data.dataset", data.dataset, "a classification dataset")
    return entry.shape(data)


def num_classes(cfg: ExperimentConfig) -> int:
    return dataset_shape(cfg.data)[1]


NAME_RULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_name(name: Any, field: str) -> str:
    """A name that becomes a directory (a run's, a sweep's): letters, digits, '.', '_' and
    '-', at most 128 characters, never a path (no separator, no '..')."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name) or ".." in name:
        raise ConfigError(field, name, "a plain name of letters, digits, '.', '_' and '-' "
                                       "(no path separator, no '..', at most 128 "
                                       "characters): it names a directory")
    return name


def validate(cfg: ExperimentConfig) -> None:
    """Cross-field rules, the registered sections, the model and the method's parameters."""
    check_name(cfg.name, "name")
    _validate_clients(cfg)
    _validate_data(cfg)
    _validate_population(cfg)
    if cfg.eval.clients == "all" and cfg.clients.num_clients > EVAL_ALL_MAX:
        raise ConfigError("eval.clients", "all", f"sampled or none above {EVAL_ALL_MAX:,} "
                          f"clients (all evaluates every one of the {cfg.clients.num_clients:,} "
                          f"clients every round)")
    for section in [cfg.fleet, cfg.dp, cfg.tracking, *cfg.sections.values()]:
        if hasattr(section, "validate"):
            section.validate(cfg)
    _validate_codecs(cfg)
    _validate_transforms(cfg)
    model = dict(cfg.model)
    name = model.pop("name", "mlp")
    cfg.model = {"name": name, **check_kwargs(registry.model_entry(name), model, "model")}
    _validate_sizes(cfg.model)
    _resolve_method(cfg)


def _validate_clients(cfg: ExperimentConfig) -> None:
    """The sample against the population, the tiers (named, unique, their resources) and
    each client's tier (listed or by shares)."""
    c = cfg.clients
    if c.per_round is not None and c.per_round > c.num_clients:
        raise ConfigError("clients.per_round", c.per_round,
                          f"at most clients.num_clients = {c.num_clients}")
    names = [t.name for t in cfg.runtime.tiers]
    if not names:
        raise ConfigError("runtime.tiers", [], "at least one tier")
    if len(set(names)) != len(names):
        raise ConfigError("runtime.tiers", names, "unique tier names")
    _validate_devices(cfg)
    if cfg.runtime.min_accepted > c.sampled_count():
        raise ConfigError("runtime.min_accepted", cfg.runtime.min_accepted,
                          f"at most the {c.sampled_count()} clients sampled per round")
    if c.tier_fractions is not None:
        if len(c.tier_fractions) != len(names) or any(not f >= 0 for f in c.tier_fractions) \
                or not sum(c.tier_fractions) > 0:
            raise ConfigError("clients.tier_fractions", c.tier_fractions,
                              f"{len(names)} shares >= 0 (one per tier of {names}), not all 0")
        if c.tiers is not None:
            raise ConfigError("clients.tier_fractions", c.tier_fractions,
                              "unset when clients.tiers lists each client's tier")
    if c.tiers is not None:
        if len(c.tiers) != c.num_clients:
            raise ConfigError("clients.tiers", c.tiers,
                              f"a list of {c.num_clients} tier names (one per client)")
        for i, t in enumerate(c.tiers):
            if t not in names:
                raise ConfigError(f"clients.tiers[{i}]", t, f"one of the tiers {names}")


def _validate_data(cfg: ExperimentConfig) -> None:
    """The dataset's own checks, the partition's and the drift's against the dataset and
    the rounds, local DP-SGD's noise."""
    dataset = registry.dataset(cfg.data.dataset)
    if dataset.check is not None:
        dataset.check(cfg)
    if dataset.natural_ids:
        _check_natural_split(cfg, dataset.kind)
    if cfg.data.partition == "pathological" and not dataset.natural_ids and \
            cfg.data.classes_per_client > num_classes(cfg):
        raise ConfigError("data.classes_per_client", cfg.data.classes_per_client,
                          f"at most the dataset's {num_classes(cfg)} classes")
    if cfg.data.drift_round is not None and cfg.data.drift_round > cfg.rounds:
        raise ConfigError("data.drift_round", cfg.data.drift_round,
                          f"a round in 1..rounds = {cfg.rounds}")
    if cfg.local.dp_noise_multiplier == 0:
        raise ConfigError("local.dp_noise_multiplier", 0, "> 0 (0 adds no noise: ε = ∞; "
                                                          "leave it unset for no DP-SGD)")


# the label partitions' knobs, and the input/label transforms of a partitioned array split
_PARTITION_KEYS = ("partition", "alpha", "classes_per_client", "shards_per_client",
                   "inner_sizes", "quantity_alpha", "feature_skew", "drift_round")


def _check_natural_split(cfg: ExperimentConfig, kind: str) -> None:
    """A dataset split by its own natural ids (a table's writers or users, BlogText's
    authors) reads none of the label partitions' knobs: another value would change nothing.
    BlogText's authors also keep their fixed 80/10/10 post split (FAVoR §4)."""
    who = f"data.dataset={cfg.data.dataset}"
    natural = "one client per natural id (writer, user, author)"
    unread = dict.fromkeys(_PARTITION_KEYS, natural)
    if kind == "method":
        split = "each author's posts split 80/10/10, seeded by the run's seed"
        unread |= {"alpha": "its authors' skew is algorithm.gini",
                   "local_test_fraction": split, "split_seed": split}
    check_unread(cfg.data, "data", unread, who)


def _resolve_method(cfg: ExperimentConfig) -> None:
    """``cfg.algorithm`` as the method's parameters (keys renamed or retired refused, its
    own ``validate``), ``cfg.server`` resolved for the method, then the method's checks."""
    algo = dict(cfg.algorithm)
    aname = algo.pop("name", DEFAULT_METHOD)
    method_cls = registry.method(aname, path="algorithm.name")
    if "server_lr" in algo:
        raise ConfigError("algorithm.server_lr", algo["server_lr"],
                          "unset: the server step is the server optimizer's now (e.g. -s "
                          "server.optimizer=sgd -s server.lr=VALUE)")
    for old, new in method_cls.renamed_keys.items():
        if old in algo:
            raise ConfigError(f"algorithm.{old}", algo[old],
                              f"algorithm.{new} (renamed for {aname}: a key means one thing "
                              f"whichever method has it)")
    params = build_dataclass(method_cls.Params, algo, "algorithm")
    if hasattr(params, "validate"):
        params.validate(cfg)
    cfg.algorithm = {"name": aname, **dataclasses.asdict(params)}
    cfg.server = resolve_server(cfg.server, method_cls)
    method_cls.check(cfg)


def resolve_server(server: Any, method: type) -> dict[str, Any]:
    """``server`` as ``{"optimizer": name, <every hyperparameter of that optimizer>}``.

    The optimizer is ``server.optimizer`` or the method's own (``Algorithm.
    server_optimizer``); a method without the ``server_optimizer`` capability keeps its own
    (a preset such as FedAvgM, or none: its rule makes its own step). A hyperparameter is
    taken only for an optimizer the config or the method names for certain — set with
    ``server.optimizer``, or fixed by the method — so switching ``algorithm.name`` never
    hands one optimizer's learning rate to another; a key the optimizer does not have is an
    error naming it."""
    from fedray.services.server_opt import OPTIMIZERS

    if not isinstance(server, dict):
        raise ConfigError("server", server, "a section: optimizer plus its hyperparameters")
    rest = dict(server)
    chosen = rest.pop("optimizer", None)
    own = method.server_optimizer
    free = "server_optimizer" in method.capabilities
    if own is None:
        if chosen is not None or rest:
            key = "optimizer" if chosen is not None else next(iter(rest))
            registry.require(method, "server_optimizer", f"server.{key}", server[key])
        return {"optimizer": None}
    if chosen is not None and chosen != own and not free:
        raise ConfigError("server.optimizer", chosen,
                          f"{own} for {method.name} (its server optimizer is fixed; "
                          f"algorithm.name=fedavg takes any: " + ", ".join(sorted(OPTIMIZERS))
                          + ")")
    if chosen is not None and (not isinstance(chosen, str) or chosen not in OPTIMIZERS):
        raise ConfigError("server.optimizer", chosen, "one of " + ", ".join(sorted(OPTIMIZERS)))
    if rest and chosen is None and free:
        key = next(iter(rest))
        raise ConfigError(f"server.{key}", rest[key],
                          f"set together with server.optimizer (its meaning depends on the "
                          f"optimizer; {method.name} runs {own} unless told otherwise)")
    name = chosen or own
    params = build_dataclass(OPTIMIZERS[name].Params, rest, "server")
    return {"optimizer": name, **dataclasses.asdict(params)}


_STORED: contextvars.ContextVar[bool] = contextvars.ContextVar("fedray_stored", default=False)


@contextlib.contextmanager
def as_stored() -> Iterator[None]:
    """Load the config of a run that already ran (``--resume``, a job continuing its run
    directory): a key :func:`check_unread` would refuse is recorded at its default instead,
    since the run never read it, so a run stored before a key was refused resumes."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def check_unread(values: Any, section: str, unread: dict[str, str], who: str) -> None:
    """Refuse a value other than its default for each key of ``values`` (the dataclass of
    config section ``section``) in ``unread`` (key → what ``who`` uses instead): a knob that
    changes nothing runs another experiment than the one asked for, without a word. Under
    :func:`as_stored` the key is set back to its default (what the run read)."""
    defaults = type(values)()
    for key, instead in unread.items():
        value, default = getattr(values, key), getattr(defaults, key)
        if value == default:
            continue
        if _STORED.get():
            setattr(values, key, default)
            continue
        shown = "unset" if default is None else json.dumps(default)
        raise ConfigError(f"{section}.{key}", value, f"its default, {shown}, for {who}, "
                                                     f"which does not read it ({instead})")


def migrate_stored(data: dict[str, Any]) -> dict[str, Any]:
    """A ``config.yaml`` an earlier version stored, in today's keys (``--resume`` of a run
    started before the server optimizers): ``algorithm.server_lr`` is ``server.lr`` of the
    method's own optimizer; a method may move more (``Algorithm.upgrade_config``). A task
    stream stored with another ``data.partition`` than dirichlet (accepted until 2026-12)
    split its tasks by Dirichlet all the same: it is recorded as what ran, dirichlet."""
    cont, d = data.get("continual"), data.get("data")
    if isinstance(cont, dict) and cont.get("tasks") and isinstance(d, dict) and \
            d.get("partition", "iid") != "dirichlet":
        data = dict(data, data=dict(d, partition="dirichlet"))
    algo = data.get("algorithm")
    if not isinstance(algo, dict) or "server" in data:
        return data
    data = dict(data, algorithm=dict(algo))
    method = registry.method(algo.get("name", DEFAULT_METHOD), path="algorithm.name")
    server: dict[str, Any] = {}
    if "server_lr" in data["algorithm"]:
        lr = data["algorithm"].pop("server_lr")
        if method.server_optimizer is not None:
            server["lr"] = lr
    for old, new in method.renamed_keys.items():
        if old in data["algorithm"]:
            data["algorithm"][new] = data["algorithm"].pop(old)
    method.upgrade_config(data["algorithm"], server)
    if server:
        server = {"optimizer": method.server_optimizer, **server}
    data["server"] = server or {"optimizer": None}
    return data


def _validate_population(cfg: ExperimentConfig) -> None:
    d = cfg.data
    if d.synthetic_per_client is not None:
        if d.dataset != "synthetic":
            raise ConfigError("data.synthetic_per_client", d.synthetic_per_client,
                              "unset unless data.dataset=synthetic")
        if d.partition not in ("iid", "dirichlet"):
            raise ConfigError("data.partition", d.partition, "iid or dirichlet with "
                              "data.synthetic_per_client (each client draws its own labels)")
        for name in ("feature_skew", "drift_round"):
            if getattr(d, name):
                raise ConfigError(f"data.{name}", getattr(d, name),
                                  "unset with data.synthetic_per_client")


def _validate_sizes(model: dict[str, Any]) -> None:
    """A model builder's integer keywords are sizes (widths, channels, layers, groups): each
    at least 1 — a zero-width layer builds a model that cannot learn, and torch accepts it
    without a word."""
    for key, value in model.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(values):
            if isinstance(v, int) and not isinstance(v, bool) and v < 1:
                where = f"model.{key}" + (f"[{i}]" if value is not v else "")
                raise ConfigError(where, v, "a size >= 1 (a zero-width layer cannot learn)")


def _validate_codecs(cfg: ExperimentConfig) -> None:
    from fedray.wire.payload import codec_names

    for key, broadcast in (("upload", False), ("download", True)):
        names = codec_names(broadcast)
        value = getattr(cfg.payload, key)
        if value not in names:
            raise ConfigError(f"payload.{key}", value,
                              "one of " + ", ".join(repr(n) for n in names))


def _validate_transforms(cfg: ExperimentConfig) -> None:
    p = cfg.payload
    if not p.transforms:
        return
    try:
        parse_transforms(p.transforms)
    except ValueError as e:
        raise ConfigError("payload.transforms", p.transforms, str(e)) from None
    if p.upload != "fp32":
        raise ConfigError("payload.upload", p.upload, "fp32 when payload.transforms is set "
                                                      "(quantize inside the chain: int8, int4)")


RAY_OWN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def _validate_devices(cfg: ExperimentConfig) -> None:
    rt = cfg.runtime
    for i, t in enumerate(rt.tiers):
        for name, amount in t.resources.items():
            if name in RAY_OWN_RESOURCES or name.startswith("accelerator_type:"):
                raise ConfigError(f"runtime.tiers[{i}].resources.{name}", amount,
                                  "a custom resource name (CPU and GPU shares are num_cpus "
                                  "and num_gpus, a GPU type accelerator_type; memory and "
                                  "object_store_memory are Ray's own)")
            if not amount >= 0:
                raise ConfigError(f"runtime.tiers[{i}].resources.{name}", amount,
                                  "an amount >= 0 of the custom resource per executor")
        if rt.device == "cuda" and t.num_gpus <= 0:
            raise ConfigError(f"runtime.tiers[{i}].num_gpus", t.num_gpus,
                              "a GPU share > 0 when runtime.device=cuda (an executor given no "
                              "GPU share runs on the CPU)")
        gpu_tier = rt.device != "cpu" and t.num_gpus > 0
        if rt.deterministic and gpu_tier and not t.accelerator_type:
            raise ConfigError(f"runtime.tiers[{i}].accelerator_type", None,
                              "a GPU type (e.g. A100) when runtime.deterministic=true: kernels "
                              "differ between GPU types, so bitwise repeatability needs one "
                              "type per tier")


def merged(rows: list[tuple[str, Knob]]) -> list[Knob]:
    """One row per key of ``(owner, knob)`` rows: the owners it applies to, one default or
    ``{owner: default}`` where they differ. A key means one thing whoever has it: rows of
    one key with different types or help texts are listed apart (and fail the conformance
    test)."""
    out: dict[tuple[str, str, str], Knob] = {}
    for owner, k in rows:
        row = out.setdefault((k.key, k.type, k.help), Knob(k.key, k.type, {}, k.help))
        row.applies_to.append(owner)
        row.default[owner] = k.default
    for row in out.values():
        values = list(row.default.values())
        if all(v == values[0] for v in values):
            row.default = values[0]
    return list(out.values())


def keys() -> list[Knob]:
    """Every knob (``fedray config --keys``): the core sections, the registered sections,
    each method's ``algorithm.*`` parameters and each server optimizer's ``server.*``
    hyperparameters, one row per key with the methods or optimizers it applies to."""
    from fedray.services.server_opt import OPTIMIZERS
    from fedray.wire.payload import codec_names

    rows = [k for k in knobs(ExperimentConfig)
            if k.key not in ("algorithm", "server", "model")]
    plugins = {"data.dataset": list(registry.datasets()), "payload.upload": codec_names(),
               "payload.download": codec_names(broadcast=True)}
    for k in rows:  # the registered names, plugins' included
        if k.key in plugins:
            k.type = "one of " + ", ".join(plugins[k.key])
    for name, cls in registry.sections().items():
        rows += knobs(cls, name + ".")
    models = registry.models()
    rows.append(Knob("model.name", "one of " + ", ".join(models), "mlp",
                     "the model (fedray models lists them; fedray models show NAME gives "
                     "its layers and size)"))
    rows += merged([(name, k) for name in models for k in keyword_knobs(
        registry.model_entry(name), "model.", "a keyword of the model's builder (fedray "
                                              "models show NAME)")])
    methods = registry.methods()
    for k in rows:  # a local.* knob some methods do not read (refused with them)
        key = k.key.removeprefix("local.")
        unread = [name for name, cls in methods.items()
                  if key != k.key and key in cls.unread_local]
        if unread:
            k.help += f" (not read by {', '.join(unread)}: refused with them)"
    rows.append(Knob("algorithm.name", "one of " + ", ".join(methods), DEFAULT_METHOD,
                     "the method (fedray methods lists each one's capabilities)"))
    rows += merged([(name, k) for name, cls in methods.items()
                    for k in knobs(cls.Params, "algorithm.")])
    from fedray.wire.transforms import TRANSFORMS

    rows += merged([(name, k) for name, t in TRANSFORMS.items() if dataclasses.is_dataclass(t)
                    for k in knobs(t, "payload.transforms[].")])
    rows.append(Knob("server.optimizer", "one of " + ", ".join(OPTIMIZERS), None,
                     "the server optimizer applying the rule's pseudo-gradient (default: "
                     "the method's own; its hyperparameters need it named)"))
    rows += merged([(name, k) for name, cls in OPTIMIZERS.items()
                    for k in knobs(cls.Params, "server.")])
    return rows


__all__ = ["ConfigError", "ExperimentConfig", "build_config", "build_dataclass", "coerce",
           "check_bounds", "check_kwargs", "dataset_shape", "keys", "knobs",
           "load_config", "num_classes", "redact", "short_repr", "spec"]
