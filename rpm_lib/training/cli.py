"""``rpm-train``: train one run from a YAML config plus ``key=value`` overrides.

    rpm-train --config configs/iraven.yaml setup=mlcl_aug encoder=scl seed=1 run_dir=runs/scl_mlcl_aug_s1
    rpm-train --config configs/tiny.yaml --print-config        # show the resolved config and exit
    rpm-train --config configs/tiny.yaml test_data_roots=[data/other-regime]   # also test on another folder
    rpm-train --config configs/iraven.yaml time_budget=540 resume=true   # 9 minutes, then exit 75 if unfinished
    torchrun --nproc-per-node 4 -m rpm_lib.training.cli --config configs/iraven.yaml devices=4 strategy=ddp

It runs exactly what ``rpm_lib.training.train(TrainConfig.from_yaml(...))`` runs in a notebook.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence

from rpm_lib.cli_parser import OneLineArgumentParser
from rpm_lib.training.config import ConfigError, TrainConfig, field_help, parse_overrides
from rpm_lib.training.setups import SETUPS


def _fields_epilog() -> str:
    lines = ["config fields (YAML keys / key=value overrides), with defaults:"]
    group = None
    for field_group, name, type_name, default, text in field_help():
        if field_group != group:
            group = field_group
            lines.append(f"\n  [{group}]")
        lines.append(f"  {name} = {default}   ({type_name})")
        lines.extend(textwrap.wrap(text, width=96, initial_indent="      ", subsequent_indent="      "))
    lines.append("\nValues are parsed as YAML: lr=1e-3, configurations=[Center,L-R], encoder_kwargs={backbone: cnn4}, "
                 "max_train_samples=null.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="rpm-train",
        description=f"Train an RPM model with one of the MLCL paper's setups ({', '.join(SETUPS)}) and evaluate it; "
                    "writes config.yaml, checkpoints/, history.csv, "
                    "metrics.json and predictions.npz into run_dir. Exit status: 0 finished, 2 bad config or "
                    "data, 1 diverged, 75 unfinished (time_budget reached, or Ctrl-C / SIGTERM: the run stops at its next "
                    "step; resume=true continues), 130 stopped at once by a second Ctrl-C.",
        epilog=_fields_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", "-c", metavar="YAML", help="YAML file of config fields (defaults otherwise)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, applied after --config")
    return parser


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    overrides = list(args.overrides)
    if args.config:
        return TrainConfig.from_yaml(args.config, overrides)
    return TrainConfig.from_dict(parse_overrides(overrides), source="overrides")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rpm-train``; returns the exit code (2 for a config error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is not None and not args.config.strip():
        # an empty --config (an unset shell variable) was taken as "no config": the defaults ran without a word
        parser.error("argument --config/-c: empty file name (name a YAML file, or leave --config out for the defaults)")
    try:
        config = resolve_config(args)
    except ConfigError as error:
        print(f"rpm-train: error: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(), end="")
        return 0
    from rpm_lib.training.run import train

    from rpm_lib.training.callbacks import NonFiniteLossError

    from rpm_lib.data import DataFormatError

    from rpm_lib.training.stop_signals import Interrupted

    try:
        metrics = train(config, stop_on_terminal_signals=True)
    except (ConfigError, DataFormatError) as error:
        print(f"rpm-train: error: {error}", file=sys.stderr)
        return 2
    except Interrupted as error:
        print(f"{error}; resume=true continues from the last epoch's checkpoint in {config.run_dir}", file=sys.stderr)
        return 130  # the shell's status for a process ended by SIGINT
    except NonFiniteLossError as error:
        print(f"rpm-train: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # a full disk or quota, a folder made unwritable mid-run: what and where, no traceback
        print(f"rpm-train: error: {_what_failed(error)}; the checkpoints written so far stay in {config.run_dir}: "
              "rerun with resume=true once that is fixed", file=sys.stderr)
        return 1
    if metrics.get("status") == "unfinished":
        from rpm_lib.run_folder import UNFINISHED_EXIT_CODE

        from rpm_lib.training.time_budget import describe_unfinished

        print(f"rpm-train: unfinished: {describe_unfinished(metrics, config.time_budget, config.run_dir)}; continue "
              f"with resume=true (state in {config.run_dir})", file=sys.stderr)
        return UNFINISHED_EXIT_CODE
    if "test_accuracy" in metrics:
        summary = {k: metrics[k] for k in ("setup", "encoder", "test_accuracy", "test_accuracy_per_configuration_short",
                                           "test_accuracy_per_regime") if k in metrics}
        print(json.dumps(summary, indent=2))
        for entry in metrics.get("test_sets", []):
            print(f"  {entry['name']:>12s} ({entry['split']}, {entry['regime'] or 'no regime.json'}): "
                  f"{100 * entry['accuracy']:.1f}% on {entry['num_samples']} problems, {entry['distribution']}")
        print(f"rpm-train: results in {config.run_dir}/metrics.json")
    return 0


def _what_failed(error: OSError) -> str:
    """``<file>: <reason>`` of an ``OSError`` (its own message when it names no file, e.g. a space check's)."""
    if error.filename and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
