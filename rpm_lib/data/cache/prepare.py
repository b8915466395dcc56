"""``rpm-data prepare``: a raw RAVEN / I-RAVEN or PGM folder listed, planned and built into a cache
(``prepare_cache``); the folder's checked ``regime.json`` goes into the manifest."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rpm_lib.data.cache.build import build_cache
from rpm_lib.data.cache.format import KINDS, ON_ERROR, kind_spec
from rpm_lib.data.cache.plan import raw_plan
from rpm_lib.data.errors import DataFormatError
from rpm_lib.data.raw_files import RawFile, find_pgm_files, find_raven_files
from rpm_lib.data.records import GeneratorSettingsError
from rpm_lib.data.resize import check_resize
from rpm_lib.data.validation import RpmRecord, read_regime_record


@dataclass(frozen=True)
class FileRecords:
    """A build's rows read from their files: called with a row's ``file``, it loads and validates ``file.path``
    (``rpm-data prepare``).

    Another source (``rpm_lib.generator.cache_writer.GeneratedRecords``) makes the same records without files;
    a source is called in worker processes, so it must pickle.
    """

    kind: str

    def __call__(self, file: RawFile) -> RpmRecord:
        return KINDS[self.kind].load(file.path)


def prepare_cache(
    root: str | Path,
    out: str | Path,
    size: int = 80,
    workers: int = 1,
    kind: str = "raven",
    on_error: str = "stop",
    *,
    resize: str = "area",
    configurations: Sequence[str] | None = None,
    regimes: Sequence[str] | None = None,
    chunk_size: int = 64,
    progress: Callable[[int, int], None] | None = None,
    show_progress: bool = True,
) -> Path:
    """Convert a raw dataset folder into a memory-mapped cache of ``size`` px panels (all splits).

    Args:
        root: raw RAVEN / I-RAVEN folder (``<root>/<configuration>/RAVEN_<k>_<split>.npz``) or PGM folder.
        out: cache folder to create (it is built in ``<out>.partial`` and renamed when complete).
        size: panel side in px after resizing (160 keeps the originals).
        workers: processes converting files in parallel (1 = in this process).
        kind: ``"raven"`` or ``"pgm"``.
        on_error: ``"stop"`` raises ``DataFormatError`` at the first bad file (finished chunks are kept and
            a rerun resumes); ``"skip"`` leaves the row invalid, lists the file and reason in
            ``<out>/skipped.txt`` and prints the count.
        resize: ``"area"`` (2x2 mean for 160 -> 80) or ``"stride"`` (every 2nd pixel, MLCL's PGM parity).
        configurations: RAVEN only: folder or short names to include (default: every folder present).
        regimes: PGM only: regimes to include (default: every regime found).
        chunk_size: files per unit of work and of resumable progress.
        progress: called as ``progress(files_done, files_total)`` after each finished chunk.
        show_progress: show a tqdm bar on stderr.

    Returns:
        ``Path(out)``. When ``out`` already holds a complete cache of the same inputs and settings it is
        returned untouched.

    Raises:
        DataFormatError: bad root / files (see ``find_raven_files``, ``load_raven_npz``), or ``out`` exists
        and is something else.
    """
    kind_spec(kind)  # an unknown kind first
    check_resize(resize)
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {list(ON_ERROR)}, got {on_error!r}")
    if size < 1 or workers < 1 or chunk_size < 1:
        raise ValueError(f"size, workers and chunk_size must be >= 1 (got {size}, {workers}, {chunk_size})")
    root = Path(root).resolve()
    if kind == "raven":
        if regimes is not None:
            raise ValueError("regimes= applies to kind='pgm' only")
        files = find_raven_files(root, configurations)
    else:
        if configurations is not None:
            raise ValueError("configurations= applies to kind='raven' only")
        files = find_pgm_files(root, regimes)
    plan = raw_plan(kind, root, files, size, resize, chunk_size)
    regime = _source_regime(root) if kind == "raven" else None
    build_cache(out, files, plan, FileRecords(kind), kind=kind, regime=regime, workers=workers, on_error=on_error,
                progress=progress, show_progress=show_progress)
    return Path(out)


def _source_regime(root: Path) -> dict | None:
    """The checked ``regime.json`` of the raw folder a cache is built from (None when it has none), recorded in the
    manifest so that the cache keeps its regime when the raw folder is gone or regenerated with another one."""
    try:
        return read_regime_record(root)
    except GeneratorSettingsError as error:
        raise DataFormatError(str(error)) from None
