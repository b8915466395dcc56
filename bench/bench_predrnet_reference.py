"""rpm_lib's PredRNet side by side with the official code (ZjjConan/AVR-PredRNet), in one run.

Needs a checkout of the official repository (``--reference DIR``: the folder holding ``networks/predrnet.py``; only
that file and ``networks/network_utils.py`` are imported, they need nothing but torch). Builds the official
``predrnet_raven`` with its training command's options (3 extra stages, block and classifier dropout 0.1,
``classifier_hidreduce`` 4) and rpm_lib's ``create_encoder("predrnet")`` + ``ScoringHead``, then reports:

1. parameters: official vs encoder + scoring head (must be equal);
2. output shapes, and with the official weights copied in: the largest score difference (train-mode pass with the
   same dropout seed, then eval mode; the official gets its own input scaling, ``2 x - 1``) and the largest
   difference of one cross-entropy step's gradients;
3. CPU training-step time (forward, backward, Adam step; batch ``--batch-size``), interleaved rounds, as a ratio;
4. learning: per ``--seeds`` seed, the official model's initial weights copied into rpm_lib's, then the same softmax
   cross-entropy training (Adam, lr 1e-3, weight decay 1e-5: the official optimiser) on the same generated I-RAVEN
   problems, batches and dropout draws; each epoch's mean loss and val accuracy, the test accuracy, and each step's
   loss difference. (The paths part within a few steps: Adam's first steps move every parameter by about the
   learning rate whatever the gradient's size, so a gradient that is zero up to rounding, summed in another order,
   moves its parameter by +lr in one model and -lr in the other. The comparison is then one of learning, not of
   numbers.)

    python bench/bench_predrnet_reference.py --reference /path/to/AVR-PredRNet
    python bench/bench_predrnet_reference.py --reference DIR --image-size 48 --per-config 200 --epochs 4 --seeds 0 1

The official model trains with per-answer binary cross-entropy (``loss.py``); part 4 uses the softmax cross-entropy
of rpm_lib's ``ce`` setup for both models, so that only the networks differ.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from rpm_lib.encoders import create_encoder  # noqa: E402
from rpm_lib.heads import ScoringHead  # noqa: E402

#: The official training command's options (README / script_train.sh).
OFFICIAL_OPTIONS: dict[str, Any] = {"num_filters": 32, "num_extra_stages": 3, "block_drop": 0.1,
                                    "classifier_drop": 0.1, "classifier_hidreduce": 4, "in_channels": 1}


def load_official(reference: Path) -> ModuleType:
    """Import ``networks/predrnet.py`` of the official checkout as a package of its own."""
    networks = reference / "networks"
    if not (networks / "predrnet.py").is_file():
        sys.exit(f"--reference {reference}: no networks/predrnet.py there (give the AVR-PredRNet checkout)")
    package = ModuleType("predrnet_official")
    package.__path__ = [str(networks)]
    sys.modules["predrnet_official"] = package
    for name in ("network_utils", "predrnet"):
        spec = importlib.util.spec_from_file_location(f"predrnet_official.{name}", networks / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["predrnet_official.predrnet"]


class RpmLibModel(nn.Module):
    """rpm_lib's encoder + scoring head: (B, 16, S, S) in [0, 1] -> (B, 8) scores."""

    def __init__(self, image_size: int) -> None:
        super().__init__()
        self.encoder = create_encoder("predrnet", image_size=image_size)
        self.head = ScoringHead(self.encoder.embedding_dim)

    def forward(self, panels: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(panels))


class OfficialModel(nn.Module):
    """The official network with its input scaling: (B, 16, S, S) in [0, 1] -> (B, 8) scores."""

    def __init__(self, official: ModuleType) -> None:
        super().__init__()
        self.net = official.predrnet_raven(**OFFICIAL_OPTIONS)

    def forward(self, panels: torch.Tensor) -> torch.Tensor:
        return self.net(panels * 2.0 - 1.0)


def official_to_rpm_lib(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official state dict under rpm_lib's names (``res{i}`` -> ``image_encoder.{i}``, ``prb{i}`` ->
    ``reasoning_blocks.{i}``, the classifier's hidden layers -> ``classifier_hidden``, its last Linear -> the head)."""
    out = {}
    for key, value in state.items():
        key = key.removeprefix("net.")
        if key.startswith("classifier.mlp.4."):
            out["head.linear." + key.rsplit(".", 1)[1]] = value
            continue
        for old, new in (("res", "image_encoder."), ("prb", "reasoning_blocks.")):
            if key.startswith(old) and key[len(old)].isdigit():
                key = new + key[len(old):]
        out["encoder." + key.replace("classifier.mlp.", "classifier_hidden.")] = value
    return out


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def equivalence(official: ModuleType, image_size: int) -> dict[str, Any]:
    """Parameters, shapes and the score difference with the official weights copied into rpm_lib's model."""
    torch.manual_seed(0)
    theirs, ours = OfficialModel(official), RpmLibModel(image_size)
    ours.load_state_dict(official_to_rpm_lib(theirs.state_dict()), strict=True)
    panels = torch.rand(8, 16, image_size, image_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.manual_seed(5)
        train_theirs = theirs.train()(panels)
        torch.manual_seed(5)
        train_ours = ours.train()(panels)
        eval_theirs, eval_ours = theirs.eval()(panels), ours.eval()(panels)
        embeddings = ours.encoder(panels)
    targets = torch.arange(8) % 8
    for model in (theirs, ours):
        torch.manual_seed(6)
        F.cross_entropy(model.train()(panels), targets).backward()
    grads_theirs = official_to_rpm_lib({k: p.grad for k, p in theirs.named_parameters()})
    grads_ours = dict((k, p.grad) for k, p in ours.named_parameters())
    # relative to the model's largest gradient entry: some gradients are zero up to rounding (a BatchNorm bias
    # followed by another BatchNorm), and there any two summation orders differ by 100 %
    largest = max(float(g.abs().max()) for g in grads_ours.values())
    gradient_gap = max(float((grads_theirs[k] - g).abs().max()) for k, g in grads_ours.items()) / largest
    return {"official_parameters": count(theirs), "rpm_lib_parameters": count(ours),
            "rpm_lib_encoder_parameters": count(ours.encoder), "official_scores_shape": list(eval_theirs.shape),
            "rpm_lib_scores_shape": list(eval_ours.shape), "rpm_lib_embeddings_shape": list(embeddings.shape),
            "max_abs_difference_train_mode": float((train_theirs - train_ours).abs().max()),
            "max_abs_difference_eval_mode": float((eval_theirs - eval_ours).abs().max()),
            "max_relative_gradient_difference": gradient_gap}


def step_function(model: nn.Module, batch: int, image_size: int) -> Callable[[], None]:
    panels = torch.rand(batch, 16, image_size, image_size, generator=torch.Generator().manual_seed(2))
    targets = torch.randint(0, 8, (batch,), generator=torch.Generator().manual_seed(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-5)
    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(panels), targets).backward()
        optimizer.step()
    return step


def step_times(official: ModuleType, args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds per training step of each model over interleaved rounds, and their ratio."""
    torch.manual_seed(0)
    steps = {"official": step_function(OfficialModel(official), args.batch_size, args.image_size),
             "rpm_lib": step_function(RpmLibModel(args.image_size), args.batch_size, args.image_size)}
    for step in steps.values():
        step()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            began = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds[name].append((time.perf_counter() - began) / args.steps)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    return {"seconds_per_step": median, "rpm_lib_over_official": median["rpm_lib"] / median["official"],
            "batch_size": args.batch_size, "rounds": args.rounds, "steps_per_round": args.steps}


def generated_problems(per_config: int, image_size: int, seed: int) -> dict[str, np.ndarray]:
    """A balanced I-RAVEN set from rpm_lib's generator at ``image_size`` px: panels and targets by split."""
    from rpm_lib.data.raw_files import SPLITS
    from rpm_lib.generator.cache_writer import generate_cache

    with tempfile.TemporaryDirectory() as folder:
        generate_cache(Path(folder) / "cache", count=per_config, seed=seed, size=image_size, progress=False,
                       workers=max(1, torch.get_num_threads()))
        root = Path(folder) / "cache"
        panels, targets, splits = (np.load(root / f"{n}.npy") for n in ("panels", "targets", "splits"))
    return {f"{part}_{name}": array[splits == index] for index, name in enumerate(SPLITS)
            for part, array in (("panels", panels), ("targets", targets))}


def accuracy(model: nn.Module, panels: np.ndarray, targets: np.ndarray, batch: int) -> float:
    model.eval()
    right = 0
    with torch.no_grad():
        for start in range(0, len(panels), batch):
            x = torch.from_numpy(panels[start:start + batch]).float() / 255.0
            right += int((model(x).argmax(1) == torch.from_numpy(targets[start:start + batch]).long()).sum())
    return right / len(panels)


def learning(official: ModuleType, data: dict[str, np.ndarray], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per seed: the official model from ``torch.manual_seed(seed)``, rpm_lib's with those weights copied in, trained
    side by side with the same CE, optimiser, batches and dropout draws; losses and accuracies of both."""
    rows = []
    train_panels, train_targets = data["panels_train"], data["targets_train"]
    for seed in args.seeds:
        torch.manual_seed(seed)
        models = {"official": OfficialModel(official), "rpm_lib": RpmLibModel(args.image_size)}
        models["rpm_lib"].load_state_dict(official_to_rpm_lib(models["official"].state_dict()), strict=True)
        optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-3, weight_decay=1e-5) for name, m in models.items()}
        order = np.random.default_rng(seed)
        curves: dict[str, dict[str, list[float]]] = {name: {"train_loss": [], "val_accuracy": []} for name in models}
        gaps: list[float] = []
        step, began = 0, time.perf_counter()
        for _ in range(args.epochs):
            losses: dict[str, list[float]] = {name: [] for name in models}
            for batch in np.array_split(order.permutation(len(train_panels)),
                                        max(1, len(train_panels) // args.batch_size)):
                picked = np.sort(batch)
                x = torch.from_numpy(train_panels[picked]).float() / 255.0
                y = torch.from_numpy(train_targets[picked]).long()
                for name, model in models.items():
                    model.train()
                    torch.manual_seed(seed * 1_000_003 + step)  # the same dropout masks for both
                    optimizers[name].zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    optimizers[name].step()
                    losses[name].append(float(loss.detach()))
                gaps.append(abs(losses["official"][-1] - losses["rpm_lib"][-1]))
                step += 1
            for name, model in models.items():
                curves[name]["train_loss"].append(statistics.mean(losses[name]))
                curves[name]["val_accuracy"].append(accuracy(model, data["panels_val"], data["targets_val"],
                                                             args.batch_size))
            print(f"  seed {seed} epoch {len(curves['official']['train_loss'])}/{args.epochs}: "
                  + "; ".join(f"{name} train loss {curve['train_loss'][-1]:.4f}, "
                              f"val {100 * curve['val_accuracy'][-1]:.1f} %" for name, curve in curves.items())
                  + f" ({time.perf_counter() - began:.0f} s)", flush=True)
        for name, model in models.items():
            rows.append({"model": name, "seed": seed, **curves[name], "steps": step,
                         "test_accuracy": accuracy(model, data["panels_test"], data["targets_test"], args.batch_size),
                         "step_loss_differences": gaps})
            print(f"  seed {seed} {name}: train loss {' '.join(f'{v:.4f}' for v in curves[name]['train_loss'])}; "
                  f"val % {' '.join(f'{100 * v:.1f}' for v in curves[name]['val_accuracy'])}; "
                  f"test {100 * rows[-1]['test_accuracy']:.1f} %", flush=True)
        apart = next((k for k, gap in enumerate(gaps) if gap > 1e-4), None)
        print(f"  seed {seed}: the two losses differ by at most {max(gaps):.2e} over {step} steps; "
              + (f"first by more than 1e-4 at step {apart}" if apart is not None else "never by more than 1e-4")
              + f" ({time.perf_counter() - began:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, metavar="DIR", help="AVR-PredRNet checkout")
    parser.add_argument("--image-size", type=int, default=80, help="panel side in px (80, as the official runs)")
    parser.add_argument("--batch-size", type=int, default=32, help="RPMs per step (timing and training)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median kept)")
    parser.add_argument("--per-config", type=int, default=100,
                        help="generated problems per configuration for the learning part (60/20/20 split); 0 skips it")
    parser.add_argument("--epochs", type=int, default=3, help="training epochs of the learning part")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="initialisation seeds of the learning part")
    parser.add_argument("--data-seed", type=int, default=1234, help="generator seed of the learning part's problems")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write every number to PATH")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    official = load_official(args.reference.resolve())
    commit = _git_commit(args.reference)

    report: dict[str, Any] = {"reference_commit": commit, "torch": torch.__version__, "threads": args.threads}
    report["equivalence"] = same = equivalence(official, args.image_size)
    print(f"official {commit}: {same['official_parameters']:,} parameters; rpm_lib encoder "
          f"{same['rpm_lib_encoder_parameters']:,} + scoring head = {same['rpm_lib_parameters']:,}")
    print(f"scores {same['official_scores_shape']} vs {same['rpm_lib_scores_shape']} (embeddings "
          f"{same['rpm_lib_embeddings_shape']}); official weights copied in: max |difference| "
          f"{same['max_abs_difference_train_mode']:.2e} (train mode), {same['max_abs_difference_eval_mode']:.2e} (eval); "
          f"CE gradients: largest difference {same['max_relative_gradient_difference']:.2e} of the largest gradient entry")
    report["step_time"] = timing = step_times(official, args)
    print(f"CPU training step, batch {args.batch_size}, {args.image_size} px: official "
          f"{timing['seconds_per_step']['official']:.3f} s, rpm_lib {timing['seconds_per_step']['rpm_lib']:.3f} s "
          f"(ratio rpm_lib / official {timing['rpm_lib_over_official']:.2f})", flush=True)
    if args.per_config > 0:
        data = generated_problems(args.per_config, args.image_size, args.data_seed)
        print(f"learning: {len(data['panels_train'])} train / {len(data['panels_val'])} val / "
              f"{len(data['panels_test'])} test problems, {args.epochs} epochs, seeds {args.seeds}", flush=True)
        report["learning"] = learning(official, data, args)
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    report["command"] = command
    print(f"command: {command}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    same_count = same["official_parameters"] == same["rpm_lib_parameters"]
    return 0 if same_count and same["max_abs_difference_eval_mode"] < 1e-4 else 1


def _git_commit(folder: Path) -> str:
    import subprocess

    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "(not a git checkout)"


if __name__ == "__main__":
    sys.exit(main())
