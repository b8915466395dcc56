"""One-command GPU verification (run through ``tools/gpu_check.sh``), or its CPU dry run.

Parts, in order, each with its own time budget (sized for one H100: 530 s in all, so the command stays within 9 minutes
with the wheel install; training runs 60 s plus start-up and evaluation); a part that fails or runs out of time is reported and the next one runs:

==================  ======  ==========================================================================
part                budget  what
==================  ======  ==========================================================================
environment            10 s versions of python / torch / lightning / numpy, the GPU's name and memory
gpu_tests              60 s ``pytest -m gpu`` (tests/training/test_device_paths.py) on the device
encoders               40 s ``bench_models.py`` every encoder, batch 128, 80 px, bf16 autocast + channels_last
encoders_compiled      70 s the same under ``torch.compile``
generate_cache         60 s 70,000 I-RAVEN problems with 16 workers, straight into the 80 px cache (timed)
train_ce_aux_sparse   120 s SCL CE+AUX-sparse, bf16, batch 128, lr 0.002, 14 workers, for a fixed wall budget
train_mlcl_aug        120 s SCL MLCL+AUG (pre-training 80 %, linear evaluation 20 % of the budget)
batch                  50 s a 2-run ``rpm-batch`` grid through papermill on the device (1 run in the dry run)
==================  ======  ==========================================================================

Training parts report epochs done, RPMs/s, the GPU's utilisation (NVML, sampled every 0.5 s), the fraction of
each step the GPU waited for data (time blocked in the data loader after the previous step finished on the
GPU), test accuracy per configuration, and for MLCL+AUG the time a 100-epoch run on 42,000 problems would take.

    bash tools/gpu_check.sh --out DIR           # on the GPU machine: writes DIR/device_report.{md,json}
    bash tools/gpu_check.sh --cpu-dry-run       # here: tiny sizes, CPU, same parts, same report

Writes ``device_report.md`` and ``device_report.json`` into ``--out`` (default
``runs/gpu_check``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------
# sizes
# ----------------------------------------------------------------------------------------------
def sizes(dry_run: bool) -> dict[str, Any]:
    """Every size the parts use: the GPU run's, or the CPU dry run's (same parts, tiny numbers)."""
    if dry_run:
        return {"device": "cpu", "batch": 4, "image": 32, "bench_steps": 1, "bench_warmup": 0, "per_config": 10,
                "workers": 2, "loader_workers": 0, "train_budget_s": 4.0, "precision": "32-true", "max_epochs": 2,
                "sample_every": 3, "batch_seeds": [0],
                # the same code with fewer items: torch.compile of one encoder, two of the gpu tests (the suite runs
                # them all on the CPU anyway), a one-run batch
                "compile_encoders": ["scl"], "gpu_test_filter": "autocast_equals_fp32 or precision_auto",
                "budgets": {"environment": 10, "gpu_tests": 300, "encoders": 120, "encoders_compiled": 240,
                            "generate_cache": 120, "train_ce_aux_sparse": 120, "train_mlcl_aug": 120, "batch": 300}}
    return {"device": "cuda", "batch": 128, "image": 80, "bench_steps": 10, "bench_warmup": 3, "per_config": 10000,
            "workers": 16, "loader_workers": 14, "train_budget_s": 60.0, "precision": "bf16-mixed", "max_epochs": 100,
            "sample_every": 10, "batch_seeds": [0, 1],
            # scl first: compiling all took over 80 s on an H200, and rows are kept as each one finishes
            "compile_encoders": ["scl", "wren", "hrinet", "copinet", "predrnet"], "gpu_test_filter": None,
            "budgets": {"environment": 10, "gpu_tests": 60, "encoders": 40, "encoders_compiled": 70,
                        "generate_cache": 60, "train_ce_aux_sparse": 120, "train_mlcl_aug": 120, "batch": 50}}


# ----------------------------------------------------------------------------------------------
# parts
# ----------------------------------------------------------------------------------------------
def _run(command: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO) -> dict[str, Any]:
    """Run ``command``; its status, wall time and the tail of its output (never raises)."""
    began = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        status = "pass" if done.returncode == 0 else "fail"
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as timeout_error:
        status = "timeout"
        output = (timeout_error.stdout or b"").decode(errors="replace") if isinstance(timeout_error.stdout, bytes) \
            else (timeout_error.stdout or "")
    return {"status": status, "seconds": round(time.perf_counter() - began, 1), "command": shlex.join(command),
            "output_tail": output[-8000:]}


def part_environment(ctx: dict[str, Any]) -> dict[str, Any]:
    import lightning
    import numpy
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "lightning": lightning.__version__, "numpy": numpy.__version__,
                            "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count()}
    for name in ("albumentations", "papermill", "nbclient", "ipykernel", "cv2"):
        try:
            info[name] = __import__(name).__version__
        except Exception as error:  # a missing package is a finding, not a crash
            info[name] = f"missing ({type(error).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported())
    status = "pass" if ctx["dry_run"] or torch.cuda.is_available() else "fail"
    return {"status": status, "numbers": info}


def part_gpu_tests(ctx: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", "--tb=short",
               "-m", "gpu", "tests/training/test_device_paths.py"]
    if ctx["sizes"]["gpu_test_filter"]:
        command += ["-k", ctx["sizes"]["gpu_test_filter"]]
    result = _run(command, ctx["budget"], env={"RPM_TEST_DEVICE": ctx["sizes"]["device"]})
    summary = [line for line in result["output_tail"].splitlines() if " passed" in line or " failed" in line]
    result["numbers"] = {"summary": summary[-1] if summary else None}
    return result


def _encoders(ctx: dict[str, Any], compiled: bool) -> dict[str, Any]:
    s = ctx["sizes"]
    out = ctx["out"] / ("encoders_compiled.json" if compiled else "encoders.json")
    command = [sys.executable, "bench/bench_models.py", "--device", s["device"], "--batch-size", str(s["batch"]),
               "--image-size", str(s["image"]), "--steps", str(s["bench_steps"]), "--warmup", str(s["bench_warmup"]),
               "--json", str(out)] + (["--compile"] if compiled else [])
    if compiled and s["compile_encoders"]:
        command += ["--encoders", *s["compile_encoders"]]
    result = _run(command, ctx["budget"])
    if out.is_file():
        result["numbers"] = {row["encoder"]: round(row["rpms_per_s"], 1) for row in json.loads(out.read_text())}
    return result


def part_encoders(ctx: dict[str, Any]) -> dict[str, Any]:
    return _encoders(ctx, compiled=False)


def part_encoders_compiled(ctx: dict[str, Any]) -> dict[str, Any]:
    return _encoders(ctx, compiled=True)


def part_generate_cache(ctx: dict[str, Any]) -> dict[str, Any]:
    # The campaign's recipe (configs/table1_scl_gpu.yaml): straight into the 80 px training cache, no problem files.
    s = ctx["sizes"]
    cache = ctx["work"] / f"iraven-{s['image']}"
    made = _run(["rpm-generate", "--out", str(cache), "--cache-size", str(s["image"]), "--num-per-config",
                 str(s["per_config"]), "--seed", "1234", "--workers", str(s["workers"]), "--quiet"], ctx["budget"])
    problems = 7 * s["per_config"]
    ctx["cache"] = cache if made["status"] == "pass" else None
    made["numbers"] = {"problems": problems, "cache_s": made["seconds"],
                       "problems_per_s": round(problems / max(made["seconds"], 1e-9), 1)}
    return made


def _train(ctx: dict[str, Any], setup: str) -> dict[str, Any]:
    if ctx.get("cache") is None:
        return {"status": "skipped", "numbers": {"reason": "no cache (generate_cache did not pass)"}}
    s = ctx["sizes"]
    report = ctx["out"] / f"train_{setup}.json"
    command = [sys.executable, "tools/gpu_check.py", "--train-part", setup, "--data", str(ctx["cache"]),
               "--json", str(report), "--out", str(ctx["work"]), "--train-budget", str(s["train_budget_s"])] \
        + (["--cpu-dry-run"] if ctx["dry_run"] else [])
    result = _run(command, ctx["budget"])
    if report.is_file():
        result["numbers"] = json.loads(report.read_text())
    return result


def part_train_ce_aux_sparse(ctx: dict[str, Any]) -> dict[str, Any]:
    return _train(ctx, "ce_aux_sparse")


def part_train_mlcl_aug(ctx: dict[str, Any]) -> dict[str, Any]:
    return _train(ctx, "mlcl_aug")


def part_batch(ctx: dict[str, Any]) -> dict[str, Any]:
    if ctx.get("cache") is None:
        return {"status": "skipped", "numbers": {"reason": "no cache (generate_cache did not pass)"}}
    s = ctx["sizes"]
    batch_yaml = ctx["work"] / "device_batch.yaml"
    batch_yaml.write_text(json.dumps({
        "name": "device_check", "template": "notebooks/03_train.ipynb", "out": str(ctx["work"] / "batch"),
        "fixed": {"dataset": "iraven", "data_root": str(ctx["cache"]), "image_size": s["image"], "encoder": "scl",
                  "setup": "ce", "batch_size": s["batch"], "max_epochs": 1, "max_steps": 5, "accelerator": "auto",
                  "precision": "auto", "devices": 1, "num_workers": 0, "progress_bar": False,
                  "max_val_samples": 64, "max_test_samples": 64},
        "grids": [{"name": "main", "axes": {"seed": s["batch_seeds"]}}],
    }))  # JSON is YAML
    result = _run(["rpm-batch", str(batch_yaml), "--jobs", "1"], ctx["budget"])
    finished = sorted(p.parent.name for p in (ctx["work"] / "batch").glob("*/*/metrics.json"))
    result["numbers"] = {"runs_finished": finished}
    if result["status"] == "pass" and len(finished) != len(s["batch_seeds"]):
        result["status"] = "fail"
    return result


PARTS = ("environment", "gpu_tests", "encoders", "encoders_compiled", "generate_cache", "train_ce_aux_sparse",
         "train_mlcl_aug", "batch")


# ----------------------------------------------------------------------------------------------
# the training part (a subprocess of its own)
# ----------------------------------------------------------------------------------------------
class _Meter:
    """Lightning callback: stops each stage after its wall budget, measures throughput and data waits, and prints
    a progress line every 10 s and at each phase, so a part stopped at its time limit still says where it was.

    Throughput is end to end: RPMs trained over the stage's training wall time, validation excluded. The data
    wait is sampled, because measuring it needs the GPU to be idle at a known moment: every ``sample_every``
    steps, the step before is synchronised, the time until the next batch arrives is the wait, and that step is
    synchronised too to time it. Synchronising every step would itself starve the GPU (first H200 run:
    55 % utilisation).
    """

    def __init__(self, budgets: dict[str, float], cuda: bool, sample_every: int, first_stage: str,
                 barrier: tuple[Path, int] | None = None) -> None:
        import lightning as L

        meter = self
        began = time.perf_counter()

        def say(message: str) -> None:
            print(f"[train {time.perf_counter() - began:6.1f} s] {message}", flush=True)

        def synchronize() -> float:
            if cuda:
                import torch

                torch.cuda.synchronize()
            return time.perf_counter()

        class Callback(L.Callback):
            def on_train_start(self, trainer, pl_module):
                stage = pl_module.plan.name
                if meter.timeline is None:  # the first stage: the one measured
                    if barrier is not None:
                        meter.barrier_waited_s = round(_wait_at_barrier(*barrier), 2)
                    meter.timeline = [(time.time(), 0)]
                meter.stage_began = meter.last_print = time.perf_counter()
                meter.synced_end = None
                meter.val_s[stage], meter.val_runs[stage] = 0.0, 0
                say(f"stage {stage}: training starts")

            def on_train_end(self, trainer, pl_module):
                stage = pl_module.plan.name
                meter.end_timeline(stage)
                meter.wall_s[stage] = time.perf_counter() - meter.stage_began - meter.val_s[stage]
                meter.epochs[stage] = trainer.current_epoch
                say(f"stage {stage}: training ends after {trainer.current_epoch} epochs, "
                    f"{meter.rpms.get(stage, 0)} RPMs")

            def on_validation_start(self, trainer, pl_module):
                meter.phase_began = time.perf_counter()

            def on_validation_end(self, trainer, pl_module):
                took = time.perf_counter() - meter.phase_began
                if trainer.state.fn == "fit" and not trainer.sanity_checking:
                    stage = pl_module.plan.name
                    meter.val_s[stage] = meter.val_s.get(stage, 0.0) + took
                    meter.val_runs[stage] = meter.val_runs.get(stage, 0) + 1
                meter.synced_end = None  # a wait measured across validation would not be a data wait
                say(f"validation took {took:.1f} s")

            def on_test_start(self, trainer, pl_module):
                meter.phase_began = time.perf_counter()
                say("testing starts")

            def on_test_end(self, trainer, pl_module):
                say(f"testing took {time.perf_counter() - meter.phase_began:.1f} s")

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                now = time.perf_counter()
                meter.timing_this_step = meter.synced_end is not None
                if meter.timing_this_step:
                    meter.wait_s += now - meter.synced_end
                meter.batch_began = now

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                stage = pl_module.plan.name
                # a linear evaluation on cached embeddings has batches of indices only (rpm_lib.training.feature_cache)
                size = batch["target"] if "target" in batch else batch["index"]
                meter.rpms[stage] = meter.rpms.get(stage, 0) + int(size.shape[0])
                if meter.measuring(stage) and time.time() - meter.timeline[-1][0] >= TIMELINE_EVERY_S:
                    meter.timeline.append((time.time(), meter.rpms[stage]))
                panels = batch.get("panels")
                meter.views[stage] = panels.shape[1] if panels is not None and panels.ndim == 5 else 1
                meter.synced_end = None
                if meter.timing_this_step:
                    meter.step_s += synchronize() - meter.batch_began
                elif (batch_idx + 1) % sample_every == 0:
                    meter.synced_end = synchronize()  # the GPU is idle now: time until the next batch is wait
                now = time.perf_counter()
                if now - meter.last_print > 10:
                    meter.last_print = now
                    done = meter.rpms[stage] / max(now - meter.stage_began - meter.val_s[stage], 1e-9)
                    say(f"stage {stage}: {meter.rpms[stage]} RPMs, {done:.0f} RPMs/s, "
                        f"data wait {meter.wait_s / max(meter.wait_s + meter.step_s, 1e-9):.1%} (sampled)")
                if now - meter.stage_began > budgets.get(stage, float("inf")):
                    meter.end_timeline(stage)
                    trainer.should_stop = True

        self.callback = Callback()
        self.wait_s = self.step_s = 0.0
        self.rpms: dict[str, int] = {}
        self.wall_s: dict[str, float] = {}
        self.val_s: dict[str, float] = {}
        self.val_runs: dict[str, int] = {}
        self.epochs: dict[str, int] = {}
        self.views: dict[str, int] = {}
        self.stage_began = self.batch_began = self.last_print = self.phase_began = 0.0
        self.synced_end: float | None = None
        self.timing_this_step = False
        # (time.time(), RPMs trained so far) of the first stage, from its start (after the barrier) to its end
        self.timeline: list[tuple[float, int]] | None = None
        self.timeline_ended = False
        self.barrier_waited_s: float | None = None
        self.first_stage = first_stage

    def measuring(self, stage: str) -> bool:
        """Whether ``stage`` is the first stage, still training (the one the timeline follows)."""
        return self.timeline is not None and not self.timeline_ended and stage == self.first_stage

    def end_timeline(self, stage: str) -> None:
        """The timeline's last point: the first stage's budget is spent (or the stage ended before it was)."""
        if self.measuring(stage):
            self.timeline.append((time.time(), self.rpms.get(stage, 0)))
            self.timeline_ended = True


#: Seconds between two points of a run's timeline (``_Meter.timeline``).
TIMELINE_EVERY_S = 0.2
#: Seconds a run waits at the start barrier for the others before it trains alone (one that crashed never comes;
#: the others reach it seconds apart).
BARRIER_TIMEOUT_S = 90.0


def _wait_at_barrier(folder: Path, count: int) -> float:
    """Say this process is ready to train (a file in ``folder``) and wait until ``count`` processes are: runs
    started together reach their first step seconds apart (imports, CUDA, data), and a run training alone meanwhile
    would count its solo speed as shared. Returns the seconds waited."""
    began = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ready-{os.getpid()}").touch()
    while len(list(folder.glob("ready-*"))) < count and time.monotonic() - began < BARRIER_TIMEOUT_S:
        time.sleep(0.02)
    return time.monotonic() - began


def _gpu_sampler(samples: list[tuple[float, int]], stop: threading.Event) -> None:
    """Append (``time.time()``, GPU utilisation %) every 0.5 s until ``stop`` is set."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not stop.wait(0.5):
            samples.append((time.time(), int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
    except Exception:
        return


def utilisation_between(samples: list[tuple[float, int]] | list[list[float]], start: float | None,
                        end: float | None) -> float | None:
    """Mean GPU utilisation (%) of the ``(time.time(), %)`` samples taken from ``start`` to ``end``; None without
    a span or without a sample in it (a CPU run, or a span shorter than the 0.5 s sampling period)."""
    if start is None or end is None:
        return None
    inside = [u for t, u in samples if start <= t <= end]
    return round(sum(inside) / len(inside), 1) if inside else None


def _span(timeline: list[tuple[float, int]] | None) -> tuple[float | None, float | None]:
    return (timeline[0][0], timeline[-1][0]) if timeline and len(timeline) > 1 else (None, None)


def train_part(setup: str, data: str, out: Path, dry_run: bool, budget: float | None = None,
               loader_workers: int | None = None, barrier: tuple[Path, int] | None = None) -> dict[str, Any]:
    """Train SCL ``setup`` for the wall budget on ``data``; the numbers for the report. ``loader_workers``: this
    run's DataLoader workers (default the sizes'; runs sharing a machine split them). ``barrier``: (folder, count)
    of runs started together, which begin their measured training at the same moment (:func:`_wait_at_barrier`)."""
    import torch

    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.run import train

    s = sizes(dry_run)
    if loader_workers is not None:
        s["loader_workers"] = loader_workers
    cuda = torch.cuda.is_available() and not dry_run
    budget = budget or s["train_budget_s"]
    budgets = {"supervised": budget} if setup != "mlcl_aug" else {"pretrain": 0.8 * budget, "linear": 0.2 * budget}
    config = TrainConfig(dataset="iraven", data_root=data, image_size=s["image"], encoder="scl", setup=setup,
                         batch_size=s["batch"], lr=0.002, max_epochs=s["max_epochs"], patience=s["max_epochs"],
                         linear_eval_epochs=s["max_epochs"], accelerator="gpu" if cuda else "cpu", devices=1,
                         precision=s["precision"], num_workers=s["loader_workers"], progress_bar=False,
                         run_dir=str(out / f"train_{setup}"), overwrite=True, save_predictions=False,
                         **({"max_val_samples": 64, "max_test_samples": 64} if dry_run else {}))
    meter = _Meter(budgets, cuda, s["sample_every"], "pretrain" if setup == "mlcl_aug" else "supervised", barrier)
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_gpu_sampler, args=(samples, stop), daemon=True)
    if cuda:
        sampler.start()
    began = time.perf_counter()
    metrics = train(config, callbacks=[meter.callback])
    stop.set()
    first = meter.first_stage
    rpms_per_s = meter.rpms.get(first, 0) / max(meter.wall_s.get(first, 0.0), 1e-9)
    timed = meter.wait_s + meter.step_s
    numbers: dict[str, Any] = {
        "setup": metrics["setup_label"], "wall_s": round(time.perf_counter() - began, 1),
        "epochs": {stage["name"]: stage["epochs"] for stage in metrics["stages"]},
        "rpms_per_s": round(rpms_per_s, 1), "views_per_rpm": meter.views.get(first, 1),
        "data_wait_fraction": round(meter.wait_s / timed, 3) if timed else None,
        "validation_s_per_epoch": round(meter.val_s.get(first, 0.0) / max(meter.val_runs.get(first, 0), 1), 2),
        "gpu_utilisation_mean_pct": round(sum(u for _, u in samples) / len(samples), 1) if samples else None,
        # the first stage's training, its validations included: the window "busy while training" means
        "gpu_utilisation_training_pct": utilisation_between(samples, *_span(meter.timeline)),
        "test_accuracy": round(metrics["test_accuracy"], 4),
        "test_accuracy_per_configuration": {k: round(v, 4) for k, v in
                                            metrics.get("test_accuracy_per_configuration_short", {}).items()},
    }
    # for experiments/concurrency/bench_concurrent_runs.py's common window (not for this check's own report)
    if barrier is not None:
        numbers["timeline"] = [[round(t, 3), n] for t, n in meter.timeline or []]
        numbers["barrier_waited_s"] = meter.barrier_waited_s
        numbers["gpu_samples"] = [[round(t, 2), u] for t, u in samples]
    if setup == "mlcl_aug" and rpms_per_s > 0:
        # 100 epochs of pre-training on 42,000 problems, each followed by one validation pass like those measured
        epoch_s = 42000 / rpms_per_s + numbers["validation_s_per_epoch"]
        numbers["extrapolated_100_epochs_42000_min"] = round(100 * epoch_s / 60, 1)
    return numbers


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def write_report(out: Path, results: dict[str, dict[str, Any]], dry_run: bool, total_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    header = {"dry_run": dry_run, "total_s": round(total_s, 1),
              "passed": sum(r["status"] == "pass" for r in results.values()), "parts": len(results)}
    (out / "device_report.json").write_text(json.dumps({**header, "results": results}, indent=1, default=str))
    lines = [f"# rpm_lib device check{' (CPU dry run)' if dry_run else ''}", "",
             f"{header['passed']} of {header['parts']} parts passed in {total_s:.0f} s.", "",
             "| part | status | seconds | numbers |", "|---|---|---:|---|"]
    for name, r in results.items():
        numbers = json.dumps(r.get("numbers", {}), default=str).replace("|", "/")
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', '')} | {numbers} |")
    for name, r in results.items():
        if r["status"] != "pass" and r.get("output_tail"):
            lines += ["", f"## {name}: {r['status']}", "", f"`{r.get('command', '')}`", "", "```",
                      r["output_tail"][-1500:], "```"]
    (out / "device_report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny sizes on the CPU, same parts and report")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_check",
                        help="report folder (default runs/gpu_check)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--train-budget", type=float, default=None, metavar="SECONDS",
                        help="wall seconds each training part trains for (default 60 on a GPU, 4 in the dry run); "
                             "its time limit is this plus 60 s for start-up and evaluation")
    parser.add_argument("--train-part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--loader-workers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start-barrier", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--barrier-count", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train_part:
        barrier = None if args.start_barrier is None else (args.start_barrier, args.barrier_count)
        numbers = train_part(args.train_part, args.data, args.out, args.cpu_dry_run, args.train_budget,
                             args.loader_workers, barrier)
        args.json.write_text(json.dumps(numbers, indent=1))
        return 0
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        print(f"error: --parts: unknown {sorted(unknown)}; known: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    out = args.out
    work = Path(os.environ.get("RPM_GPU_WORK") or (REPO / "runs" / "gpu_check_work"))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    ctx: dict[str, Any] = {"dry_run": args.cpu_dry_run, "sizes": sizes(args.cpu_dry_run), "out": out, "work": work}
    if args.train_budget:
        ctx["sizes"]["train_budget_s"] = args.train_budget
        for name in ("train_ce_aux_sparse", "train_mlcl_aug"):
            ctx["sizes"]["budgets"][name] = args.train_budget + 60
    results: dict[str, dict[str, Any]] = {}
    began = time.perf_counter()
    for name in PARTS:
        if name not in args.parts.split(","):
            continue
        ctx["budget"] = ctx["sizes"]["budgets"][name]
        print(f"[gpu_check] {name} (budget {ctx['budget']} s)", flush=True)
        part_began = time.perf_counter()
        try:
            result = globals()[f"part_{name}"](ctx)
        except Exception:
            result = {"status": "fail", "output_tail": traceback.format_exc()[-3000:]}
        result.setdefault("seconds", round(time.perf_counter() - part_began, 1))
        results[name] = result
        print(f"[gpu_check] {name}: {result['status']} in {result['seconds']} s "
              f"{json.dumps(result.get('numbers', {}), default=str)[:400]}", flush=True)
        write_report(out, results, args.cpu_dry_run, time.perf_counter() - began)  # a report even if killed later
    passed = all(r["status"] == "pass" for r in results.values())
    print(f"[gpu_check] report: {out / 'device_report.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
