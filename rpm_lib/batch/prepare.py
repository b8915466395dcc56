"""A batch's ``prepare`` steps (:func:`run_prepare`): the commands that make the data before any run, each skipped
once the path it ``creates`` exists. They run where ``rpm-batch`` runs, for the local and the SLURM executor alike.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rpm_lib.batch.config import BatchConfig


def resolve_command(command: Sequence[str]) -> list[str]:
    """``python`` -> this interpreter; a console script missing from PATH -> the one beside this interpreter."""
    first, rest = command[0], list(command[1:])
    if first in ("python", "python3"):
        return [sys.executable, *rest]
    beside = Path(sys.executable).parent / first
    if shutil.which(first) is None and beside.is_file():
        return [str(beside), *rest]
    return [first, *rest]


def run_prepare(config: BatchConfig, dry_run: bool, log: Callable[[str], None]) -> None:
    """Run the ``prepare`` steps. Consecutive steps may share one ``creates`` (generate, then cache): each is
    skipped once that path exists, and only the last step naming it must have made it."""
    for number, step in enumerate(config.prepare):
        if step.creates is not None and Path(step.creates).exists():
            log(f"prepare: {step.creates} exists, skipping: {' '.join(step.command)}")
            continue
        log(f"prepare: {' '.join(step.command)}")
        if dry_run:
            continue
        try:
            result = subprocess.run(resolve_command(step.command), check=False)
        except FileNotFoundError as exc:
            raise RuntimeError(f"{config.path}: prepare command not found: {step.command[0]}") from exc
        if result.returncode != 0:
            raise RuntimeError(f"{config.path}: prepare command failed (exit {result.returncode}): "
                               f"{' '.join(step.command)}")
        last_to_create = all(later.creates != step.creates for later in config.prepare[number + 1:])
        if step.creates is not None and last_to_create and not Path(step.creates).exists():
            raise RuntimeError(f"{config.path}: prepare command did not create {step.creates}: "
                               f"{' '.join(step.command)}")
