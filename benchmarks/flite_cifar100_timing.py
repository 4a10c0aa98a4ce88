"""Wall time of ``jobs/flite_cifar100.py`` on this machine's CPU at the paper's sizes.

There is no CIFAR-100 download here, so the data are ``tests/cifar_fixture.py``'s fake
CIFAR-100 written at full size in torchvision's real on-disk format (``cifar-100-python/
train`` with 50,000 images, ``test`` with 10,000, ``meta``; uniform random pixels, labels
``i mod 100``), with torchvision's md5 check pointed at the generated files in this process
(so the job runs in-process, and its pretraining is done here rather than as a Ray task,
whose worker would not see the patch). Timing does not depend on the pixel values.

Measured, with the job's own overrides (:func:`flite_cifar100.stage_overrides`: full-width
ResNet-18, GroupNorm 32, frozen orthogonal head, 32×32×3, 100 classes, K = 8, batch 128 to
pretrain, 64 locally, d = 64, r = 32):

1. pretraining: ``--steps`` SGD steps of batch 128 with crop+flip (the steps of
   :func:`fedray.models.pretrain.pretrain`, after one warm-up step) and the per-epoch evaluation
   on the 10,000 test images; one epoch = ⌈50,000/128⌉ = 391 steps + that evaluation
   (extrapolated from the measured steps);
2. federated rounds: ``jobs/flite_cifar100.py --gpus-per-executor 0 --executors 1`` for
   ``--rounds`` rounds with ``local.max_steps`` = ``--local-steps`` per client (on a base
   pretrained here for one short epoch); a full round (1 local epoch of each client's
   5,000 train images = ⌈5,000/64⌉ = 79 steps, 8 clients on one 2-CPU executor, one after
   the other) is extrapolated from the measured
   per-step client time plus the measured rest of the round (broadcast, aggregation, the
   identity check) plus the job's per-round evaluation (global model on the 10,000 test
   images and on the clients' test splits, 10,000 more: 2 × the timed evaluation of 1.),
   which the timed rounds switch off.

    .venv/bin/python benchmarks/flite_cifar100_timing.py --steps 5 --rounds 2 --local-steps 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "jobs"), os.path.join(ROOT, "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="timed pretraining steps")
    ap.add_argument("--eval-samples", type=int, default=2000,
                    help="test images evaluated to time the 10,000-image evaluation")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=2, help="local.max_steps per client")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "flite_study", "cifar100_timing.json"))
    args = ap.parse_args()

    import flite_cifar100 as job
    import numpy as np
    import pytest
    import torch
    from cifar_fixture import patch_cifar_md5, write_fake_cifar

    from fedray.core.config import load_config
    from fedray.core.seeding import torch_generator
    from fedray.data import load_dataset
    from fedray.models.pretrain import build_base_model, pretrain
    from fedray.models.training import SGD, evaluate, random_crop_flip
    from fedray.observe.metrics import read_metrics

    out: dict = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                 "load_average_start": os.getloadavg()}
    mp = pytest.MonkeyPatch()
    with tempfile.TemporaryDirectory() as tmp:
        data_root, run_dir = os.path.join(tmp, "data"), os.path.join(tmp, "run")
        t = time.perf_counter()
        write_fake_cifar(data_root, "cifar100", train_per_file=10_000, num_test=10_000)
        patch_cifar_md5(mp, data_root, "cifar100")
        argv = ["--data-root", data_root, "--run-dir", run_dir, "--gpus-per-executor", "0",
                "--executors", "1", "--rounds", str(args.rounds), "--pretrain-epochs", "1",
                "--no-progress"]
        jargs = job.build_parser().parse_args(argv)
        common, _ = job.stage_overrides(jargs)
        cfg = load_config(None, common)
        data = load_dataset(cfg.data, cfg.seed)
        out["write_and_load_s"] = time.perf_counter() - t
        out["train_shape"] = list(data.x_train.shape)
        out["test_shape"] = list(data.x_test.shape)

        # 1. pretraining steps (the loop of fedray.models.pretrain.pretrain) and the evaluation
        p = cfg.pretrain
        model = build_base_model(cfg, data.input_shape, data.num_classes)
        out["model_parameters"] = int(sum(q.numel() for q in model.parameters()))
        params = [q for q in model.parameters() if q.requires_grad]
        opt = SGD(params, lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay)
        loss_fn = torch.nn.CrossEntropyLoss()
        gen = torch_generator(0, 0, -1, "pretrain-augment")
        xt, yt = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
        model.train()
        times = []
        for b in range(args.steps + 1):
            t = time.perf_counter()
            idx = torch.arange(b * p.batch_size, (b + 1) * p.batch_size)
            opt.zero_grad()
            loss = loss_fn(model(random_crop_flip(xt[idx], gen)), yt[idx])
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t)
        step = float(np.mean(times[1:]))
        t = time.perf_counter()
        evaluate(model, data.x_test[:args.eval_samples], data.y_test[:args.eval_samples])
        eval_10k = (time.perf_counter() - t) * len(data.x_test) / args.eval_samples
        steps_per_epoch = math.ceil(len(data.x_train) / p.batch_size)
        out["pretrain"] = {"batch": p.batch_size, "timed_steps": args.steps,
                           "step_s": step, "step_s_all": times[1:],
                           "steps_per_epoch": steps_per_epoch, "eval_10k_s": eval_10k,
                           "epoch_s_extrapolated": steps_per_epoch * step + eval_10k,
                           "100_epochs_h_extrapolated":
                               100 * (steps_per_epoch * step + eval_10k) / 3600}

        # 2. a base for the federated stage (one epoch of 2 batches of class 0, evaluated on
        # class 0's 100 test images: only the base's shapes matter for timing)
        bcfg = load_config(None, common + ["pretrain.classes=[0]", "pretrain.fraction=0.5"])
        t = time.perf_counter()
        pretrain(bcfg, os.path.join(run_dir, "base"), progress=False)
        out["base_for_timing_s"] = time.perf_counter() - t

        # 3. the job's federated stage, local.max_steps per client, evaluation off (timed
        # above: the job evaluates the global model on the 10,000 test images and on the
        # clients' test splits, 10,000 more, every round)
        t = time.perf_counter()
        job.main(argv + ["-s", f"local.max_steps={args.local_steps}", "-s", "eval.every=0",
                         "-s", "eval.clients=none", "-s", "eval.global_test=false", "--json"])
        out["federated_stage_s"] = time.perf_counter() - t
        rounds = read_metrics(os.path.join(run_dir, "federated"), "rounds").to_pandas()
        clients = read_metrics(os.path.join(run_dir, "federated"), "clients").to_pandas()
        clients = clients[clients["sampled"]]
        k = cfg.clients.num_clients
        per_client = clients.groupby("round")["seconds"].sum()
        round_s = rounds.set_index("round")["seconds"]
        local_step = float(clients["seconds"].mean()) / args.local_steps
        # one local epoch of each client's train split (its shard less the local test share)
        full_steps = int(sum(math.ceil(n / cfg.local.batch_size) for n in clients.groupby(
            "client_id")["num_samples"].first()))
        rest = float((round_s - per_client).iloc[-1])  # all but the clients' local work
        out["federated"] = {
            "clients": k, "local_batch": cfg.local.batch_size,
            "local_steps_measured": args.local_steps,
            "round_s_measured": round_s.tolist(),
            "client_s_measured": clients["seconds"].tolist(),
            "local_step_s": local_step, "rest_of_round_s": rest,
            "client_train_samples": clients.groupby("client_id")["num_samples"].first()
            .tolist(),
            "local_steps_per_round_full_epoch": full_steps,
            "round_s_extrapolated_no_eval": full_steps * local_step + rest,
            "round_s_extrapolated": full_steps * local_step + rest + 2 * eval_10k,
            "columns": sorted(rounds.columns)}
    mp.undo()
    out["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2, default=float)
    print(json.dumps({k: out[k] for k in ("pretrain", "federated")}, indent=2, default=float))


if __name__ == "__main__":
    main()
