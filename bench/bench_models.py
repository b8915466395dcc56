"""Encoder throughput: forward + backward RPMs per second, one row per registered encoder.

Each step embeds a batch of random RPMs (B, 16, S, S), applies a scoring head and the answer
cross-entropy, and back-propagates; the optimiser step is left out. Weights and inputs are channels_last
as in training (--memory-format contiguous for NCHW); on CUDA the step runs under bf16 autocast (--no-amp).

    python bench/bench_models.py                         # CPU, batch 32, 80 px, every encoder
    python bench/bench_models.py --device cuda           # GPU, bf16 autocast + channels_last
    python bench/bench_models.py --encoders scl wren --steps 5 --threads 2
    python bench/bench_models.py --side-by-side [--compile]   # NCHW vs channels_last (vs compiled), one run

Prints a Markdown table, the torch thread count and the exact command.
"""
from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
import statistics
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from rpm_lib.encoders import create_encoder, list_encoders
from rpm_lib.heads import ScoringHead
from rpm_lib.losses import answer_cross_entropy
from rpm_lib.training.config import MEMORY_FORMATS
from rpm_lib.training.config_values import resolve_memory_format_for


@dataclass
class BenchResult:
    name: str
    parameters: int
    embedding_dim: int
    seconds_per_step: float
    batch_size: int

    @property
    def rpms_per_second(self) -> float:
        return self.batch_size / self.seconds_per_step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--encoders", nargs="+", default=None, help="names from list_encoders() (default: all)")
    parser.add_argument("--backbone", default=None, help="HriNet backbone override (cnn4 / resnet18)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per encoder")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per encoder")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--no-amp", action="store_true", help="CUDA: run in fp32 instead of bf16 autocast")
    parser.add_argument("--memory-format", choices=MEMORY_FORMATS, default="auto",
                        help="tensor layout; auto = what training uses on this device (see docs/performance.md)")
    parser.add_argument("--no-channels-last", action="store_true", help="same as --memory-format contiguous")
    parser.add_argument("--side-by-side", action="store_true",
                        help="time eager NCHW, eager channels_last (and with --compile both compiled) for each "
                             "encoder in interleaved rounds; print each variant's ratio to eager NCHW")
    parser.add_argument("--rounds", type=int, default=3, help="--side-by-side: interleaved rounds (median kept)")
    parser.add_argument("--compile", action="store_true", help="wrap encoder + head in torch.compile")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the rows as JSON to PATH")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_step(name: str, args: argparse.Namespace, device: torch.device, memory_format: str,
               compiled: bool) -> tuple[Callable[[], None], int, int]:
    """One forward + backward step of encoder ``name`` + scoring head on a fixed random batch.

    Returns:
        ``(step, parameters, embedding_dim)``: the step as a function, the encoder's parameter count and D.
    """
    torch.manual_seed(args.seed)
    kwargs: dict[str, object] = {"image_size": args.image_size}
    if name == "hrinet" and args.backbone:
        kwargs["backbone"] = args.backbone
    encoder = create_encoder(name, **kwargs).to(device).train()
    head = ScoringHead(encoder.embedding_dim).to(device)
    use_cuda = device.type == "cuda"
    channels_last = memory_format == "channels_last"
    if channels_last:
        encoder = encoder.to(memory_format=torch.channels_last)
    generator = torch.Generator(device="cpu").manual_seed(args.seed)
    panels = torch.rand(args.batch_size, 16, args.image_size, args.image_size, generator=generator).to(device)
    if channels_last:
        panels = panels.contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 8, (args.batch_size,), generator=generator).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_cuda and not args.no_amp else nullcontext()
    model = torch.nn.Sequential(encoder, head)
    forward = torch.compile(model) if compiled else model

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = answer_cross_entropy(forward(panels).float(), target)
        loss.backward()

    return step, sum(p.numel() for p in encoder.parameters()), encoder.embedding_dim


def time_steps(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Seconds per step, the mean over ``steps`` steps (the GPU drained before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / steps


def memory_format_for(args: argparse.Namespace, device: torch.device) -> str:
    """The layout a run uses: ``--memory-format``, with ``auto`` resolved the way training resolves it."""
    if args.no_channels_last:
        return "contiguous"
    return resolve_memory_format_for(args.memory_format)


def bench_encoder(name: str, args: argparse.Namespace, device: torch.device) -> BenchResult:
    step, parameters, embedding_dim = build_step(name, args, device, memory_format_for(args, device), args.compile)
    for _ in range(args.warmup):
        step()
    elapsed = time_steps(step, args.steps, device)
    return BenchResult(name, parameters, embedding_dim, elapsed, args.batch_size)


# (label, memory format, torch.compile): the variants of --side-by-side, eager NCHW first as the baseline
SIDE_BY_SIDE = (("eager NCHW", "contiguous", False), ("eager channels_last", "channels_last", False),
                ("compiled NCHW", "contiguous", True), ("compiled channels_last", "channels_last", True))


def side_by_side(names: list[str], args: argparse.Namespace, device: torch.device) -> list[dict[str, object]]:
    """Every variant of every encoder, timed in interleaved rounds (so drifts in machine speed hit all variants
    alike); the median round per variant and its ratio to eager NCHW."""
    variants = [v for v in SIDE_BY_SIDE if args.compile or not v[2]]
    rows: list[dict[str, object]] = []
    for name in names:
        steps = {}
        for label, memory_format, compiled in variants:
            steps[label] = build_step(name, args, device, memory_format, compiled)[0]
            for _ in range(args.warmup):
                steps[label]()
        rounds: dict[str, list[float]] = {label: [] for label in steps}
        for _ in range(args.rounds):
            for label, step in steps.items():
                rounds[label].append(args.batch_size / time_steps(step, args.steps, device))
        baseline = statistics.median(rounds["eager NCHW"])
        for label, values in rounds.items():
            median = statistics.median(values)
            rows.append({"encoder": name, "variant": label, "rpms_per_s": median, "vs_eager_nchw": median / baseline,
                         "rounds": values})
            print(f"{name} {label}: {median:.1f} RPMs/s ({median / baseline:.2f}x eager NCHW)", flush=True)
    return rows


def _hardware(args: argparse.Namespace, device: torch.device) -> str:
    """What the numbers were measured on, in words: device, precision, layout, compilation."""
    if device.type == "cuda":
        precision = "fp32" if args.no_amp else "bf16 autocast"
        hardware = f"{torch.cuda.get_device_name(device)}, {precision}"
    else:
        hardware = f"CPU ({platform.processor() or platform.machine()}), fp32, torch threads {torch.get_num_threads()}"
    if not args.side_by_side:
        hardware += ", " + ("NCHW" if memory_format_for(args, device) == "contiguous" else "channels_last")
    return hardware + (", torch.compile" if args.compile else "")


def _write_json(path: str, results: list, hardware: str) -> None:
    import json

    rows = [{"encoder": r.name, "parameters": r.parameters, "embedding_dim": r.embedding_dim,
             "ms_per_step": 1000 * r.seconds_per_step, "rpms_per_s": r.rpms_per_second,
             "batch_size": r.batch_size, "hardware": hardware} for r in results]
    Path(path).write_text(json.dumps(rows, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda requested but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = args.encoders or list_encoders()
    unknown = sorted(set(names) - set(list_encoders()))
    if unknown:
        print(f"error: unknown encoders {unknown}; registered: {list_encoders()}", file=sys.stderr)
        return 2

    if args.side_by_side:
        rows = side_by_side(names, args, device)
        print(f"\n## Side by side: forward+backward, batch {args.batch_size}, {args.image_size} px, "
              f"{_hardware(args, device)}, median of {args.rounds} interleaved rounds of {args.steps} steps\n")
        print("| encoder | variant | RPMs / s | vs eager NCHW |")
        print("|---|---|---:|---:|")
        for row in rows:
            print(f"| {row['encoder']} | {row['variant']} | {row['rpms_per_s']:.1f} | {row['vs_eager_nchw']:.2f}x |")
        print("command: " + shlex.join([sys.executable, *sys.argv]))
        if args.json:
            import json

            Path(args.json).write_text(json.dumps([{**row, "hardware": _hardware(args, device)} for row in rows],
                                                  indent=1))
        return 0

    # Rows are written after every encoder, so a run stopped at its time limit keeps what finished.
    results = []
    for name in names:
        results.append(bench_encoder(name, args, device))
        print(f"{name}: {results[-1].rpms_per_second:.1f} RPMs/s", flush=True)
        if args.json:
            _write_json(args.json, results, _hardware(args, device))

    hardware = _hardware(args, device)
    print(f"## Encoder forward+backward throughput: batch {args.batch_size}, {args.image_size} px, {hardware}\n")
    print("| encoder | parameters | D | ms / step | RPMs / s |")
    print("|---|---:|---:|---:|---:|")
    for result in results:
        label = result.name + (f" ({args.backbone})" if result.name == "hrinet" and args.backbone else "")
        print(f"| {label} | {result.parameters:,} | {result.embedding_dim} | "
              f"{1000 * result.seconds_per_step:.1f} | {result.rpms_per_second:.1f} |")
    print(f"\ntorch {torch.__version__}, torch threads {torch.get_num_threads()}, "
          f"{args.warmup} warm-up + {args.steps} timed steps per encoder")
    print("command: " + shlex.join([sys.executable, *sys.argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
