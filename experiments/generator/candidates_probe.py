"""Learned candidates-only probe: can a small CNN pick the answer while seeing only the 8 candidates?
(docs/generator.md, "Candidates-only probe")

    .venv/bin/python experiments/generator/candidates_probe.py [--runs I-RAVEN-Mesh,I-RAVEN-Mesh:mesh-faithful,A/Color,...]
        [--per-config 1500] [--seed 2024] [--size 40] [--epochs 8] [--threads 2] [--cache DIR] [--json FILE]

A run is ``REGIME[:MODE]`` (mode ``balanced`` unless given; ``I-RAVEN:original`` is RAVEN's candidates, the
positive control). Per run, ``--per-config`` problems of every configuration are generated
(``api.generate_problems``; problem k is filed in the split ``regimes.split_of(k)``: 6/2/2 train/val/test);
only the 8 candidate panels are rendered and shrunk to ``--size`` px (area averaging). The context panels are
never seen.

The model is permutation-equivariant: one small CNN embeds every candidate, each embedding is joined with its
difference to the mean embedding of the 8, and a shared MLP scores it; a softmax over the 8 scores is trained
with cross-entropy. The candidate order is shuffled anew for every sample of every batch (and for evaluation,
once with a fixed seed), so the answer's stored position cannot be learned. After every epoch the val and
test accuracies are measured; the epoch with the best val accuracy gives the reported test accuracy, with
its 99 % Clopper-Pearson interval and the one-sided binomial p-value against chance (1/8). "at chance" means
the interval contains 12.5 %.

Rendered candidates are cached under ``--cache`` (default: a folder in the system temp dir) as .npz, keyed by
run, seed, count and size. Prints one Markdown row per run and the command line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import beta, binomtest

CHANCE = 1 / 8
DEFAULT_RUNS = ("I-RAVEN-Mesh,I-RAVEN-Mesh:mesh-faithful,A/Color,A/Position,A/Size,A/Type,I-RAVEN:original")


def parse_run(text: str) -> tuple[str, str]:
    """``"REGIME[:MODE]"`` -> ``(regime, mode)``; the regime and mode are checked against the generator."""
    from rpm_lib.generator.candidates import check_mode
    from rpm_lib.generator.regimes import resolve_regime

    regime, _, mode = text.strip().partition(":")
    mode = mode or "balanced"
    check_mode(mode, resolve_regime(regime).mesh)
    return regime, mode


def candidate_arrays(regime: str, mode: str, per_config: int, seed: int, size: int,
                     cache: Path | None = None) -> dict[str, np.ndarray]:
    """``images`` uint8 (N, 8, size, size) candidates (255 = white), ``target`` (N,), ``split`` (N,) 0/1/2 =
    train/val/test, ``configuration`` (N,) index into ``rpm_lib.rules.CONFIGURATIONS``."""
    import cv2

    from rpm_lib.generator.api import generate_problems
    from rpm_lib.generator.render import render_panel
    from rpm_lib.rules import CONFIGURATIONS

    path = None
    if cache is not None:
        name = f"{regime.replace('/', '_')}_{mode}_{per_config}_{seed}_{size}.npz"
        path = cache / name
        if path.exists():
            with np.load(path) as data:
                return {key: data[key] for key in data.files}
    splits = {"train": 0, "val": 1, "test": 2}
    n = per_config * len(CONFIGURATIONS)
    images = np.empty((n, 8, size, size), np.uint8)
    target = np.empty(n, np.int64)
    split = np.empty(n, np.int8)
    configuration = np.empty(n, np.int8)
    i = 0
    for c, name in enumerate(CONFIGURATIONS):
        for problem in generate_problems(name, per_config, seed=seed, mode=mode, regime=None if regime == "I-RAVEN"
                                         else regime):
            for j, panel in enumerate(problem.candidates):
                images[i, j] = cv2.resize(render_panel(name, panel), (size, size), interpolation=cv2.INTER_AREA)
            target[i] = problem.target
            split[i] = splits[problem.extra["split"]]
            configuration[i] = c
            i += 1
    arrays = {"images": images, "target": target, "split": split, "configuration": configuration}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
    return arrays


def build_model(size: int, embed: int = 64):
    """Per-candidate CNN + set-aware scorer (permutation-equivariant over the 8 candidates). The CNN is small
    on purpose (two strided convolutions: 40 px -> 10 -> 5), so that a CPU trains it in minutes."""
    import torch
    from torch import nn

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            convolutions = nn.Sequential(nn.Conv2d(1, 16, 5, stride=4, padding=2), nn.ReLU(),
                                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
            features = convolutions(torch.zeros(1, 1, size, size)).shape[1]
            self.encoder = nn.Sequential(convolutions, nn.Linear(features, embed), nn.ReLU())
            self.scorer = nn.Sequential(nn.Linear(2 * embed, embed), nn.ReLU(), nn.Linear(embed, 1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, 8, S, S) float, ink = 1
            b, k = x.shape[:2]
            e = self.encoder(x.reshape(b * k, 1, *x.shape[2:])).reshape(b, k, -1)
            h = torch.cat([e, e - e.mean(dim=1, keepdim=True)], dim=-1)
            return self.scorer(h).squeeze(-1)

    return Probe()


def _permuted(images, target, generator):
    """Each sample's candidates in a fresh random order; the target follows its candidate."""
    import torch

    order = torch.argsort(torch.rand(images.shape[0], 8, generator=generator), dim=1)
    shuffled = torch.gather(images, 1, order[:, :, None, None].expand_as(images))
    new_target = (order == target[:, None]).float().argmax(dim=1)
    return shuffled, new_target


def clopper_pearson(hits: int, n: int, level: float = 0.99) -> tuple[float, float]:
    alpha = 1 - level
    low = beta.ppf(alpha / 2, hits, n - hits + 1) if hits > 0 else 0.0
    high = beta.ppf(1 - alpha / 2, hits + 1, n - hits) if hits < n else 1.0
    return float(low), float(high)


def train_probe(arrays: dict[str, np.ndarray], epochs: int, seed: int, batch: int = 128, lr: float = 2e-3) -> dict:
    """Train on the train split, pick the epoch on val, report test. Returns a dict of results."""
    import torch

    torch.manual_seed(seed)
    images = torch.from_numpy(arrays["images"])
    target = torch.from_numpy(arrays["target"])
    split = torch.from_numpy(arrays["split"])
    x = 1.0 - images.float() / 255.0  # ink = 1
    parts = {name: (x[split == k], target[split == k]) for k, name in enumerate(("train", "val", "test"))}
    fixed = torch.Generator().manual_seed(seed + 1)
    evaluation = {name: _permuted(*parts[name], fixed) for name in ("val", "test")}
    model = build_model(x.shape[-1])
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    shuffle = torch.Generator().manual_seed(seed + 2)
    history = []
    train_x, train_y = parts["train"]
    for epoch in range(1, epochs + 1):
        model.train()
        began = time.perf_counter()
        order = torch.randperm(len(train_y), generator=shuffle)
        total_loss = 0.0
        for start in range(0, len(order), batch):
            index = order[start:start + batch]
            xb, yb = _permuted(train_x[index], train_y[index], shuffle)
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total_loss += float(loss.detach()) * len(index)
        model.eval()
        row = {"epoch": epoch, "loss": total_loss / len(order), "seconds": time.perf_counter() - began}
        with torch.no_grad():
            for name, (ex, ey) in evaluation.items():
                hits = sum(int((model(ex[i:i + 512]).argmax(1) == ey[i:i + 512]).sum()) for i in range(0, len(ey), 512))
                row[name] = hits
        history.append(row)
        print(f"    epoch {epoch}: loss {row['loss']:.4f}, val {row['val']}/{len(evaluation['val'][1])}, test "
              f"{row['test']}/{len(evaluation['test'][1])} ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    best = max(history, key=lambda r: (r["val"], -r["epoch"]))
    n_test = len(evaluation["test"][1])
    low, high = clopper_pearson(best["test"], n_test)
    return {"train": len(train_y), "val": len(evaluation["val"][1]), "test": n_test, "epoch": best["epoch"],
            "val_hits": best["val"], "test_hits": best["test"], "accuracy": best["test"] / n_test,
            "ci99": (low, high), "p_one_sided": binomtest(best["test"], n_test, CHANCE, "greater").pvalue,
            "at_chance": low <= CHANCE <= high, "history": history}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated REGIME[:MODE] (default: %(default)s)")
    parser.add_argument("--per-config", type=int, default=1500, help="problems per configuration and run")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--size", type=int, default=40, help="candidate side in px after shrinking")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "candidates_probe")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if args.per_config < 10 or args.epochs < 1 or args.size < 8:
        parser.error("--per-config >= 10, --epochs >= 1 and --size >= 8 are needed")
    try:
        runs = [parse_run(text) for text in args.runs.split(",") if text.strip()]
    except ValueError as error:
        parser.error(f"--runs: {error}")
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print(f"`{' '.join(['.venv/bin/python', 'experiments/generator/candidates_probe.py'] + (argv if argv is not None else sys.argv[1:]))}`\n")
    print("| run | train / val / test problems | epoch (by val) | test accuracy | 99 % interval | one-sided p vs 12.5 % "
          "| verdict |")
    print("|---|---|---:|---:|---|---:|---|")
    results = []
    for regime, mode in runs:
        began = time.perf_counter()
        print(f"  {regime}:{mode}: generating", file=sys.stderr, flush=True)
        arrays = candidate_arrays(regime, mode, args.per_config, args.seed, args.size,
                                  None if args.no_cache else args.cache)
        result = train_probe(arrays, args.epochs, args.seed)
        result.update(run=f"{regime}:{mode}", seconds=time.perf_counter() - began)
        results.append(result)
        low, high = result["ci99"]
        verdict = "at chance" if result["at_chance"] else ("ABOVE chance" if low > CHANCE else "below chance")
        print(f"| {regime} ({mode}) | {result['train']} / {result['val']} / {result['test']} | {result['epoch']} | "
              f"{100 * result['accuracy']:.2f} % ({result['test_hits']}) | {100 * low:.2f}-{100 * high:.2f} % | "
              f"{result['p_one_sided']:.3g} | {verdict} |", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
