"""``rpm-pretrained``: the shipped models -- list them, check their files, evaluate one on fresh problems, add one.

    rpm-pretrained list                                  # what ships: setup, data, device, recorded accuracies
    rpm-pretrained evaluate NAME                         # fresh I-RAVEN problems (another seed) beside the recorded
    rpm-pretrained evaluate NAME --regimes I-RAVEN A/Color I-RAVEN-Mesh   # in and out of distribution
    rpm-pretrained verify                                # every shipped file against its SHA-256
    rpm-pretrained add RUN_DIR --name NAME --command "rpm-batch configs/x.yaml"   # ship a finished run's weights
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rpm_lib.cli_parser import OneLineArgumentParser
from rpm_lib.run_folder import FINAL_WEIGHTS

PROG = "rpm-pretrained"


def _count(limit: int, least: int = 1):
    """An argparse type: an integer from ``least`` to ``limit``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not least <= value <= limit:
            raise argparse.ArgumentTypeError(f"must be from {least} to {limit:,}, got {value}")
        return value
    return parse


def _parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].strip(),
                                   epilog="Models, their recipes and accuracies: docs/pretrained.md")
    parser.add_argument("--registry", type=Path, default=None, metavar="FILE",
                        help="another registry file (a models.json of your own; weights relative to its folder); "
                        "default: the models that ship with rpm_lib")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser("list", help="the shipped models, one line each")
    listing.add_argument("--json", action="store_true", help="every registry field, as JSON")
    commands.add_parser("verify", help="check every shipped weights file against its recorded SHA-256")
    evaluate = commands.add_parser(
        "evaluate", help="score a shipped model on freshly generated problems, per configuration, beside its "
        "recorded test accuracy",
        description="Generate problems the model has never seen (another seed) at its image size, score it per "
        "configuration with a 99%% Clopper-Pearson interval, and say whether each accuracy lies in the range its "
        "recorded test accuracy predicts for that many problems. With --regimes, one row per generalisation regime "
        "and split, labelled in or out of the model's training distribution.")
    evaluate.add_argument("name", help="a shipped model (rpm-pretrained list)")
    evaluate.add_argument("--num-per-config", type=_count(100_000, least=10), default=100,
                          help="problems per configuration, at least 10 (split 60/20/20 like the training data; every "
                          "split is scored; default 100, i.e. 700 problems)")
    evaluate.add_argument("--seed", type=int, default=20_261_128, help="generator seed (default 20261128)")
    evaluate.add_argument("--regimes", nargs="+", metavar="REGIME",
                          help="generator regimes to compare (e.g. I-RAVEN A/Color A/Position I-RAVEN-Mesh)")
    evaluate.add_argument("--data", metavar="DIR",
                          help="keep the generated problems here (reused by the next call); default: a temporary "
                          "folder, removed afterwards")
    evaluate.add_argument("--workers", type=_count(256), default=1, help="generator processes (default 1)")
    evaluate.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add = commands.add_parser("add", help="ship a finished run's final weights: copy the file, write its entry",
                              description="Copy RUN_DIR/final_weights.pt to rpm_lib/pretrained/weights/NAME.pt and "
                              "write NAME's entry into rpm_lib/pretrained/models.json from the run's records.")
    add.add_argument("run_dir", help="a finished run folder with final_weights.pt")
    add.add_argument("--name", required=True, help="the model's name, e.g. scl-ce-aux-sparse-cpu48")
    add.add_argument("--command", required=True, help="the command that trained it (recorded in the entry)")
    add.add_argument("--data", metavar="DIR", help="the training data folder (default: the run config's data_root)")
    add.add_argument("--replace", action="store_true", help="replace an entry of that name")
    return parser


def _list(as_json: bool, path: Path) -> int:
    from rpm_lib.pretrained.registry import read_registry, registry_json

    registry = read_registry(path)
    if as_json:
        print(registry_json(registry))
        return 0
    if not registry:
        print("no model ships yet")
        return 0
    print("| name | encoder | setup | protocol | px | training data | epochs | device | val % | test % | MB |")
    print("|---|---|---|---|---:|---|---|---|---:|---:|---:|")
    for m in registry.values():
        data = f"{m.data['regime'].get('regime')} seed {m.data['regime'].get('seed')}, {m.data.get('num_problems')}"
        epochs = ", ".join(f"{stage} {n}" for stage, n in m.epochs.items())
        print(f"| {m.name} | {m.encoder} | {m.setup_label} | {m.protocol} | {m.image_size} | {data} | {epochs} | "
              f"{m.device} | {100 * m.val_accuracy:.1f} | {100 * m.test_accuracy:.1f} | {m.bytes / 1e6:.2f} |")
    return 0


def _verify(path: Path) -> int:
    from rpm_lib.pretrained.load import verify
    from rpm_lib.pretrained.registry import read_registry

    registry = read_registry(path)
    problems = [problem for entry in registry.values() if (problem := verify(entry, path))]
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{len(registry)} shipped weights files match their SHA-256")
    return 1 if problems else 0


def _evaluate(args) -> int:
    from rpm_lib.pretrained.evaluate import (ACCURACY_COLUMNS, REGIME_COLUMNS, accuracy_rows, format_rows,
                                             fresh_problems, merged, regime_rows, score_folder)
    from rpm_lib.pretrained.load import load_pretrained
    from rpm_lib.pretrained.registry import model_entry

    entry = model_entry(args.name, args.registry)
    model = load_pretrained(args.name, device=args.device, registry=args.registry)
    folder = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="rpm-pretrained-"))
    progress = sys.stderr.isatty()
    try:
        if args.regimes:
            rows = regime_rows(model, entry, args.regimes, folder, args.num_per_config, args.seed, args.workers,
                               progress)
            print("\n".join(format_rows(rows, REGIME_COLUMNS)))
            return 0
        root = fresh_problems(folder / "I-RAVEN", entry.image_size, args.num_per_config, args.seed,
                              workers=args.workers, progress=progress)
        rows = accuracy_rows(entry, merged(list(score_folder(model, root, progress=progress).values())))
        print(f"{args.name} on {rows[-1]['problems']} fresh I-RAVEN problems (seed {args.seed}; it was trained on "
              f"seed {entry.data['regime'].get('seed')}):")
        print("\n".join(format_rows(rows, ACCURACY_COLUMNS)))
        if not rows[-1].get("as_recorded", True):
            print(f"{PROG}: warning: the accuracy on fresh problems lies outside the range its recorded test "
                  "accuracy predicts", file=sys.stderr)
        return 0
    finally:
        if not args.data:
            shutil.rmtree(folder, ignore_errors=True)


def _add(args) -> int:
    from rpm_lib.atomic_files import write_atomically
    from rpm_lib.pretrained.registry import entry_from_run, read_registry, write_registry

    registry = read_registry(args.registry)
    if args.name in registry and not args.replace:
        raise ValueError(f"a model called {args.name!r} ships already (--replace to replace it)")
    entry = entry_from_run(args.run_dir, args.name, args.command, args.data)
    target = entry.weights_path(args.registry)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = (Path(args.run_dir) / FINAL_WEIGHTS).read_bytes()
    write_atomically(target, lambda handle: handle.write(data), fsync=True)
    registry[args.name] = entry
    write_registry(registry, args.registry)
    print(f"{PROG}: {args.name} added ({entry.bytes / 1e6:.2f} MB, test {100 * entry.test_accuracy:.1f} %); "
          f"commit {args.registry} and {target}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from rpm_lib.pretrained.registry import PretrainedError
    from rpm_lib.training.config import ConfigError
    from rpm_lib.training.final_weights import WeightsError

    from rpm_lib.pretrained.registry import REGISTRY_FILE

    args = _parser().parse_args(argv)
    args.registry = args.registry or REGISTRY_FILE
    try:
        if args.command == "list":
            return _list(args.json, args.registry)
        if args.command == "verify":
            return _verify(args.registry)
        if args.command == "evaluate":
            return _evaluate(args)
        return _add(args)
    except (PretrainedError, WeightsError, ConfigError, ValueError, OSError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
