"""Random corruptions of every kind of file the package reads: one line naming the file, or a clean read.

Each file kind is damaged in seeded random ways (cut short, bytes flipped, emptied, a JSON value replaced by one of
another type) and read through the public function a command uses. The reader may accept a harmless change (a
flipped pixel is still a problem); what it must never do is fail with anything but its own one-line error that
names the file. The seed of each case is in its id, so a failure is reproduced by rerunning that case.
"""
from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rpm_lib.checkpoints import load_plain
from rpm_lib.data import DataFormatError, prepare_cache
from rpm_lib.data.cache import CacheReader
from rpm_lib.data.problem_hashes import RAW_RECORD, read_raw_record
from rpm_lib.data.validation import load_raven_npz
from rpm_lib.generator import writer
from rpm_lib.runs.progress import run_progress
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.eval_sets import read_regime
from rpm_lib.training.run_dir import read_progress as _read_progress

CONFIGURATION = "center_single"
CASES = 6  # seeds per (file kind, corruption)
WRONG_TYPES = [None, True, -1, 2.5, "text", [], [1, "a"], {}, {"x": 1}]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated folder (raw), its cache (32 px) and the files of a run folder, never modified."""
    root = tmp_path_factory.mktemp("pristine")
    raw = root / "raw"
    writer.write_dataset(raw, [CONFIGURATION], count=10, seed=3, progress=False, regime="A/Color")
    prepare_cache(raw, root / "cache", size=32, show_progress=False)
    run = root / "run"
    run.mkdir()
    TrainConfig(data_root=str(raw)).to_yaml(run / "config.yaml")
    (run / "progress.json").write_text(json.dumps({
        "status": "unfinished", "slices": [{"seconds": 1.5, "ended_in": "supervised"}],
        "stages": {"supervised": {"completed": False, "global_step": 4, "batch_size": 2}}}))
    (run / "history.csv").write_text("stage,epoch,step,train_loss,val_accuracy\nsupervised,0,2,1.9,0.25\n"
                                     "supervised,1,4,1.7,0.5\n")
    torch.save({"state_dict": {"w": torch.zeros(3)}, "epoch": 1}, run / "last.ckpt")
    return root


# ----------------------------------------------------------------------------------------------
# corruptions
# ----------------------------------------------------------------------------------------------
def _truncate(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(len(data))])


def _flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    # Mostly near the start, where headers and structure are: flipped pixels alone are not damage a reader can see.
    span = min(len(data), rng.choice([64, 512, len(data)]))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(span)] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _empty(path: Path, rng: random.Random) -> None:
    path.write_bytes(b"")


def _wrong_json_type(path: Path, rng: random.Random) -> None:
    data = json.loads(path.read_text())

    def places(value, trail=()):  # every key path into the object
        if isinstance(value, dict):
            for key, item in value.items():
                yield (*trail, key)
                yield from places(item, (*trail, key))
        elif isinstance(value, list):
            for i, item in enumerate(value[:3]):
                yield (*trail, i)
                yield from places(item, (*trail, i))

    choices = list(places(data))
    if not choices or rng.random() < 0.1:
        data = rng.choice([[], "text", 3, None])
    else:
        trail = rng.choice(choices)
        holder = data
        for step in trail[:-1]:
            holder = holder[step]
        holder[trail[-1]] = rng.choice(WRONG_TYPES)
    path.write_text(json.dumps(data))


BYTES = {"truncate": _truncate, "flip": _flip, "empty": _empty}
JSON = {**BYTES, "wrong type": _wrong_json_type}


# ----------------------------------------------------------------------------------------------
# readers: (folder copied from the pristine one, file inside it, how it is read, the errors it may raise)
# ----------------------------------------------------------------------------------------------
def _npz(folder: Path) -> None:
    load_raven_npz(folder / CONFIGURATION / "RAVEN_0_train.npz")


def _cache(folder: Path) -> None:
    CacheReader(folder, "raven", 32, "area")


def _regime(folder: Path) -> None:
    read_regime(folder)


def _hash_record(folder: Path) -> None:
    read_raw_record(folder)


def _progress(folder: Path) -> None:
    standing = run_progress(folder)  # what `rpm-batch progress` shows: never raises, a damaged file is its status
    if standing.status.startswith("damaged"):
        assert "\n" not in standing.status
        assert standing.status.startswith(("damaged: progress.json", "damaged: history.csv")), standing.status
    _read_progress(folder / "progress.json")  # what a resumed run reads


def _config(folder: Path) -> None:
    TrainConfig.from_yaml(folder / "config.yaml")


def _checkpoint(folder: Path) -> None:
    load_plain(folder / "last.ckpt", ConfigError)


KINDS: dict[str, tuple[str, str, Callable[[Path], None], tuple[type[Exception], ...], dict]] = {
    "problem .npz": ("raw", f"{CONFIGURATION}/RAVEN_0_train.npz", _npz, (DataFormatError,), BYTES),
    "cache panels.npy": ("cache", "panels.npy", _cache, (DataFormatError,), BYTES),
    "cache meta.npy": ("cache", "meta.npy", _cache, (DataFormatError,), BYTES),
    "cache problem_hashes.npy": ("cache", "problem_hashes.npy", _cache, (DataFormatError,), BYTES),
    "cache manifest.json": ("cache", "manifest.json", _cache, (DataFormatError,), JSON),
    "regime.json": ("raw", "regime.json", _regime, (ConfigError,), JSON),
    "generator.json": ("raw", "generator.json", _regime, (ConfigError,), JSON),
    "cache manifest regime": ("cache", "manifest.json", _regime, (ConfigError,), JSON),
    "problem_hashes.json": ("raw", RAW_RECORD, _hash_record, (DataFormatError,), JSON),
    "progress.json": ("run", "progress.json", _progress, (ConfigError,), JSON),
    "history.csv": ("run", "history.csv", _progress, (ConfigError,), BYTES),
    "config.yaml": ("run", "config.yaml", _config, (ConfigError,), BYTES),
    "checkpoint": ("run", "last.ckpt", _checkpoint, (ConfigError,), BYTES),
}

PARAMS = [pytest.param(kind, how, seed, id=f"{kind}-{how}-{seed}")
          for kind, (_, _, _, _, corruptions) in KINDS.items() for how in corruptions for seed in range(CASES)]


@pytest.mark.parametrize("kind, how, seed", PARAMS)
def test_a_corrupted_file_is_one_line_naming_it_or_is_read(pristine: Path, tmp_path: Path, kind: str, how: str,
                                                           seed: int) -> None:
    folder_name, name, read, errors, corruptions = KINDS[kind]
    folder = tmp_path / folder_name
    shutil.copytree(pristine / folder_name, folder)
    path = folder / name
    corruptions[how](path, random.Random(f"{kind}/{how}/{seed}"))
    try:
        read(folder)
    except errors as error:
        message = str(error)
        assert "\n" not in message, message
        assert str(path) in message or (name == "manifest.json" and str(folder) in message), message
    # anything else propagates: a traceback is the failure this test looks for


#: Kinds whose reader accepts an empty file: defaults (config.yaml), a status line (history.csv), and a cache
#: manifest that ``read_regime`` leaves to the cache reader (which refuses it: "cache manifest.json").
EMPTY_IS_READ = {"config.yaml", "history.csv", "cache manifest regime"}


def test_an_emptied_file_is_refused_by_every_reader_that_needs_its_content(pristine: Path, tmp_path: Path) -> None:
    """The corruptions reach the readers: emptying a file is refused wherever its content is needed."""
    read_anyway = set()
    for kind, (folder_name, name, read, errors, _) in KINDS.items():
        folder = tmp_path / kind.replace(" ", "_")
        shutil.copytree(pristine / folder_name, folder)
        (folder / name).write_bytes(b"")
        try:
            read(folder)
        except errors:
            continue
        read_anyway.add(kind)
    assert read_anyway == EMPTY_IS_READ


def test_an_intact_run_folder_is_read_as_before(pristine: Path) -> None:
    standing = run_progress(pristine / "run")
    assert (standing.status, standing.stage, standing.epochs) == ("unfinished", "supervised", {"supervised": 2})
    assert (standing.val_accuracy, standing.best_val_accuracy, standing.slices, standing.seconds) == (0.5, 0.5, 1, 1.5)
    assert (standing.steps, standing.rpms) == (4, 8)


def test_a_raw_pickle_checkpoint_is_refused_without_torch_warnings(tmp_path: Path,
                                                                   recwarn: pytest.WarningsRecorder) -> None:
    # Regression: torch printed "Detected pickle protocol 4 ... please file an issue" above the refusal.
    import pickle
    import warnings

    path = tmp_path / "last.ckpt"
    path.write_bytes(pickle.dumps({"state_dict": {}}, protocol=4))
    warnings.simplefilter("always")
    with pytest.raises(ConfigError, match="not loadable as plain weights"):
        load_plain(path, ConfigError)
    assert [str(w.message) for w in recwarn] == []
