"""``rpm-batch``: its command line (:func:`main`): run a batch YAML (``rpm_lib.batch.run``), ``--gather`` a batch
folder's tables, ``pack`` / ``unpack`` / ``progress`` a batch folder's resumable state (``rpm_lib.runs.archive``,
``rpm_lib.runs.progress``), and ``status`` / ``cancel`` the cells of a batch on SLURM (``rpm_lib.batch.slurm``).

Exit status: 0, 1 when any run failed, 75 when runs are unfinished (a time budget; run the same command again to
continue), 2 for bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rpm_lib.batch.cell import BACKSTOP_S
from rpm_lib.batch.config import BatchConfigError, load_batch_config, parse_settings, shown
from rpm_lib.batch.grid import expand_grid
from rpm_lib.batch.prepare import run_prepare
from rpm_lib.batch.run import STALL_MINUTES, gather_results, printer, run_batch, time_budget_problem
from rpm_lib.cli_parser import OneLineArgumentParser, print_error
from rpm_lib.folder_lock import UnsafeLockFileError
from rpm_lib.json_files import write_object
from rpm_lib.run_folder import UNFINISHED_EXIT_CODE, RunStatus


#: The most runs executed at once (``--jobs``) and DataLoader workers per run (``--workers-per-run``).
MAX_JOBS = 4096
MAX_WORKERS = 1024
#: The longest ``--stall-minutes``: 30 days.
MAX_STALL_MINUTES = 30 * 24 * 60


def _parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {shown(text)}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(value)
    except (yaml.YAMLError, ValueError):  # an unclosed '[', a number of more digits than int() takes
        raise argparse.ArgumentTypeError(f"{shown(key.strip())}: not a YAML value (or a number too long): "
                                         f"{shown(value)}") from None


def _whole(text: str) -> int:
    """A whole number in ASCII digits (argparse's int() would echo a huge string whole, or accept '١')."""
    if not re.fullmatch(r"[+-]?\d{1,18}", text.strip(), re.ASCII):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text)}")
    return int(text)


def _number(text: str) -> float:
    """A number (float(); an error shows at most ~80 characters of what was given)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {shown(text)}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="rpm-batch",
        description=(
            "Run a grid of notebook executions with papermill (one run folder per grid point, named from its "
            "parameters), resumably: runs whose folder holds metrics.json are skipped; a failing run keeps its "
            "executed notebook and error.txt and does not stop the others. At the end writes results.csv and "
            "table1.csv / table1.md (the MLCL paper's Table 1 layout, with the published numbers), and test_sets.csv "
            "(every run's in- / out-of-distribution test sets) when runs report them, into the batch folder. The "
            "YAML format is described in rpm_lib/batch/config.py and configs/table1.yaml."),
        epilog=("examples:\n"
                "  rpm-batch configs/demo.yaml --dry-run        # print the plan\n"
                "  rpm-batch configs/demo.yaml --jobs 2\n"
                "  rpm-batch configs/table1.yaml --jobs 4       # the paper's grid (GPU machine)\n"
                "  rpm-batch configs/table1.yaml --grid ablation_beta --set max_epochs=10\n"
                "  rpm-batch configs/regimes_cpu.yaml           # train on a regime, test in / out of distribution\n"
                "  rpm-batch --gather runs/table1              # only rebuild results.csv / table1.md\n"
                "  rpm-batch configs/table1_scl_gpu.yaml --jobs 5 --cuda-devices 0 --time-budget 540   # one GPU slice\n"
                "  rpm-batch pack runs/table1_scl --out state.tar.gz   # resumable state (also: unpack, progress;\n"
                "                                                  #   rpm-batch pack --help)"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", help="batch YAML (e.g. configs/table1.yaml)")
    parser.add_argument("--jobs", "-j", type=_whole, default=1,
                        help=f"runs executed in parallel (default 1, at most {MAX_JOBS})")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (runs, parameters, skips) and exit")
    parser.add_argument("--prepare-only", action="store_true",
                        help="run the YAML's prepare steps (make the data) and exit, e.g. before a time-limited "
                             "call or job that should spend its time on training")
    parser.add_argument("--out", help="batch folder (default: the YAML's 'out')")
    parser.add_argument("--grid", action="append", help="run only this grid (repeatable; default: default grids)")
    parser.add_argument("--set", dest="overrides", action="append", type=_parse_override, default=[],
                        metavar="KEY=VALUE", help="force a notebook parameter on every run (YAML value; repeatable)")
    parser.add_argument("--cuda-devices", help="comma-separated GPU ids assigned round-robin to runs, e.g. 0,1,2,3")
    parser.add_argument("--gather", metavar="BATCH_DIR", help="only gather results of an existing batch folder")
    parser.add_argument("--time-budget", type=_number, metavar="SECONDS",
                        help="wall-clock seconds for this call: runs stop at a step boundary before it ends, leave a "
                             "resumable state and count as unfinished (exit status 75); run again to continue. A run still "
                             f"going {BACKSTOP_S:g} s after it has ended is asked to stop at its next step")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="where runs execute: local processes (default) or one SLURM job array through submitit "
                             "(settings: the YAML's 'slurm:' mapping and --slurm; docs/cluster.md)")
    parser.add_argument("--slurm", dest="slurm", action="append", type=_parse_override, default=[],
                        metavar="KEY=VALUE", help="a SLURM setting over the YAML's (partition, account, time_min, "
                        "cpus_per_task, gpus_per_task, mem_gb, signal_delay_s, max_requeues, array_parallelism, "
                        "extra, setup); repeatable")
    parser.add_argument("--wait", action="store_true",
                        help="with --executor slurm: wait for the array, then write the tables (else return once "
                             "submitted; `rpm-batch status CONFIG` shows the cells)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no live progress lines (one per finished epoch of each running run; the start / done "
                             "lines and the tables stay)")
    parser.add_argument("--stall-minutes", type=_number, default=STALL_MINUTES, metavar="MIN",
                        help="report a running run whose folder has not changed for MIN minutes as 'no progress' "
                             f"(it is not stopped; default {STALL_MINUTES:g})")
    parser.add_argument("--cuda-mps", action="store_true",
                        help="NVIDIA GPUs: the runs executed at once share their GPU through a private CUDA "
                             "Multi-Process Service daemon, so that their kernels may run side by side instead of "
                             "taking turns (started before the first run, stopped after the last; local runs only). "
                             "Whether it pays: experiments/concurrency/bench_concurrent_runs.py --cuda-mps")
    parser.add_argument("--workers-per-run", type=_workers, metavar="N|auto",
                        help="DataLoader workers of each run (its num_workers); auto: the cores shared among the runs "
                             "executed at once (--jobs, or the runs left to train when fewer), one kept for each "
                             "run's training process")
    return parser


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    if not re.fullmatch(r"\d{1,9}", text, re.ASCII) or int(text) > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"expected a count from 0 to {MAX_WORKERS} or 'auto', got {shown(text)}")
    return int(text)


def build_state_parser() -> argparse.ArgumentParser:
    """``rpm-batch pack | unpack | progress``: a batch folder's resumable state and standing."""
    parser = OneLineArgumentParser(
        prog="rpm-batch",
        description="Carry a batch's (or one run's) resumable state to another machine, or show where its runs "
                    "stand. pack keeps only what resuming needs (config, progress, history, results; the "
                    "checkpoints of unfinished runs, best weights reduced to the model); unpack checks every file's "
                    "SHA-256 and refuses anything but run-state files. Resume there with the same command after "
                    "regenerating the data: a run refuses data whose fingerprint differs from its progress.json.",
        epilog="examples:\n"
               "  rpm-batch pack runs/table1_scl --out results/table1_scl_gpu/state.tar.gz\n"
               "  rpm-batch unpack results/table1_scl_gpu/state.tar.gz --out runs/table1_scl\n"
               "  rpm-batch progress runs/table1_scl --plot runs/table1_scl/progress.png --paper",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="pack the resumable state of every run under a folder")
    pack.add_argument("folder", help="a batch folder or one run folder")
    pack.add_argument("--out", required=True,
                      help="archive to write (.tar.gz); replaces an archive written by pack, never another file")
    pack.add_argument("--keep-final-weights", action="store_true",
                      help="also keep finished runs' final weights in full precision (their bfloat16 final_weights.pt "
                      "always travels; resuming needs neither)")
    pack.add_argument("--compact", action="store_true",
                      help="store unfinished runs' Adam moments in bfloat16 (12 instead of 16 bytes per parameter; "
                           "resuming is then not bit-exact: for GPU runs, which are not bit-exact anyway)")
    pack.add_argument("--run", action="append", dest="runs", metavar="RUN",
                      help="pack only this run folder, given relative to the packed folder (e.g. "
                           "main/setup-ce__seed-0); repeat for several. One archive per run changes only when its "
                           "run does")
    unpack = commands.add_parser("unpack", help="restore run folders from an archive")
    unpack.add_argument("archive", help="an archive written by rpm-batch pack")
    unpack.add_argument("--out", required=True, help="folder to restore into (the packed folder's place)")
    unpack.add_argument("--overwrite", action="store_true",
                        help="replace runs already there, each as a whole (their progress, results and checkpoints "
                             "that the archive lacks are removed); a run that had gone further is named on stderr")
    unpack.add_argument("--keep-further", action="store_true",
                        help="with --overwrite: keep a run already there that had gone further than the archive's "
                             "(finished, or more steps or epochs) instead of replacing it, and say so on stderr; "
                             "e.g. a second time slice on a machine that still holds the first one's runs")
    progress = commands.add_parser("progress", help="print each run's status, epochs and validation accuracy")
    progress.add_argument("folder", help="a batch folder")
    progress.add_argument("--json", action="store_true", help="print JSON (one object per run) instead of a table")
    progress.add_argument("--json-out", metavar="FILE",
                          help="also write that JSON into FILE (the table is printed as without it)")
    progress.add_argument("--plot", metavar="PNG",
                          help="also draw each run's validation accuracy over its epochs into this PNG file")
    progress.add_argument("--paper", action="store_true",
                          help="with --plot: dash the MLCL paper's Table 1 test average of each run's encoder and "
                               "setup (I-RAVEN at the paper's settings)")
    return parser


def state_main(argv: Sequence[str]) -> int:
    """``rpm-batch pack | unpack | progress``; returns 2 for bad input (one line on stderr)."""
    from rpm_lib.runs import archive as run_archive
    from rpm_lib.runs import progress as run_progress

    parser = build_state_parser()
    args = parser.parse_args(argv)
    for name in ("folder", "archive", "out"):
        # Path("") is the current folder: an unset shell variable would pack, unpack or list whatever is here
        if getattr(args, name, None) is not None and not getattr(args, name).strip():
            parser.error(f"argument {name if name != 'out' else '--out'}: empty path")
    try:
        if args.command == "pack":
            runs = run_archive.pack(args.folder, args.out, keep_final_weights=args.keep_final_weights,
                                    compact=args.compact, runs=args.runs)
            print(f"rpm-batch pack: {len(runs)} run(s) into {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB)")
            print("\n".join(run_archive.describe(runs)))
        elif args.command == "unpack":
            manifest = run_archive.unpack(
                args.archive, args.out, overwrite=args.overwrite, keep_further=args.keep_further,
                warn=lambda line: print(f"rpm-batch unpack: {'note' if args.keep_further else 'warning'}: {line}",
                                        file=sys.stderr))
            print(f"rpm-batch unpack: {len(manifest['runs'])} run(s), {len(manifest['files'])} files into {args.out} "
                  f"(packed {manifest.get('created', '?')})")
        else:
            if not Path(args.folder).is_dir():
                raise run_archive.ArchiveError(f"{args.folder}: no such batch folder")
            if args.plot is not None and not args.plot.lower().endswith(".png"):  # "" too: an unset shell variable
                raise run_archive.ArchiveError(f"--plot {args.plot}: give a .png file name")
            if args.paper and args.plot is None:
                raise run_archive.ArchiveError("--paper draws into the figure: give --plot PNG too")
            if args.json_out is not None and not args.json_out.strip():
                raise run_archive.ArchiveError("--json-out: empty path")
            runs = run_progress.batch_progress(args.folder)
            if args.json_out is not None:
                Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
                write_object(args.json_out, [dataclasses.asdict(run) for run in runs], indent=1)
            if args.json:
                print(json.dumps([dataclasses.asdict(run) for run in runs], indent=1))
            else:
                print(run_progress.progress_table(runs))
            if args.plot is not None:
                figure = run_progress.progress_figure(args.folder, runs, paper=args.paper)
                Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
                figure.savefig(args.plot, dpi=100, bbox_inches="tight")
                print(f"rpm-batch progress: figure written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
    except run_archive.ArchiveError as error:
        print(f"rpm-batch {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a file that cannot be read or written (permissions, a vanished run folder, ...)
        print(f"rpm-batch {args.command}: error: {error.filename or args.command}: {error.strerror or error}",
              file=sys.stderr)
        return 2
    return 0


STATE_COMMANDS = ("pack", "unpack", "progress")
SLURM_COMMANDS = ("status", "cancel")


def slurm_main(argv: Sequence[str]) -> int:
    """``rpm-batch status | cancel CONFIG``: the cells of a batch submitted with ``--executor slurm``."""
    from rpm_lib.batch import slurm  # its task's modules load Lightning

    parser = OneLineArgumentParser(prog=f"rpm-batch {argv[0]}", description=(
        "status: each cell of a batch submitted with --executor slurm (done, failed, unfinished, or SLURM's state: "
        "pending, running, requeued, ...), its job id and requeues. cancel: scancel the cells' jobs SLURM still "
        "lists (finished runs keep their results; rerun the batch to resume the others)."))
    parser.add_argument("config", help="the batch YAML")
    parser.add_argument("--out", help="batch folder (default: the YAML's 'out')")
    parser.add_argument("--grid", action="append", help="only this grid (repeatable; default: default grids)")
    args = parser.parse_args(argv[1:])
    try:
        config = load_batch_config(args.config)
        out = Path(args.out) if args.out else config.out
        specs = expand_grid(config, args.grid)
        if argv[0] == "status":
            print(slurm.status_table(slurm.cell_status(config, specs, out)))
        else:
            jobs = slurm.cancel(config, specs, out)
            print(f"rpm-batch cancel: {len(jobs)} job(s) cancelled" + (f": {' '.join(jobs)}" if jobs else "")
                  + ("; running cells stop at their next step with their state saved and are not requeued (submitting "
                     "the batch again resumes them)" if jobs else ""))
    except (BatchConfigError, FileNotFoundError, slurm.SlurmError) as exc:
        print(f"rpm-batch {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``rpm-batch``; returns 1 when any run failed, 75 when runs are unfinished (time budget),
    2 for bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in STATE_COMMANDS:
        return state_main(argv)
    if argv and argv[0] in SLURM_COMMANDS:
        return slurm_main(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.jobs > MAX_JOBS:
        parser.error(f"--jobs must be at most {MAX_JOBS}, got {args.jobs}")
    if not args.stall_minutes > 0:
        parser.error(f"--stall-minutes must be a positive number of minutes, got {args.stall_minutes:g}")
    if not args.stall_minutes <= MAX_STALL_MINUTES:
        parser.error(f"--stall-minutes must be at most {MAX_STALL_MINUTES} (30 days), got {args.stall_minutes:g}")
    if (problem := time_budget_problem(args.time_budget)) is not None:
        parser.error(problem)  # before the YAML is read, like the other arguments
    if args.gather:
        if not Path(args.gather).is_dir():
            parser.error(f"--gather: batch folder {args.gather} does not exist")
        try:
            written = gather_results(args.gather)
        except OSError as error:  # a shared folder one may read but not write: what and where, no traceback
            print_error("rpm-batch", f"--gather: {error.strerror or error} ({error.filename or args.gather}); the "
                        "tables are written into the batch folder: gather a copy of it that you can write to")
            return 1
        for key, p in written.items():
            print(f"{key}: {p}")
        print(Path(args.gather, "table1.md").read_text())
        return 0
    if not args.config:
        parser.error("a batch YAML is required (or --gather BATCH_DIR)")
    devices = [d.strip() for d in args.cuda_devices.split(",")] if args.cuda_devices is not None else None
    if devices is not None and not args.cuda_devices.strip():  # '' (an unset shell variable): was ignored
        parser.error(f"--cuda-devices: empty list {shown(args.cuda_devices)}; give GPU ids, e.g. 0,1,2,3")
    if devices is not None and not all(devices):
        parser.error(f"--cuda-devices: an empty GPU id in {shown(args.cuda_devices)} (e.g. 0,1,2,3)")
    # CUDA_VISIBLE_DEVICES takes indices and UUIDs; anything else hides every GPU, and a run with
    # accelerator=auto would then train on the CPU without a word
    unknown = [d for d in devices or () if not re.fullmatch(r"\d+|(GPU|MIG)-\S+", d)]
    if unknown:
        parser.error(f"--cuda-devices: {shown(unknown[0])} is neither a GPU index (0, 1, ...) nor a GPU-/MIG- UUID "
                     "(nvidia-smi -L lists both); CUDA would show such a run no GPU")
    try:
        if args.prepare_only:
            config = load_batch_config(args.config)
            parse_settings(config.slurm, dict(args.slurm), source=str(config.path))  # as a run would, before work
            if not config.prepare:
                print(f"rpm-batch: {config.path} has no prepare steps; nothing to do")
            run_prepare(config, args.dry_run, (lambda *_: None) if args.quiet else printer())
            return 0
        results = run_batch(args.config, jobs=args.jobs, dry_run=args.dry_run, out=args.out, grids=args.grid,
                            overrides=dict(args.overrides), cuda_devices=devices,
                            time_budget=args.time_budget, workers_per_run=args.workers_per_run,
                            executor=args.executor, slurm=dict(args.slurm), wait=args.wait,
                            live=not args.quiet, stall_minutes=args.stall_minutes, cuda_mps=args.cuda_mps)
    except (BatchConfigError, FileNotFoundError, RuntimeError, UnsafeLockFileError) as exc:
        # RuntimeError: a failed prepare step, SLURM, another submission holding the batch folder
        print(f"rpm-batch: error: {exc}", file=sys.stderr)
        return 2
    if any(r.status == RunStatus.FAILED for r in results):
        return 1
    return UNFINISHED_EXIT_CODE if any(r.status == RunStatus.UNFINISHED for r in results) else 0
