"""From nothing to the training cache: the two-step recipe against ``rpm-generate --cache-size``, side by side.

    .venv/bin/python bench/bench_training_data.py [--per-config 300] [--workers N] [--size 80] [--rounds 2]

Two ways to make the memory-mapped cache that ``rpm-train`` reads (``data_root``), timed as the commands a user
runs (subprocesses, wall clock, process start-up included), in the same process and alternating order round
by round so that the machine's other load falls on both:

* **two-step**: ``rpm-generate --no-xml`` writes every problem as a ~410 kB ``.npz`` at 160 px, then
  ``rpm-data prepare --size S`` reads them back and resizes them;
* **direct**: ``rpm-generate --cache-size S`` resizes each problem in the worker that rendered it and writes only
  the cache.

Each round starts from empty folders (the previous round's are deleted). Reported per recipe: the median wall
time, problems/s, and the bytes the recipe left on disk (the raw folder and the cache); then the ratio, and
whether both caches have the same data fingerprint (``rpm_lib.data.fingerprint``; they must: the campaign's runs
resume on either). The GPU campaign's data step is the same work at 10,000 problems per configuration with
16 workers (``configs/table1_scl_gpu.yaml``).

Prints a Markdown table and the command line.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rpm_lib.batch.prepare import resolve_command as _resolve_command
from rpm_lib.data.fingerprint import data_fingerprint

RECIPES = ("two-step", "direct")


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def _run(argv: list[str]) -> None:
    """Run a console script as a user would (the one beside this interpreter when it is not on PATH)."""
    done = subprocess.run(_resolve_command(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench_training_data: {' '.join(argv)} failed: {done.stderr.strip()[-500:]}")


def make_cache(recipe: str, root: Path, per_config: int, workers: int, size: int, seed: int) -> tuple[float, int, Path]:
    """Build the cache with ``recipe`` under ``root``: (wall seconds, bytes left on disk, the cache folder)."""
    raw, cache = root / "raw", root / f"cache-{size}"
    common = ["--num-per-config", str(per_config), "--seed", str(seed), "--mode", "balanced", "--workers",
              str(workers), "--quiet"]
    began = time.perf_counter()
    if recipe == "two-step":
        _run(["rpm-generate", "--out", str(raw), "--no-xml", *common])
        _run(["rpm-data", "prepare", str(raw), "--out", str(cache), "--size", str(size), "--workers", str(workers),
              "--no-progress"])
    else:
        _run(["rpm-generate", "--out", str(cache), "--cache-size", str(size), *common])
    seconds = time.perf_counter() - began
    return seconds, _folder_bytes(raw) + _folder_bytes(cache), cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-config", type=int, default=300, help="problems per configuration (default 300)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes of both recipes (default: the number of CPUs)")
    parser.add_argument("--size", type=int, default=80, help="cache panel size in px (default 80)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, the recipes' order alternating (default 2)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--tmp", default=None, help="parent folder of the temporary output (default: system temp)")
    args = parser.parse_args(argv)
    if min(args.per_config, args.workers, args.size, args.rounds) < 1:
        parser.error("--per-config, --workers, --size and --rounds must be >= 1")
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    problems = 7 * args.per_config
    seconds: dict[str, list[float]] = {recipe: [] for recipe in RECIPES}
    disk: dict[str, int] = {}
    fingerprints: dict[str, str] = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for number in range(args.rounds):
            for recipe in (RECIPES if number % 2 == 0 else RECIPES[::-1]):
                root = Path(tmp) / recipe
                shutil.rmtree(root, ignore_errors=True)
                took, used, cache = make_cache(recipe, root, args.per_config, args.workers, args.size, args.seed)
                seconds[recipe].append(took)
                disk[recipe] = used
                fingerprints[recipe] = data_fingerprint(cache)
                print(f"round {number + 1}: {recipe:8s} {took:6.1f} s", file=sys.stderr)
                shutil.rmtree(root, ignore_errors=True)
    median = {recipe: statistics.median(values) for recipe, values in seconds.items()}
    print(f"\n## From nothing to the {args.size} px training cache ({problems:,} problems, {args.workers} workers, "
          f"median of {args.rounds} rounds)\n")
    print("| recipe | seconds | problems/s | on disk after (GB) |")
    print("|---|---:|---:|---:|")
    for recipe in RECIPES:
        print(f"| {recipe} | {median[recipe]:.1f} | {problems / median[recipe]:,.0f} | {disk[recipe] / 1e9:.2f} |")
    same = fingerprints["two-step"] == fingerprints["direct"]
    print(f"\ndirect / two-step speed: {median['two-step'] / median['direct']:.2f}x; the two caches' data fingerprints "
          f"are {'equal' if same else 'DIFFERENT'}")
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"command: python bench/bench_training_data.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
