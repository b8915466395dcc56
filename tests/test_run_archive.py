"""``rpm_lib.run_archive`` (``rpm-batch pack`` / ``unpack``): what travels, and archives from elsewhere that are
refused before anything is written."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import torch

from rpm_lib import batch, run_archive
from rpm_lib.run_archive import ArchiveError


def _fake_run(run_dir: Path, status: str) -> None:
    """A run folder as train() leaves it: finished, or stopped in its second stage."""
    (run_dir / "checkpoints" / "pretrain").mkdir(parents=True)
    (run_dir / "checkpoints" / "linear").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("setup: mlcl\n")
    (run_dir / "history.csv").write_text("stage,epoch\npretrain,0\n")
    (run_dir / "03_train.ipynb").write_text("{}")  # an executed notebook: never packed
    weights = {"state_dict": {"w": torch.arange(4.0)}, "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(4)}}}]}
    for stage in ("pretrain", "linear"):
        for name in ("last.ckpt", "best.ckpt"):
            torch.save(weights, run_dir / "checkpoints" / stage / name)
    stages = {"pretrain": {"completed": True, "weights": "checkpoints/pretrain/best.ckpt"},
              "linear": {"completed": status == "finished", "weights": "checkpoints/linear/best.ckpt"}}
    (run_dir / "progress.json").write_text(json.dumps({"status": status, "stages": stages}))
    if status == "finished":
        (run_dir / "metrics.json").write_text("{}")
        (run_dir / "predictions.npz").write_bytes(b"npz")


def test_pack_keeps_what_resuming_needs_and_reduces_best_weights(tmp_path: Path) -> None:
    _fake_run(tmp_path / "batch" / "main" / "a", "unfinished")
    _fake_run(tmp_path / "batch" / "main" / "b", "finished")
    runs = run_archive.pack(tmp_path / "batch", tmp_path / "state.tar.gz")
    assert [(r.path, r.status) for r in runs] == [("main/a", "unfinished"), ("main/b", "finished")]
    assert sorted(runs[0].files) == ["checkpoints/linear/best.ckpt", "checkpoints/linear/last.ckpt",
                                     "checkpoints/pretrain/best.ckpt", "config.yaml", "history.csv", "progress.json"]
    assert sorted(runs[1].files) == ["config.yaml", "history.csv", "metrics.json", "predictions.npz", "progress.json"]
    run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "moved")
    best = torch.load(tmp_path / "moved" / "main" / "a" / "checkpoints" / "linear" / "best.ckpt", weights_only=True)
    last = torch.load(tmp_path / "moved" / "main" / "a" / "checkpoints" / "linear" / "last.ckpt", weights_only=True)
    assert set(best) == {"state_dict"} and "optimizer_states" in last  # the resume point keeps its optimiser
    assert not (tmp_path / "moved" / "main" / "a" / "03_train.ipynb").exists()
    with pytest.raises(ArchiveError, match="exists; unpack into an empty folder"):
        run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "moved")
    run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "moved", overwrite=True)


def test_compact_packs_adam_moments_in_bfloat16_and_never_rounds_weights(tmp_path: Path) -> None:
    _fake_run(tmp_path / "run", "unfinished")
    runs = run_archive.pack(tmp_path / "run", tmp_path / "state.tar.gz", compact=True)
    assert run_archive.read_manifest(tmp_path / "state.tar.gz")["compact"] is True and runs[0].status == "unfinished"
    run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "moved")
    last = torch.load(tmp_path / "moved" / "checkpoints" / "linear" / "last.ckpt", weights_only=True)
    assert last["optimizer_states"][0]["state"][0]["exp_avg"].dtype == torch.bfloat16
    assert last["state_dict"]["w"].dtype == torch.float32


def _archive(path: Path, members: dict[str, bytes], manifest_files: dict | None = None,
             extra: list[tarfile.TarInfo] = ()) -> Path:
    files = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in members.items()}
    manifest = {"format": run_archive.FORMAT, "version": run_archive.VERSION, "runs": [],
                "files": files if manifest_files is None else manifest_files}
    with tarfile.open(path, "w:gz") as archive:
        for name, data in [(run_archive.MANIFEST, json.dumps(manifest).encode()), *members.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for info in extra:
            archive.addfile(info)
    return path


@pytest.mark.parametrize(("members", "extra", "message"), [
    ({"../evil/config.yaml": b"x"}, [], "unsafe member name"),
    ({"/etc/config.yaml": b"x"}, [], "unsafe member name"),
    ({"run/evil.py": b"import os"}, [], "not a run-state file"),
    ({"run/checkpoints/pretrain/model.pkl": b"x"}, [], "not a run-state file"),
    ({}, [tarfile.TarInfo("run/config.yaml")], "does not match its SHA-256"),
])
def test_unpack_refuses_unsafe_or_unexpected_members_and_writes_nothing(tmp_path: Path, members: dict[str, bytes],
                                                                       extra: list[tarfile.TarInfo],
                                                                       message: str) -> None:
    source = _archive(tmp_path / "bad.tar.gz", members, extra=extra)
    with pytest.raises(ArchiveError, match=message):
        run_archive.unpack(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unpack_refuses_links_altered_members_and_other_files(tmp_path: Path) -> None:
    link = tarfile.TarInfo("run/config.yaml")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(ArchiveError, match="not a regular file"):
        run_archive.unpack(_archive(tmp_path / "link.tar.gz", {}, {}, extra=[link]), tmp_path / "out")
    altered = _archive(tmp_path / "altered.tar.gz", {"run/config.yaml": b"seed: 1\n"},
                       {"run/config.yaml": {"sha256": "0" * 64}})
    with pytest.raises(ArchiveError, match="does not match its SHA-256"):
        run_archive.unpack(altered, tmp_path / "out")
    missing = _archive(tmp_path / "missing.tar.gz", {}, {"run/config.yaml": {"sha256": "0" * 64}})
    with pytest.raises(ArchiveError, match="listed in rpm_state.json are missing"):
        run_archive.unpack(missing, tmp_path / "out")
    (tmp_path / "not.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(ArchiveError, match="not a readable tar archive"):
        run_archive.unpack(tmp_path / "not.tar.gz", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_cli_says_one_line_for_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert batch.main(["unpack", str(tmp_path / "none.tar.gz"), "--out", str(tmp_path / "o")]) == 2
    assert batch.main(["pack", str(tmp_path), "--out", str(tmp_path / "s.tar.gz")]) == 2
    assert batch.main(["progress", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("rpm-batch ") and "error:" in line for line in err)
    assert "Traceback" not in "".join(err)


def test_progress_names_runs_that_went_on_with_other_pixels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, changes in (("a", []), ("b", [{"slice": 2, "accepted_by": "data_check=problems"}])):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text("batch_size: 4\n")
        (run / "progress.json").write_text(json.dumps({"status": "unfinished", "slices": [{"ended_in": "supervised"}],
                                                       "data_changes": changes}))
    assert batch.main(["progress", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == ("Went on with other pixels of the same problems (data_check=problems; "
                                            "data_changes in their progress.json): b")
    assert batch.main(["progress", str(tmp_path), "--json"]) == 0
    assert [run["data_changes"] for run in json.loads(capsys.readouterr().out)] == [0, 1]

