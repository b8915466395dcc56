"""Stress bench for papermill stalls: N sequential notebook executions in one process, counting stalls.

``make demo`` and ``rpm-batch`` execute every notebook from one long-lived Python process, one after the
other. This bench does the same with a tiny notebook (a parameters cell and two prints) and with
``notebooks/02_augmentations.ipynb`` (real imports, figures, albumentations), alternating them.

A *stall* is an execution that has not returned within ``--bound`` seconds (default 120 s, about 20x the
slowest normal execution on 2 cores). On a stall the worker process dumps every thread's stack into
``<out>/stall-<i>.txt`` (``faulthandler``), kills its kernels and exits; the bench records the stall, starts a fresh worker
and goes on with the next execution, so one stall never hides the others.

    python experiments/notebook-execution/bench_notebook_stall.py                      # 200 executions (150 tiny + 50 of 02)
    python experiments/notebook-execution/bench_notebook_stall.py --n 40 --every-02 4  # shorter
    python experiments/notebook-execution/bench_notebook_stall.py --no-fix             # as papermill ships (before the fix)
    python experiments/notebook-execution/bench_notebook_stall.py --n 10 --every-02 0 --inject execute_reply --bound 60 [--no-fix]
                                                              # fault injection: a reply the kernel loses

Output: one line per execution in ``<out>/executions.jsonl`` and a summary line
``stalls: S / N executions (tiny T, 02 M), median s, max s``.

Not a test: the result is a count over many repetitions on a loaded machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[2]


#: Fault injection (``--inject``): a last cell that makes the kernel lose one reply papermill waits for.
INJECTED_CELLS = {
    # The kernel ignores kernel_info requests from now on: papermill's final kernel_info wait never ends.
    "kernel_info": ("kernel = get_ipython().kernel\n"
                    "async def _ignore(*args, **kwargs):\n    return None\n"
                    "kernel.shell_handlers['kernel_info_request'] = _ignore\n"),
    # The kernel builds but never sends this cell's execute_reply (it still reports idle on IOPub).
    "execute_reply": ("kernel = get_ipython().kernel\n_send = kernel.session.send\n"
                      "def _drop(stream, msg_or_type, *args, **kwargs):\n"
                      "    if msg_or_type == 'execute_reply' and not getattr(kernel, '_dropped', False):\n"
                      "        kernel._dropped = True\n"
                      "        return kernel.session.msg('execute_reply', content=kwargs.get('content', args[0] if args else None))\n"
                      "    return _send(stream, msg_or_type, *args, **kwargs)\n"
                      "kernel.session.send = _drop\n"),
}


def _write_tiny_notebook(path: Path, inject: str | None = None) -> None:
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("value: int = 0", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print('value', value)"),
        nbformat.v4.new_code_cell("import sys\nprint(sys.version_info[:2])"),
    ]
    if inject:
        notebook.cells.append(nbformat.v4.new_code_cell(INJECTED_CELLS[inject]))
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(path))


def _plan(n: int, every_02: int, every_03: int = 0) -> list[str]:
    """Which notebook each execution runs: every ``every_03``-th is a short notebook-03 training, every
    ``every_02``-th (of the rest) notebook 02, all others the tiny notebook."""
    def kind(i: int) -> str:
        if every_03 and (i + 1) % every_03 == 0:
            return "03"
        return "02" if every_02 and (i + 1) % every_02 == 0 else "tiny"
    return [kind(i) for i in range(n)]


#: Notebook 03 parameters of the ``03`` executions: a real (tiny) SCL training with Lightning.
TRAIN_PARAMETERS = {"setup": "ce", "encoder": "scl", "image_size": 48, "batch_size": 8, "max_epochs": 1,
                    "limit_train_batches": 3, "limit_val_batches": 1, "limit_test_batches": 1,
                    "accelerator": "cpu", "precision": "32-true", "num_workers": 0, "progress_bar": False,
                    "overwrite": True}


def _on_stall(dump_path: Path) -> None:
    """Watchdog: write every thread's stack, kill this process's kernels, end the worker (exit code 3)."""
    import faulthandler
    import signal

    with dump_path.open("w") as dump:
        faulthandler.dump_traceback(file=dump, all_threads=True)
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
    os._exit(3)


def worker(args: argparse.Namespace) -> int:
    """Execute ``plan[start:]`` in this process; a stall dumps stacks and ends the process (exit 3)."""
    if args.no_fix:
        os.environ["RPM_LIB_PLAIN_PAPERMILL"] = "1"
    from rpm_lib.notebook_execution import execute_notebook

    out = Path(args.out)
    plan = _plan(args.n, args.every_02, args.every_03)
    tiny = out / "tiny.ipynb"
    log = (out / "executions.jsonl").open("a")
    for i in range(args.start, args.n):
        kind = plan[i]
        if kind == "tiny":
            template, params = tiny, {"value": i}
        elif kind == "02":
            template, params = (REPO / "notebooks" / "02_augmentations.ipynb",
                                {"data_root": args.data, "interactive": False, "num_random": 2,
                                 "recipes": ["official"], "image_size": 80})
        else:
            template, params = (REPO / "notebooks" / "03_train.ipynb",
                                {**TRAIN_PARAMETERS, "data_root": args.train_data, "run_dir": str(out / "train-run"),
                                 "output_dir": str(out / "train-run" / "figures")})
        watchdog = threading.Timer(args.bound, _on_stall, args=(out / f"stall-{i}.txt",))
        watchdog.daemon = True
        watchdog.start()
        began = time.perf_counter()
        execute_notebook(template, out / "executed" / f"{i}-{kind}.ipynb", params, cwd=REPO)
        seconds = time.perf_counter() - began
        watchdog.cancel()
        log.write(json.dumps({"i": i, "kind": kind, "seconds": round(seconds, 2), "stalled": False}) + "\n")
        log.flush()
        if not args.quiet:
            print(f"{i + 1}/{args.n} {kind} {seconds:.1f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="executions in all (default 200)")
    parser.add_argument("--every-02", type=int, default=4,
                        help="every k-th execution runs notebook 02, the others the tiny notebook (default 4; 0: none)")
    parser.add_argument("--every-03", type=int, default=0,
                        help="every k-th execution is a 3-batch SCL training with notebook 03 (default 0: none)")
    parser.add_argument("--inject", choices=sorted(INJECTED_CELLS),
                        help="the tiny notebook's last cell makes the kernel lose this reply (fault injection)")
    parser.add_argument("--bound", type=int, default=120, help="seconds after which an execution counts as stalled")
    parser.add_argument("--out", default=None, help="folder for logs and stack dumps (default: a temporary folder)")
    parser.add_argument("--data", default=None, help="data for notebook 02 (default: 10 generated problems per configuration)")
    parser.add_argument("--train-data", default=None, help="48 px cache for the 03 executions (default: built from --data)")
    parser.add_argument("--no-fix", action="store_true", help="execute with papermill's own client (no rpm_lib fix)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    out = Path(args.out or tempfile.mkdtemp(prefix="stall-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "executions.jsonl").unlink(missing_ok=True)
    _write_tiny_notebook(out / "tiny.ipynb", args.inject)
    if args.data is None and (args.every_02 or args.every_03):
        from rpm_lib.generator.writer import write_dataset

        args.data = str(out / "data")
        write_dataset(args.data, "all", count=10, seed=0, mode="balanced", workers=1, progress=False)
    if args.train_data is None and args.every_03:
        from rpm_lib.data import prepare_cache

        args.train_data = str(out / "data-48")
        prepare_cache(args.data, args.train_data, size=48, workers=1, kind="raven")
    began = time.perf_counter()
    start, stalls = 0, []
    while start < args.n:
        command = [sys.executable, __file__, "--worker", "--start", str(start), "--n", str(args.n),
                   "--every-02", str(args.every_02), "--every-03", str(args.every_03),
                   "--train-data", str(args.train_data), "--bound", str(args.bound), "--out", str(out),
                   "--data", str(args.data)] + (["--no-fix"] if args.no_fix else []) + (["--quiet"] if args.quiet else []) + (["--inject", args.inject] if args.inject else [])
        code = subprocess.run(command, cwd=REPO).returncode
        done = [json.loads(line) for line in (out / "executions.jsonl").read_text().splitlines()]
        start = (done[-1]["i"] + 1) if done else start
        if code == 0:
            break
        # The worker died inside execution `start`: a stall (faulthandler exit) or a crash.
        stalls.append(start)
        with (out / "executions.jsonl").open("a") as log:
            log.write(json.dumps({"i": start, "kind": _plan(args.n, args.every_02, args.every_03)[start], "stalled": True,
                                  "exit_code": code}) + "\n")
        print(f"STALL at execution {start} (exit {code}); stacks in {out / f'stall-{start}.txt'}", flush=True)
        start += 1
    rows = [json.loads(line) for line in (out / "executions.jsonl").read_text().splitlines()]
    seconds = [r["seconds"] for r in rows if not r["stalled"]]
    kinds = [r["kind"] for r in rows]
    timing = f"median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s" if seconds else "none finished"
    print(f"stalls: {len(stalls)} / {len(rows)} executions (tiny {kinds.count('tiny')}, 02 {kinds.count('02')}, "
          f"03 {kinds.count('03')}{', injected ' + args.inject if args.inject else ''}); {timing}; "
          f"{'papermill engine (no fix)' if args.no_fix else 'rpm_lib engine'}; wall {(time.perf_counter() - began) / 60:.1f} min; logs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
