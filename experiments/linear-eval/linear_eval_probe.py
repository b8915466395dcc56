"""Why can longer MLCL pre-training give a worse linear evaluation? Probe frozen encoders on cached features.

Two sub-commands (docs/linear-evaluation.md explains the question and the protocol):

``probe RUN_DIR [RUN_DIR ...]``
    For every pre-training checkpoint of an MLCL / MLCL+AUG run (``<run>/checkpoints/pretrain/*.ckpt``, or the
    names / paths given with ``--checkpoints``), builds the run's ``RpmModule`` from its ``config.yaml``, loads the
    checkpoint (``torch.load(..., weights_only=True)``), and extracts the frozen encoder's per-completion
    embeddings h (N, 8, D) once for N train and N val problems (un-augmented, fixed answer order) under three
    BatchNorm treatments:

    * ``stored``: eval mode with the running statistics in the checkpoint (what rpm_lib's linear stage uses);
    * ``recomputed``: eval mode with statistics re-estimated (cumulative average) on un-augmented train batches;
    * ``batch``: BatchNorm in train mode, i.e. each batch's own statistics (what the release's head-training
      phase feeds its scorer during training).

    Then, per checkpoint: embedding norms, effective ranks, cosine(correct, own wrong completions), the BatchNorm
    statistic shift, and the val accuracy of answer scorers fitted on the cached features:

    * ``adam``: rpm_lib's ``ScoringHead`` (same seeded initialisation as the linear stage), Adam with the run's
      betas / eps, mini-batches of the linear stage's batch size, evaluated every epoch; for each step budget
      both the last state and the state with the lowest val loss so far (as ``restore_best``);
      the full lr x steps grid on (stored, h), the run's linear-stage lr on every other feature set;
    * ``lbfgs``: the same linear scorer fitted full-batch by L-BFGS (strong Wolfe) on mean CE + a small penalty,
      i.e. with the optimiser taken out of the question (the penalty l2/2 w'Sw, S the within-problem covariance,
      makes the fit invariant to rescaling the features);
    * closed-form / training-free scorers: the mean difference direction (correct - mean of own wrong), its
      Fisher/LDA version with the within-problem covariance, and (non-linear) nearest neighbours among the train
      problems' correct completions;
    * ``mlp``: a one-hidden-layer scorer (non-linear), to tell "the information is gone" from "it is there but
      not linearly".

    Feature sets: ``h`` (what the linear head reads in rpm_lib and in the release: the encoder output, before the
    projection head, not normalised) under each BN treatment; ``h_l2`` (h normalised per completion); ``z`` and
    ``z_l2`` (after the MLCL projection head, the space the contrastive loss shapes). One JSON + a printed table.

``pretrain [--snapshot-steps 1300,2600] key=value ...``
    ``rpm-train`` with the same ``key=value`` config fields, plus a callback that saves the pre-training weights at
    the given optimiser steps as ``<run_dir>/checkpoints/pretrain/step-NNNNNNN.ckpt``, so one run yields the
    encoders after 1,300 and 2,600 steps (the stage's own best.ckpt / last.ckpt are kept as usual).

Examples::

    python experiments/linear-eval/linear_eval_probe.py pretrain --snapshot-steps 20,40 setup=mlcl_aug generate=true \\
        data_root=/tmp/lep/data generate_num_per_config=20 image_size=32 batch_size=8 max_epochs=4 \\
        linear_eval_epochs=1 progress_bar=false accelerator=cpu run_dir=/tmp/lep/run overwrite=true
    python experiments/linear-eval/linear_eval_probe.py probe /tmp/lep/run --steps 50,200 --lrs 2e-3,2e-4

CPU use: ``--threads`` (default: ``OMP_NUM_THREADS`` if set, else torch's default).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BN_MODES: tuple[str, ...] = ("stored", "recomputed", "batch")


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    probe = sub.add_parser("probe", help="probe the pre-training checkpoints of one or more run folders")
    probe.add_argument("runs", nargs="+", help="run folders (config.yaml + checkpoints/pretrain/*.ckpt)")
    probe.add_argument("--checkpoints", default="",
                       help="comma-separated checkpoint names (file stems in checkpoints/pretrain, e.g. "
                            "best,last,step-0001300) or .ckpt paths; default: every .ckpt there")
    probe.add_argument("--num-train", type=int, default=10000, help="train problems to fit on (default 10000)")
    probe.add_argument("--num-val", type=int, default=4000, help="val problems to evaluate on (default 4000)")
    probe.add_argument("--lrs", default="2e-3,2e-4,2e-5", help="Adam lrs of the grid on (stored, h)")
    probe.add_argument("--steps", default="500,1000,5000", help="Adam step budgets reported (default 500,1000,5000)")
    probe.add_argument("--batch-size", type=int, default=None, help="Adam / extraction batch (default: the run's "
                                                                    "linear-stage batch size)")
    probe.add_argument("--bn-batches", type=int, default=50, help="train batches for the recomputed BN statistics")
    probe.add_argument("--bn-modes", default=",".join(BN_MODES), help=f"subset of {','.join(BN_MODES)}")
    probe.add_argument("--lbfgs-iters", type=int, default=300, help="L-BFGS iteration limit (default 300)")
    probe.add_argument("--l2", type=float, default=1e-3,
                       help="L-BFGS penalty on the mean squared within-problem logit deviation (default 1e-3)")
    probe.add_argument("--knn", type=int, default=10, help="neighbours of the nearest-neighbour scorer (0 = off)")
    probe.add_argument("--no-mlp", action="store_true", help="skip the one-hidden-layer scorer")
    probe.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1 ...")
    probe.add_argument("--precision", default="auto", help="feature extraction precision: auto (the run's, as "
                                                           "resolved for this device), 32-true, bf16-mixed, ...")
    probe.add_argument("--data-root", default=None, help="read the data from here instead of the run's data_root")
    probe.add_argument("--num-workers", type=int, default=0, help="DataLoader workers for reading problems")
    probe.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    probe.add_argument("--seed", type=int, default=0, help="seed of the problem subsets and Adam batch order")
    probe.add_argument("--out", default=None, help="JSON path (default <first run>/linear_eval_probe.json)")

    pretrain = sub.add_parser("pretrain", help="rpm-train with pre-training snapshots at given steps")
    pretrain.add_argument("--snapshot-steps", default="1300,2600", help="optimiser steps to save (pre-training)")
    pretrain.add_argument("--config", "-c", default=None, help="YAML file of config fields")
    pretrain.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    pretrain.add_argument("overrides", nargs="*", metavar="key=value", help="config fields, as for rpm-train")
    return parser


# ----------------------------------------------------------------------------------------------
# pretrain: rpm-train + step snapshots
# ----------------------------------------------------------------------------------------------
def snapshot_callback(steps: list[int], run_dir: Path) -> Any:
    """A Lightning callback saving the weights at the given pre-training steps (other stages are ignored)."""
    import lightning as L

    wanted = sorted(set(int(s) for s in steps if int(s) > 0))

    class PretrainSnapshots(L.Callback):
        def __init__(self) -> None:
            self.saved: list[str] = []

        def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
            plan = getattr(pl_module, "plan", None)
            if plan is None or plan.name != "pretrain" or trainer.global_step not in wanted:
                return
            path = run_dir / "checkpoints" / "pretrain" / f"step-{trainer.global_step:07d}.ckpt"
            if str(path) in self.saved:
                return
            trainer.save_checkpoint(str(path), weights_only=True)
            self.saved.append(str(path))

    return PretrainSnapshots()


def run_pretrain(args: argparse.Namespace) -> int:
    import torch

    from rpm_lib.training.config import ConfigError, TrainConfig, parse_overrides
    from rpm_lib.training.run import train

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.config:
            config = TrainConfig.from_yaml(args.config, list(args.overrides))
        else:
            config = TrainConfig.from_dict(parse_overrides(list(args.overrides)), source="overrides")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    callback = snapshot_callback(_ints(args.snapshot_steps), Path(config.run_dir))
    began = time.perf_counter()
    metrics = train(config, callbacks=[callback])
    print(json.dumps({"run_dir": config.run_dir, "snapshots": callback.saved,
                      "stages": metrics.get("stages"), "val_accuracy": metrics.get("val_accuracy"),
                      "wall_s": round(time.perf_counter() - began, 1)}, indent=2, default=str))
    return 0


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------
def load_checkpoint(path: Path) -> dict[str, Any]:
    """A Lightning checkpoint as plain weights (``weights_only=True``: never unpickle code from a run folder)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def find_checkpoints(run_dir: Path, spec: str) -> list[Path]:
    stage_dir = run_dir / "checkpoints" / "pretrain"
    if not spec:
        found = sorted(stage_dir.glob("*.ckpt"))
        if not found:
            raise SystemExit(f"error: no checkpoints in {stage_dir}")
        return found
    paths = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        path = Path(item) if item.endswith(".ckpt") else stage_dir / f"{item}.ckpt"
        if not path.is_file():
            raise SystemExit(f"error: checkpoint {path} not found")
        paths.append(path)
    return paths


def resolve_device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def problem_batches(config: Any, plan: Any, split: str, limit: int, batch_size: int, seed: int,
                    num_workers: int) -> list[dict[str, Any]]:
    """``limit`` problems of ``split`` (seeded subset, fixed answer order, no augmentation) as in-memory batches."""
    import numpy as np
    from torch.utils.data import DataLoader, Subset

    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.training.datamodule import RpmDataModule

    datamodule = RpmDataModule(config, plan)
    samples = datamodule.make_split(split)  # answer_order="fixed", one view, no transform
    total = len(samples)
    if limit < total:
        rng = np.random.default_rng(derive_seed(seed, "linear_eval_probe", {"train": 0, "val": 1}[split]))
        positions = np.sort(rng.choice(total, size=limit, replace=False))
        samples = Subset(samples, positions.tolist())
    loader = DataLoader(samples, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    keep = ("panels", "target", "configuration", "rules")
    return [{k: b[k] for k in keep if k in b} for b in loader]


# ----------------------------------------------------------------------------------------------
# features
# ----------------------------------------------------------------------------------------------
def _bn_layers(module: Any) -> list[tuple[str, Any]]:
    """(name, layer) of the BatchNorm layers the library re-estimates (``batchnorm_layers``)."""
    from rpm_lib.training.batchnorm import batchnorm_layers

    layers = set(batchnorm_layers(module))
    return [(name, m) for name, m in module.named_modules() if m in layers]


def _to_input(module: Any, panels: Any, device: Any) -> Any:
    return module.to_float(panels.to(device, non_blocking=True))


def recompute_bn(encoder: Any, module: Any, batches: list[dict[str, Any]], device: Any, autocast: Any,
                 max_batches: int) -> Any:
    """A copy of ``encoder`` whose BN running statistics are the average over un-augmented batches (the library's
    ``recalibrate_batchnorm``, which ``bn_recalibration_batches`` applies in training)."""
    from rpm_lib.training.batchnorm import recalibrate_batchnorm

    fresh = copy.deepcopy(encoder).eval()

    def forward(batch: dict[str, Any]) -> None:
        with autocast():
            fresh(_to_input(module, batch["panels"], device))

    recalibrate_batchnorm(fresh, batches[:max(1, max_batches)], forward)
    return fresh.eval()


def bn_shift(stored: Any, recomputed: Any) -> list[dict[str, Any]]:
    """Per BN layer: mean |mu_rec - mu_stored| / sd_stored and mean |log(var_rec / var_stored)| over channels."""
    import torch

    rows = []
    for (name, a), (_, b) in zip(_bn_layers(stored), _bn_layers(recomputed)):
        if a.running_mean is None or b.running_mean is None:
            continue
        sd = torch.sqrt(a.running_var.float() + a.eps)
        rows.append({
            "layer": name,
            "mean_shift_in_sd": float(((b.running_mean.float() - a.running_mean.float()).abs() / sd).mean()),
            "abs_log_var_ratio": float(torch.log((b.running_var.float() + a.eps) /
                                                 (a.running_var.float() + a.eps)).abs().mean()),
        })
    return rows


def extract(module: Any, encoder: Any, batches: list[dict[str, Any]], device: Any, autocast: Any,
            bn_train: bool) -> dict[str, Any]:
    """h (N, 8, D) float32 [+ z (N, 8, P) through the projection head], target (N,), configuration (N,)."""
    import torch

    enc = copy.deepcopy(encoder) if bn_train else encoder
    enc.eval()
    if bn_train:
        for _, bn in _bn_layers(enc):
            bn.train()
    projection = module.projection_head
    if projection is not None:
        projection.eval()
    hs, zs, targets, configurations = [], [], [], []
    with torch.no_grad():
        for batch in batches:
            with autocast():
                h = enc(_to_input(module, batch["panels"], device))
                z = projection(h) if projection is not None else None
            hs.append(h.float())
            if z is not None:
                zs.append(z.float())
            targets.append(batch["target"].to(device))
            configurations.append(batch["configuration"])
    out = {"h": torch.cat(hs), "target": torch.cat(targets).long(),
           "configuration": torch.cat(configurations).long()}
    if zs:
        out["z"] = torch.cat(zs)
    return out


def effective_rank(x: Any, max_rows: int = 20000) -> float:
    """exp(entropy of the normalised singular values) of the centred rows of x (Roy & Vetterli 2007)."""
    import torch

    x = x.reshape(-1, x.shape[-1]).double()
    if x.shape[0] > max_rows:
        x = x[torch.linspace(0, x.shape[0] - 1, max_rows, device=x.device).long()]
    x = x - x.mean(dim=0, keepdim=True)
    s = torch.linalg.svdvals(x)
    if float(s.sum()) <= 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def _split(h: Any, target: Any) -> tuple[Any, Any]:
    from rpm_lib.losses import split_completions

    return split_completions(h, target)


def feature_stats(h: Any, target: Any) -> dict[str, Any]:
    """Norms, cosines, variance split and effective ranks of per-completion features (N, 8, D)."""
    import torch
    from torch.nn import functional as F

    norms = h.norm(dim=-1)  # (N, 8)
    correct, wrong = _split(h, target)
    cos = F.cosine_similarity(correct.unsqueeze(1), wrong, dim=-1)  # (N, 7)
    centred = h - h.mean(dim=1, keepdim=True)
    total = (h - h.reshape(-1, h.shape[-1]).mean(dim=0)).pow(2).sum()
    diff = correct - wrong.mean(dim=1)
    wrong_norms = wrong.norm(dim=-1)
    return {
        "norm_mean": float(norms.mean()), "norm_std": float(norms.std()), "norm_min": float(norms.min()),
        "norm_max": float(norms.max()), "norm_correct_mean": float(correct.norm(dim=-1).mean()),
        "norm_wrong_mean": float(wrong_norms.mean()),
        "cos_correct_own_wrong": float(cos.mean()),
        "within_problem_variance_fraction": float(centred.pow(2).sum() / total) if float(total) > 0 else None,
        "diff_norm_mean": float(diff.norm(dim=-1).mean()),
        "effective_rank_all": effective_rank(h),
        "effective_rank_within_problem": effective_rank(centred),
        "effective_rank_correct_minus_wrong": effective_rank(diff),
        "dim": int(h.shape[-1]),
    }


# ----------------------------------------------------------------------------------------------
# scorers
# ----------------------------------------------------------------------------------------------
def _ce_acc(scores: Any, target: Any) -> tuple[float, float]:
    from torch.nn import functional as F

    return float(F.cross_entropy(scores, target)), float((scores.argmax(dim=1) == target).float().mean())


def fit_adam(train: dict[str, Any], val: dict[str, Any], key: str, lrs: list[float], steps: list[int],
             batch_size: int, init_seed: int, order_seed: int, config: Any, hidden: int | None = None
             ) -> list[dict[str, Any]]:
    """Adam on cached features; one scorer per lr, all seeing the same mini-batches.

    ``hidden=None``: the linear scorer (rpm_lib's ``ScoringHead`` init, seeded like the linear stage). Otherwise a
    Linear(D, hidden) -> ReLU -> Linear(hidden, 1) scorer. Evaluated at every epoch end and at every step budget;
    for each budget, ``last`` is the state after that many steps and ``restored`` the evaluated state with the
    lowest val loss so far (rpm_lib's restore_best over epochs).
    """
    import numpy as np
    import torch
    from torch import nn
    from torch.nn import functional as F

    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.heads import ScoringHead

    xtr, ytr, xva, yva = train[key], train["target"], val[key], val["target"]
    device, dim, num = xtr.device, xtr.shape[-1], xtr.shape[0]
    heads = []
    for _ in lrs:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            if hidden is None:
                head = ScoringHead(dim)
            else:
                head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        heads.append(head.to(device))

    def scores(head: Any, x: Any) -> Any:
        out = head(x)
        return out if hidden is None else out.squeeze(-1)

    optimisers = [torch.optim.Adam(head.parameters(), lr=lr, betas=(config.adam_beta1, config.adam_beta2),
                                   eps=config.adam_eps, weight_decay=config.weight_decay)
                  for head, lr in zip(heads, lrs)]
    budgets = sorted(set(int(s) for s in steps if int(s) > 0))
    max_steps = budgets[-1]
    batch_size = max(1, min(batch_size, num))
    per_epoch = max(1, num // batch_size)  # drop_last, as the linear stage's loader
    best = [{"val_loss": math.inf} for _ in lrs]
    results: dict[tuple[int, int], dict[str, Any]] = {}

    def evaluate(i: int) -> dict[str, float]:
        with torch.no_grad():
            tl, ta = _ce_acc(scores(heads[i], xtr), ytr)
            vl, va = _ce_acc(scores(heads[i], xva), yva)
        return {"train_loss": tl, "train_accuracy": ta, "val_loss": vl, "val_accuracy": va}

    step, epoch = 0, 0
    while step < max_steps:
        order = torch.from_numpy(np.random.default_rng(derive_seed(order_seed, "probe_order", epoch))
                                 .permutation(num)).to(device)
        for b in range(per_epoch):
            idx = order[b * batch_size:(b + 1) * batch_size]
            x, y = xtr[idx], ytr[idx]
            for head, opt in zip(heads, optimisers):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(scores(head, x), y).backward()
                opt.step()
            step += 1
            epoch_end = b == per_epoch - 1
            if step in budgets or epoch_end:
                for i in range(len(lrs)):
                    now = {**evaluate(i), "step": step}
                    if epoch_end and now["val_loss"] < best[i]["val_loss"]:
                        best[i] = now
                    if step in budgets:
                        # The stage stops at this step and validates once more; restore_best then picks the
                        # lowest val loss among the epoch-end validations and this one.
                        restored = min([best[i], now], key=lambda r: r["val_loss"])
                        results[(i, step)] = {"lr": lrs[i], "steps": step, "epochs": round(step / per_epoch, 2),
                                              "last": now, "restored": restored}
            if step >= max_steps:
                break
        epoch += 1
    return [results[(i, s)] for i in range(len(lrs)) for s in budgets if (i, s) in results]


def fit_lbfgs(train: dict[str, Any], val: dict[str, Any], key: str, l2: float, max_iter: int) -> dict[str, Any]:
    """The linear scorer fitted full-batch by L-BFGS (strong Wolfe, float64) on

        mean CE + l2 / 2 * w' S w,   S = covariance of the within-problem deviations h_k - mean_k(h)

    i.e. the penalty is on the spread of the 8 logits of a problem (the only thing the softmax sees), so the fit
    and its accuracy do not change when the features are rescaled or linearly re-parametrised: what is left is
    whether the answer is linearly readable from the features, not how easy the features are to optimise on.
    """
    import torch
    from torch.nn import functional as F

    xtr = train[key].double()
    ytr = train["target"]
    xva = val[key].double()
    dim = xtr.shape[-1]
    centred = (xtr - xtr.mean(dim=1, keepdim=True)).reshape(-1, dim)
    within = centred.t() @ centred / max(1, centred.shape[0])
    w = torch.zeros(dim, dtype=torch.float64, device=xtr.device, requires_grad=True)
    # The bias of a per-completion linear scorer cancels in the softmax over the 8 completions: no bias.
    optimiser = torch.optim.LBFGS([w], lr=1.0, max_iter=max_iter, history_size=50, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-10, tolerance_change=1e-14)

    def objective() -> Any:
        return F.cross_entropy(xtr @ w, ytr) + 0.5 * l2 * (w @ within @ w)

    def closure() -> Any:
        optimiser.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    began = time.perf_counter()
    start_grad = torch.autograd.grad(objective(), w)[0]
    optimiser.step(closure)
    loss = objective()
    grad = torch.autograd.grad(loss, w)[0]
    state = optimiser.state[w]
    with torch.no_grad():
        tl, ta = _ce_acc(xtr @ w, ytr)
        vl, va = _ce_acc(xva @ w, val["target"])
    return {"train_loss": tl, "train_accuracy": ta, "val_loss": vl, "val_accuracy": va,
            "objective": float(loss.detach()), "grad_norm": float(grad.norm()),
            "grad_norm_start": float(start_grad.norm()),
            "iterations": int(state.get("n_iter", 0)),
            "weight_norm": float(w.detach().norm()), "l2": l2, "seconds": round(time.perf_counter() - began, 2)}


def closed_form_probes(train: dict[str, Any], val: dict[str, Any], key: str, ridge: float = 1e-3
                       ) -> dict[str, Any]:
    """Training-free linear directions: mean difference, and Fisher/LDA with the within-problem covariance."""
    import torch

    h = train[key].double()
    correct, wrong = _split(h, train["target"])
    mu = (correct - wrong.mean(dim=1)).mean(dim=0)
    centred = (h - h.mean(dim=1, keepdim=True)).reshape(-1, h.shape[-1])
    cov = centred.t() @ centred / max(1, centred.shape[0] - 1)
    scale = float(torch.diagonal(cov).mean()) or 1.0
    w_lda = torch.linalg.solve(cov + ridge * scale * torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device), mu)
    out = {}
    for name, w in (("mean_difference", mu), ("lda", w_lda)):
        tl, ta = _ce_acc(train[key].double() @ w, train["target"])
        vl, va = _ce_acc(val[key].double() @ w, val["target"])
        out[name] = {"train_accuracy": ta, "val_accuracy": va}
    return out


def knn_probe(train: dict[str, Any], val: dict[str, Any], key: str, k: int, max_reference: int = 10000
              ) -> dict[str, Any]:
    """Non-linear, training-free: score = mean cosine of a completion to its k nearest train *correct* completions
    minus the same to train *wrong* completions."""
    import torch
    from torch.nn import functional as F

    h = F.normalize(train[key], dim=-1)
    correct, wrong = _split(h, train["target"])
    correct = correct[:max_reference]
    wrong = wrong.reshape(-1, h.shape[-1])[:max_reference]
    kk = max(1, min(k, correct.shape[0], wrong.shape[0]))
    x = F.normalize(val[key], dim=-1).reshape(-1, h.shape[-1])
    scores = []
    for chunk in torch.split(x, 4096):
        pos = (chunk @ correct.t()).topk(kk, dim=1).values.mean(dim=1)
        neg = (chunk @ wrong.t()).topk(kk, dim=1).values.mean(dim=1)
        scores.append(pos - neg)
    s = torch.cat(scores).reshape(val[key].shape[0], -1)
    return {"k": kk, "val_accuracy": float((s.argmax(dim=1) == val["target"]).float().mean())}


# ----------------------------------------------------------------------------------------------
# probe
# ----------------------------------------------------------------------------------------------
def probe_checkpoint(path: Path, config: Any, plan: Any, data: dict[str, list[dict[str, Any]]],
                     args: argparse.Namespace, device: Any, precision: str) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.training.evaluation import autocast_context
    from rpm_lib.training.module import RpmModule
    from rpm_lib.training.setups import STAGES

    began = time.perf_counter()
    checkpoint = load_checkpoint(path)
    torch.manual_seed(derive_seed(config.seed, "init"))
    module = RpmModule(config, config.rule_spec.width)
    module.load_state_dict(checkpoint["state_dict"])
    module.set_stage(plan)  # linear stage: encoder frozen and in eval mode, fresh scoring head
    module.to(device).eval()

    def autocast() -> Any:
        return autocast_context(device, precision)

    encoders = {"stored": module.encoder}
    modes = [m for m in args.bn_modes.split(",") if m]
    record: dict[str, Any] = {"path": str(path), "global_step": int(checkpoint.get("global_step", -1)),
                              "epoch": int(checkpoint.get("epoch", -1)), "stage": checkpoint.get("rpm_stage")}
    if "recomputed" in modes:
        encoders["recomputed"] = recompute_bn(module.encoder, module, data["train"], device, autocast,
                                              args.bn_batches)
        record["bn_shift_recomputed_vs_stored"] = bn_shift(module.encoder, encoders["recomputed"])
    feature_sets: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for mode in modes:
        encoder = encoders["stored"] if mode == "batch" else encoders[mode]
        tr = extract(module, encoder, data["train"], device, autocast, bn_train=mode == "batch")
        va = extract(module, encoder, data["val"], device, autocast, bn_train=mode == "batch")
        feature_sets[f"{mode}/h"] = (tr, va)
        if mode == "stored":
            l2 = ({**tr, "h": F.normalize(tr["h"], dim=-1)}, {**va, "h": F.normalize(va["h"], dim=-1)})
            feature_sets["stored/h_l2"] = l2
            if "z" in tr:
                feature_sets["stored/z"] = ({**tr, "h": tr["z"]}, {**va, "h": va["z"]})
                feature_sets["stored/z_l2"] = ({**tr, "h": F.normalize(tr["z"], dim=-1)},
                                               {**va, "h": F.normalize(va["z"], dim=-1)})
    record["extract_s"] = round(time.perf_counter() - began, 1)

    lrs, steps = _floats(args.lrs), _ints(args.steps)
    linear_lr = plan.lr
    batch_size = args.batch_size or plan.batch_size
    init_seed = derive_seed(config.seed, "scoring_head", STAGES.index(plan.name))  # the linear stage's head init
    results: dict[str, Any] = {}
    for name, (tr, va) in feature_sets.items():
        entry: dict[str, Any] = {"stats_train": feature_stats(tr["h"], tr["target"])}
        grid = lrs if name == "stored/h" else [linear_lr]
        entry["adam"] = fit_adam(tr, va, "h", grid, steps, batch_size, init_seed, args.seed, config)
        entry["lbfgs"] = fit_lbfgs(tr, va, "h", args.l2, args.lbfgs_iters)
        if name in ("stored/h", "stored/z_l2", "stored/h_l2"):
            entry.update(closed_form_probes(tr, va, "h"))
            if args.knn > 0:
                entry["knn"] = knn_probe(tr, va, "h", args.knn)
        if name == "stored/h" and not args.no_mlp:
            entry["mlp"] = fit_adam(tr, va, "h", [linear_lr], steps, batch_size, init_seed, args.seed, config,
                                    hidden=min(256, tr["h"].shape[-1]))
        results[name] = entry
    record["features"] = results
    record["seconds"] = round(time.perf_counter() - began, 1)
    return record


def run_probe(args: argparse.Namespace) -> int:
    import torch

    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.history import history_rows
    from rpm_lib.training.trainer import resolve_precision
    from rpm_lib.training.plans import stage_plan
    from rpm_lib.training.setups import SETUPS

    if args.threads:
        torch.set_num_threads(args.threads)
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    unknown = set(m for m in args.bn_modes.split(",") if m) - set(BN_MODES)
    if unknown:
        print(f"error: --bn-modes: unknown {sorted(unknown)}", file=sys.stderr)
        return 2
    device = resolve_device(args.device)
    report: dict[str, Any] = {"command": sys.argv, "device": str(device), "complete": False, "runs": []}
    out = Path(args.out) if args.out else Path(args.runs[0]) / "linear_eval_probe.json"
    began = time.perf_counter()
    for run in args.runs:
        run_dir = Path(run)
        overrides: dict[str, Any] = {"progress_bar": False, "num_workers": args.num_workers,
                                     "accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1}
        if args.data_root:
            overrides["data_root"] = args.data_root
        config = TrainConfig.from_yaml(run_dir / "config.yaml").with_overrides(overrides)
        if not SETUPS[config.setup].contrastive:
            print(f"error: {run_dir}: setup {config.setup} has no pre-training / linear evaluation", file=sys.stderr)
            return 2
        plan = next(p for p in stage_plan(config) if p.name == "linear")
        precision = resolve_precision(config) if args.precision == "auto" else args.precision
        batch_size = args.batch_size or plan.batch_size
        data = {"train": problem_batches(config, plan, "train", args.num_train, batch_size, args.seed,
                                         args.num_workers),
                "val": problem_batches(config, plan, "val", args.num_val, batch_size, args.seed, args.num_workers)}
        history = [dict(r) for r in history_rows(run_dir / "history.csv")] if (run_dir / "history.csv").is_file() \
            else []
        entry: dict[str, Any] = {
            "run_dir": str(run_dir), "setup": config.setup, "encoder": config.encoder,
            "image_size": config.image_size, "precision": precision, "linear_stage": {
                "lr": plan.lr, "batch_size": plan.batch_size, "max_epochs": plan.max_epochs},
            "num_train": sum(len(b["target"]) for b in data["train"]),
            "num_val": sum(len(b["target"]) for b in data["val"]),
            "history": history, "checkpoints": {},
        }
        report["runs"].append(entry)
        for path in find_checkpoints(run_dir, args.checkpoints):
            print(f"probing {path} ...", file=sys.stderr, flush=True)
            entry["checkpoints"][path.stem] = probe_checkpoint(path, config, plan, data, args, device, precision)
            # A probe of several checkpoints can outlast a time limit: every finished checkpoint is saved and
            # printed at once, so a killed probe still leaves its finished checkpoints behind.
            report["seconds"] = round(time.perf_counter() - began, 1)
            _save_report(report, out)
            print(render_table({"runs": [{**entry, "checkpoints": {path.stem: entry["checkpoints"][path.stem]}}]}),
                  flush=True)
    report["seconds"] = round(time.perf_counter() - began, 1)
    report["complete"] = True
    _save_report(report, out)
    print("\n=== all checkpoints ===" + render_table(report))
    print(f"\nJSON: {out}")
    return 0


def _save_report(report: dict[str, Any], out: Path) -> None:
    from rpm_lib.training.run_dir import finite_for_json

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(finite_for_json(report), indent=2, default=str))
    tmp.replace(out)


# ----------------------------------------------------------------------------------------------
# table
# ----------------------------------------------------------------------------------------------
def _pct(x: Any) -> str:
    return "  -  " if x is None else f"{100 * x:5.1f}"


def render_table(report: dict[str, Any]) -> str:
    lines = []
    for run in report["runs"]:
        lines.append(f"\n{run['run_dir']}  ({run['setup']}, {run['encoder']}, {run['image_size']} px, "
                     f"{run['precision']}; {run['num_train']} train / {run['num_val']} val problems; "
                     f"linear stage lr {run['linear_stage']['lr']:g}, batch {run['linear_stage']['batch_size']})")
        for name, ck in run["checkpoints"].items():
            lines.append(f"\n[{name}]  step {ck['global_step']}, epoch {ck['epoch']}")
            shift = ck.get("bn_shift_recomputed_vs_stored")
            if shift:
                lines.append("  BN stored -> recomputed on un-augmented train: " + ", ".join(
                    f"{r['layer'].split('.', 1)[-1]} dmu {r['mean_shift_in_sd']:.2f} sd / |dlog var| "
                    f"{r['abs_log_var_ratio']:.2f}" for r in shift))
            head = (f"  {'features':<17}{'|h|':>8}{'cos c/w':>8}{'erank':>7}{'erank Δ':>8}{'win%':>6}"
                    f"{'LBFGS tr':>9}{'LBFGS va':>9}")
            first = next(iter(ck["features"].values()))
            adam_cols = [(a["lr"], a["steps"]) for a in first["adam"]]
            head += "".join(f"{'A' + format(lr, 'g') + '@' + str(s):>14}" for lr, s in adam_cols)
            lines.append(head + "   (Adam: val % last / restored)")
            for fname, f in ck["features"].items():
                st = f["stats_train"]
                row = (f"  {fname:<17}{st['norm_mean']:8.2f}{st['cos_correct_own_wrong']:8.3f}"
                       f"{st['effective_rank_all']:7.1f}{st['effective_rank_correct_minus_wrong']:8.1f}"
                       f"{100 * (st['within_problem_variance_fraction'] or 0):6.1f}"
                       f"{_pct(f['lbfgs']['train_accuracy']):>9}{_pct(f['lbfgs']['val_accuracy']):>9}")
                by_key = {(a["lr"], a["steps"]): a for a in f["adam"]}
                for col in adam_cols:
                    a = by_key.get(col)
                    cell = ("" if a is None else
                            f"{_pct(a['last']['val_accuracy'])}/{_pct(a['restored']['val_accuracy'])}")
                    row += f"{cell:>14}"
                lines.append(row)
                extra = []
                for probe in ("mean_difference", "lda", "knn"):
                    if probe in f:
                        extra.append(f"{probe} {_pct(f[probe]['val_accuracy']).strip()}")
                if "mlp" in f:
                    extra.append("mlp " + " ".join(f"@{a['steps']} {_pct(a['restored']['val_accuracy']).strip()}"
                                                   for a in f["mlp"]))
                # Adam at the other lrs, where the grid was not the header's
                for a in f["adam"]:
                    if (a["lr"], a["steps"]) not in adam_cols:
                        extra.append(f"adam lr {a['lr']:g}@{a['steps']} {_pct(a['restored']['val_accuracy']).strip()}")
                if extra:
                    lines.append(f"  {'':<17}val %: " + ", ".join(extra))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "pretrain":
        return run_pretrain(args)
    return run_probe(args)


if __name__ == "__main__":
    sys.exit(main())
