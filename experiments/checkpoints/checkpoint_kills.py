"""How often a SIGKILL during a checkpoint save leaves a damaged file: Lightning's writer against rpm_lib's.

A child process saves 24 MB checkpoints in a loop; after its first save it is killed at a growing delay and the
target is loaded and checked. With the system temporary folder on another filesystem than the target (the default
here: ``TMPDIR=/dev/shm``, a tmpfs), Lightning's move of its temporary file is a copy into the target.

    .venv/bin/python experiments/checkpoints/checkpoint_kills.py            # 20 kills for each writer
    .venv/bin/python experiments/checkpoints/checkpoint_kills.py --kills 5 --tmpdir /tmp
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WRITERS = {
    "lightning": "from lightning.fabric.plugins import TorchCheckpointIO as Writer",
    "rpm_lib": "from rpm_lib.training.checkpoint_io import SameFolderCheckpointIO as Writer",
}
VALUES = 6_000_000  # float32: a 24 MB checkpoint, a small model's weights and Adam moments

_LOOP = """
import sys, torch
{import_line}
target, ready = sys.argv[1], sys.argv[2]
writer, round = Writer(), 0
while True:
    round += 1
    writer.save_checkpoint({{"round": round, "weights": torch.full(({values},), float(round))}}, target)
    if round == 1:
        open(ready, "w").close()
"""


def _whole(target: Path) -> bool:
    try:
        checkpoint = torch.load(target, weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable file counts as damaged
        return False
    return bool(torch.equal(checkpoint["weights"], torch.full((VALUES,), float(checkpoint["round"]))))


def damaged_count(writer: str, kills: int, tmpdir: str, work: Path) -> int:
    """How many of ``kills`` SIGKILLs of ``writer``'s save loop left an unloadable or inconsistent file."""
    code = _LOOP.format(import_line=WRITERS[writer], values=VALUES)
    damaged = 0
    for kill in range(kills):
        folder = work / f"{writer}-{kill}"
        folder.mkdir()
        target, ready = folder / "last.ckpt", folder / "ready"
        child = subprocess.Popen([sys.executable, "-c", code, str(target), str(ready)],
                                 env={**os.environ, "TMPDIR": tmpdir})
        while not ready.exists():
            if child.poll() is not None:
                raise SystemExit(f"the {writer} writer ended before its first save (exit {child.returncode})")
            time.sleep(0.01)
        time.sleep(0.05 + 0.037 * kill)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        damaged += not _whole(target)
        shutil.rmtree(folder)
    return damaged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="kills per writer (default 20)")
    parser.add_argument("--tmpdir", default="/dev/shm",
                        help="the children's TMPDIR, where Lightning writes its temporary file (default /dev/shm)")
    args = parser.parse_args(argv)
    if not Path(args.tmpdir).is_dir():
        parser.error(f"--tmpdir {args.tmpdir}: not a folder")
    before = set(Path(args.tmpdir).iterdir())
    with tempfile.TemporaryDirectory() as work:
        for writer in WRITERS:
            print(f"{writer:>9}: {damaged_count(writer, args.kills, args.tmpdir, Path(work))} of {args.kills} "
                  f"kills left a damaged last.ckpt (TMPDIR={args.tmpdir})", flush=True)
    # a killed Lightning writer leaves its temporary file behind; do not leave them in the user's TMPDIR
    for left in set(Path(args.tmpdir).iterdir()) - before:
        if left.is_file() and left.name.startswith("tmp"):
            left.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
