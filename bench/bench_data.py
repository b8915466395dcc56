"""Data-loading throughput: RPMs/s in one process from raw .npz (160 -> 80 px) vs the memory-mapped cache.

    .venv/bin/python bench/bench_data.py [--root RAW_I_RAVEN] [--per-config 60] [--size 80] [--passes 3]

Without ``--root`` a temporary raw set is built by copying the reference files
(``../shared/reference-data/I-RAVEN``) under new ids k (bench only; deleted afterwards). Samples are read
with ``RavenDataset[i]`` exactly as training does (answer shuffling on, no augmentation), in one process,
sequentially. Targets: cache >= 10x raw and >= 3,000 RPMs/s at 80 px. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import torch  # noqa: E402

from rpm_lib import rules  # noqa: E402
from rpm_lib.data import RavenDataset, prepare_cache  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference-data" / "I-RAVEN"


def split_of(k: int) -> str:
    return "train" if k % 10 < 6 else ("val" if k % 10 < 8 else "test")


def build_raw_copy(reference: Path, out: Path, per_config: int) -> int:
    """Copy reference problems under ids 0..per_config-1 (reference id k % 10) into ``out``; return count."""
    count = 0
    for configuration in rules.CONFIGURATIONS:
        (out / configuration).mkdir(parents=True)
        for k in range(per_config):
            source = reference / configuration / f"RAVEN_{k % 10}_{split_of(k % 10)}.npz"
            shutil.copyfile(source, out / configuration / f"RAVEN_{k}_{split_of(k)}.npz")
            count += 1
    return count


def throughput(dataset: RavenDataset, passes: int) -> tuple[float, int]:
    """RPMs/s over ``passes`` sequential passes (after one warm-up sample)."""
    dataset[0]
    n = 0
    start = time.perf_counter()
    for _ in range(passes):
        for i in range(len(dataset)):
            sample = dataset[i]
            n += 1
    elapsed = time.perf_counter() - start
    assert sample["panels"].shape[-1] == dataset.image_size
    return n / elapsed, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None, help="raw RAVEN / I-RAVEN folder (default: temp copy of the reference files)")
    parser.add_argument("--per-config", type=int, default=60, help="problems per configuration in the temp copy")
    parser.add_argument("--size", type=int, default=80)
    parser.add_argument("--passes", type=int, default=3, help="passes over the cached train split")
    parser.add_argument("--workers", type=int, default=1, help="processes for building the cache")
    args = parser.parse_args()

    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="rpm_bench_data_"))
    try:
        if args.root is None:
            if not REFERENCE.is_dir():
                sys.exit(f"no --root given and reference data not found at {REFERENCE}")
            root = scratch / "raw"
            files = build_raw_copy(REFERENCE, root, args.per_config)
            origin = f"temp copy of {REFERENCE} ({files} files)"
        else:
            root = args.root
            origin = str(root)
        start = time.perf_counter()
        cache = prepare_cache(root, scratch / "cache", size=args.size, workers=args.workers, show_progress=False)
        prepare_seconds = time.perf_counter() - start
        raw_area = RavenDataset(root, "train", image_size=args.size)
        raw_stride = RavenDataset(root, "train", image_size=args.size, resize="stride")
        cached = RavenDataset(cache, "train", image_size=args.size)
        results = [
            ("raw .npz, 160 -> %d area" % args.size, *throughput(raw_area, 1)),
            ("raw .npz, 160 -> %d stride" % args.size, *throughput(raw_stride, 1)),
            ("cache (memmap), %d px" % args.size, *throughput(cached, args.passes)),
        ]
        raw_rate = results[0][1]
        print(f"command: {shlex.join([sys.executable, *sys.argv])}")
        print(f"data: {origin}; train split, {len(raw_area)} problems; answer shuffling on, no augmentation")
        print(
            f"machine: {platform.processor() or platform.machine()}, os.cpu_count()={os.cpu_count()}, "
            f"usable cores={len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}, "
            f"torch threads={torch.get_num_threads()}, one process"
        )
        print(f"cache build: {prepare_seconds:.2f} s for {cached._cache.manifest['num_rows']} problems "
              f"({cached._cache.manifest['num_rows'] / prepare_seconds:.0f} RPMs/s, workers={args.workers})")
        print()
        print("| source | samples | RPMs/s | us/RPM | vs raw area |")
        print("|---|---:|---:|---:|---:|")
        for name, rate, n in results:
            print(f"| {name} | {n} | {rate:,.0f} | {1e6 / rate:.0f} | {rate / raw_rate:.1f}x |")
        cache_rate = results[2][1]
        print()
        print(f"targets: cache >= 10x raw: {'met' if cache_rate >= 10 * raw_rate else 'NOT met'}; "
              f">= 3,000 RPMs/s: {'met' if cache_rate >= 3000 else 'NOT met'}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
