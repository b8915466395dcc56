"""Portable run state: pack what resuming needs from run folders into one small archive, and unpack it elsewhere.

``rpm-batch pack DIR --out state.tar.gz`` packs every run folder under ``DIR`` (a batch folder, or one run
folder); ``rpm-batch unpack state.tar.gz --out DIR`` restores them, on this machine or another. Resume there
with ``resume=true`` once the data are regenerated (the run refuses data whose fingerprint differs from the one
in its ``progress.json``).

What a run folder contributes (everything else -- executed notebooks, figures, logs -- stays behind):

* always: ``config.yaml``, ``progress.json``, ``history.csv``, ``run.json`` (rpm-batch's record of the run);
* a finished run (``metrics.json``): ``metrics.json`` and ``predictions*.npz``; its final weights only with
  ``keep_final_weights`` (resuming never needs them);
* an unfinished run: each finished stage's chosen weights, and of the stage in progress its ``last.ckpt``
  (weights, optimiser, loop and callback state: the exact resume point) and its ``best.ckpt`` -- the latter two
  reduced to the model weights where that is all the run reads back (``restore_best`` and finished stages only
  read ``state_dict``).

``compact=True`` (``rpm-batch pack --compact``) also stores the Adam moments of ``last.ckpt`` in bfloat16 (PyTorch
casts them back to the parameters' dtype when the optimiser loads them): 12 instead of 16 bytes per parameter
of an unfinished run, at the price of bit-exactness -- for GPU campaigns, whose runs are not bit-exact anyway.
Weights are never rounded.

Unpacking is for files from elsewhere: only regular files with the names above, below a run folder, no
absolute paths, no ``..``, no links, each checked against the SHA-256 in the archive's ``rpm_state.json``;
existing files are never overwritten unless asked. Checkpoints are plain tensors, read with
``torch.load(weights_only=True)`` when resumed, so an archive cannot run code.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from rpm_lib.checkpoints import load_plain
from rpm_lib.json_files import read_object
from rpm_lib.run_progress import FINISHED, UNFINISHED, recorded_weights

#: The archive's own record: format, version, runs, files with their sizes and SHA-256.
MANIFEST = "rpm_state.json"
FORMAT = "rpm_lib-run-state"
VERSION = 1
#: Files of a run folder that always travel (when present).
RUN_FILES: tuple[str, ...] = ("config.yaml", "progress.json", "history.csv", "run.json")
#: Files of a finished run that travel (besides RUN_FILES).
RESULT_FILES: tuple[str, ...] = ("metrics.json",)
RESULT_GLOB = "predictions*.npz"
#: Names a run folder's file may have in an archive (checked on unpack).
_ALLOWED = re.compile(r"(config\.yaml|progress\.json|history\.csv|run\.json|metrics\.json|predictions[A-Za-z0-9_.-]*"
                      r"\.npz|checkpoints/(supervised|pretrain|linear|finetune)/(last|best)\.ckpt)")
#: Largest file accepted on unpack (a checkpoint of the largest encoder with Adam state is ~160 MB).
MAX_FILE_BYTES = 1 << 30


class ArchiveError(ValueError):
    """A run folder cannot be packed, or an archive is malformed or unsafe; the message names the file."""


@dataclasses.dataclass
class PackedRun:
    """One run in an archive: its folder (relative to the packed folder), status and bytes packed."""

    path: str
    status: str
    files: list[str]
    bytes: int


def find_runs(folder: str | Path) -> list[Path]:
    """Run folders at or below ``folder``: folders holding ``config.yaml`` and ``progress.json`` or ``metrics.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArchiveError(f"{folder}: not a folder")
    candidates = [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]
    return [p for p in candidates if (p / "config.yaml").is_file()
            and ((p / "progress.json").is_file() or (p / "metrics.json").is_file())]


def run_status(run_dir: Path) -> str:
    """``finished`` (metrics.json) or ``unfinished`` (to be resumed: stopped by a budget, or killed)."""
    return FINISHED if (run_dir / "metrics.json").is_file() else UNFINISHED


def _read_json(path: Path) -> dict[str, Any]:
    return read_object(path, ArchiveError, missing_ok=True)


def _weights_only(path: Path) -> bytes:
    """The model weights of a Lightning checkpoint, re-saved as ``{"state_dict": ...}`` (plain tensors)."""
    import torch

    buffer = io.BytesIO()
    torch.save({"state_dict": load_plain(path, ArchiveError)["state_dict"]}, buffer)
    return buffer.getvalue()


#: Optimiser-state entries ``compact`` stores in bfloat16 (Adam's first and second moments).
COMPACT_STATE_KEYS: frozenset[str] = frozenset({"exp_avg", "exp_avg_sq"})


def _compact_checkpoint(path: Path) -> bytes:
    """A Lightning checkpoint with its Adam moments in bfloat16 (everything else unchanged)."""
    import torch

    checkpoint = load_plain(path, ArchiveError)
    for optimizer in checkpoint.get("optimizer_states", []):
        for state in optimizer.get("state", {}).values():
            for key in COMPACT_STATE_KEYS & set(state):
                if state[key].is_floating_point():
                    state[key] = state[key].to(torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def _run_members(run_dir: Path, keep_final_weights: bool, compact: bool = False) -> list[tuple[str, bytes]]:
    """(name inside the run folder, content) of what resuming ``run_dir`` needs (see the module docstring)."""
    status = run_status(run_dir)
    members: list[tuple[str, bytes]] = []
    names = list(RUN_FILES)
    if status == FINISHED:
        names += list(RESULT_FILES) + sorted(p.name for p in run_dir.glob(RESULT_GLOB))
    for name in names:
        if (run_dir / name).is_file():
            members.append((name, (run_dir / name).read_bytes()))
    stages = _read_json(run_dir / "progress.json").get("stages", {})
    if status == FINISHED:
        if keep_final_weights and stages:
            final = recorded_weights(run_dir, list(stages.values())[-1].get("weights"))
            if final is not None and final.is_file():
                members.append((final.relative_to(run_dir.resolve()).as_posix(), _weights_only(final)))
        return members
    for name, summary in stages.items():
        if not isinstance(summary, dict):
            raise ArchiveError(f"{run_dir / 'progress.json'}: stage {name!r} is not a mapping")
        if summary.get("completed"):
            weights = recorded_weights(run_dir, summary.get("weights"))
            if weights is None or not weights.is_file():
                raise ArchiveError(f"{run_dir}: finished stage {name} names weights {summary.get('weights')!r}, "
                                   "which are missing or outside the run folder")
            members.append((weights.relative_to(run_dir.resolve()).as_posix(), _weights_only(weights)))
        else:
            stage_dir = run_dir / "checkpoints" / name
            last = stage_dir / "last.ckpt"
            if last.is_file():
                members.append((f"checkpoints/{name}/last.ckpt",
                                _compact_checkpoint(last) if compact else last.read_bytes()))
            if (stage_dir / "best.ckpt").is_file():
                members.append((f"checkpoints/{name}/best.ckpt", _weights_only(stage_dir / "best.ckpt")))
    # A stage that ended at an epoch boundary has no entry yet when the budget stopped the next one from starting.
    return list(dict(members).items())


def pack(folder: str | Path, out: str | Path, keep_final_weights: bool = False,
         compact: bool = False) -> list[PackedRun]:
    """Pack every run folder at or below ``folder`` into the gzip tar ``out`` (written atomically).

    Returns:
        One :class:`PackedRun` per run, in folder order.

    Raises:
        ArchiveError: no run folder found, or a run folder that names missing weights.
    """
    folder, out = Path(folder), Path(out)
    runs = find_runs(folder)
    if not runs:
        raise ArchiveError(f"{folder}: no run folders (a folder with config.yaml and progress.json or metrics.json)")
    packed: list[PackedRun] = []
    files: dict[str, dict[str, Any]] = {}
    contents: list[tuple[str, bytes]] = []
    for run_dir in runs:
        relative = run_dir.relative_to(folder).as_posix()
        members = _run_members(run_dir, keep_final_weights, compact)
        for name, data in members:
            arcname = name if relative == "." else f"{relative}/{name}"
            files[arcname] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            contents.append((arcname, data))
        packed.append(PackedRun(relative, run_status(run_dir), [n for n, _ in members],
                                sum(len(d) for _, d in members)))
    manifest = {"format": FORMAT, "version": VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "compact": compact, "runs": [dataclasses.asdict(p) for p in packed], "files": files}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
        _add(archive, MANIFEST, json.dumps(manifest, indent=1).encode())
        for arcname, data in contents:
            _add(archive, arcname, data)
    partial.replace(out)
    return packed


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same state packs to the same bytes
    archive.addfile(info, io.BytesIO(data))


def _check_name(name: str, source: Path) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or not path.parts:
        raise ArchiveError(f"{source}: unsafe member name {name!r}; refusing to unpack")
    inside_run = "/".join(path.parts[-3:]) if "checkpoints" in path.parts else path.name
    if not _ALLOWED.fullmatch(inside_run):
        raise ArchiveError(f"{source}: member {name!r} is not a run-state file; refusing to unpack")
    return path


def read_manifest(source: str | Path) -> dict[str, Any]:
    """The ``rpm_state.json`` of an archive (checked to be this format)."""
    source = Path(source)
    with _open(source) as archive:
        return _manifest(archive, source)


def _open(source: Path) -> tarfile.TarFile:
    if not source.is_file():
        raise ArchiveError(f"{source}: no such archive")
    try:
        return tarfile.open(source, "r:*")
    except (tarfile.TarError, OSError, EOFError) as error:
        raise ArchiveError(f"{source}: not a readable tar archive ({error})") from None


def _manifest(archive: tarfile.TarFile, source: Path) -> dict[str, Any]:
    try:
        member = archive.getmember(MANIFEST)
        handle = archive.extractfile(member)
        manifest = json.loads(handle.read() if handle is not None else b"")
    except (KeyError, json.JSONDecodeError, UnicodeDecodeError, tarfile.TarError, EOFError) as error:
        raise ArchiveError(f"{source}: no readable {MANIFEST} ({type(error).__name__}); not an rpm-batch pack "
                           "archive") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ArchiveError(f"{source}: {MANIFEST} is not format {FORMAT} version {VERSION}")
    if not isinstance(manifest.get("files"), dict):
        raise ArchiveError(f"{source}: {MANIFEST} has no 'files' mapping")
    return manifest


def unpack(source: str | Path, out: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Restore the run folders of archive ``source`` under ``out``; returns the archive's manifest.

    Raises:
        ArchiveError: unreadable archive, an unsafe or unexpected member, a checksum mismatch, or (without
            ``overwrite``) a file that already exists under ``out``. Nothing is written in any of these cases.
    """
    source, out = Path(source), Path(out)
    with _open(source) as archive:
        manifest = _manifest(archive, source)
        expected = manifest["files"]
        contents: list[tuple[PurePosixPath, bytes]] = []
        seen: set[str] = set()
        for member in archive:
            if member.name == MANIFEST:
                continue
            path = _check_name(member.name, source)
            if not member.isreg():
                raise ArchiveError(f"{source}: member {member.name!r} is not a regular file; refusing to unpack")
            if member.size > MAX_FILE_BYTES:
                raise ArchiveError(f"{source}: member {member.name!r} is {member.size} bytes; refusing to unpack")
            record = expected.get(member.name)
            handle = archive.extractfile(member)
            data = handle.read() if handle is not None else b""
            if not isinstance(record, dict) or record.get("sha256") != hashlib.sha256(data).hexdigest():
                raise ArchiveError(f"{source}: member {member.name!r} does not match its SHA-256 in {MANIFEST} "
                                   "(damaged or altered archive)")
            seen.add(member.name)
            contents.append((path, data))
        missing = sorted(set(expected) - seen)
        if missing:
            raise ArchiveError(f"{source}: {len(missing)} file(s) listed in {MANIFEST} are missing, e.g. {missing[0]}")
    targets = [(out.joinpath(*path.parts), data) for path, data in contents]
    existing = [t for t, _ in targets if t.exists()]
    if existing and not overwrite:
        raise ArchiveError(f"{existing[0]} exists; unpack into an empty folder or pass --overwrite "
                           f"({len(existing)} file(s) would be replaced)")
    for target, data in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_bytes(data)
        partial.replace(target)
    return manifest


def describe(runs: Iterable[PackedRun]) -> list[str]:
    """One line per packed run: folder, status, megabytes."""
    return [f"  {run.path:<60s} {run.status:<10s} {run.bytes / 1e6:7.2f} MB ({len(run.files)} files)" for run in runs]
