"""``rpm-generate``: write an I-RAVEN (balanced), RAVEN (original) or RAVEN-FAIR (fair) data set in the released
layout, optionally in a generalisation regime (Attributeless-I-RAVEN; docs/generator.md, "Generalisation regimes"),
or straight into a training cache (``--cache-size``; docs/generator.md, "Straight into a training cache").

Example (the full I-RAVEN set, 70,000 problems, ~30 GB)::

    rpm-generate --out data/i-raven --num-per-config 10000 --configurations all --seed 1234 \\
        --mode balanced --workers 2

    rpm-generate --out data/a-color --regime A/Color              # train/val: Color Constant; test: not
    rpm-generate --out data/a-color-ood --regime A/Color --val 0 --test 10   # an all-test folder
    rpm-generate --out data/custom --held-out size:Progression --held-out type
    rpm-generate --out data/raven-fair --mode fair                # RAVEN-FAIR (docs/generator.md, "RAVEN-FAIR")
    rpm-generate --out data/i-raven-mesh --mesh                   # I-RAVEN-Mesh (docs/generator.md, "Mesh")
    rpm-generate --out data/mesh-faithful --mesh --mode mesh-faithful   # with raven-datasets' line-count leak
    rpm-generate --out data/i-raven-80 --cache-size 80 --workers 16     # straight into a training cache (7.2 GB)

Every error is one line on stderr with exit status 2 (bad options, nothing written) or 1 (the write failed).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from rpm_lib.cli_parser import OneLineArgumentParser, print_error
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.records import REGIME_FILE
from rpm_lib.folder_lock import NotEnoughSpaceError, UnsafeLockFileError, cap_workers, output_folder_problem
from rpm_lib.generator.regimes import PRIMARY_REGIMES, REGIMES, check_split_proportions, regime_from_options
from rpm_lib.generator.cache_writer import MAX_INDEX, generate_cache
from rpm_lib.generator.candidates import MODES, check_mode
from rpm_lib.generator.writer import write_dataset
from rpm_lib.rules import CONFIGURATIONS, resolve_configurations

def _regime_lines() -> str:
    width = max(len(name) for name in REGIMES)
    lines = []
    for name, regime in REGIMES.items():
        tier = " [primary]" if name in PRIMARY_REGIMES else ""
        lines.append(f"  {name:<{width}}  {regime.description}{tier}")
    return "\n".join(lines)


_EPILOG = f"""\
--cache-size S writes no problem files: <out> becomes the memory-mapped training cache that `rpm-data
prepare <raw> --size S` would build from them (the same bytes), without the ~410 kB .npz per problem between.

output layout: <out>/<configuration>/RAVEN_<k>_<split>.npz (+ .xml), split by k % 10 in tenths:
the first 10-val-test remainders train, then val, then test (default --val 2 --test 2: 0-5 train,
6-7 val, 8-9 test). Keys: image (16,160,160) uint8, target, predict (= target), meta_matrix (8,9) (also
in every Attributeless regime; (12,9) with the Mesh rules in rows 8-11 under --mesh), meta_target (9),
structure, meta_structure (21). <out>/{REGIME_FILE} names the regime. --mode original and --mode fair write
RAVEN's form (no Modified_attributes in the .xml); RAVEN-FAIR's own generator compresses its .npz, rpm-generate
writes every .npz uncompressed (the same keys and arrays, byte-identical for equal problems).

regimes (--regime NAME; train and val share the train rules, only test is out of distribution):
{_regime_lines()}
--held-out ATTR[:RULE] builds another regime: ATTR position|number (one group), type, size, color;
RULE Constant (default), Progression, Arithmetic, Distribute_Three (no Arithmetic on type).

Resumable: finished problems are skipped, so rerun the same command after an interruption. Files are
written under a temporary name and renamed into place (.npz first, .xml last).
Deterministic: problem k of configuration c depends only on (seed, c, k), so the files are
byte-identical for any --workers and across interruptions.

configurations: {", ".join(CONFIGURATIONS)}
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="rpm-generate",
        description="Generate RAVEN-style problems (I-RAVEN balanced candidates by default) as .npz + .xml files, "
                    "or straight into a training cache (--cache-size).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="output root folder (created if missing)")
    parser.add_argument("--num-per-config", type=int, default=10000, metavar="N",
                        help="problems per configuration (default: 10000, the I-RAVEN size)")
    parser.add_argument("--configurations", default="all",
                        help="'all' (default) or a comma-separated list of configuration folder or short names (Center, L-R, ...)")
    parser.add_argument("--seed", type=int, default=1234, help="base seed (default: 1234)")
    parser.add_argument("--mode", choices=MODES, default="balanced",
                        help="candidate generation: 'balanced' = I-RAVEN (default), 'original' = RAVEN (biased), "
                             "'fair' = RAVEN-FAIR (a tree of one-attribute changes grown from the answer; files "
                             "like RAVEN's), 'mesh-faithful' = with --mesh, raven-datasets' Mesh Number alternatives "
                             "(the answer tends to have fewer lines than its distractors)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="worker processes (default: 1; capped at the number of CPUs)")
    parser.add_argument("--start", type=int, default=0, metavar="K",
                        help="first problem index k (default: 0); generates k = start .. start+N-1")
    parser.add_argument("--no-xml", action="store_true", help="write only the .npz files (no .xml annotations; a few %% faster, 8 %% less disk)")
    parser.add_argument("--cache-size", type=int, default=None, metavar="S",
                        help="write a training cache at S px (rpm-data prepare's format, area resize) into --out "
                             "instead of .npz/.xml files; rpm-train reads it as data_root")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--regime", choices=list(REGIMES), default=None, metavar="NAME",
                        help="generalisation regime (listed below; default: plain I-RAVEN)")
    parser.add_argument("--held-out", action="append", default=None, metavar="ATTR[:RULE]",
                        help="hold out a rule group with a train rule (repeatable; instead of --regime)")
    parser.add_argument("--mesh", action="store_true",
                        help="add the I-RAVEN-Mesh component: a rule-governed 12-line lattice over the shapes "
                             "(= --regime I-RAVEN-Mesh; not with --mode original or fair)")
    parser.add_argument("--val", type=int, default=2, metavar="N",
                        help="tenths of the problems filed as val (default 2)")
    parser.add_argument("--test", type=int, default=2, metavar="N",
                        help="tenths of the problems filed as test (default 2; --val 0 --test 10: all test)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpm-generate``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_per_config < 1:
        parser.error("--num-per-config must be >= 1")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.start < 0:
        parser.error("--start must be >= 0")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.cache_size is not None and args.cache_size < 1:
        parser.error(f"--cache-size must be >= 1, got {args.cache_size}")
    if args.cache_size is not None and args.no_xml:
        # not an error (the request is met), but an option that does nothing is never dropped silently
        print("rpm-generate: note: --no-xml has no effect with --cache-size: a cache holds no .xml files",
              file=sys.stderr)
    if args.cache_size is not None and args.start + args.num_per_config - 1 > MAX_INDEX:
        parser.error(f"--start {args.start} with --num-per-config {args.num_per_config} goes past problem index "
                     "2**63 - 1, the largest a cache stores (int64)")
    problem = output_folder_problem(args.out)
    if problem:
        parser.error(f"--out: {problem}")
    try:
        configurations = resolve_configurations(args.configurations)
    except ValueError as error:
        parser.error(f"--configurations: {error}")
    try:
        check_split_proportions(args.val, args.test)
    except ValueError as error:
        parser.error(f"--val/--test: {error}")
    try:
        regime = regime_from_options(args.regime, args.held_out, args.mesh)
        check_mode(args.mode, regime.mesh)
    except ValueError as error:
        parser.error(str(error))
    workers = cap_workers(args.workers, "rpm-generate")
    began = time.perf_counter()
    shared = dict(count=args.num_per_config, seed=args.seed, mode=args.mode, workers=workers, start=args.start,
                  progress=not args.quiet, regime=regime, val=args.val, test=args.test)
    try:
        if args.cache_size is None:
            summary = write_dataset(args.out, configurations, write_xml=not args.no_xml, **shared)
        else:
            summary = generate_cache(args.out, configurations, size=args.cache_size, **shared)
    except DataFormatError as error:  # --out holds something else, or a cache of other settings: nothing written
        print_error("rpm-generate", error)
        return 2
    except UnsafeLockFileError as error:  # no problem written yet, and only the user can remove it: like bad options
        print_error("rpm-generate", error)
        return 2
    except RuntimeError as error:
        print_error("rpm-generate", error)
        return 1
    except NotEnoughSpaceError as error:  # checked before writing: nothing was written
        print_error("rpm-generate", error)
        return 1
    except OSError as error:  # e.g. the disk filled up anyway: finished problems stay, a rerun resumes
        print_error("rpm-generate", f"{error.strerror or error} ({error.filename or args.out}); the problems written so far are kept and "
               "a rerun of the same command resumes")
        return 1
    seconds = time.perf_counter() - began
    rate = summary["written"] / seconds if seconds > 0 else 0.0
    what = "" if args.cache_size is None else f"a cache at {args.cache_size} px; "
    print(
        f"rpm-generate: {summary['total']} {regime.name} problems in {args.out} "
        f"({what}{summary['written']} written, {summary['skipped']} already complete) "
        f"in {seconds:.1f} s ({rate:.1f} problems/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
