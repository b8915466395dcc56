"""``rpm-batch pack`` / ``unpack`` on a real stopped run (the ``stopped`` fixture of tests/conftest.py): pack takes
only files that lie inside the packed folder, refusing a symbolic link instead of packing what it points at, and
``unpack --overwrite`` is refused while a run trains in the folder it would replace, or where a run or grid folder
below ``--out`` is a link."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import copy_run
from rpm_lib import batch
from rpm_lib.folder_lock import exclusive_writer
from rpm_lib.run_folder import RUN_LOCK
from rpm_lib.runs import archive as run_archive
from rpm_lib.runs.archive import ArchiveError
from rpm_lib.training.config import TrainConfig


def test_unpack_overwrite_is_refused_while_a_run_trains_in_the_folder(stopped: TrainConfig, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # found: the archive's older state replaced the files under the running process, which went on writing
    config = copy_run(stopped, tmp_path)
    run_dir = Path(config.run_dir)
    run_archive.pack(run_dir, tmp_path / "state.tar.gz")
    (run_dir / "history.csv").write_text((run_dir / "history.csv").read_text() + "linear,1,9,1,1,0.5,0.002\n")
    went_on = (run_dir / "history.csv").read_bytes()
    with exclusive_writer(run_dir / RUN_LOCK, "rpm-train"):
        assert batch.main(["unpack", str(tmp_path / "state.tar.gz"), "--out", str(run_dir), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another rpm-train is writing here" in err[0] and "nothing unpacked" in err[0], err
    assert (run_dir / "history.csv").read_bytes() == went_on
    # released (the process ended): the unpack goes ahead as before
    assert batch.main(["unpack", str(tmp_path / "state.tar.gz"), "--out", str(run_dir), "--overwrite"]) == 0


# ----------------------------------------------------------------------------------------------
# pack: only files inside the packed folder
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["run/history.csv", "run/checkpoints/linear/last.ckpt", "linked"])
def test_pack_refuses_a_symbolic_link_instead_of_packing_what_it_points_at(stopped: TrainConfig, tmp_path: Path,
                                                                          link: str) -> None:
    # found: history.csv -> a secret elsewhere, or a run folder linked in, was packed into the shareable archive
    batch_dir = tmp_path / "batch"
    shutil.copytree(stopped.run_dir, batch_dir / "run")
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    place = batch_dir / link
    if link == "linked":
        place.symlink_to(stopped.run_dir, target_is_directory=True)
    else:
        place.unlink()
        place.symlink_to(secret)
    with pytest.raises(ArchiveError, match="a symbolic link; pack copies only files that lie inside") as error:
        run_archive.pack(batch_dir, tmp_path / "state.tar.gz")
    assert str(error.value).startswith(f"{place}: ") and "\n" not in str(error.value)
    assert not (tmp_path / "state.tar.gz").exists()


# ----------------------------------------------------------------------------------------------
# unpack: nothing written or removed through a link below --out
# ----------------------------------------------------------------------------------------------
def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("link", ["grid/run", "grid"])
def test_unpack_overwrite_refuses_a_run_or_grid_folder_linked_outside(stopped: TrainConfig, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      link: str) -> None:
    # found: the linked run folder's files outside --out were rewritten by the archive's, its others removed
    batch_dir = tmp_path / "batch"
    shutil.copytree(stopped.run_dir, batch_dir / "grid" / "run")
    run_archive.pack(batch_dir, tmp_path / "state.tar.gz")
    (batch_dir / "grid" / "run" / "metrics.json").write_text("{}")  # gone further: --overwrite would remove it
    place, outside = batch_dir / link, tmp_path / "outside"
    shutil.move(place, outside)
    place.symlink_to(outside, target_is_directory=True)
    before = _files(outside)
    assert batch.main(["unpack", str(tmp_path / "state.tar.gz"), "--out", str(batch_dir), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rpm-batch unpack: error: {place}: a symbolic link;"), err
    assert _files(outside) == before and place.is_symlink()
    assert not list(tmp_path.rglob("*partial*"))
