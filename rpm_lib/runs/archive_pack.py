"""``rpm-batch pack``: what resuming needs from run folders, packed into one small archive.

Which run folders travel (those with something to resume, :func:`has_run_state`, or the chosen ones among
them), which of their files (see
``rpm_lib.runs.archive``), checkpoints reduced to what resuming reads back, and the archive written atomically.
The archive's format is ``rpm_lib.runs.archive_manifest``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from rpm_lib.checkpoints import load_plain
from rpm_lib.json_files import read_object
from rpm_lib.run_folder import (CHECKPOINTS, CONFIG, FINISHED, HISTORY, METRICS, PROGRESS, UNFINISHED, RunFolders,
                                RunStatus, find_run_folders, is_finished, recorded_weights, weights_record)
from rpm_lib.runs.archive_manifest import (CHECKPOINT_NAMES, FORMAT, MANIFEST, RESULT_FILES, RESULT_GLOB, RUN_FILES,
                                           VERSION, ArchiveError, read_manifest)
from rpm_lib.training.setups import STAGES

#: Optimiser-state entries ``compact`` stores in bfloat16 (Adam's first and second moments).
COMPACT_STATE_KEYS: frozenset[str] = frozenset({"exp_avg", "exp_avg_sq"})


@dataclasses.dataclass
class PackedRun:
    """One run in an archive: its folder (relative to the packed folder), status and bytes packed."""

    path: str
    status: RunStatus
    files: list[str]
    bytes: int


def has_run_state(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run with something to resume or keep: ``config.yaml`` and a record of progress
    (``progress.json``, ``metrics.json``, ``history.csv`` or a stage's ``last.ckpt``). A run folder with only its
    ``config.yaml`` has not started: there is nothing to pack."""
    return (run_dir / CONFIG).is_file() and (
        any((run_dir / name).is_file() for name in (PROGRESS, METRICS, HISTORY))
        or any((run_dir / CHECKPOINTS / stage / "last.ckpt").is_file() for stage in STAGES))


def find_runs(folder: str | Path) -> list[Path]:
    """The run folders at or below ``folder`` (``rpm_lib.run_folder.find_run_folders``) that :func:`has_run_state`.

    Raises:
        ArchiveError: ``folder`` is not a folder.
    """
    return [run for run in _found(Path(folder)).runs if has_run_state(run)]


def _found(folder: Path) -> RunFolders:
    try:
        return find_run_folders(folder)
    except FileNotFoundError:
        raise ArchiveError(f"{folder}: not a folder") from None


def run_status(run_dir: Path) -> RunStatus:
    """``finished`` (metrics.json) or ``unfinished`` (to be resumed: stopped by a budget, or killed)."""
    return FINISHED if is_finished(run_dir) else UNFINISHED


def _read_json(path: Path) -> dict[str, Any]:
    return read_object(path, ArchiveError, missing_ok=True)


def _weights_only(path: Path) -> bytes:
    """The model weights of a Lightning checkpoint, re-saved as ``{"state_dict": ...}`` (plain tensors)."""
    import torch

    buffer = io.BytesIO()
    torch.save({"state_dict": load_plain(path, ArchiveError)["state_dict"]}, buffer)
    return buffer.getvalue()


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


def _link_refused(place: Path) -> ArchiveError:
    return ArchiveError(f"{place}: a symbolic link; pack copies only files that lie inside the packed folder "
                        "(replace the link by a copy of its target, or pack the target's folder)")


def _refuse_links(top: Path, path: Path) -> None:
    """Refuse ``path`` when it, or a folder between ``top`` and it, is a symbolic link.

    An archive is made to be shared: a link in a run folder (``history.csv -> ~/.netrc``, a run folder linked in
    from elsewhere) put the bytes of a file outside the packed folder into it.

    Raises:
        ArchiveError: naming the link.
    """
    for place in [path, *path.parents]:
        if place == top or top not in place.parents:
            return
        if place.is_symlink():
            raise _link_refused(place)


def _run_members(run_dir: Path, keep_final_weights: bool, compact: bool = False) -> list[tuple[str, bytes]]:
    """(name inside the run folder, content) of what resuming ``run_dir`` needs (see ``rpm_lib.runs.archive``)."""
    status = run_status(run_dir)
    members: list[tuple[str, bytes]] = []
    names = list(RUN_FILES)
    if status == FINISHED:
        names += list(RESULT_FILES) + sorted(p.name for p in run_dir.glob(RESULT_GLOB))
    for name in [*names, *(f"{CHECKPOINTS}/{stage}/{ckpt}" for stage in STAGES for ckpt in CHECKPOINT_NAMES)]:
        _refuse_links(run_dir, run_dir / name)
    for name in names:
        if (run_dir / name).is_file():
            members.append((name, (run_dir / name).read_bytes()))
    stages = _read_json(run_dir / PROGRESS).get("stages", {})
    if not isinstance(stages, dict):
        raise ArchiveError(f"{run_dir / PROGRESS}: field 'stages' is not a mapping")
    if status == FINISHED:
        if keep_final_weights and stages:
            final = recorded_weights(run_dir, list(stages.values())[-1].get("weights"))
            if final is not None and final.is_file():
                members.append((weights_record(run_dir, final), _weights_only(final)))
        return members
    completed = set()
    for name, summary in stages.items():
        if not isinstance(summary, dict):
            raise ArchiveError(f"{run_dir / PROGRESS}: stage {name!r} is not a mapping")
        if not summary.get("completed"):
            continue
        completed.add(name)
        if summary.get("skipped"):
            continue  # the epochs of the stages before it left it none: it trained nothing
        weights = recorded_weights(run_dir, summary.get("weights"))
        if weights is None or not weights.is_file():
            raise ArchiveError(f"{run_dir}: finished stage {name} names weights {summary.get('weights')!r}, "
                               "which are missing or outside the run folder")
        members.append((weights_record(run_dir, weights), _weights_only(weights)))
    # The stage in progress: the one progress.json marks unfinished (a time budget stopped it) or, in a killed run,
    # one it has no entry for yet (stages enter progress.json when they end): its checkpoints are the resume point.
    for name in STAGES:
        stage_dir = run_dir / CHECKPOINTS / name
        if name in completed:
            continue
        last = stage_dir / "last.ckpt"
        if last.is_file():
            members.append((f"{CHECKPOINTS}/{name}/last.ckpt",
                            _compact_checkpoint(last) if compact else last.read_bytes()))
        if (stage_dir / "best.ckpt").is_file():
            members.append((f"{CHECKPOINTS}/{name}/best.ckpt", _weights_only(stage_dir / "best.ckpt")))
    # A finished stage whose recorded weights are its last.ckpt is packed once.
    return list(dict(members).items())


def pack(folder: str | Path, out: str | Path, keep_final_weights: bool = False,
         compact: bool = False, runs: Iterable[str] | None = None) -> list[PackedRun]:
    """Pack every run folder at or below ``folder`` (or the ``runs`` among them) into the gzip tar ``out``
    (written atomically).

    ``out`` may replace an archive written here (the normal workflow: a campaign re-packs its state every slice),
    never another file or a folder. ``runs``: the run folders to pack, as paths relative to ``folder``
    (``main/setup-ce__seed-0``; ``.`` for ``folder`` itself), e.g. one run per archive, so that an archive
    changes only when its run does; its members keep the same paths as in an archive of the whole folder.

    Returns:
        One :class:`PackedRun` per run, in folder order.

    Raises:
        ArchiveError: no run folder found, one of ``runs`` that is not a run folder of ``folder`` with something to
            pack, a run folder that names missing weights or is (or holds) a symbolic link, a folder below
            ``folder`` that cannot be listed, or an ``out`` that is a folder, another file, or cannot be written.
            Nothing is left behind at ``out`` then.
    """
    folder, out = Path(folder), Path(out)
    _check_pack_out(out)
    runs = _runs_to_pack(folder) if runs is None else _chosen_runs(folder, runs)
    packed: list[PackedRun] = []
    files: dict[str, dict[str, Any]] = {}
    contents: list[tuple[str, bytes]] = []
    for run_dir in runs:
        _refuse_links(folder, run_dir)
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
    partial = out.with_name(f".{out.name}.partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
            _add(archive, MANIFEST, json.dumps(manifest, indent=1).encode())
            for arcname, data in contents:
                _add(archive, arcname, data)
        partial.replace(out)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise ArchiveError(f"{out}: cannot write the archive ({error.strerror or error})") from None
    return packed


def _runs_to_pack(folder: Path) -> list[Path]:
    """The run folders of ``folder`` to pack (:func:`find_runs`); refuses a linked run folder (links are never
    followed, and an archive must not carry what lies outside ``folder``) and a folder that cannot be listed (a run
    below it would be left out without a word)."""
    found = _found(folder)
    runs = [run for run in found.runs if has_run_state(run)]
    links = [link for link in found.links if has_run_state(link)]
    if links:
        raise _link_refused(links[0])
    if found.unlisted:
        unlisted, why = next(iter(sorted(found.unlisted.items())))
        raise ArchiveError(f"{unlisted}: cannot be listed ({why}); a run folder below it would be left out")
    if not runs:
        raise ArchiveError(f"{folder}: no run folders (a folder with config.yaml and progress.json, metrics.json, "
                           "history.csv or checkpoints/<stage>/last.ckpt)")
    return runs


def _chosen_runs(folder: Path, chosen: Iterable[str]) -> list[Path]:
    """The run folders ``chosen`` (paths relative to ``folder``) among :func:`_runs_to_pack`'s, in folder order.

    Raises:
        ArchiveError: none chosen, or one that is not a run folder of ``folder`` with something to pack (named,
            with the runs there).
    """
    wanted = [PurePosixPath(name).as_posix() for name in chosen]
    if not wanted:
        raise ArchiveError(f"{folder}: no run chosen to pack")
    runs = {run.relative_to(folder).as_posix(): run for run in _runs_to_pack(folder)}
    unknown = [name for name in wanted if name not in runs]
    if unknown:
        names = sorted(runs)
        there = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
        raise ArchiveError(f"{folder}: no run folder {unknown[0]!r} to pack (the runs there: {there})")
    return [run for name, run in runs.items() if name in wanted]


def _check_pack_out(out: Path) -> None:
    """Refuse an ``out`` that is a folder, or a file other than an archive written here (checked before packing)."""
    if out.is_dir():
        raise ArchiveError(f"{out}: is a folder; --out names the archive file to write (e.g. {out / 'state.tar.gz'})")
    if out.exists() or out.is_symlink():
        try:
            read_manifest(out)
        except ArchiveError:
            raise ArchiveError(f"{out}: exists and is not an archive written by rpm-batch pack; refusing to replace "
                               "it (remove it or choose another --out)") from None


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0  # the same state packs to the same bytes
    archive.addfile(info, io.BytesIO(data))


def describe(runs: Iterable[PackedRun]) -> list[str]:
    """One line per packed run: folder, status, megabytes."""
    return [f"  {run.path:<60s} {run.status:<10s} {run.bytes / 1e6:7.2f} MB ({len(run.files)} files)" for run in runs]
