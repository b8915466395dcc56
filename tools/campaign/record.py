"""Record one Table 1 campaign slice here, after `bash tools/campaign/gpu_slice.sh` ran on a GPU machine.

    python tools/campaign/record.py FOLDER          # a copy of the slice's CAMPAIGN_OUT folder
    python tools/campaign/record.py FOLDER FOLDER2  # two slices (e.g. a second on the same machine), any order

The campaign's state (what the next slice resumes) lies in ``results/table1_scl_gpu`` as one archive per run,
``state/<grid>__<run>.tar.gz`` (``rpm-batch pack --run``), over a base layer, ``state.tar.gz``: one archive of every
run, as slices 1-6 committed it. A run's own archive replaces its copy in the base (:func:`committed_state`); the
base goes once every run in it has its own. Every commit of the state then adds only the archives of the runs that
changed: a slice that trained one run adds that run's archive (7.5-9.7 MB for an unfinished SCL run, well under
1 MB for a finished one without its weights), where one archive of every run added all of them (27.7 MB) each time.

* the slice's reports come from ``FOLDER/slice.tar.gz`` (``progress.md``, ``progress.json``, ``table1.md``,
  ``slice.json``, ``gpu_util.csv``; slices 1-3 returned them as loose files, which are read the same way);
* the slice's state comes as one archive per run in ``FOLDER/state/`` (or as one archive of several runs,
  ``FOLDER/state.tar.gz``, as slices 1-6 returned it); every one is checked (each file's SHA-256) before anything
  is stored. A run's archive is stored in ``results/table1_scl_gpu/state/`` when its files differ from the
  committed ones (the SHA-256 of each, from the archives' manifests: packing the same tensors again gives the
  same bytes, while the archives' own bytes differ by their packing time) or when the run has finished and only
  the base held it; the others stay as committed. A run the slice did not return keeps its committed archive.
  The base goes once every run in it has its own archive, or earlier, its last runs stored as their own archives
  too, where the next slice could not carry it beside the runs' newer archives (:func:`_base_runs_to_move`);
* the slice (date, card, seconds, exit status, the state's size and the bytes its archives added, mean GPU
  utilisation, the seconds the GPU sat idle before training began, each run's standing) is appended to
  ``results/table1_scl_gpu/slices.jsonl``; over :data:`ADDED_LIMIT` bytes added, a warning says so;
* ``results/table1_scl_gpu/progress.md`` and ``table1.md`` are replaced by the slice's;
* in ``docs/reproduction-gpu.md``, the per-slice table (between its ``slices`` markers) is rewritten from
  ``slices.jsonl``; each run's standing (between the ``standing`` markers: stage, epochs, lowest validation loss,
  the epochs early stopping can still give the stage) from the unpacked state; and, once runs have finished, the
  Table 1 section (between the ``table1`` markers) from the state with ``rpm_lib.results.claims`` verdicts;
* ``results/table1_scl_gpu/progress.png`` is drawn from the state: each run's validation accuracy over its epochs,
  the paper's Table 1 average dashed.

Several folders are recorded in the order the slices began (``started`` in ``slice.json``), whatever the order they
are named in; the first one refused stops the rest. Nothing is recorded from a slice that is recorded already (the
same ``started``) or whose state would lose work the committed one holds (a run missing, or with fewer steps or
epochs: an older slice's files; ``--accept-behind`` records it anyway, with a warning, for a run restarted on
purpose).

It ends with a line on what the next slice copies to the GPU machine (the state, the wheels, the rest of the
repository; at most 64 MiB), a warning when that comes within 4 MiB of the limit. Then commit ``results/`` and
``docs/`` (``git add -A results/table1_scl_gpu``: the base's removal too). ``--check`` only re-renders the document
and the figure from what is committed.

On the GPU machine, ``gpu_slice.sh`` restores and packs the state with this layout (``--restore RUNS`` and
``--pack RUNS``, with ``--results`` naming the folder that holds the state).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import re
import shutil
import statistics
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from rpm_lib.cli_parser import OneLineArgumentParser

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "table1_scl_gpu"
DOC = REPO / "docs" / "reproduction-gpu.md"
SLICES = RESULTS / "slices.jsonl"
#: The figure drawn into ``RESULTS`` (see ``render``).
FIGURE_NAME = "progress.png"
#: The state's base layer in ``RESULTS``: one archive of every run (see the module docstring).
BASE_NAME = "state.tar.gz"
#: The folder of the per-run archives, in ``RESULTS`` and in a slice's returned folder.
STATE_FOLDER = "state"
#: What one slice's state may add to the repository, bytes: over it, recording warns (runs trained at once each
#: add their archive; see CAMPAIGN_JOBS in gpu_slice.sh).
ADDED_LIMIT = 15_000_000


def run_archive_name(run: str) -> str:
    """The file name of run ``run``'s own archive (its path in the batch folder, ``main/setup-ce__seed-0``):
    ``main__setup-ce__seed-0.tar.gz``."""
    return f"{run.replace('/', '__') if run != '.' else 'run'}.tar.gz"


class StateRun(NamedTuple):
    """One run of a state: the archive it is restored from, its status, and its files (name inside the run folder
    -> SHA-256, from that archive's manifest). (A named tuple: tests load this script without registering it as a
    module, which a dataclass needs.)"""

    archive: Path
    status: str
    files: dict[str, str]


def _run_files(manifest: dict, run: str, source: Path) -> dict[str, str]:
    """Name inside run folder ``run`` -> SHA-256, of that run's files in an archive's ``manifest``."""
    from rpm_lib.runs.archive_manifest import split_name

    files = {}
    for name, record in manifest["files"].items():
        folder, inside = split_name(name, source)
        if folder == run:
            files[inside] = record["sha256"]
    return files


def _archive_runs(archive: Path) -> dict[str, StateRun]:
    """Each run of ``archive`` (checked manifest; ``ArchiveError`` when it is not an rpm-batch pack archive)."""
    from rpm_lib.runs import archive as run_archive

    manifest = run_archive.read_manifest(archive)
    return {entry["path"]: StateRun(archive, str(entry.get("status")), _run_files(manifest, entry["path"], archive))
            for entry in manifest["runs"]}


def state_archives(results: Path) -> list[Path]:
    """The archives of the state in ``results``: the base (where it still is), then the per-run ones."""
    base = results / BASE_NAME
    return ([base] if base.is_file() else []) + sorted((results / STATE_FOLDER).glob("*.tar.gz"))


def committed_state(results: Path) -> dict[str, StateRun]:
    """Every run of the state in ``results`` and where it comes from: its own archive in ``state/``, else the base.

    The one reading of the layout: restoring (:func:`restore_state`), rendering and recording all go through it.

    Raises:
        ArchiveError: an archive that is not an rpm-batch pack archive, or two per-run archives of one run.
    """
    from rpm_lib.runs import archive as run_archive

    base = results / BASE_NAME
    runs: dict[str, StateRun] = {}
    for archive in state_archives(results):  # the base first
        for run, held in _archive_runs(archive).items():
            if run in runs and runs[run].archive != base:
                raise run_archive.ArchiveError(f"{archive}: holds run {run}, as {runs[run].archive} does; one "
                                               "archive per run")
            else:
                runs[run] = held
    return runs


def restore_state(results: Path, into: Path, keep_further: bool = False,
                  warn: Callable[[str], None] | None = None) -> dict[str, StateRun]:
    """Unpack the state in ``results`` into ``into``, each run from the one archive :func:`committed_state` names
    (``rpm_lib.runs.archive.unpack`` with ``overwrite``, ``keep_further`` and ``warn``); returns
    :func:`committed_state`.

    Raises:
        ArchiveError: see :func:`committed_state` and ``unpack``.
    """
    from rpm_lib.runs import archive as run_archive

    runs = committed_state(results)
    by_archive: dict[Path, list[str]] = {}
    for run, held in runs.items():
        by_archive.setdefault(held.archive, []).append(run)
    for archive in state_archives(results):  # the base first: a run's own archive is newer
        if archive in by_archive:
            run_archive.unpack(archive, into, overwrite=True, keep_further=keep_further, warn=warn,
                               runs=by_archive[archive])
    return runs


def state_bytes(results: Path) -> int:
    """The bytes of the state in ``results``: what the next slice copies to the GPU machine."""
    return sum(archive.stat().st_size for archive in state_archives(results))


def gpu_utilisation(path: Path) -> float | None:
    """Mean GPU utilisation (percent) over the samples of an ``nvidia-smi --query-gpu=timestamp,utilization.gpu,...``
    CSV, leaving out the first and last minute (data generation before training, packing after)."""
    if not path.is_file():
        return None
    values = [percent for _when, percent in _samples(path)]
    inner = values[12:-12] if len(values) > 30 else values
    return round(statistics.fmean(inner), 1) if inner else None


def _samples(path: Path) -> list[tuple[datetime.datetime, float]]:
    """(time, utilisation %) of each sample of an ``nvidia-smi --query-gpu=timestamp,utilization.gpu,...`` CSV."""
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].endswith("%"):
            try:
                when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
            except ValueError:
                continue
            samples.append((when, float(parts[1].rstrip(" %"))))
    return samples


def idle_before_training(path: Path) -> float | None:
    """Seconds from the slice's first ``nvidia-smi`` sample to the first with the GPU busy (> 0 %): the time the
    data generation, unpacking and the runs' start-up leave the GPU with nothing to do (to 5 s, the sampling
    period). None without samples or without a busy one."""
    samples = _samples(path) if path.is_file() else []
    busy = [when for when, percent in samples if percent > 0]
    return round((busy[0] - samples[0][0]).total_seconds(), 1) if busy else None


#: Largest report file read from ``slice.tar.gz`` (the GPU samples of a 10-minute slice are ~10 kB).
REPORT_BYTES = 16 * 2**20
#: The slice's reports (in ``slice.tar.gz``, or loose beside the state as slices 1-3 returned them).
REPORTS = ("slice.json", "progress.json", "progress.md", "table1.md", "gpu_util.csv")


def slice_reports(returned: Path, into: Path) -> Path:
    """The folder holding the slice's reports: ``into`` with the known members of ``returned/slice.tar.gz`` copied
    out by name (nothing else of the archive is written anywhere), or ``returned`` itself without the archive."""
    import tarfile

    archive = returned / "slice.tar.gz"
    if not archive.is_file():
        return returned
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and name in REPORTS and Path(member.name).parent in (Path("."), Path("")):
                    if member.size > REPORT_BYTES:
                        raise SystemExit(f"campaign_record: error: {archive}: {member.name} is {member.size} bytes, "
                                         f"more than a report's {REPORT_BYTES}; nothing recorded")
                    (into / name).write_bytes(tar.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise SystemExit(f"campaign_record: error: {archive}: not a readable tar archive ({reason}); "
                         "nothing recorded") from None
    return into


def record(returned: Path, accept_behind: bool = False) -> dict:
    """Store the slice found in ``returned`` (see the module docstring); returns its slices.jsonl entry.
    ``accept_behind``: record a state that holds less of some run than the committed one (a run restarted on
    purpose), with a warning line naming them, instead of refusing it."""
    with tempfile.TemporaryDirectory() as folder:
        return _record(returned, slice_reports(returned, Path(folder)), accept_behind)


def _report(path: Path, kind: type, returned: Path) -> object:
    """The JSON ``kind`` (dict or list) in the slice's report ``path``; a damaged one ends the script in one line
    naming it as the slice returned it (in ``returned``, loose or inside ``slice.tar.gz``)."""
    shown = returned / path.name if (returned / path.name).is_file() else returned / "slice.tar.gz" / path.name
    try:
        value = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SystemExit(f"campaign_record: error: {shown}: not JSON ({error}); nothing recorded") from None
    if not isinstance(value, kind):
        raise SystemExit(f"campaign_record: error: {shown}: expected a JSON {kind.__name__}; nothing recorded")
    return value


#: What a slice's ``slice.json`` must hold for its row.
SLICE_FIELDS = ("date", "device", "seconds", "exit_status")


def _runs_behind(results: Path, new_state: Path, scratch: Path) -> list[str]:
    """The runs of the committed state in ``results`` that the unpacked ``new_state`` folder lacks or holds less of
    (fewer steps or epochs, or unfinished where they had finished), each as one phrase."""
    from rpm_lib.runs import archive as run_archive

    try:
        runs = restore_state(results, scratch)
    except run_archive.ArchiveError:
        return []  # a damaged committed state holds nothing a new one could lose
    behind = []
    for name in sorted(runs):
        was, now = run_archive.run_reach(scratch / name), run_archive.run_reach(new_state / name)
        if not (new_state / name).is_dir():
            behind.append(f"{name} is missing")
        elif was.beyond(now):
            behind.append(f"{name}: {now} against {was}")
    return behind


def _returned_state(archives: list[Path]) -> dict[str, StateRun]:
    """Each run of the state a slice returned in ``archives`` and the archive holding it; ends the script in one
    line when an archive is not one of rpm-batch pack, or two hold the same run."""
    from rpm_lib.runs import archive as run_archive

    runs: dict[str, StateRun] = {}
    for archive in archives:
        try:
            held = _archive_runs(archive)
        except run_archive.ArchiveError as error:
            raise SystemExit(f"campaign_record: error: {' '.join(str(error).split())}; nothing recorded") from None
        for run, state in held.items():
            if run in runs:
                raise SystemExit(f"campaign_record: error: {archive} and {runs[run].archive} both hold run {run}; "
                                 "nothing recorded")
            runs[run] = state
    return runs


def _to_store(returned: dict[str, StateRun], committed: dict[str, StateRun], results: Path) -> list[str]:
    """The returned runs whose own archive is to be stored: those whose files differ from the committed ones (or
    that are new), and finished ones that only the base holds (a finished run's archive is small, and the base goes
    once every run in it has its own)."""
    base = results / BASE_NAME
    return [run for run, new in sorted(returned.items())
            if run not in committed or committed[run].files != new.files
            or (new.status == "finished" and committed[run].archive == base)]


def _store(run: str, held: StateRun, unpacked: Path, results: Path) -> Path:
    """Write run ``run``'s own archive into ``results/state/`` (atomically): the returned archive itself where it
    holds this run alone, else packed again from its ``unpacked`` (checked) files."""
    from rpm_lib.runs import archive as run_archive

    target = results / STATE_FOLDER / run_archive_name(run)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    if len(_archive_runs(held.archive)) == 1:
        shutil.copyfile(held.archive, partial)
    else:
        compact = bool(run_archive.read_manifest(held.archive).get("compact"))
        run_archive.pack(unpacked, partial, compact=compact, runs=[run])
    partial.replace(target)
    return target


def _base_runs_to_move(results: Path) -> list[str]:
    """The runs that only the base still holds, where the next slice would carry more than :data:`CARRY_LIMIT` with
    the base beside the runs' own archives (see :func:`carry_note`); none otherwise.

    The base goes once every run in it has its own archive; until then it is carried whole, beside the newer
    archives of its other runs. One run at a time, the last run in it (MLCL+AUG) gets its own only after the one
    before (MLCL) has trained for slices, and base (27.7 MB), MLCL's own (9.7 MB) and the finished runs' would no
    longer fit beside the wheels: then storing that run's unchanged archive too (one commit over
    :data:`ADDED_LIMIT`) keeps the campaign going.
    """
    from rpm_lib.runs import archive as run_archive

    base = results / BASE_NAME
    try:
        left = [run for run, held in sorted(committed_state(results).items()) if held.archive == base]
    except run_archive.ArchiveError:
        return []  # a damaged archive: rendering names it
    if not left or state_bytes(results) + sum(_carried_besides_state()) <= CARRY_LIMIT:
        return []
    return left


def _drop_superseded_base(results: Path) -> bool:
    """Remove the base once every run in it has its own archive (it then restores nothing); whether it went."""
    from rpm_lib.runs import archive as run_archive

    base = results / BASE_NAME
    try:
        if not base.is_file() or any(held.archive == base for held in committed_state(results).values()):
            return False
    except run_archive.ArchiveError:
        return False  # a damaged archive: nothing is removed without a word (rendering names it)
    base.unlink()
    return True


def _record(returned: Path, reports: Path, accept_behind: bool = False) -> dict:
    if not returned.is_dir():
        raise SystemExit(f"campaign_record: error: {returned} is not a folder (a copy of the slice's CAMPAIGN_OUT)")
    # its state: one archive per run in state/, or (slices 1-6) one archive of every run beside the reports
    archives = state_archives(returned)
    if not archives:
        raise SystemExit(f"campaign_record: error: {returned / STATE_FOLDER} holds no run archive (did the slice "
                         "run?); nothing recorded")
    for name in ("slice.json", "progress.json"):
        if not (reports / name).is_file():
            raise SystemExit(f"campaign_record: error: {name} is missing from {returned / 'slice.tar.gz'} and "
                             f"{returned} (did the slice finish?)")
    info = _report(reports / "slice.json", dict, returned)
    missing = [field for field in SLICE_FIELDS if field not in info]
    if missing:
        raise SystemExit(f"campaign_record: error: slice.json lacks {', '.join(missing)}; nothing recorded")
    runs = _report(reports / "progress.json", list, returned)
    previous = _slice_entries()
    again = next((e for e in previous if info.get("started") is not None and e.get("started") == info["started"]), None)
    if again is not None:
        raise SystemExit(f"campaign_record: error: {returned} holds the slice that began at {info['started']} "
                         f"({info['date']}, {info['device']}), already recorded as slice {again['slice']}; "
                         "nothing recorded")
    new = _returned_state(archives)
    from rpm_lib.runs import archive as run_archive

    with tempfile.TemporaryDirectory() as folder:
        # The committed state is the campaign's only copy of its finished epochs: replace a run's archive only with
        # one that unpacks (every file checked against its SHA-256).
        check = Path(folder) / "check"
        for archive in sorted({held.archive for held in new.values()}):
            try:
                run_archive.unpack(archive, check)
            except run_archive.ArchiveError as error:
                raise SystemExit(f"campaign_record: error: {' '.join(str(error).split())}; nothing recorded") from None
        behind = _runs_behind(RESULTS, check, Path(folder) / "committed")
        if behind and not accept_behind:
            raise SystemExit(f"campaign_record: error: {returned}'s state would lose work that the committed state "
                             f"holds ({'; '.join(behind)}): an older slice's files? (a run restarted on purpose: "
                             "--accept-behind); nothing recorded")
        if behind:
            print(f"campaign_record: warning: recorded although it holds less than the committed state: "
                  f"{'; '.join(behind)}", file=sys.stderr)
        try:
            committed = committed_state(RESULTS)
        except run_archive.ArchiveError:
            committed = {}  # damaged: every returned run is stored, and replaces it
        stored = [_store(run, new[run], check, RESULTS) for run in _to_store(new, committed, RESULTS)]
        moved = [run for run in _base_runs_to_move(RESULTS) if run in new]
        if moved:
            print(f"campaign_record: with {BASE_NAME} beside the runs' own archives, the next slice would carry more "
                  f"than the {CARRY_LIMIT / 2**20:.0f} MiB it may: the runs only it held ({', '.join(moved)}) are "
                  "stored as their own archives, and it goes")
            stored += [_store(run, new[run], check, RESULTS) for run in moved]
    dropped = _drop_superseded_base(RESULTS)
    entry = {"slice": len(previous) + 1, **info, "state_bytes": state_bytes(RESULTS),
             "state_bytes_added": sum(path.stat().st_size for path in stored),
             "gpu_utilisation_percent": gpu_utilisation(reports / "gpu_util.csv"),
             "idle_before_training_seconds": idle_before_training(reports / "gpu_util.csv"), "runs": runs,
             "rpms_per_second": aggregate_rate(previous[-1]["runs"] if previous else [], runs, info["seconds"])}
    for name in ("progress.md", "table1.md"):
        if (reports / name).is_file():
            shutil.copyfile(reports / name, RESULTS / name)
    with SLICES.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
    print(f"campaign_record: slice {entry['slice']} on {entry['device']} ({returned}): state "
          f"{entry['state_bytes'] / 1e6:.1f} MB, exit {entry['exit_status']}")
    print(added_note(entry["slice"], [path.name for path in stored], entry["state_bytes_added"], dropped))
    return entry


def added_note(slice_number: int, stored: list[str], added: int, base_dropped: bool = False) -> str:
    """One line on what recording slice ``slice_number`` adds to the repository: the per-run archives ``stored``
    (``added`` bytes in all), and whether the base went; a warning over :data:`ADDED_LIMIT`."""
    what = f"{', '.join(stored)}" if stored else "no archive: no run's state changed"
    gone = f"; {BASE_NAME} removed (every run has its own archive)" if base_dropped else ""
    line = f"slice {slice_number} adds {added / 1e6:.1f} MB to the repository ({what}){gone}"
    if added > ADDED_LIMIT:
        return (f"campaign_record: warning: {line}: over the {ADDED_LIMIT / 1e6:.0f} MB a commit should add; train "
                "fewer runs at once (CAMPAIGN_JOBS=1) so that fewer unfinished runs change per slice")
    return f"campaign_record: {line}"


def aggregate_rate(before: list[dict], after: list[dict], seconds: float) -> float | None:
    """Problems trained per second by all runs together during one slice, over its whole wall time (data
    generation, start-up, validation and packing included: what a slice really delivers)."""
    done_before = {run["run"]: run.get("rpms", 0) for run in before}
    trained = sum(run.get("rpms", 0) - done_before.get(run["run"], 0) for run in after)
    return round(trained / seconds, 1) if seconds > 0 else None


def _run_cell(run: dict, trained_now: bool, slice_started: float | None = None) -> str:
    setup = run["run"].split("setup-")[-1].split("__")[0]
    epochs = "+".join(str(n) for n in run["epochs"].values()) or "0"
    accuracy = "" if run["best_val_accuracy"] is None else f", val {100 * run['best_val_accuracy']:.1f}"
    done = " ✓" if run["status"] == "finished" else ""
    # data_check=problems let the run go on with pixels another OpenCV drew (rpm_lib.data.opencv_version)
    pixels = ", other pixels" if run.get("data_changes") else ""
    # for a run that trained in this slice: when its training call began after the slice's start, how long its
    # process (a notebook's kernel) had run by then, and the seconds from that call to its first step
    began = ""
    if trained_now and slice_started is not None and run.get("called_at") is not None:
        began = f", train() at {run['called_at'] - slice_started:.0f} s"
        if run.get("process_s") is not None:
            began += f" (its process {run['process_s']:.0f} s old)"
    first = (f", 1st step {run['first_step_s']:.0f} s" if trained_now and run.get("first_step_s") is not None
             else "")
    return f"{setup} {epochs} ep{accuracy}{done}{pixels}{began}{first}"


def slices_markdown(entries: list[dict]) -> str:
    lines = ["| slice | date | card | seconds | idle at start s | after the batch s | exit | state MB | added MB | "
             "GPU util % | RPMs/s, all runs | runs (epochs per stage, best val %, seconds to the first step) |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    slices_before: dict[str, int] = {}
    for e in entries:
        runs = "; ".join(_run_cell(run, run.get("slices", 0) > slices_before.get(run["run"], 0), e.get("started"))
                         for run in e["runs"])
        slices_before = {run["run"]: run.get("slices", 0) for run in e["runs"]}
        util = "" if e.get("gpu_utilisation_percent") is None else f"{e['gpu_utilisation_percent']:.0f}"
        rate = "" if e.get("rpms_per_second") is None else f"{e['rpms_per_second']:,.0f}"
        idle = "" if e.get("idle_before_training_seconds") is None else f"{e['idle_before_training_seconds']:.0f}"
        # packing the state and writing the reports (slice.json phases_s, recorded since slice 6)
        ended = (e.get("phases_s") or {}).get("batch_ended")
        after = "" if ended is None else f"{e['seconds'] - ended:.0f}"
        # the bytes its per-run archives added to the repository (recorded since the state has one archive per run)
        added = "" if e.get("state_bytes_added") is None else f"{e['state_bytes_added'] / 1e6:.1f}"
        lines.append(f"| {e['slice']} | {e['date']} | {e['device']} | {e['seconds']:.0f} | {idle} | {after} | "
                     f"{e['exit_status']} | {e['state_bytes'] / 1e6:.1f} | {added} | {util} | {rate} | {runs} |")
    return "\n".join(lines)


def _slice_entries() -> list[dict]:
    """The recorded slices, oldest first (``slices.jsonl``; none yet: empty)."""
    return [json.loads(line) for line in SLICES.read_text().splitlines()] if SLICES.is_file() else []


@contextlib.contextmanager
def _unpacked_state() -> Iterator[Path | None]:
    """The committed state (:func:`restore_state`) unpacked into a temporary folder for the renderings (None before
    the first slice)."""
    if not state_archives(RESULTS):
        yield None
        return
    with tempfile.TemporaryDirectory() as folder:
        restore_state(RESULTS, Path(folder))
        yield Path(folder)


def table1_markdown(state: Path | None) -> str | None:
    """The SCL row beside the paper with the claims' verdicts, from the unpacked ``state`` (None: nothing
    finished)."""
    from rpm_lib import results
    from rpm_lib.results import claims

    if state is None:
        return None
    report = claims.reproduction_report(state)
    if report.finished == 0:
        return None
    # The campaign has no ablation grid: only the orderings between the five setups are checked.
    from rpm_lib.training.setups import SETUPS

    labels = {spec.label for spec in SETUPS.values()}
    setup_claims = [c for c in claims.CLAIMS if set(c.worse) <= labels]
    checks = claims.check_claims_setting_split_rows_aside(report.setups, report.num_test, setup_claims)
    # The state holds only the runs started so far; the row has as many runs as the last slice's progress lists.
    entries = _slice_entries()
    total = max(report.total, len(entries[-1]["runs"]) if entries else 0)
    return "\n".join([f"{report.finished} of {total} runs finished; {claims.test_sizes_phrase(report)}; "
                      "accuracies in percent.", "", results.table1_markdown(report.setups, with_paper=True), "",
                      claims.claims_markdown(checks)])


def standing_markdown(state: Path | None, entries: list[dict]) -> str | None:
    """Where each run of the row stands, from the unpacked ``state`` (None before the first slice) after the slices
    ``entries``: its stage and the stages to come, the epochs done, the stage's best validation loss so far, and the
    epochs early stopping can still give the stage (``rpm_lib.runs.progress.RunProgress``)."""
    from rpm_lib import results
    from rpm_lib.runs import plan
    from rpm_lib.runs import progress as run_progress
    from rpm_lib.training.setups import SETUPS

    if state is None:
        return None
    runs = run_progress.batch_progress(state / "main")
    cards = collections.Counter(entry.get("device", "?") for entry in entries)
    finished = sum(run.status == run_progress.FINISHED for run in runs)
    lines = [f"After {len(entries)} slice{'s' * (len(entries) != 1)} ({entries[0].get('date')} to "
             f"{entries[-1].get('date')}; " + ", ".join(f"{card} ×{count}" for card, count in cards.items())
             + f"; {sum(float(entry.get('seconds') or 0) for entry in entries):,.0f} s in all): {finished} of "
             f"{len(runs)} runs finished.", "",
             "| setup | status | stage (stages to come) | epochs done | best validation loss (its epoch) | epochs left "
             "in the stage: fewest–most | best val % | test % | paper's Table 1 % |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        values = plan.run_config(state / "main" / run.run) or {}
        stages = list(plan.stage_epochs(values) or {})
        after = stages[stages.index(run.stage) + 1:] if run.stage in stages else []
        to_come = f" ({', '.join(after)})" if after and run.status != run_progress.FINISHED else ""
        paper = results.paper_row(str(values.get("encoder")), str(values.get("setup")))
        lines.append(" | ".join([
            f"| {SETUPS[values['setup']].label if values.get('setup') in SETUPS else run.run}", run.status,
            f"{run.stage or ''}{to_come}", str(run.epochs.get(run.stage or "", 0)),
            "" if run.best_val_loss is None else f"{run.best_val_loss:.3f} ({run.best_val_loss_epoch})",
            run_progress.epochs_left_text(run.epochs_left) or "–", run_progress.percent(run.best_val_accuracy),
            run_progress.percent(run.test_accuracy),
            "" if paper is None else f"{paper.average:.1f} ± {paper.std:.1f}" if paper.std is not None
            else f"{paper.average:.1f}"]) + " |")
    return "\n".join(lines)


def _replace_between(text: str, marker: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {marker} -->\n).*?(\n<!-- /{marker} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"campaign_record: error: {DOC} has no <!-- {marker} --> ... <!-- /{marker} --> markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def render() -> None:
    """Rewrite the document's tables and draw ``RESULTS/FIGURE_NAME`` (each run's validation accuracy over its
    epochs, the paper's Table 1 average dashed) from ``slices.jsonl`` and the committed state, unpacked once."""
    from rpm_lib.runs import progress as run_progress

    entries = _slice_entries()
    text = DOC.read_text()
    text = _replace_between(text, "slices", slices_markdown(entries) if entries else "No slice has run yet.")
    with _unpacked_state() as state:
        text = _replace_between(text, "table1", table1_markdown(state) or "No run has finished yet.")
        text = _replace_between(text, "standing", standing_markdown(state, entries) or "No slice has run yet.")
        if state is not None:
            figure = run_progress.progress_figure(
                state / "main", paper=True, title=f"The SCL row after slice {len(entries)}: validation accuracy per run")
            figure.savefig(RESULTS / FIGURE_NAME, dpi=100, bbox_inches="tight")
    DOC.write_text(text)


#: What one slice may copy to the GPU machine at most (the working tree and ``.gpu`` together), bytes.
CARRY_LIMIT = 64 * 1024 * 1024


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def carry_note(state_bytes: int, wheels_bytes: int, other_bytes: int) -> str:
    """One line on what the next slice copies to the GPU machine: the state, ``.gpu`` (the wheels) and the rest of
    the repository, against the 64 MiB a slice may copy; a warning when less than 4 MiB would be left."""
    total = state_bytes + wheels_bytes + other_bytes
    line = (f"the next slice carries ~{total / 2**20:.1f} MiB of {CARRY_LIMIT / 2**20:.0f} (state "
            f"{state_bytes / 2**20:.1f}, .gpu {wheels_bytes / 2**20:.1f}, the rest {other_bytes / 2**20:.1f})")
    if total > CARRY_LIMIT - 4 * 2**20:
        return (f"campaign_record: warning: {line}: too close to the limit; train fewer runs at once "
                "(CAMPAIGN_JOBS) so that fewer unfinished runs carry checkpoints")
    return f"campaign_record: {line}"


def _carried_besides_state() -> tuple[int, int]:
    """(bytes in ``.gpu``: the wheels; tracked files other than the state, bytes) as the next slice copies them."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True).stdout
    state = {archive.resolve() for archive in state_archives(RESULTS)}
    other = sum((REPO / name).stat().st_size for name in listed.split("\0")
                if name and (REPO / name).is_file() and (REPO / name).resolve() not in state)
    return _tree_bytes(REPO / ".gpu"), other


def _started(returned: Path) -> float:
    """When the slice in ``returned`` began (``slice.json``'s ``started``); one whose record lacks it (slices 1-3) or
    cannot be read sorts first, and :func:`record` then says what is wrong with it."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            info = json.loads((slice_reports(returned, Path(folder)) / "slice.json").read_text())
            return float(info["started"])
        except (OSError, ValueError, KeyError, TypeError, SystemExit):
            return float("-inf")


def pack_state(runs_folder: Path, results: Path) -> list[Path]:
    """Pack each run of the batch folder ``runs_folder`` into its own archive in ``results/state/`` (compact:
    the Adam moments in bfloat16), printing each; returns the archives. None where no run has begun (no folder, or
    none with something to resume): the budget ran out before, and the state stays as it came.

    Raises:
        ArchiveError: see ``rpm_lib.runs.archive.pack``.
    """
    from rpm_lib.runs import archive as run_archive

    runs = run_archive.find_runs(runs_folder) if runs_folder.is_dir() else []
    if not runs:
        print(f"campaign_record: no run has begun yet in {runs_folder}; nothing to pack")
    written = []
    for run_dir in runs:
        run = run_dir.relative_to(runs_folder).as_posix()
        out = results / STATE_FOLDER / run_archive_name(run)
        packed = run_archive.pack(runs_folder, out, compact=True, runs=[run])
        print(f"campaign_record: {out.name} {out.stat().st_size / 1e6:.2f} MB")
        print("\n".join(run_archive.describe(packed)))
        written.append(out)
    return written


def _slice_state(restore: Path | None, pack: Path | None, results: Path) -> int:
    """``--restore RUNS`` or ``--pack RUNS`` (see :func:`main`); 2 with one line on stderr when an archive or a run
    folder is refused."""
    from rpm_lib.runs import archive as run_archive

    try:
        if restore is not None:
            if not state_archives(results):
                print(f"campaign_record: no state in {results}: every run starts from the beginning")
                return 0
            runs = restore_state(results, restore, keep_further=True,
                                 warn=lambda line: print(f"campaign_record: note: {line}", file=sys.stderr))
            archives = sorted({held.archive.name for held in runs.values()})
            print(f"campaign_record: {len(runs)} run(s) restored into {restore} from {', '.join(archives)} in "
                  f"{results}")
        else:
            pack_state(pack, results)
    except run_archive.ArchiveError as error:
        print(f"campaign_record: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("folders", nargs="*", type=Path, metavar="FOLDER",
                        help="a copy of the slice's CAMPAIGN_OUT folder (several: one per slice, e.g. a second slice "
                             "on the same machine; recorded in the order the slices began)")
    parser.add_argument("--accept-behind", action="store_true",
                        help="record a state that holds less of a run than the committed one (a run restarted on "
                             "purpose), with a warning, instead of refusing it")
    parser.add_argument("--check", action="store_true",
                        help="only re-render docs/reproduction-gpu.md and results/table1_scl_gpu/progress.png")
    parser.add_argument("--restore", type=Path, metavar="RUNS",
                        help="(on the GPU machine, by gpu_slice.sh) unpack the state into the batch folder RUNS, each "
                             "run from its own archive, else from the base; a run there that has gone further is "
                             "kept (rpm-batch unpack --keep-further)")
    parser.add_argument("--pack", type=Path, metavar="RUNS",
                        help="(on the GPU machine, by gpu_slice.sh) pack each run of the batch folder RUNS into its "
                             "own archive in the state's state/ folder (rpm-batch pack --compact --run)")
    parser.add_argument("--results", type=Path, metavar="DIR",
                        help="with --restore or --pack: the folder holding the state (default "
                             "results/table1_scl_gpu)")
    args = parser.parse_args(argv)
    chosen = [flag for flag, given in (("--check", args.check), ("--restore", args.restore is not None),
                                       ("--pack", args.pack is not None), ("FOLDER", bool(args.folders))) if given]
    if len(chosen) > 1:
        parser.error(f"{' and '.join(chosen)} do not go together")
    if args.results is not None and not (args.restore or args.pack):
        parser.error("--results goes with --restore or --pack")
    if args.restore is not None or args.pack is not None:
        return _slice_state(args.restore, args.pack, args.results or RESULTS)
    if not args.check:
        if not args.folders:
            parser.error("give the folder of the slice's files (or --check)")
        for returned in sorted(args.folders, key=_started):
            entry = record(returned, args.accept_behind)
        print(carry_note(entry["state_bytes"], *_carried_besides_state()))
    from rpm_lib.runs import archive as run_archive

    try:
        render()
    except run_archive.ArchiveError as error:
        raise SystemExit(f"campaign_record: error: the committed state: {' '.join(str(error).split())}") from None
    print(f"campaign_record: {DOC} and {RESULTS / FIGURE_NAME} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
