"""One training run on a GPU against several at once, side by side in one call: the aggregate training throughput.

An SCL step at batch 128 is bound by the host's kernel launches (the GPU is busy about half of each step:
docs/reproduction-gpu.md), so two runs sharing one GPU can fill each other's gaps, which is how the Table 1 campaign
trains (``rpm-batch --jobs 2`` in slices 1-3, ``--jobs 3`` since). This measures it: for each count N in ``--runs``
(default 1,2), N processes each train the same setup on the same data for the same wall budget
(``tools/gpu_check.py``'s training part), started together, each with ``--total-workers / N`` DataLoader
workers. Per run: the RPMs/s of its training steps (validation excluded) and the GPU utilisation it sampled; per
N: their sum, and its ratio to N = 1.

This version's runs wait for each other before their measured training begins (a start barrier: they reach their
first step seconds apart, and a run training alone meanwhile would count its solo speed as shared), and record a
timeline of the problems trained. The table's "common window" is the time all N were training, its RPMs/s the
problems all of them trained in it over its length: validation inside it counts as time without training, so it is
the honest aggregate; the sum of the per-run rates leaves each run's validation out while the others go on. The GPU
utilisation is given over that window (the runs' NVML samples pooled) and, in parentheses, over the runs' whole lives
(start-up, validation and a later stage included).

``--cuda-mps`` adds, for every count above one, a round of the same runs through a private CUDA Multi-Process Service
daemon (``rpm_lib.cuda_mps``), whose server lets the processes' kernels run side by side instead of taking turns; the
row gives the client connections the daemon logged (0: no run found it, and they trained without it; on an H200 each
SCL run made 4, for reasons not looked into).

``--baseline-code DIR`` first trains one run of an earlier version in the same call: DIR holds that version's
``rpm_lib`` and ``bench`` (``git archive ce69914 rpm_lib bench | tar -x -C .gpu/baseline`` makes issue 20's reference), so a
speed-up over it is a ratio measured side by side on one machine, never two numbers from two machines.

    python experiments/concurrency/bench_concurrent_runs.py --data data/i-raven-80 --out runs/concurrent     # GPU, ~3 min
    python experiments/concurrency/bench_concurrent_runs.py --data data/i-raven-80 --baseline-code .gpu/baseline --out ...
    python experiments/concurrency/bench_concurrent_runs.py --data data/i-raven-80 --cuda-mps --out runs/concurrent  # + 2 runs under MPS
    python experiments/concurrency/bench_concurrent_runs.py --cpu-dry-run --out /tmp/cr                       # tiny, CPU, ~1 min

Writes ``concurrent_runs.json`` and ``concurrent_runs.md`` in ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
from rpm_lib.cuda_mps import MpsUnavailable, find_control, private_mps_daemon  # noqa: E402 - after the environment is set

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "tools") not in sys.path:
    sys.path.insert(0, str(REPO / "tools"))
from gpu_check import utilisation_between  # noqa: E402 - the runs' own measure, one definition
#: The ``code`` of the rows that this checkout trained (the others name an earlier version).
THIS_VERSION = "this version"
#: Beside it, the rows of this checkout trained through an MPS daemon.
THIS_VERSION_MPS = "this version, MPS"


def _counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--runs: positive counts separated by commas, not {text!r}")
    return counts


def _code_env(code: Path | None) -> dict[str, str]:
    """The environment of a training process: an earlier version's tree ``code`` first on the import path."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    return env


def check_baseline_code(code: Path) -> str | None:
    """Why ``code`` cannot serve as the earlier version, or None: it must hold ``tools/gpu_check.py`` and an
    ``rpm_lib`` that a process started with :func:`_code_env` really imports (not this checkout's)."""
    if not (code / "bench" / "device_check.py").is_file() or not (code / "rpm_lib" / "__init__.py").is_file():
        return f"{code} holds no tools/gpu_check.py and rpm_lib/ (make it with `git archive <rev> rpm_lib bench`)"
    found = subprocess.run([sys.executable, "-c", "import rpm_lib; print(rpm_lib.__file__)"], cwd=code,
                           capture_output=True, text=True, env=_code_env(code), timeout=120)
    if found.returncode != 0:
        return f"{code}: importing its rpm_lib fails: {(found.stderr.strip().splitlines() or ['no output'])[-1]}"
    where = found.stdout.strip()
    if not Path(where).resolve().is_relative_to(code.resolve()):
        return f"{code}: a process there imports rpm_lib from {where}, not from it"
    return None


def run_together(count: int, args: argparse.Namespace, data: str, out: Path,
                 code: Path | None = None, label: str = THIS_VERSION, mps: bool = False) -> dict[str, Any]:
    """``count`` training processes started together; their numbers when all have ended. ``code``: an earlier
    version's tree to train with instead of this checkout (``label`` names it in the table). ``mps``: through a
    private MPS daemon, started before the processes and stopped after them."""
    if not mps:
        return _run_processes(count, args, data, out, code, label, {})
    with private_mps_daemon() as daemon:
        row = _run_processes(count, args, data, out, code, label, daemon.env, prefix=f"mps{count}")
        row["mps_clients"] = daemon.clients()
        row["mps_server_failure"] = daemon.server_failure()
        return row


def _run_processes(count: int, args: argparse.Namespace, data: str, out: Path, code: Path | None, label: str,
                   extra_env: dict[str, str], prefix: str | None = None) -> dict[str, Any]:
    workers = args.total_workers // count
    root = REPO if code is None else code.resolve()
    # this checkout's GPU check, or the earlier version's (then still bench/device_check.py)
    script = REPO / "tools" / "gpu_check.py" if code is None else root / "bench" / "device_check.py"
    source = script.read_text(encoding="utf-8")
    # an earlier version may not know --loader-workers; then it trains with its own default
    takes_workers = "--loader-workers" in source
    prefix = prefix or (f"n{count}" if code is None else "baseline")
    processes = []
    began = time.perf_counter()
    # this version's runs begin their measured training together (an earlier version's script has no barrier)
    barrier = out / f"{prefix}_barrier" if "--start-barrier" in source else None
    if barrier is not None:
        shutil.rmtree(barrier, ignore_errors=True)
    for index in range(count):
        report = out / f"{prefix}_run{index}.json"
        command = [sys.executable, str(script), "--train-part", args.setup, "--data", str(Path(data).resolve()),
                   "--json", str(report), "--out", str(out / f"{prefix}_run{index}"),
                   "--train-budget", str(args.train_budget)]
        if takes_workers:
            command += ["--loader-workers", str(workers)]
        if barrier is not None:
            command += ["--start-barrier", str(barrier), "--barrier-count", str(count)]
        if args.cpu_dry_run:
            command.append("--cpu-dry-run")
        env = {**_code_env(code), **extra_env}
        if args.cpu_dry_run:
            # CPU runs split the cores: OpenMP threads spinning on more cores than there are slow everyone down
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // count))
        log = open(out / f"{prefix}_run{index}.log", "w")
        processes.append((subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env),
                          report, log))
    runs = []
    for process, report, log in processes:
        status = process.wait(timeout=args.train_budget + 300)
        log.close()
        numbers = json.loads(report.read_text()) if status == 0 and report.is_file() else None
        runs.append({"exit": status, "numbers": numbers})
    wall = time.perf_counter() - began
    speeds = [r["numbers"]["rpms_per_s"] for r in runs if r["numbers"]]
    utils = [r["numbers"]["gpu_utilisation_mean_pct"] for r in runs
             if r["numbers"] and r["numbers"].get("gpu_utilisation_mean_pct") is not None]
    timelines = [r["numbers"].get("timeline") for r in runs if r["numbers"]]
    window = common_window(timelines) if len(speeds) == count else None
    bounds = window_bounds(timelines) if window is not None else None
    return {"code": label, "runs": count, "loader_workers_per_run": workers if takes_workers else None,
            "wall_s": round(wall, 1),
            "rpms_per_s_per_run": speeds, "aggregate_rpms_per_s": round(sum(speeds), 1) if len(speeds) == count else None,
            "window_s": None if window is None else round(window[0], 1),
            "window_rpms_per_s": None if window is None else round(window[1], 1),
            "gpu_utilisation_mean_pct": round(sum(utils) / len(utils), 1) if utils else None,
            "window_gpu_utilisation_pct": window_utilisation([r["numbers"].get("gpu_samples") for r in runs
                                                              if r["numbers"]], bounds),
            "failed": [i for i, r in enumerate(runs) if r["numbers"] is None]}


def _trained_by(timeline: list[list[float]], moment: float) -> float:
    """RPMs a run had trained at ``moment`` (``time.time()``), linear between its timeline's points."""
    previous = timeline[0]
    for point in timeline[1:]:
        if point[0] >= moment:
            span = point[0] - previous[0]
            share = 0.0 if span <= 0 else (moment - previous[0]) / span
            return previous[1] + share * (point[1] - previous[1])
        previous = point
    return float(previous[1])


def window_bounds(timelines: list[list[list[float]] | None]) -> tuple[float, float] | None:
    """(start, end), in ``time.time()`` seconds, of the window in which all runs were training: from the last start
    to the first end of their timelines (``[time.time(), RPMs so far]`` points); None without a timeline for every
    run (an earlier version) or without overlap."""
    if not timelines or any(not t or len(t) < 2 for t in timelines):
        return None
    start, end = max(t[0][0] for t in timelines), min(t[-1][0] for t in timelines)
    return (start, end) if end > start else None


def common_window(timelines: list[list[list[float]] | None]) -> tuple[float, float] | None:
    """(seconds, RPMs/s) of the runs together over :func:`window_bounds`' window: the problems all of them trained
    in it over its length. Validation inside the window counts as time without training, so this is at most the sum
    of the runs' own rates; None where there is no window."""
    bounds = window_bounds(timelines)
    if bounds is None:
        return None
    start, end = bounds
    trained = sum(_trained_by(t, end) - _trained_by(t, start) for t in timelines)
    return end - start, trained / (end - start)


def window_utilisation(sample_lists: list[list[list[float]] | None],
                       bounds: tuple[float, float] | None) -> float | None:
    """Mean GPU utilisation (%) over the window, from every run's ``[time.time(), %]`` samples pooled (they all
    sample the one GPU); None without a window or without a sample in it (CPU runs, an earlier version)."""
    if bounds is None:
        return None
    return utilisation_between([sample for samples in sample_lists if samples for sample in samples], *bounds)


def render(rows: list[dict[str, Any]], args: argparse.Namespace, device: str) -> str:
    """The rows as a Markdown table: each aggregate against one run of this version and, when an earlier version
    ran first, against that version's one run."""
    def single(code: str) -> float | None:
        return next((r["aggregate_rpms_per_s"] for r in rows
                     if r["code"] == code and r["runs"] == 1 and r["aggregate_rpms_per_s"]), None)

    base = single(THIS_VERSION)
    base_window = next((r["window_rpms_per_s"] for r in rows if r["code"] == THIS_VERSION and r["runs"] == 1
                        and r.get("window_rpms_per_s")), None)
    earlier = next((r["code"] for r in rows if r["code"] not in (THIS_VERSION, THIS_VERSION_MPS)), None)
    with_mps = any("mps_clients" in r for r in rows)
    before = single(earlier) if earlier else None
    columns = ["code", "runs at once", "loader workers per run", "RPMs/s per run", "aggregate RPMs/s", "vs 1 run"]
    columns += [f"vs {earlier}"] if earlier else []
    columns += ["common window: RPMs/s (s)", "vs 1 run, window", "GPU util %: window (whole lives)"]
    columns += ["MPS client connections"] if with_mps else []
    lines = [f"SCL {args.setup}, {device}, each run trains for {args.train_budget:g} s. RPMs/s per run: its training "
             "steps, validation excluded; aggregate: their sum. This version's runs begin their measured training "
             "together; the common window is the time all of them were training, and its RPMs/s are the problems "
             "all of them trained in it over its length (validation inside it counts as time without training).",
             "", "| " + " | ".join(columns) + " |",
             "|---|" + "---:|" * 2 + "---|" + "---:|" * (len(columns) - 4)]
    for r in rows:
        agg, window = r["aggregate_rpms_per_s"], r.get("window_rpms_per_s")
        mine = r["code"] in (THIS_VERSION, THIS_VERSION_MPS)
        cells = [r["code"], str(r["runs"]),
                 "its default" if r["loader_workers_per_run"] is None else str(r["loader_workers_per_run"]),
                 ", ".join(f"{x:,.0f}" for x in r["rpms_per_s_per_run"]) or "failed",
                 "" if agg is None else format(agg, ",.0f"),
                 f"{agg / base:.2f}x" if agg and base and mine else ""]
        if earlier:
            cells.append(f"{agg / before:.2f}x" if agg and before else "")
        cells += ["" if window is None else f"{window:,.0f} ({r['window_s']:g})",
                  f"{window / base_window:.2f}x" if window and base_window and mine else "",
                  _utilisation_cell(r.get("window_gpu_utilisation_pct"), r["gpu_utilisation_mean_pct"])]
        if with_mps:
            cells.append(str(r["mps_clients"]) if "mps_clients" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    failures = sorted({r["mps_server_failure"] for r in rows if r.get("mps_server_failure")})
    if failures:
        lines += ["", *(f"MPS server: {line}" for line in failures)]
    return "\n".join(lines)


def _utilisation_cell(window: float | None, whole: float | None) -> str:
    """``"88 (87)"``: the GPU busy over the common window, then over the runs' whole lives (either may be blank)."""
    if whole is None:
        return "" if window is None else f"{window:.0f}"
    return f"({whole:.0f})" if window is None else f"{window:.0f} ({whole:.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="an I-RAVEN cache or folder (the dry run generates a tiny one)")
    parser.add_argument("--runs", type=_counts, default=[1, 2], help="counts of concurrent runs to compare (default 1,2)")
    parser.add_argument("--setup", default="ce_aux_sparse", help="training setup (default ce_aux_sparse)")
    parser.add_argument("--train-budget", type=float, default=None,
                        help="wall seconds each run trains (default 60 on a GPU, 4 in the dry run)")
    parser.add_argument("--total-workers", type=int, default=None,
                        help="DataLoader workers shared by the runs at once (default 14 on a GPU, 0 in the dry run)")
    parser.add_argument("--baseline-code", type=Path, default=None, metavar="DIR",
                        help="first train one run of the earlier version in DIR (its rpm_lib/ and bench/, e.g. from "
                             "`git archive ce69914 rpm_lib bench`) on the same data, for ratios against it")
    parser.add_argument("--baseline-label", default=None,
                        help="that version's name in the table (default: DIR/REVISION's text, else DIR's name)")
    parser.add_argument("--cuda-mps", action="store_true",
                        help="for each count above one, also train the runs through a private CUDA MPS daemon "
                             "(rpm_lib.cuda_mps; NVIDIA GPUs): kernels of the runs may then run side by side")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny sizes on the CPU: the same code path")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "concurrent_runs", help="output folder")
    args = parser.parse_args(argv)
    args.train_budget = args.train_budget or (4.0 if args.cpu_dry_run else 60.0)
    args.total_workers = args.total_workers if args.total_workers is not None else (0 if args.cpu_dry_run else 14)
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data is None:
        if not args.cpu_dry_run:
            parser.error("--data is required (a cache such as data/i-raven-80), except with --cpu-dry-run")
        from rpm_lib.training.config import TrainConfig
        from rpm_lib.training.generation import ensure_generated

        data = str(args.out / "iraven")
        ensure_generated(TrainConfig(data_root=data, generate=True, generate_num_per_config=10, generate_seed=3,
                                     progress_bar=False))
    elif not Path(data).exists():
        parser.error(f"--data: {data} does not exist")
    label = None
    if args.baseline_code is not None:
        problem = check_baseline_code(args.baseline_code)
        if problem:
            parser.error(f"--baseline-code: {problem}")
        revision = args.baseline_code / "REVISION"
        label = args.baseline_label or (revision.read_text(encoding="utf-8").strip() if revision.is_file()
                                        else args.baseline_code.resolve().name)
    if args.cuda_mps and max(args.runs) < 2:
        parser.error(f"--cuda-mps: MPS rounds are of several runs at once; --runs {','.join(map(str, args.runs))} "
                     "has no count above one")
    if args.cuda_mps:
        try:
            find_control()
        except MpsUnavailable as error:
            parser.error(f"--cuda-mps: {error}")
    import torch

    device = "CPU (dry run)" if args.cpu_dry_run or not torch.cuda.is_available() else torch.cuda.get_device_name(0)
    rounds: list[tuple[int, Path | None, str, bool]] = []
    for count in args.runs:
        rounds.append((count, None, THIS_VERSION, False))
        if args.cuda_mps and count > 1:
            rounds.append((count, None, THIS_VERSION_MPS, True))
    if label is not None:
        rounds.insert(0, (1, args.baseline_code, label, False))
    rows = []
    for count, code, name, mps in rounds:
        print(f"[concurrent] {count} run(s) at once of {name}, {args.train_budget:g} s each ...", flush=True)
        try:
            rows.append(run_together(count, args, data, args.out, code, name, mps))
        except MpsUnavailable as error:  # the daemon would not start: the other rounds still count
            print(f"[concurrent] {name}: skipped: {error}", flush=True)
            continue
        print(f"[concurrent] {json.dumps(rows[-1])}", flush=True)
        (args.out / "concurrent_runs.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    table = render(rows, args, device)
    (args.out / "concurrent_runs.md").write_text(table + "\n")
    print(table)
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
