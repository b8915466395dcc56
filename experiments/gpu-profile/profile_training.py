"""Where does a training step's time go? Encoder alone vs. real DataLoader vs. Lightning, in one process.

On an H100 the SCL encoder alone ran 7,746 RPMs/s (bf16, channels_last, ``bench_models.py``) while training
CE+AUX-sparse at batch 128, 80 px ran 4,508 RPMs/s at 50-55 % GPU utilisation with only 6 % data wait. This
script measures, for one TrainConfig and its first stage (``--stage`` for another), built exactly as
``rpm_lib.training.run.train`` builds it (``stage_plan``, ``RpmModule``, ``RpmDataModule``, ``make_trainer``,
``resolve_precision``):

a. **encoder only**: ``RpmModule.stage_losses`` + backward + Adam step on one real batch already on the device;
   no loader, no Lightning. The upper bound (RPMs/s). With ``--compile`` also under ``module.encoder.compile()``,
   the compilation (first step, s) reported apart from the steady speed. With ``--compile-step`` also with the
   whole forward compiled (``stage_losses``: encoder, heads and losses, whose backward AOTAutograd then compiles
   as one graph), and on CUDA that with CUDA graphs (``mode="reduce-overhead"``), for a step bound by launches.
b. **manual loop**: the same step fed by the datamodule's real ``train_dataloader`` (``non_blocking`` copies to the
   device); RPMs/s and the host time blocked in ``next(loader)`` (ms/step).
c. **Lightning fit**: a Trainer from ``make_trainer`` (one epoch of ``--warmup + --steps`` batches, validation
   limited to ``--val-batches``); RPMs/s from ``on_train_batch_start/end`` timestamps without any added
   synchronisation (one ``torch.cuda.synchronize`` closes the window after the last step), the host time of every
   Lightning action (self time, ms/step: data fetch, batch transfer, hooks, training_step, backward, optimiser),
   validation time (s, and extrapolated to the full validation split), start-up and epoch-end (checkpoint) time.
   On CUDA a second fit synchronises at every batch start and end ("synced"): the time between steps is then time
   the GPU sits idle waiting for the host.
d. **profiled Lightning fit** (``torch.profiler``, schedule wait/warmup/active): the top CPU ops by self CPU time
   (ms/step) and the ``.item()`` reads per step (``aten::_local_scalar_dense``: each one is a device->host sync on
   CUDA). On CUDA only: GPU busy fraction (union of kernel/memcpy time / wall time of the active steps), the
   ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize`` / ``cudaMemcpy`` calls per step, the Python lines that
   synchronised (``torch.cuda.set_sync_debug_mode("warn")``) and a Chrome trace (``trace_lightning.json.gz``, open in
   chrome://tracing or https://ui.perfetto.dev) with every Lightning action as a named range.

The differences a -> b -> c attribute the lost time: b - a is the loader and host->device copy, c - b is
Lightning / Python per-step overhead; the verdict lines say so in ms/step and in % of a Lightning step.

On the GPU (one call of about 2.5 minutes: generating the 70,000 problems straight into the 80 px cache, then
about 90 s of profiling; ``--compile`` adds roughly a minute of compilation; the timed fits need
``(--warmup + --steps) * batch_size`` training problems, 28,160 here of the 42,000)::

    rpm-generate --out /tmp/iraven-80 --cache-size 80 --num-per-config 10000 --seed 1234 --workers 16 --quiet && \\
    python experiments/gpu-profile/profile_training.py --steps 200 --warmup 20 --out runs/profile data_root=/tmp/iraven-80 \\
        encoder=scl setup=ce_aux_sparse batch_size=128 image_size=80 num_workers=14 progress_bar=false

Here (CPU, tiny sizes; what ``tests/test_profile_training.py`` runs)::

    python experiments/gpu-profile/profile_training.py --steps 3 --warmup 1 --threads 1 --out /tmp/profile data_root=/tmp/iraven \\
        generate=true \\
        generate_num_per_config=10 image_size=32 batch_size=4 max_epochs=1 num_workers=0 progress_bar=false \\
        accelerator=cpu encoder=scl setup=ce_aux_sparse

Writes ``profile.json`` (every number, the config, the command) and on CUDA ``trace_lightning.json.gz`` into
``--out``; Lightning's run folders (checkpoints of the timed fits) go to ``--out/runs``. A case that fails is
reported with its error and the others still run (exit status 1); a bad config value exits 2 with one line.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import shlex
import sys
import time
import traceback
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

SKIPPED_ON_CPU = "skipped on CPU (no CUDA)"
#: CUDA runtime calls that block the host until the device is done (counted per step in case d).
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
#: ATen ops that read a device value on the host (``.item()``, ``float(t)``, ``bool(t)``, ``int(t)``).
SCALAR_READS = ("aten::_local_scalar_dense",)


# ----------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------
def _fields_summary() -> str:
    from rpm_lib.training.config import field_help

    groups: dict[str, list[str]] = {}
    for group, name, _type, _default, _help in field_help():
        groups.setdefault(group, []).append(name)
    lines = ["TrainConfig fields accepted as key=value (meanings and defaults: `rpm-train --help`):"]
    lines += [f"  [{group}] {', '.join(names)}" for group, names in groups.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="profile_training.py",
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:4]),
        epilog=_fields_summary() + "\n\nGPU command:\n" + __doc__.split("::\n\n")[1].split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", "-c", metavar="YAML", help="YAML file of TrainConfig fields (defaults otherwise)")
    parser.add_argument("--steps", type=int, default=50, help="timed training steps per case (default 50)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps before each case's timed ones, >= 1 (default 5): cuDNN autotuning, "
                             "loader start-up and first-call costs fall here")
    parser.add_argument("--val-batches", type=int, default=5,
                        help="validation batches of the Lightning fits (default 5); the full split is extrapolated")
    parser.add_argument("--profile-steps", type=int, default=10,
                        help="active steps of the torch.profiler window in case d (default 10, at most --steps)")
    parser.add_argument("--stage", default=None,
                        help="stage of the setup to profile (supervised, pretrain, linear, finetune; default: the "
                             "first stage of the setup)")
    parser.add_argument("--compile", action="store_true",
                        help="also time case a with module.encoder.compile() (compile time reported apart)")
    parser.add_argument("--compile-step", action="store_true",
                        help="also time case a with the whole forward compiled (module.stage_losses: encoder, heads "
                             "and losses, so AOTAutograd compiles their backward too), and on CUDA the same with "
                             "CUDA graphs (mode reduce-overhead: one graph launch instead of hundreds of kernels)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled cases (default inductor; aot_eager captures the "
                             "graphs without generating code: a quick check that the step compiles at all)")
    parser.add_argument("--compare-progress-bar", action="store_true",
                        help="also run case c with progress_bar=true (TQDM reads the logged loss every step)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (CPU; fewer threads than busy cores keeps timings stable)")
    parser.add_argument("--cases", default="a,b,c,d",
                        help="comma-separated subset of a,b,c,d to run (default all)")
    parser.add_argument("--out", default="runs/profile_training", help="output folder (default runs/profile_training)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig overrides, after --config")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if min(args.steps, args.warmup, args.val_batches, args.profile_steps, args.threads or 1) < 1:
        parser.error("--steps, --warmup, --val-batches, --profile-steps and --threads must be >= 1")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - set("abcd"):
        parser.error(f"--cases: expected a comma-separated subset of a,b,c,d, got {args.cases!r}")
    args.cases = cases
    return args


# ----------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Setup:
    """The resolved run: config, stage plan, device, precision, and the sizes used for extrapolation."""

    config: Any
    plan: Any
    device: Any
    precision: str
    memory_format: str
    out: Path
    num_train: int = 0
    num_val: int = 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def synchronize(setup: Setup) -> None:
    """Drain the GPU (no-op on the CPU)."""
    if setup.cuda:
        import torch

        torch.cuda.synchronize(setup.device)


def fresh_module(setup: Setup, eager: bool = False) -> Any:
    """A new RpmModule with train()'s initial weights (same seed), set to the profiled stage.

    ``eager``: without the config's own ``compile=true`` (where the library has that field).
    """
    import torch

    from rpm_lib.data.seeding import derive_seed
    from rpm_lib.training.module import RpmModule

    config = setup.config
    if eager and getattr(config, "compile", False):
        config = config.with_overrides({"compile": False})
    torch.manual_seed(derive_seed(config.seed, "init"))
    module = RpmModule(config, config.rule_spec.width)
    module.set_stage(setup.plan)
    return module


def to_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """Tensors of a batch to ``device`` with ``non_blocking`` (pinned memory on CUDA makes it asynchronous, as
    Lightning's ``batch_to_device`` does); other values (``source_id`` strings) unchanged."""
    import torch

    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def manual_step(setup: Setup, module: Any, graph_steps: bool = False) -> Callable[[dict[str, Any]], None]:
    """One optimiser step as Lightning's automatic optimisation runs it for ``precision``: zero_grad, forward
    under autocast (mixed precisions), backward, gradient clipping if configured, Adam step (with a GradScaler
    for 16-mixed, as Lightning's MixedPrecision plugin). ``graph_steps``: tell CUDA graphs where a step begins
    (the previous step's outputs may then be overwritten)."""
    import torch

    precision = setup.precision
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    true_dtype = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}.get(precision)
    if true_dtype is not None:
        module.to(true_dtype)
    module.to(setup.device).train()
    optimizer = module.make_optimizer()  # the stage's Adam without any lr schedule
    scaler = torch.amp.GradScaler(setup.device.type) if precision == "16-mixed" else None
    autocast = (lambda: torch.autocast(setup.device.type, dtype=dtype)) if dtype is not None else nullcontext
    clip = setup.config.gradient_clip_val
    params = module.trainable_parameters()

    def step(batch: dict[str, Any]) -> None:
        if graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            to_backward, _value, _parts = module.stage_losses(batch)
        if scaler is not None:
            scaler.scale(to_backward).backward()
            if clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, clip)
            scaler.step(optimizer)
            scaler.update()
            return
        to_backward.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()

    return step


def rate(rpms: int, seconds: float) -> float | None:
    return rpms / seconds if seconds > 0 else None


def release(setup: Setup) -> None:
    """Free what a case left (workers, GPU memory) before the next one starts."""
    gc.collect()
    if setup.cuda:
        import torch

        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# a + b: no Lightning
# ----------------------------------------------------------------------------------------------
#: What case a compiles (``case_encoder_only(compiled=...)``): the encoder in place (as ``compile=true`` does),
#: the whole forward of a step (``stage_losses``: encoder, heads, losses; AOTAutograd then compiles its backward
#: as one graph), or that with CUDA graphs (``mode="reduce-overhead"``: the kernels replay as one graph launch).
COMPILED_PARTS: tuple[str, ...] = ("encoder", "step", "step_cudagraphs")


def case_encoder_only(setup: Setup, batch: dict[str, Any], steps: int, warmup: int, compiled: str | None = None,
                      backend: str = "inductor") -> dict[str, Any]:
    """Case a: ``steps`` optimiser steps on one batch already on the device (RPMs/s; GPU drained before/after).

    With ``compiled`` (one of :data:`COMPILED_PARTS`): that part compiled first with ``backend``; ``compile_s`` is
    the first step's wall time (s), which holds the compilation, and the steady-state speed excludes it.
    """
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from bench_models import time_steps

    # a follows the config (compiled too if its compile=true, like b-d); the compiled variants start from an eager one
    module = fresh_module(setup, eager=compiled is not None)
    if compiled == "encoder":
        module.encoder.compile(backend=backend)  # in place: state_dict keys stay those of the eager encoder
    elif compiled in ("step", "step_cudagraphs"):
        mode = "reduce-overhead" if compiled == "step_cudagraphs" else None
        module.stage_losses = torch.compile(module.stage_losses, backend=backend, mode=mode)
    elif compiled is not None:
        raise ValueError(f"compiled: {compiled!r} is not one of {COMPILED_PARTS}")
    step = manual_step(setup, module, graph_steps=compiled == "step_cudagraphs")
    result: dict[str, Any] = {"status": "ok"}
    synchronize(setup)
    began = time.perf_counter()
    step(batch)
    synchronize(setup)
    first = time.perf_counter() - began
    if compiled:
        result["compile_s"] = round(first, 3)
    for _ in range(warmup - 1):
        step(batch)
    seconds = time_steps(lambda: step(batch), steps, setup.device)
    size = int(batch["target"].shape[0])
    result.update(steps=steps, batch_size=size, ms_per_step=1000 * seconds, rpms_per_s=rate(size, seconds),
                  first_step_s=round(first, 3))
    del module, step
    release(setup)
    return result


def case_manual_loop(setup: Setup, loader: Any, iterator: Any, steps: int, warmup: int) -> dict[str, Any]:
    """Case b: the real training DataLoader feeding the case-a step; RPMs/s over the timed steps and the host
    time blocked in ``next(loader)`` (ms/step). The loader restarts (next epoch) if it runs out."""
    module = fresh_module(setup)
    step = manual_step(setup, module)
    epoch = 0
    wait = 0.0
    rpms = 0
    began = 0.0
    for index in range(warmup + steps):
        if index == warmup:
            synchronize(setup)  # the window starts with a drained GPU and ends with one
            began, wait, rpms = time.perf_counter(), 0.0, 0
        fetch = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            epoch += 1
            loader.sampler.set_epoch(epoch)
            iterator = iter(loader)
            batch = next(iterator)
        wait += time.perf_counter() - fetch
        step(to_device(batch, setup.device))
        rpms += int(batch["target"].shape[0])
    synchronize(setup)
    seconds = time.perf_counter() - began
    del module, step, iterator
    release(setup)
    return {"status": "ok", "steps": steps, "rpms": rpms, "ms_per_step": 1000 * seconds / steps,
            "rpms_per_s": rate(rpms, seconds), "loader_wait_ms_per_step": 1000 * wait / steps,
            "loader_wait_fraction": wait / seconds if seconds > 0 else None, "epochs_restarted": epoch}


# ----------------------------------------------------------------------------------------------
# c + d: Lightning
# ----------------------------------------------------------------------------------------------
def _lightning_profiler_class() -> type:
    from lightning.pytorch.profilers import Profiler

    class ActionTimer(Profiler):
        """Lightning profiler: host wall time of every Lightning action (``[Strategy]...training_step``,
        ``[_TrainingEpochLoop].train_dataloader_next``, callback hooks, ...), as self time (minus nested
        actions), counted only while ``active`` (the timed steps). ``record=True`` also opens a
        ``torch.profiler.record_function`` range per action so the Chrome trace names them."""

        def __init__(self, record: bool = False) -> None:
            super().__init__()
            self.record = record
            self.active = False
            self.stack: list[list[Any]] = []  # [name, began, child seconds, counted, record_function]
            self.self_s: dict[str, float] = {}
            self.total_s: dict[str, float] = {}
            self.calls: dict[str, int] = {}

        def start(self, action_name: str) -> None:
            ranged = None
            if self.record:
                import torch

                ranged = torch.profiler.record_function(action_name)
                ranged.__enter__()
            self.stack.append([action_name, time.perf_counter(), 0.0, self.active, ranged])

        def stop(self, action_name: str) -> None:
            now = time.perf_counter()
            names = [entry[0] for entry in self.stack]
            if action_name not in names:
                return
            while self.stack:  # unmatched inner actions (never expected) are closed with their parent
                name, began, children, counted, ranged = self.stack.pop()
                if ranged is not None:
                    ranged.__exit__(None, None, None)
                total = now - began
                if self.stack:
                    self.stack[-1][2] += total
                if counted:
                    self.self_s[name] = self.self_s.get(name, 0.0) + total - children
                    self.total_s[name] = self.total_s.get(name, 0.0) + total
                    self.calls[name] = self.calls.get(name, 0) + 1
                if name == action_name:
                    return

        def summary(self) -> str:
            return ""

        def describe(self) -> None:  # Lightning prints summary() at teardown: nothing to print here
            return None

    return ActionTimer


def _clock_class() -> type:
    import lightning as L
    import torch

    class StepClock(L.Callback):
        """Timestamps (``time.perf_counter``, s) of every training batch start / end, validation, start-up and
        epoch end. ``synced``: ``torch.cuda.synchronize()`` before every batch timestamp (the separate "synced"
        mode); otherwise a single synchronize after the last step closes the window, so the CPU may run ahead of
        the GPU as in real training (``close_window=False``: not even that one, for the profiled fit whose sync
        count it would change). ``on_window(i)`` is called after step ``i``'s end timestamp."""

        def __init__(self, total: int, warmup: int, cuda: bool, synced: bool,
                     on_window: Callable[[int], None] | None = None, close_window: bool = True) -> None:
            self.total, self.warmup, self.cuda, self.synced = total, warmup, cuda, synced
            self.close_window = close_window
            self.on_window = on_window
            self.starts: list[float] = []
            self.ends: list[float] = []
            self.sizes: list[int] = []
            self.val_batch_ends: list[float] = []
            self.marks: dict[str, float] = {}

        def _now(self, sync: bool) -> float:
            if sync and self.cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.marks["train_start"] = time.perf_counter()

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            self.starts.append(self._now(self.synced))

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            index = len(self.ends)
            last = index == self.total - 1
            self.ends.append(self._now(self.synced or (last and self.close_window)))
            self.sizes.append(int(batch["target"].shape[0]))
            if self.on_window is not None:
                self.on_window(index)

        def on_validation_start(self, trainer: Any, module: Any) -> None:
            self.marks["val_start"] = time.perf_counter()

        def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int,
                                    dataloader_idx: int = 0) -> None:
            self.val_batch_ends.append(time.perf_counter())
            self.marks.setdefault("val_batch_size", int(batch["target"].shape[0]))

        def on_validation_end(self, trainer: Any, module: Any) -> None:
            self.marks["val_end"] = self._now(True)

        def on_train_end(self, trainer: Any, module: Any) -> None:
            self.marks["train_end"] = time.perf_counter()

    return StepClock


def _lightning_fit(setup: Setup, name: str, total: int, val_batches: int, callbacks: list[Any],
                   profiler: Any = None, overrides: dict[str, Any] | None = None) -> tuple[Any, float]:
    """One ``Trainer.fit`` of ``total`` training batches (one epoch) and ``val_batches`` validation batches,
    with the Trainer of ``make_trainer``; returns (trainer, fit wall seconds)."""
    from rpm_lib.training.callbacks import quiet_lightning
    from rpm_lib.training.datamodule import RpmDataModule
    from rpm_lib.training.trainer import make_trainer

    run_dir = setup.out / "runs" / name
    config = setup.config.with_overrides({"limit_train_batches": total, "limit_val_batches": val_batches,
                                          "max_steps": -1, "run_dir": str(run_dir), **(overrides or {})})
    plan = dataclasses.replace(setup.plan, max_epochs=1)
    module = fresh_module(dataclasses.replace(setup, config=config, plan=plan))
    datamodule = RpmDataModule(config, plan)
    with quiet_lightning():  # as train(): Lightning's banners and tips off, real warnings kept
        trainer, _checkpoint, _early = make_trainer(config, plan, run_dir / "checkpoints" / plan.name, callbacks)
        if profiler is not None:
            trainer.profiler = profiler  # Trainer(profiler=...) equivalent; make_trainer takes none
        began = time.perf_counter()
        trainer.fit(module, datamodule=datamodule)
        seconds = time.perf_counter() - began
    del module, datamodule
    trainer.fit_began = began  # perf_counter at the fit call: start-up is measured from here
    return trainer, seconds


def _step_split(clock: Any, warmup: int) -> dict[str, Any]:
    """Throughput and per-step split over the timed steps: window = end of the last warm-up step .. end of the
    last step; in-step = batch start -> end (the hooks' view: forward, backward, optimiser); between = the rest
    (data fetch, transfer, Lightning's loop and logging bookkeeping)."""
    ends, starts, sizes = clock.ends, clock.starts, clock.sizes
    timed = len(ends) - warmup
    if timed < 1:
        raise RuntimeError(f"only {len(ends)} training batches ran (need > --warmup {warmup}); more data or fewer "
                           "steps")
    window = ends[-1] - ends[warmup - 1]
    rpms = sum(sizes[warmup:])
    in_step = sum(ends[i] - starts[i] for i in range(warmup, len(ends)))
    return {"steps": timed, "rpms": rpms, "ms_per_step": 1000 * window / timed, "rpms_per_s": rate(rpms, window),
            "in_step_ms": 1000 * in_step / timed, "between_steps_ms": 1000 * (window - in_step) / timed}


def _validation(setup: Setup, clock: Any) -> dict[str, Any]:
    """Validation wall time (s, from the last training step's end: includes the val loader's start-up) and
    steady ms per batch, extrapolated to the full validation split and compared with a full training epoch."""
    marks = clock.marks
    if "val_end" not in marks or not clock.ends:
        return {"status": "not run"}
    wall = marks["val_end"] - clock.ends[-1]
    ends = clock.val_batch_ends
    steady = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else wall / max(len(ends), 1)
    size = marks.get("val_batch_size", setup.plan.batch_size)
    full_batches = math.ceil(setup.num_val / max(setup.plan.batch_size, 1)) if setup.num_val else 0
    startup = max(wall - steady * len(ends), 0.0)
    return {"wall_s": wall, "batches": len(ends), "ms_per_batch": 1000 * steady, "batch_size": size,
            "startup_s": startup, "full_split_problems": setup.num_val,
            "full_split_s": startup + steady * full_batches}


def case_lightning(setup: Setup, steps: int, warmup: int, val_batches: int, synced: bool,
                   name: str = "lightning_fit", overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Case c: a Lightning fit timed by StepClock (+ ActionTimer for the host time of each Lightning action)."""
    timer = _lightning_profiler_class()()
    total = warmup + steps

    def window(index: int) -> None:
        timer.active = warmup - 1 <= index < total - 1  # actions that start after warm-up and before the last end

    clock = _clock_class()(total, warmup, setup.cuda, synced, on_window=window)
    timings: dict[str, float] = {}

    def timed_stage_losses(original: Callable) -> Callable:
        # training_step = stage_losses + self.log x(1 + parts) + bookkeeping: time stage_losses to split them
        def wrapper(batch: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(batch, *args, **kwargs)
            finally:
                if timer.active:
                    timings["stage_losses"] = timings.get("stage_losses", 0.0) + time.perf_counter() - began
        return wrapper

    trainer, fit_s = _fit_with_wrapped_losses(setup, name, total, val_batches, [clock], timer, overrides,
                                              timed_stage_losses)
    result: dict[str, Any] = {"status": "ok", "synced": synced, **_step_split(clock, warmup), "fit_wall_s": fit_s}
    marks = clock.marks
    result["startup_s"] = clock.starts[0] - trainer.fit_began
    result["validation"] = _validation(setup, clock)
    if "train_end" in marks and "val_end" in marks:
        result["epoch_end_s"] = marks["train_end"] - marks["val_end"]  # checkpoints, early stopping, history
    timed = result["steps"]
    actions = sorted(timer.self_s.items(), key=lambda kv: -kv[1])
    result["host_actions_ms_per_step"] = [
        {"action": a, "self_ms": 1000 * s / timed, "total_ms": 1000 * timer.total_s[a] / timed,
         "calls_per_step": timer.calls[a] / timed} for a, s in actions]
    if "stage_losses" in timings:
        step_total = timer.total_s.get("[Strategy]SingleDeviceStrategy.training_step")
        result["stage_losses_ms_per_step"] = 1000 * timings["stage_losses"] / timed
        if step_total is not None:
            result["training_step_outside_stage_losses_ms"] = 1000 * (step_total - timings["stage_losses"]) / timed
    result["global_step"] = int(trainer.global_step)
    release(setup)
    return result


def _fit_with_wrapped_losses(setup: Setup, name: str, total: int, val_batches: int, callbacks: list[Any],
                             profiler: Any, overrides: dict[str, Any] | None,
                             wrap: Callable[[Callable], Callable] | None) -> tuple[Any, float]:
    """``_lightning_fit`` with the module's ``stage_losses`` wrapped (instance attribute; the class is untouched)."""
    import lightning as L

    class WrapLosses(L.Callback):
        def on_fit_start(self, trainer: Any, module: Any) -> None:
            if wrap is not None and "stage_losses" not in vars(module):
                module.stage_losses = wrap(module.stage_losses)

    return _lightning_fit(setup, name, total, val_batches, [WrapLosses(), *callbacks], profiler, overrides)


def case_profiled(setup: Setup, steps: int, warmup: int, val_batches: int, active: int) -> dict[str, Any]:
    """Case d: a Lightning fit under ``torch.profiler`` (schedule: wait ``warmup`` steps, 1 warm-up step,
    ``active`` recorded steps). CPU: top ops by self CPU time and ``.item()`` reads per step. CUDA also: GPU busy
    fraction, sync calls per step, the Python lines that synchronised, and the Chrome trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    active = min(active, steps)
    total = warmup + 1 + active
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.cuda else [])
    result: dict[str, Any] = {"status": "ok", "active_steps": active}
    trace = setup.out / "trace_lightning.json"

    def ready(prof: Any) -> None:
        result.update(analyse_profile(prof, active, setup.cuda))
        if setup.cuda:
            # gzip: tens of MB of JSON shrink ~10x; chrome://tracing and ui.perfetto.dev open .json.gz
            import gzip
            import shutil

            prof.export_chrome_trace(str(trace))
            with trace.open("rb") as source, gzip.open(f"{trace}.gz", "wb") as target:
                shutil.copyfileobj(source, target)
            trace.unlink()
            result["chrome_trace"] = f"{trace}.gz"

    prof = profile(activities=activities, schedule=schedule(wait=warmup, warmup=1, active=active, repeat=1),
                   on_trace_ready=ready, record_shapes=False, with_stack=False)
    caught: list[warnings.WarningMessage] = []

    def window(index: int) -> None:
        # prof.step() after each batch; the sync-debug mode covers exactly the recorded steps
        if setup.cuda and index == warmup:
            torch.cuda.set_sync_debug_mode("warn")
        if setup.cuda and index == total - 1:
            torch.cuda.set_sync_debug_mode("default")
        prof.step()

    clock = _clock_class()(total, warmup, setup.cuda, False, on_window=window, close_window=False)
    timer = _lightning_profiler_class()(record=True)
    with prof, warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", message=".*synchroniz.*")
        try:
            _lightning_fit(setup, "lightning_profiled", total, val_batches, [clock], timer)
        finally:
            if setup.cuda:
                torch.cuda.set_sync_debug_mode("default")
    if "top_cpu_ops" not in result:
        raise RuntimeError(f"the profiler window never completed ({len(clock.ends)} of {total} steps ran)")
    if setup.cuda:
        sites: dict[str, int] = {}
        for w in caught:
            if "synchroniz" in str(w.message):
                key = f"{w.filename}:{w.lineno}"
                sites[key] = sites.get(key, 0) + 1
        result["sync_debug"] = {"warnings_per_step": sum(sites.values()) / active,
                                "sites": dict(sorted(sites.items(), key=lambda kv: -kv[1]))}
    else:
        result["gpu_busy_fraction"] = {"status": "skipped", "reason": SKIPPED_ON_CPU}
        result["sync_calls_per_step"] = {"status": "skipped", "reason": SKIPPED_ON_CPU}
        result["sync_debug"] = {"status": "skipped", "reason": SKIPPED_ON_CPU}
        result["chrome_trace"] = {"status": "skipped", "reason": SKIPPED_ON_CPU}
    release(setup)
    return result


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    covered, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def analyse_profile(prof: Any, active: int, cuda: bool) -> dict[str, Any]:
    """Numbers from one completed profiler window (times in ms per step unless named otherwise)."""
    from torch.autograd import DeviceType

    events = prof.events()
    steps = [e for e in events if e.name.startswith("ProfilerStep") and e.device_type == DeviceType.CPU]
    active = len(steps) or active  # fewer when the fit ended inside the window
    window_start = min(e.time_range.start for e in steps)
    window_end = max(e.time_range.end for e in steps)
    wall_us = window_end - window_start
    averages = [a for a in prof.key_averages() if not a.key.startswith("ProfilerStep")]
    top = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:15]
    out: dict[str, Any] = {
        "window_ms_per_step": wall_us / 1000 / active,
        "top_cpu_ops": [{"op": a.key, "self_cpu_ms_per_step": a.self_cpu_time_total / 1000 / active,
                         "calls_per_step": a.count / active} for a in top],
        "scalar_reads_per_step": sum(a.count for a in averages if a.key in SCALAR_READS) / active,
        # Reads of CPU tensors count too (Adam's per-parameter step counters, the losses' value checks on CPU);
        # the enclosing range tells them apart from reads of device tensors.
        "scalar_reads_by_range": _by_range([e for e in events if e.name in SCALAR_READS], active),
    }
    if cuda:
        device = [(max(e.time_range.start, window_start), min(e.time_range.end, window_end)) for e in events
                  if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
                  and e.time_range.end > window_start
                  and e.time_range.start < window_end]
        # kernels, memcpy and memset on the GPU timeline; the GPU copies of record_function ranges
        # (ProfilerStep, Lightning actions: is_user_annotation) span idle gaps and are left out
        out["gpu_busy_fraction"] = _union(device) / wall_us if wall_us > 0 else None
        out["gpu_kernel_sum_fraction"] = sum(b - a for a, b in device) / wall_us if wall_us > 0 else None
        out["sync_calls_per_step"] = {name: sum(a.count for a in averages if a.key == name) / active
                                      for name in SYNC_CALLS}
        out["sync_calls_by_range"] = _by_range([e for e in events if e.name in SYNC_CALLS], active)
    return out


def _by_range(events: list[Any], active: int) -> dict[str, float]:
    """Per-step counts of ``events`` by their innermost enclosing Lightning action (``[Strategy]...``,
    ``[Callback]...``, ...) or ``Optimizer.step``/DataLoader range: which part of the loop asks for the value."""
    counts: dict[str, float] = {}
    for event in events:
        parent, where = event.cpu_parent, "(outside any Lightning action)"
        while parent is not None:
            if parent.name.startswith(("[", "Optimizer.", "enumerate(DataLoader)")):
                where = parent.name[:120]
                break
            parent = parent.cpu_parent
        counts[where] = counts.get(where, 0.0) + 1.0 / active
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------
def _hardware(setup: Setup) -> str:
    import torch

    if setup.cuda:
        device = torch.cuda.get_device_name(setup.device)
    else:
        device = f"CPU ({platform.processor() or platform.machine()}), torch threads {torch.get_num_threads()}"
    return (f"{device}, {setup.precision}, {setup.memory_format}, {setup.config.num_workers} loader workers, "
            f"torch {torch.__version__}")


def _ms(case: dict[str, Any]) -> float | None:
    return case.get("ms_per_step") if case.get("status") == "ok" else None


def verdict(report: dict[str, Any]) -> list[str]:
    """The attribution lines: a -> b -> c differences in ms/step and % of a Lightning step, plus validation,
    GPU busy fraction and host syncs where measured."""
    cases = report["cases"]
    a, b, c = (_ms(cases.get(k, {})) for k in ("encoder_only", "manual_loop", "lightning_fit"))
    lines = []
    base = c or b or a
    if a and base:
        lines.append(f"Encoder + heads + Adam (a): {a:.2f} ms/step ({100 * a / base:.0f} % of a "
                     f"{'Lightning' if c else 'measured'} step)")
    if a and b and base:
        lines.append(f"DataLoader + host->device copy (b - a): {b - a:.2f} ms/step ({100 * (b - a) / base:.0f} %); "
                     f"host blocked in next(loader): {cases['manual_loop']['loader_wait_ms_per_step']:.2f} ms/step")
    if b and c:
        lines.append(f"Lightning overhead (c - b): {c - b:.2f} ms/step ({100 * (c - b) / c:.0f} %)")
        fit = cases["lightning_fit"]
        if "training_step_outside_stage_losses_ms" in fit:
            lines.append("  of which training_step outside stage_losses (self.log calls, strategy/precision "
                         f"wrappers): {fit['training_step_outside_stage_losses_ms']:.3f} ms/step")
        top = fit.get("host_actions_ms_per_step", [])[:4]
        if top:
            lines.append("  largest Lightning actions by host self time (ms/step): "
                         + ", ".join(f"{x['action']} {x['self_ms']:.3f}" for x in top))
    for key, what in (("encoder_only_compiled", "torch.compile of the encoder"),
                      ("step_compiled", "torch.compile of the whole forward (stage_losses)"),
                      ("step_compiled_cudagraphs", "the same with CUDA graphs (reduce-overhead)")):
        compiled = cases.get(key, {})
        if compiled.get("status") == "ok" and a:
            lines.append(f"{what} (a): {compiled['ms_per_step']:.2f} ms/step vs {a:.2f} "
                         f"({a / compiled['ms_per_step']:.2f}x), after {compiled['compile_s']:.1f} s of compilation")
    foreach = cases.get("encoder_only_foreach_adam", {})
    if foreach.get("status") == "ok" and a:
        lines.append(f"Fused Adam (a): {a:.2f} ms/step vs {foreach['ms_per_step']:.2f} with per-parameter Adam "
                     f"({foreach['ms_per_step'] / a:.2f}x)")
    if (a and b and b < a) or (b and c and c < b):
        lines.append("Caution: a later case ran faster than an earlier, simpler one: the machine's speed varied "
                     "between cases (shared CPU?); rerun with more --steps (and --threads on a busy CPU)")
    synced = cases.get("lightning_fit_synced", {})
    if synced.get("status") == "ok":
        lines.append(f"Synced Lightning steps: GPU idle between steps {synced['between_steps_ms']:.2f} ms of "
                     f"{synced['ms_per_step']:.2f} ms ({100 * synced['between_steps_ms'] / synced['ms_per_step']:.0f} "
                     "%; the host's loop, fetch and transfer while nothing is queued)")
    pbar = cases.get("lightning_fit_progress_bar", {})
    if pbar.get("status") == "ok" and c:
        lines.append(f"Progress bar on: {pbar['ms_per_step']:.2f} ms/step vs {c:.2f} off "
                     f"({pbar['ms_per_step'] - c:+.2f} ms/step)")
    if c:
        fit = cases["lightning_fit"]
        val = fit.get("validation", {})
        if "full_split_s" in val and report.get("num_train"):
            epoch_steps = report["num_train"] / max(report["batch_size"], 1)
            train_s = epoch_steps * c / 1000
            full = val["full_split_s"] + fit.get("epoch_end_s", 0.0)
            lines.append(f"Validation: {val['ms_per_batch']:.1f} ms/batch + {val['startup_s']:.2f} s start-up; a full "
                         f"split of {val['full_split_problems']} problems ~ {val['full_split_s']:.1f} s, plus "
                         f"{fit.get('epoch_end_s', 0.0):.2f} s epoch end (checkpoints) = "
                         f"{100 * full / (train_s + full):.0f} % of a full epoch ({train_s:.1f} s of steps for "
                         f"{report['num_train']} problems)")
        lines.append("Fit start-up (trainer.fit call to the first batch's start: prepare_data, setup, loader "
                     f"workers): {fit['startup_s']:.2f} s")
    prof = cases.get("lightning_profiled", {})
    if prof.get("status") == "ok":
        busy = prof.get("gpu_busy_fraction")
        if isinstance(busy, (int, float)):
            lines.append(f"GPU busy over profiled Lightning steps: {100 * busy:.0f} % (idle {100 * (1 - busy):.0f} %)")
        syncs = prof.get("sync_calls_per_step")
        reads = prof["scalar_reads_per_step"]
        where = ", ".join(f"{k} {v:g}" for k, v in list(prof["scalar_reads_by_range"].items())[:4])
        lines.append(f"Host reads of tensor values (.item(), float(t); CPU tensors included) per step: {reads:g}"
                     + (f" ({where})" if where else ""))
        if isinstance(syncs, dict) and "status" not in syncs:
            total = sum(syncs.values())
            where = ", ".join(f"{k} {v:g}" for k, v in list(prof.get("sync_calls_by_range", {}).items())[:4])
            named = ", ".join(f"{k} {v:g}" for k, v in syncs.items() if v)
            lines.append(f"Device->host syncs per step: {total:g}" + (f" ({named})" if named else "")
                         + (f" in {where}" if where else ""))
        else:
            lines.append(f"Device->host syncs per step: {SKIPPED_ON_CPU}")
        sites = prof.get("sync_debug", {}).get("sites")
        if sites:
            lines.append("Synchronising Python lines (sync debug mode, per profiled window): "
                         + ", ".join(f"{k} x{v}" for k, v in list(sites.items())[:6]))
    return lines


def print_report(report: dict[str, Any]) -> None:
    cases = report["cases"]
    print(f"\n## Training-step profile: {report['encoder']}, {report['setup']} (stage {report['stage']}), batch "
          f"{report['batch_size']}, {report['image_size']} px, {report['hardware']}\n")
    print(f"{report['warmup']} warm-up + {report['steps']} timed steps per case\n")
    print("| case | RPMs / s | ms / step | vs encoder only | notes |")
    print("|---|---:|---:|---:|---|")
    base = cases.get("encoder_only", {}).get("rpms_per_s")
    labels = {"encoder_only": "a. encoder only (stage_losses + backward + Adam, batch on device)",
              "encoder_only_compiled": "a. encoder only, torch.compile",
              "step_compiled": "a. whole forward (stage_losses) compiled",
              "step_compiled_cudagraphs": "a. whole forward compiled, CUDA graphs",
              "encoder_only_foreach_adam": "a. encoder only, per-parameter (foreach) Adam instead of fused",
              "manual_loop": "b. manual loop, real DataLoader",
              "lightning_fit": "c. Lightning fit (make_trainer)",
              "lightning_fit_synced": "c. Lightning fit, synced every step",
              "lightning_fit_progress_bar": "c. Lightning fit, progress_bar=true",
              "lightning_profiled": "d. torch.profiler over Lightning steps"}
    for key, label in labels.items():
        case = cases.get(key)
        if case is None:
            continue
        if case.get("status") != "ok":
            print(f"| {label} | | | | {case.get('status')}: {case.get('reason') or case.get('error', '')} |")
            continue
        speed = case.get("rpms_per_s")
        ratio = f"{speed / base:.2f}x" if speed and base else ""
        notes = []
        if "compile_s" in case:
            notes.append(f"compile (first step) {case['compile_s']:.1f} s")
        if "loader_wait_ms_per_step" in case:
            notes.append(f"next(loader) {case['loader_wait_ms_per_step']:.2f} ms/step "
                         f"({100 * (case['loader_wait_fraction'] or 0):.0f} %)")
        if "between_steps_ms" in case:
            notes.append(f"in step {case['in_step_ms']:.2f} ms, between steps {case['between_steps_ms']:.2f} ms")
        if "validation" in case and "wall_s" in case["validation"]:
            notes.append(f"validation {case['validation']['wall_s']:.2f} s / {case['validation']['batches']} batches")
        if key == "lightning_profiled":
            busy = case.get("gpu_busy_fraction")
            notes.append(f"GPU busy {100 * busy:.0f} %" if isinstance(busy, (int, float))
                         else f"GPU busy {busy.get('reason')}")
            notes.append(f".item() reads {case['scalar_reads_per_step']:g}/step")
            ms = f"{case['window_ms_per_step']:.2f}"
            print(f"| {label} | | {ms} | | {'; '.join(notes)} |")
            continue
        print(f"| {label} | {speed:.1f} | {case['ms_per_step']:.2f} | {ratio} | {'; '.join(notes)} |")
    prof = cases.get("lightning_profiled", {})
    if prof.get("status") == "ok":
        print("\nTop CPU ops by self CPU time over the profiled Lightning steps (ms/step, calls/step):")
        for op in prof["top_cpu_ops"]:
            print(f"  {op['self_cpu_ms_per_step']:8.3f}  {op['calls_per_step']:7.1f}  {op['op']}")
    fit = cases.get("lightning_fit", {})
    if fit.get("status") == "ok":
        print("\nHost self time of Lightning actions over the timed steps of c (ms/step, calls/step):")
        for action in fit["host_actions_ms_per_step"][:12]:
            print(f"  {action['self_ms']:8.3f}  {action['calls_per_step']:5.1f}  {action['action'][:100]}")
    print("\nVerdict:")
    for line in report["verdict"]:
        print(f"- {line}")
    print(f"\ncommand: {report['command']}")


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------
def resolve(args: argparse.Namespace) -> Setup:
    """Config, stage plan, device and precision; raises ConfigError for every bad value."""
    from rpm_lib.training.cli import resolve_config
    from rpm_lib.training.config import ConfigError
    from rpm_lib.training.module import resolve_memory_format
    from rpm_lib.training.trainer import resolve_precision
    from rpm_lib.training.plans import stage_plan

    import torch

    config = resolve_config(args)
    precision = resolve_precision(config)
    plans = stage_plan(config)
    if args.stage is None:
        plan = plans[0]
    else:
        named = [p for p in plans if p.name == args.stage]
        if not named:
            raise ConfigError(f"--stage {args.stage}: setup {config.setup} runs {', '.join(p.name for p in plans)}")
        plan = named[0]
    device = torch.device("cuda", 0) if config.trains_on_cuda else torch.device("cpu")
    return Setup(config, plan, device, precision, resolve_memory_format(config), Path(args.out))


def _run_case(report: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]], write: Callable[[], None]) -> None:
    print(f"[profile] {key} ...", flush=True)
    began = time.perf_counter()
    try:
        report["cases"][key] = fn()
    except Exception as error:  # one broken case must not cost the others (a GPU call is precious)
        report["cases"][key] = {"status": "error", "error": f"{type(error).__name__}: {error}"[:500],
                                "traceback": traceback.format_exc()[-3000:]}
        traceback.print_exc()
    report["cases"][key]["case_wall_s"] = round(time.perf_counter() - began, 2)
    print(f"[profile] {key}: {report['cases'][key]['status']} in {report['cases'][key]['case_wall_s']} s",
          flush=True)
    write()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rpm_lib.training.config import ConfigError

    try:
        setup = resolve(args)
    except ConfigError as error:
        print(f"profile_training: error: {error}", file=sys.stderr)
        return 2
    import torch

    from rpm_lib.data import DataFormatError

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if getattr(setup.config, "matmul_precision", "auto") != "auto":
        # for every case: the bare steps (a, b) never pass through train(), which sets it for a run
        torch.set_float32_matmul_precision(setup.config.matmul_precision)
    from rpm_lib.training.datamodule import RpmDataModule

    config, plan = setup.config, setup.plan
    report: dict[str, Any] = {
        "command": shlex.join([sys.executable, *sys.argv]), "hardware": _hardware(setup),
        "device": str(setup.device), "precision": setup.precision, "memory_format": setup.memory_format,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "encoder": config.encoder, "setup": config.setup, "stage": plan.name, "batch_size": plan.batch_size,
        "num_views": plan.num_views, "image_size": config.image_size, "num_workers": config.num_workers,
        "config_compile": bool(getattr(config, "compile", False)),
        "steps": args.steps, "warmup": args.warmup, "config": config.to_dict(), "cases": {},
    }
    path = setup.out / "profile.json"

    def write() -> None:
        report["verdict"] = verdict(report)
        path.write_text(json.dumps(report, indent=1, default=str))

    # The data once for a and b: prepare_data generates with generate=true; errors here are config errors.
    try:
        datamodule = RpmDataModule(config, plan)
        datamodule.prepare_data()
        datamodule.setup("fit")
    except (ConfigError, DataFormatError) as error:
        print(f"profile_training: error: {error}", file=sys.stderr)
        return 2
    setup.out.mkdir(parents=True, exist_ok=True)
    setup.num_train, setup.num_val = len(datamodule.train_set), len(datamodule.val_set)
    report.update(num_train=setup.num_train, num_val=setup.num_val)
    cuda_skip = {"status": "skipped", "reason": SKIPPED_ON_CPU}

    ab = [k for k, c in (("encoder_only", "a"), ("manual_loop", "b")) if c in args.cases]
    if ab:
        try:
            loader = datamodule.train_dataloader()
            iterator = iter(loader)
            fixed = to_device(next(iterator), setup.device)
        except Exception as error:  # the loader itself broke: a and b cannot run, c and d still try
            traceback.print_exc()
            for key in ab:
                report["cases"][key] = {"status": "error", "error": f"first batch: {type(error).__name__}: {error}"}
            ab = []
    if ab:
        if "a" in args.cases:
            _run_case(report, "encoder_only", lambda: case_encoder_only(setup, fixed, args.steps, args.warmup), write)
            if args.compile:
                _run_case(report, "encoder_only_compiled",
                          lambda: case_encoder_only(setup, fixed, args.steps, args.warmup, compiled="encoder",
                                                    backend=args.compile_backend), write)
            else:
                report["cases"]["encoder_only_compiled"] = {"status": "skipped", "reason": "--compile not given"}
            for part, key in (("step", "step_compiled"), ("step_cudagraphs", "step_compiled_cudagraphs")):
                if not args.compile_step:
                    report["cases"][key] = {"status": "skipped", "reason": "--compile-step not given"}
                elif part == "step_cudagraphs" and not (setup.cuda and args.compile_backend == "inductor"):
                    report["cases"][key] = {"status": "skipped", "reason": "CUDA graphs need CUDA and inductor"}
                else:
                    _run_case(report, key, lambda part=part: case_encoder_only(
                        setup, fixed, args.steps, args.warmup, compiled=part, backend=args.compile_backend), write)
            if setup.cuda and getattr(config, "fused_adam", False):
                # Side by side with the fused update the config uses: the per-parameter (foreach) Adam it replaced.
                foreach = dataclasses.replace(setup, config=dataclasses.replace(config, fused_adam=False))
                _run_case(report, "encoder_only_foreach_adam",
                          lambda: case_encoder_only(foreach, fixed, args.steps, args.warmup), write)
            else:
                report["cases"]["encoder_only_foreach_adam"] = {
                    "status": "skipped", "reason": "needs CUDA and fused_adam=true (fused Adam is CUDA only here)"}
        if "b" in args.cases:
            _run_case(report, "manual_loop",
                      lambda: case_manual_loop(setup, loader, iterator, args.steps, args.warmup), write)
        del loader, iterator, fixed
    del datamodule
    release(setup)
    if "c" in args.cases:
        _run_case(report, "lightning_fit",
                  lambda: case_lightning(setup, args.steps, args.warmup, args.val_batches, synced=False), write)
        if setup.cuda:
            _run_case(report, "lightning_fit_synced",
                      lambda: case_lightning(setup, args.steps, args.warmup, args.val_batches, synced=True,
                                             name="lightning_fit_synced"), write)
        else:
            report["cases"]["lightning_fit_synced"] = dict(cuda_skip)
        if args.compare_progress_bar:
            _run_case(report, "lightning_fit_progress_bar",
                      lambda: case_lightning(setup, args.steps, args.warmup, args.val_batches, synced=False,
                                             name="lightning_fit_progress_bar", overrides={"progress_bar": True}),
                      write)
    if "d" in args.cases:
        _run_case(report, "lightning_profiled",
                  lambda: case_profiled(setup, args.steps, args.warmup, args.val_batches, args.profile_steps), write)
    write()
    print_report(report)
    print(f"\nwritten: {path}")
    failed = [k for k, v in report["cases"].items() if v.get("status") == "error"]
    if failed:
        print(f"profile_training: error: cases failed: {', '.join(failed)} (see profile.json)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
