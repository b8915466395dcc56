"""``rpm-data``: build and inspect the memory-mapped cache.

    rpm-data prepare <root> --out <cache> [--size 80] [--workers N] [--kind raven|pgm] [--on-error stop|skip]
                     [--resize area|stride] [--configurations NAME ...] [--regimes NAME ...]
    rpm-data info <cache>
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import rpm_lib.data.opencv_version as opencv_version
from rpm_lib.cli_parser import OneLineArgumentParser, print_error
from rpm_lib.data.cache import check_cache, prepare_cache, read_manifest
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import SPLITS
from rpm_lib.data.resize import RESIZE_METHODS
from rpm_lib.folder_lock import cap_workers


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="rpm-data", description="RAVEN / I-RAVEN / PGM data tools")
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser("prepare", help="resize a raw dataset folder into a memory-mapped cache")
    prepare.add_argument("root", type=Path, help="raw dataset folder")
    prepare.add_argument("--out", type=Path, required=True, help="cache folder to create")
    prepare.add_argument("--size", type=int, default=80, help="panel side in px (default 80)")
    prepare.add_argument("--workers", type=int, default=1,
                         help="worker processes (default 1; capped at the number of CPUs)")
    prepare.add_argument("--kind", choices=("raven", "pgm"), default="raven", help="dataset kind (default raven)")
    prepare.add_argument("--on-error", choices=("stop", "skip"), default="stop",
                         help="stop at the first bad file (default) or skip and report bad files in <out>/skipped.txt")
    prepare.add_argument("--resize", choices=RESIZE_METHODS, default="area", help="downscaling method (default area)")
    prepare.add_argument("--configurations", nargs="+", default=None, help="RAVEN: configurations to include (default: all present)")
    prepare.add_argument("--regimes", nargs="+", default=None, help="PGM: regimes to include (default: all present)")
    prepare.add_argument("--chunk-size", type=int, default=64, help="files per unit of resumable work (default 64)")
    prepare.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    info = commands.add_parser("info", help="summarise a cache")
    info.add_argument("cache", type=Path)
    return parser


def _info(cache: Path) -> str:
    """The summary of a cache, checked first as a reader checks it (``check_cache``: the manifest's fields and every
    array against them), with its counts taken from its arrays: a hand-edited or damaged manifest gets the reader's
    one-line error instead of a traceback, and never makes ``info`` report problems the cache does not hold."""
    manifest = read_manifest(cache)
    arrays = check_cache(cache, manifest)
    groups, splits, valid = arrays["groups"], arrays["splits"], arrays["valid"]
    names = manifest["group_names"]  # checked: this version's groups of the kind
    meta_rows = arrays["meta"].shape[1]
    size_bytes = sum(p.stat().st_size for p in cache.iterdir() if p.is_file())
    lines = [
        f"cache        {cache}",
        f"kind         {manifest['kind']}",
        f"image size   {manifest['image_size']} px ({manifest['resize']})",
        f"source       {manifest['plan'].get('source_root', '(not recorded)')}",
        f"pixels       {opencv_version.describe(opencv_version.recorded(cache))}",
        f"problems     {int(valid.sum())} valid of {len(valid)} ({int((~valid).sum())} skipped)",
        *([f"labels       meta_matrix with {meta_rows} rows"
           + (" (I-RAVEN-Mesh: rows 8-11 the Mesh)" if meta_rows == 12 else "")]
          if manifest["kind"] == "raven" and "meta_rows" in manifest else []),
        f"disk         {size_bytes / 1e9:.2f} GB",
        "",
        "| group | " + " | ".join(SPLITS) + " |",
        "|---|" + "---:|" * len(SPLITS),
    ]
    for g in np.unique(groups):
        counts = [int(((groups == g) & (splits == i) & valid).sum()) for i in range(len(SPLITS))]
        lines.append(f"| {names[g]} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            workers = cap_workers(args.workers, "rpm-data prepare")
            out = prepare_cache(
                args.root, args.out, size=args.size, workers=workers, kind=args.kind, on_error=args.on_error,
                resize=args.resize, configurations=args.configurations, regimes=args.regimes,
                chunk_size=args.chunk_size, show_progress=not args.no_progress,
            )
            print(_info(out))
        else:
            print(_info(args.cache))
    except (DataFormatError, ValueError) as error:
        print_error("rpm-data", error)
        return 2
    except (RuntimeError, OSError) as error:  # another writer, a dead worker, a full disk: work done is kept
        message = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        where = f" ({error.filename})" if isinstance(error, OSError) and error.filename else ""
        print_error("rpm-data", f"{message}{where}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
