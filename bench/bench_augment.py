"""Throughput of rpm_lib.augment: RPMs per second, one process, OpenCV on one thread.

Each RPM is 16 panels (white canvases with black boxes) of S x S uint8 pixels, augmented by one
``RpmAugment`` call, the way ``Dataset.__getitem__`` calls it. Prints a Markdown table and the command.

    .venv/bin/python bench/bench_augment.py [--calls-80 2000] [--calls-160 600] [--seed 0]
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from rpm_lib.augment import RpmAugment  # noqa: E402


def make_panels(size: int, seed: int) -> np.ndarray:
    """uint8 (16, size, size): white panels with a few black rectangles, like rendered RPM panels."""
    rng = np.random.default_rng(seed)
    panels = np.full((16, size, size), 255, np.uint8)
    for k in range(16):
        for _ in range(4):
            y, x = rng.integers(0, size * 3 // 4, 2)
            h, w = rng.integers(size // 10, size // 4, 2)
            panels[k, y : y + h, x : x + w] = 0
    return panels


def rpms_per_second(aug: RpmAugment, panels: np.ndarray, calls: int, preserve_position: bool) -> float:
    for _ in range(min(50, calls)):  # warm-up: first OpenCV calls allocate
        aug(panels, preserve_position)
    start = time.perf_counter()
    for _ in range(calls):
        aug(panels, preserve_position)
    return calls / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls-80", type=int, default=2000, help="timed calls at 80 px")
    parser.add_argument("--calls-160", type=int, default=600, help="timed calls at 160 px")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    cases = [
        ("official", None, False),          # the training default (pipeline p=0.5)
        ("official", 1.0, False),           # pipeline always runs (worst case of the recipe)
        ("official", None, True),           # position_preserving fallback, as for Position rules
    ]
    rows = []
    for size, calls in ((80, args.calls_80), (160, args.calls_160)):
        panels = make_panels(size, args.seed)
        for recipe, p, preserve in cases:
            aug = RpmAugment(recipe, seed=args.seed, p=p)
            rate = rpms_per_second(aug, panels, calls, preserve)
            label = recipe + (f" p={p:g}" if p is not None else "") + (" preserve_position" if preserve else "")
            rows.append((size, label, calls, rate, 1e3 / rate))

    print(f"cv2 {cv2.__version__}, {cv2.getNumThreads()} OpenCV thread, numpy {np.__version__}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs (shared machine: expect +-20 %)\n")
    print("| panel px | recipe | calls | RPM/s | ms / RPM |")
    print("|---:|---|---:|---:|---:|")
    for size, label, calls, rate, ms in rows:
        print(f"| {size} | {label} | {calls} | {rate:,.0f} | {ms:.3f} |")
    print("\ncommand: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
