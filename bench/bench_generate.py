"""Speed of ``rpm-generate``: problems/s per configuration in one process, writing complete files.

    .venv/bin/python bench/bench_generate.py [--per-config 300] [--pool-per-config 1000] [--workers 2]

Part 1 (one process): for each configuration, generate, render and write (.npz + .xml) ``--per-config``
problems, timing the stages: sampling (``generate_problem``), rendering (``render_problem``) and
files (labels + .xml + .npz, written atomically). The sprite cache starts empty for each configuration,
so the rates include the warm-up a real run pays once per worker and configuration.
Targets: >= 180 problems/s per process overall.

Part 2: ``write_dataset`` (what ``rpm-generate`` runs) with ``--workers`` processes on all configurations,
``--pool-per-config`` problems each, wall clock including process start-up and cache warm-up,
extrapolated linearly to the full 70,000-problem I-RAVEN set (conservative: the sprite caches keep
warming up over a full run). Target: <= 5 min with 2 workers.

Prints Markdown tables and the command line.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from rpm_lib.generator.api import generate_problem, problem_rng
from rpm_lib.generator.render import SPRITES, render_problem
from rpm_lib.generator.writer import ALL_CONFIGURATIONS, problem_stem, write_dataset, write_problem
from rpm_lib.generator.xml_io import problem_xml
from rpm_lib.rules import SHORT_NAMES

FULL_SET = 70_000
TARGET_PER_PROCESS = 180.0
TARGET_FULL_SET_MIN = 5.0


def bench_one_process(root: Path, per_config: int, seed: int, mode: str) -> list[dict]:
    rows = []
    for configuration in ALL_CONFIGURATIONS:
        (root / configuration).mkdir(parents=True, exist_ok=True)
        SPRITES.clear()
        sample = render = files = xml = 0.0
        xml_bytes = 0
        for k in range(per_config):
            t0 = time.perf_counter()
            problem = generate_problem(configuration, problem_rng(seed, configuration, k), mode)
            t1 = time.perf_counter()
            image = render_problem(problem)
            t2 = time.perf_counter()
            write_problem(problem, problem_stem(root, configuration, k), image=image)
            t3 = time.perf_counter()
            sample, render, files = sample + t1 - t0, render + t2 - t1, files + t3 - t2
            if k % 10 == 0:  # the .xml string alone (already included in "files"), on a subsample
                t4 = time.perf_counter()
                xml_bytes += len(problem_xml(problem))
                xml += (time.perf_counter() - t4) * 10
        total = sample + render + files
        rows.append({
            "configuration": configuration, "n": per_config, "sample_ms": 1e3 * sample / per_config,
            "render_ms": 1e3 * render / per_config, "files_ms": 1e3 * files / per_config,
            "xml_ms": 1e3 * xml / per_config, "rate": per_config / total, "seconds": total,
            "sprites": len(SPRITES), "hit_rate": SPRITES.hits / max(1, SPRITES.hits + SPRITES.misses),
        })
        print(f"  {configuration}: {per_config / total:.0f} problems/s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-config", type=int, default=300, help="problems per configuration (default 300)")
    parser.add_argument("--pool-per-config", type=int, default=1000,
                        help="problems per configuration for the multi-worker run (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="workers for the full-set extrapolation (default 2)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--mode", default="balanced", choices=("balanced", "original"))
    parser.add_argument("--keep", default=None, help="write into this folder and keep it (default: a temp folder)")
    parser.add_argument("--tmp", default=None, help="parent folder of the temporary output (default: system temp)")
    args = parser.parse_args()

    command = "python bench/bench_generate.py " + " ".join(sys.argv[1:])
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_generate_", dir=args.tmp))
    try:
        print(f"one process, {args.per_config} problems per configuration ...", file=sys.stderr)
        rows = bench_one_process(base / "one", args.per_config, args.seed, args.mode)
        print(f"{args.workers} workers via write_dataset ...", file=sys.stderr)
        began = time.perf_counter()
        write_dataset(base / "pool", "all", count=args.pool_per_config, seed=args.seed, mode=args.mode,
                      workers=args.workers, progress=False)
        pool_seconds = time.perf_counter() - began
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    n_total = sum(r["n"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    overall = n_total / seconds
    n_pool = args.pool_per_config * len(ALL_CONFIGURATIONS)
    pool_rate = n_pool / pool_seconds
    full_minutes = FULL_SET / pool_rate / 60

    print(f"\n## rpm-generate speed ({args.mode}, {args.per_config} problems per configuration)\n")
    print(f"command: `{command}`  ")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared), "
          f"Python {platform.python_version()}, numpy {np.__version__}, OpenCV {cv2.__version__}\n")
    print("| configuration | problems/s | sample ms | render ms | files ms (.npz+.xml) | of which .xml string ms | sprites cached | sprite hit rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {SHORT_NAMES[r['configuration']]} | {r['rate']:.0f} | {r['sample_ms']:.2f} | {r['render_ms']:.2f} | "
              f"{r['files_ms']:.2f} | {r['xml_ms']:.2f} | {r['sprites']} | {100 * r['hit_rate']:.1f} % |")
    print(f"| **overall (1 process)** | **{overall:.0f}** | | | | | | |")
    print()
    print("| measurement | value | target |")
    print("|---|---:|---:|")
    print(f"| one process, all configurations | {overall:.0f} problems/s | >= {TARGET_PER_PROCESS:.0f} |")
    print(f"| {args.workers} workers, {n_pool} problems (wall, incl. start-up) | {pool_rate:.0f} problems/s | |")
    print(f"| full 70,000-problem set, {args.workers} workers (extrapolated) | {full_minutes:.1f} min | "
          f"<= {TARGET_FULL_SET_MIN:.0f} min |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
