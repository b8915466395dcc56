"""``rpm_lib.runs.archive`` (``rpm-batch pack`` / ``unpack``): what travels, and archives from elsewhere that are
refused before anything is written."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import re
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rpm_lib import batch
from rpm_lib.json_files import shown_value
from rpm_lib.runs import archive as run_archive
from rpm_lib.runs.archive import ArchiveError
from comparable_metrics import comparable as _comparable


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


def _archive(path: Path, members: dict[str, bytes] | list[tuple[str, bytes]], manifest_files: dict | None = None,
             extra: list[tarfile.TarInfo] = (), runs: list | None = None, omit: str = "",
             manifest_text: bytes | None = None, **fields: Any) -> Path:
    """A gzip tar as pack writes it (manifest first, then the members), or altered: ``manifest_files`` / ``runs``
    replace what the members imply (runs: each first path component); ``omit`` drops a manifest field;
    ``fields`` are added to the manifest; ``manifest_text`` replaces it whole."""
    members = list(members.items()) if isinstance(members, dict) else members
    files = {name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in members}
    files = files if manifest_files is None else manifest_files
    folders = sorted({name.split("/")[0] if "/" in name else "." for name in files})
    manifest = {"format": run_archive.FORMAT, "version": run_archive.VERSION,
                "runs": [{"path": f} for f in folders] if runs is None else runs, "files": files}
    manifest.update(fields)
    manifest.pop(omit, None)
    text = json.dumps(manifest).encode() if manifest_text is None else manifest_text
    with tarfile.open(path, "w:gz") as archive:
        for name, data in [(run_archive.MANIFEST, text), *members]:
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
    ({}, [tarfile.TarInfo("run/config.yaml")], "is not listed in rpm_state.json"),
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
                       {"run/config.yaml": {"bytes": 8, "sha256": "0" * 64}})
    with pytest.raises(ArchiveError, match="does not match its SHA-256"):
        run_archive.unpack(altered, tmp_path / "out")
    missing = _archive(tmp_path / "missing.tar.gz", {}, {"run/config.yaml": {"bytes": 1, "sha256": "0" * 64}})
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


def test_reading_a_batch_s_progress_does_not_import_lightning() -> None:
    # `rpm-batch progress` and the live watcher run beside training, often many times a slice: Lightning's import
    # (seconds on a slow host) is not theirs to pay
    import subprocess
    import sys

    code = "import sys, rpm_lib.runs.progress, rpm_lib.runs.live; print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_progress_says_how_many_epochs_early_stopping_can_still_give_a_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(name: str, config: str, history: str, progress: dict[str, Any], finished: bool = False) -> None:
        folder = tmp_path / "batch" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(config)
        (folder / "history.csv").write_text("stage,epoch,val_loss,val_accuracy\n" + history)
        (folder / "progress.json").write_text(json.dumps(progress))
        if finished:
            (folder / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))

    unfinished = {"status": "unfinished", "slices": [{"ended_in": "supervised"}]}
    # best 0.4 at epoch 2 of 4; patience 3 ends the stage after epoch 5 at the earliest; the limit after epoch 20
    run("a", "setup: ce\nmax_epochs: 20\npatience: 3\n",
        "supervised,0,0.9,0.5\nsupervised,1,0.4,0.6\nsupervised,2,0.6,0.6\nsupervised,3,0.4,0.6\n", unfinished)
    # pre-training done, linear evaluation not begun: its first epoch sets the best, `patience` more can end it
    run("b", "setup: mlcl\nmax_epochs: 20\nlinear_eval_epochs: 8\npatience: 3\n", "pretrain,0,7.0,\n",
        {"status": "unfinished", "slices": [{"ended_in": "linear"}]})
    run("c", "setup: ce\nmax_epochs: 2\npatience: 3\n", "supervised,0,0.9,0.5\nsupervised,1,0.8,0.6\n",
        unfinished, finished=True)
    run("d", "setup: no_such_setup\n", "supervised,0,0.9,0.5\n", unfinished)  # not a TrainConfig: not known
    assert batch.main(["progress", str(tmp_path / "batch"), "--json"]) == 0
    reported = {run["run"]: run for run in json.loads(capsys.readouterr().out)}
    assert reported["a"]["epochs_left"] == [1, 16] and reported["a"]["best_val_loss_epoch"] == 2
    assert reported["b"]["epochs_left"] == [4, 8] and reported["b"]["best_val_loss"] is None
    assert reported["c"]["epochs_left"] is None and reported["c"]["best_val_loss"] == 0.8
    assert reported["d"]["epochs_left"] is None and reported["d"]["status"] == "unfinished"
    assert batch.main(["progress", str(tmp_path / "batch")]) == 0
    rows = {line.split("|")[1].strip(): line.split("|")[5].strip() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows == {"a": "1–16", "b": "4–8", "c": "", "d": ""}


def test_progress_gives_the_last_slice_s_seconds_to_the_first_step_in_its_json_out_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = {"a": [{"ended_in": "supervised", "first_step_s": 40.0},
                     {"ended_in": "supervised", "first_step_s": 12.5, "called_at": 1795845371.2, "process_s": 14.5}],
               "b": [{"ended_in": "supervised", "first_step_s": 9.0}, {"ended_in": "supervised"}],  # trained no step
               "c": [{"ended_in": "supervised", "first_step_s": "soon", "process_s": True}]}  # hand-edited: no figure
    for name, slices in records.items():
        run = tmp_path / "batch" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("batch_size: 4\n")
        (run / "progress.json").write_text(json.dumps({"status": "unfinished", "slices": slices}))
    out = tmp_path / "reports" / "progress.json"
    assert batch.main(["progress", str(tmp_path / "batch"), "--json-out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("| run | status |")  # the table, as without --json-out
    reported = json.loads(out.read_text())
    assert [run["first_step_s"] for run in reported] == [12.5, None, None]
    assert [(run["called_at"], run["process_s"]) for run in reported] == [(1795845371.2, 14.5), (None, None),
                                                                          (None, None)]
    assert batch.main(["progress", str(tmp_path / "batch"), "--json-out", " "]) == 2
    assert "--json-out: empty path" in capsys.readouterr().err



# ----------------------------------------------------------------------------------------------
# a run killed before it could record its end (SIGKILL, the out-of-memory killer)
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny generated I-RAVEN (10 problems per configuration; under a second to make)."""
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.generation import ensure_generated

    root = tmp_path_factory.mktemp("tiny_iraven")
    assert ensure_generated(TrainConfig(data_root=str(root), generate=True, generate_num_per_config=10,
                                        generate_seed=3, progress_bar=False))
    return root


class _Killed(RuntimeError):
    pass


def _kill_in(stage: str) -> Any:
    """A callback that stops training like SIGKILL would: after the first batch of ``stage``'s second epoch, with
    nothing recorded (the first epoch's checkpoint is the resume point)."""
    import lightning as L

    class Kill(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
            if pl_module.plan.name == stage and trainer.current_epoch == 1:
                raise _Killed(stage)

    return Kill()


def _epochs_started() -> Any:
    import lightning as L

    class Log(L.Callback):
        epochs: list[tuple[str, int]] = []

        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
            self.epochs.append((pl_module.plan.name, trainer.current_epoch))

    return Log()




@pytest.mark.parametrize(("setup", "stage"), [("ce_aux_sparse", "supervised"), ("mlcl", "linear")])
def test_a_killed_run_is_packed_and_resumes_elsewhere_to_the_same_metrics(tiny_data: Path, tmp_path: Path,
                                                                        setup: str, stage: str) -> None:
    # ce_aux_sparse killed in its only stage has a progress.json with its data's fingerprint and no stage; mlcl
    # killed in linear has one that does not mention linear yet. Either way its last.ckpt is the resume point,
    # which must travel.
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.run import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-reproducible
    try:
        fields = dict(data_root=str(tiny_data), setup=setup, encoder="scl", max_steps=-1, max_epochs=2,
                      linear_eval_epochs=2, max_train_samples=8, batch_size=4, max_val_samples=4, max_test_samples=6,
                      limit_val_batches=1.0, limit_test_batches=1.0, patience=5, progress_bar=False)
        reference = train(TrainConfig(run_dir=str(tmp_path / "uninterrupted"), **fields))
        killed = tmp_path / "batch" / "run"
        with pytest.raises(_Killed):
            train(TrainConfig(run_dir=str(killed), **fields), callbacks=[_kill_in(stage)])
        progress = json.loads((killed / "progress.json").read_text())
        assert progress["data_fingerprint"].startswith("sha256-") and stage not in progress.get("stages", {})
        assert run_archive.find_runs(tmp_path / "batch") == [killed]
        runs = run_archive.pack(killed, tmp_path / "state.tar.gz")
        assert runs[0].status == "unfinished" and f"checkpoints/{stage}/last.ckpt" in runs[0].files
        run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "elsewhere")
        log = _epochs_started()
        resumed = train(TrainConfig(run_dir=str(tmp_path / "elsewhere"), resume=True, **fields), callbacks=[log])
        assert log.epochs == [(stage, 1)]  # continued from the packed checkpoint, not from the stage's start
        assert _comparable(resumed) == _comparable(reference)
    finally:
        torch.set_num_threads(threads)


def test_a_skipped_stage_of_an_unfinished_run_packs(tmp_path: Path) -> None:
    # max_total_epochs left linear no epochs, and the budget then stopped the run before its evaluation.
    _fake_run(tmp_path / "run", "unfinished")
    stages = {"pretrain": {"completed": True, "weights": "checkpoints/pretrain/best.ckpt"},
              "linear": {"completed": True, "skipped": True, "epochs": 0, "global_step": 0}}
    (tmp_path / "run" / "progress.json").write_text(json.dumps({"status": "unfinished", "stages": stages}))
    runs = run_archive.pack(tmp_path / "run", tmp_path / "state.tar.gz")
    assert sorted(runs[0].files) == ["checkpoints/pretrain/best.ckpt", "config.yaml", "history.csv", "progress.json"]


# ----------------------------------------------------------------------------------------------
# unpack: the whole archive checked before anything is written
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("members", "fields", "message"), [
    ({"r/config.yaml": b"a", "r/config.yaml/progress.json": b"{}"}, {}, "lies below member 'r/config.yaml'"),
    ({"r/config.yaml": b"a"}, {"omit": "runs"}, "'runs' must list each run folder"),
    ({"r/config.yaml": b"a", "s/config.yaml": b"b"}, {"runs": [{"path": "r"}]}, "'runs' must list each run folder"),
    ({"r/config.yaml": b"a"}, {"manifest_files": {"r/config.yaml": {"sha256": hashlib.sha256(b"a").hexdigest()}}},
     'must be {"bytes"'),
    ({"r/config.yaml": b"a"}, {"manifest_files": {"r/config.yaml": {"bytes": 1, "sha256": "x"}}}, "must be"),
    ({"r/config.yaml": b"a"}, {"manifest_files": {"r/config.yaml": {"bytes": 2,
                                                                    "sha256": hashlib.sha256(b"a").hexdigest()}}},
     "is 1 bytes, rpm_state.json says 2"),
    ([("r/config.yaml", b"a"), ("r/config.yaml", b"a")], {}, "appears twice"),
    ({"r/./config.yaml": b"a"}, {}, "unsafe member name"),
    ({"r//config.yaml": b"a"}, {}, "unsafe member name"),
])
def test_unpack_refuses_a_malformed_archive_before_writing(tmp_path: Path, members: Any, fields: dict[str, Any],
                                                           message: str) -> None:
    source = _archive(tmp_path / "bad.tar.gz", members, **fields)
    with pytest.raises(ArchiveError, match=re.escape(message)):
        run_archive.unpack(source, tmp_path / "out", overwrite=True)
    assert not (tmp_path / "out").exists()


def test_unpack_caps_the_total_size_before_reading_data_and_streams_members(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 x 600 declared bytes over a cap of 1000: refused from the manifest, before the (altered) data are read.
    altered = {f"r{i}/config.yaml": {"bytes": 600, "sha256": "0" * 64} for i in range(2)}
    source = _archive(tmp_path / "big.tar.gz", {f"r{i}/config.yaml": bytes(600) for i in range(2)}, altered)
    monkeypatch.setattr(run_archive, "MAX_TOTAL_BYTES", 1000)
    with pytest.raises(ArchiveError, match="hold 1200 bytes"):
        run_archive.unpack(source, tmp_path / "out")
    monkeypatch.undo()
    # Nor more than the disk has free.
    source = _archive(tmp_path / "fits.tar.gz", {"r/config.yaml": b"a"})
    monkeypatch.setattr(run_archive.shutil, "disk_usage", lambda path: SimpleNamespace(total=1, used=1, free=0))
    with pytest.raises(ArchiveError, match="need 0.00 GB, the disk has 0.00 GB free; nothing written"):
        run_archive.unpack(source, tmp_path / "out")
    monkeypatch.undo()
    # A member is hashed and written in chunks, never held whole.
    import tracemalloc

    data = bytes(32 << 20)
    source = _archive(tmp_path / "zeros.tar.gz", {"r/config.yaml": b"a", "r/checkpoints/pretrain/last.ckpt": data})
    tracemalloc.start()
    try:
        run_archive.unpack(source, tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    written = tmp_path / "out" / "r" / "checkpoints" / "pretrain" / "last.ckpt"
    assert peak < 8 << 20 and written.stat().st_size == len(data)
    # Nor a header extension that tarfile reads whole (a GNU long name of 32 MB here).
    longname = tarfile.TarInfo("././@LongLink")
    longname.type, longname.size = tarfile.GNUTYPE_LONGNAME, len(data)
    source = _archive(tmp_path / "long.tar.gz", {"r/config.yaml": b""})
    with tarfile.open(source) as archive:
        manifest = archive.extractfile(run_archive.MANIFEST).read()
    with tarfile.open(source, "w:gz") as archive:  # rewritten: the manifest, the long name, the member
        info = tarfile.TarInfo(run_archive.MANIFEST)
        info.size = len(manifest)
        archive.addfile(info, io.BytesIO(manifest))
        archive.addfile(longname, io.BytesIO(data))
        archive.addfile(tarfile.TarInfo("r/config.yaml"), io.BytesIO())
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError, match="header extension of 33554432 bytes"):
            run_archive.unpack(source, tmp_path / "out2")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20 and not (tmp_path / "out2").exists()


def test_unpack_refuses_an_archive_whose_manifest_is_not_first(tmp_path: Path) -> None:
    source = tmp_path / "late.tar.gz"
    with tarfile.open(source, "w:gz") as archive:
        for name, data in (("r/config.yaml", b"a"), (run_archive.MANIFEST, b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(ArchiveError, match="does not begin with a readable rpm_state.json"):
        run_archive.unpack(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unpack_refuses_places_taken_by_other_things_and_writes_nothing(tmp_path: Path) -> None:
    source = _archive(tmp_path / "s.tar.gz", {"r/config.yaml": b"a", "r/checkpoints/linear/last.ckpt": b"w"})
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ArchiveError, match="exists and is not a folder; --out names the folder"):
        run_archive.unpack(source, tmp_path / "file")
    (tmp_path / "a" / "r" / "config.yaml").mkdir(parents=True)
    with pytest.raises(ArchiveError, match="config.yaml exists and is not a regular file"):
        run_archive.unpack(source, tmp_path / "a", overwrite=True)
    (tmp_path / "b" / "r").mkdir(parents=True)
    (tmp_path / "b" / "r" / "checkpoints").write_text("mine")
    with pytest.raises(ArchiveError, match="checkpoints exists and is not a folder"):
        run_archive.unpack(source, tmp_path / "b", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "a").rglob("*")) == ["config.yaml", "r"]
    assert sorted(p.name for p in (tmp_path / "b").rglob("*")) == ["checkpoints", "r"]
    assert (tmp_path / "file").read_text() == "mine"


def _finish(run_dir: Path) -> None:
    """What a later slice adds to a run of :func:`_fake_run`: more history, and its end."""
    (run_dir / "history.csv").write_text("stage,epoch\npretrain,0\nlinear,0\nlinear,1\n")
    progress = json.loads((run_dir / "progress.json").read_text())
    progress["status"] = "finished"
    progress["stages"]["linear"].update(completed=True, global_step=8)
    (run_dir / "progress.json").write_text(json.dumps(progress))
    (run_dir / "metrics.json").write_text('{"test_accuracy": 0.5}')
    (run_dir / "predictions.npz").write_bytes(b"npz")
    (run_dir / "predictions_other.npz").write_bytes(b"npz")


def test_overwrite_replaces_a_run_as_a_whole_and_names_one_that_had_gone_further(tmp_path: Path) -> None:
    run, other = tmp_path / "batch" / "a", tmp_path / "batch" / "b"
    _fake_run(run, "unfinished")
    run_archive.pack(tmp_path / "batch", tmp_path / "old.tar.gz")
    history = (run / "history.csv").read_text()
    _finish(run)
    _fake_run(other, "finished")  # a run the archive does not name
    with pytest.raises(ArchiveError, match="exists; unpack into an empty folder or pass --overwrite"):
        run_archive.unpack(tmp_path / "old.tar.gz", tmp_path / "batch")
    warnings: list[str] = []
    run_archive.unpack(tmp_path / "old.tar.gz", tmp_path / "batch", overwrite=True, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith(f"{run}: the run here had gone further (finished")
    assert "than the archive's (unfinished" in warnings[0]
    assert (run / "history.csv").read_text() == history
    assert json.loads((run / "progress.json").read_text())["status"] == "unfinished"
    # Nothing of the finished state survives to contradict the restored one; notebooks and other runs stay.
    assert not any((run / name).exists() for name in ("metrics.json", "predictions.npz", "predictions_other.npz"))
    assert not (run / "checkpoints" / "pretrain" / "last.ckpt").exists()  # not part of the packed state
    assert (run / "checkpoints" / "linear" / "last.ckpt").is_file() and (run / "03_train.ipynb").is_file()
    assert (other / "metrics.json").is_file() and (other / "checkpoints" / "linear" / "best.ckpt").is_file()
    assert not list(tmp_path.rglob("*partial*"))


def test_unpack_refuses_a_run_without_its_config_rather_than_keep_the_replaced_run_s(tmp_path: Path) -> None:
    # found: with --overwrite the replaced run's config.yaml stayed beside the archive's resume point
    run = tmp_path / "batch" / "r"
    _fake_run(run, "unfinished")
    (run / "config.yaml").write_text("setup: mlcl\nseed: 99\n")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    source = _archive(tmp_path / "s.tar.gz", {"r/progress.json": b'{"status": "unfinished", "stages": {}}',
                                              "r/checkpoints/pretrain/last.ckpt": b"w"})
    with pytest.raises(ArchiveError) as caught:
        run_archive.unpack(source, tmp_path / "batch", overwrite=True)
    assert str(caught.value) == (f"{source}: run 'r' has no config.yaml (pack never leaves it out, and a run state "
                                 "without its config cannot be resumed safely); damaged or altered archive; refusing "
                                 "to unpack")
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_keep_further_keeps_a_run_that_went_further_and_restores_the_others(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # A second slice on a machine still holding the first slice's runs, carrying the state from before the first.
    ahead, behind = tmp_path / "batch" / "a", tmp_path / "batch" / "b"
    _fake_run(ahead, "unfinished")
    _fake_run(behind, "unfinished")
    run_archive.pack(tmp_path / "batch", tmp_path / "old.tar.gz")
    packed_history = (behind / "history.csv").read_text()
    _finish(ahead)
    shutil.rmtree(ahead / "checkpoints" / "linear")  # its final weights moved elsewhere: the archive has that folder
    finished_files = {p.relative_to(ahead): p.read_bytes() for p in ahead.rglob("*") if p.is_file()}
    (behind / "history.csv").write_text("stage,epoch\n")  # this one lost an epoch here: the archive's wins
    with pytest.raises(ArchiveError, match="applies with --overwrite"):
        run_archive.unpack(tmp_path / "old.tar.gz", tmp_path / "batch", keep_further=True)
    notes: list[str] = []
    run_archive.unpack(tmp_path / "old.tar.gz", tmp_path / "batch", overwrite=True, keep_further=True,
                       warn=notes.append)
    assert notes == [f"{ahead}: the run here had gone further (finished, 8 steps, 3 epochs) than the archive's "
                     f"(unfinished, 0 steps, 1 epochs); kept (--keep-further)"], notes
    assert {p.relative_to(ahead): p.read_bytes() for p in ahead.rglob("*") if p.is_file()} == finished_files
    assert not [p for p in ahead.rglob("*") if p.is_dir() and not any(p.iterdir())]  # no folder made for it
    assert (behind / "history.csv").read_text() == packed_history
    assert not list(tmp_path.rglob("*partial*"))
    # the command line: a note, not a warning, and the same refusal without --overwrite
    from rpm_lib import batch

    assert batch.main(["unpack", str(tmp_path / "old.tar.gz"), "--out", str(tmp_path / "batch"), "--overwrite",
                       "--keep-further"]) == 0
    assert f"rpm-batch unpack: note: {ahead}: the run here had gone further" in capsys.readouterr().err
    assert batch.main(["unpack", str(tmp_path / "old.tar.gz"), "--out", str(tmp_path / "new"),
                       "--keep-further"]) == 2
    assert "applies with --overwrite" in capsys.readouterr().err


def test_overwrite_without_a_stale_file_asks_and_an_identical_state_keeps_final_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _fake_run(run, "finished")
    run_archive.pack(run, tmp_path / "state.tar.gz")
    # A folder that holds only a result of another run: restoring beside it would leave the two mixed.
    (tmp_path / "stale").mkdir()
    (tmp_path / "stale" / "metrics.json").write_text("{}")
    with pytest.raises(ArchiveError, match="metrics.json exists; unpack into an empty folder"):
        run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "stale")
    # The campaign unpacks the state it has just packed over the same folder: the final weights stay.
    warnings: list[str] = []
    run_archive.unpack(tmp_path / "state.tar.gz", run, overwrite=True, warn=warnings.append)
    assert warnings == [] and (run / "checkpoints" / "linear" / "best.ckpt").is_file()


# ----------------------------------------------------------------------------------------------
# the command line: one line, exit 2, nothing left behind
# ----------------------------------------------------------------------------------------------
def _one_error_line(capsys: pytest.CaptureFixture[str], command: str, names: Path) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rpm-batch {command}: error: ") and str(names) in err[0], err
    return err[0]


def test_pack_out_must_be_a_writable_file_and_replaces_only_its_own_archives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_run(tmp_path / "run", "finished")
    (tmp_path / "folder").mkdir()
    assert batch.main(["pack", str(tmp_path / "run"), "--out", str(tmp_path / "folder")]) == 2
    _one_error_line(capsys, "pack", tmp_path / "folder")
    assert list((tmp_path / "folder").iterdir()) == [] and not list(tmp_path.glob(".*partial"))
    (tmp_path / "a_file").write_text("x")
    out = tmp_path / "a_file" / "s.tar.gz"  # its folder cannot be made (like /proc/s.tar.gz)
    assert batch.main(["pack", str(tmp_path / "run"), "--out", str(out)]) == 2
    _one_error_line(capsys, "pack", out)
    (tmp_path / "notes.txt").write_text("mine")
    assert batch.main(["pack", str(tmp_path / "run"), "--out", str(tmp_path / "notes.txt")]) == 2
    assert "is not an archive written by rpm-batch pack" in _one_error_line(capsys, "pack", tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    for _ in range(2):  # re-packing over its own archive is the campaign's every slice
        assert batch.main(["pack", str(tmp_path / "run"), "--out", str(tmp_path / "s.tar.gz")]) == 0
    assert run_archive.read_manifest(tmp_path / "s.tar.gz")["runs"][0]["path"] == "."
    assert not list(tmp_path.rglob("*partial*"))


def test_unpack_cli_one_line_for_foreign_files_and_a_warning_line_for_rollbacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import zipfile

    (tmp_path / "empty.tar.gz").write_bytes(b"")
    (tmp_path / "random.tar.gz").write_bytes(bytes(range(256)) * 8)
    with zipfile.ZipFile(tmp_path / "zip.tar.gz", "w") as archive:
        archive.writestr("config.yaml", "a")
    for name in ("empty.tar.gz", "random.tar.gz", "zip.tar.gz"):
        assert batch.main(["unpack", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        _one_error_line(capsys, "unpack", tmp_path / name)
    _fake_run(tmp_path / "run", "unfinished")
    assert batch.main(["pack", str(tmp_path / "run"), "--out", str(tmp_path / "s.tar.gz")]) == 0
    assert batch.main(["unpack", str(tmp_path / "s.tar.gz"), "--out", str(tmp_path / "s.tar.gz")]) == 2
    _one_error_line(capsys, "unpack", tmp_path / "s.tar.gz")
    assert not (tmp_path / "o").exists()
    _finish(tmp_path / "run")
    assert batch.main(["unpack", str(tmp_path / "s.tar.gz"), "--out", str(tmp_path / "run"), "--overwrite"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rpm-batch unpack: warning: {tmp_path / 'run'}: the run here had gone")


def test_unpack_refuses_to_write_through_a_symbolic_link_already_in_the_folder(tmp_path: Path) -> None:
    # a run folder there that is a link to elsewhere would have had the archive's files written outside it: the
    # link is named (tarfile's data filter, which resolves each member's place, would blame the archive)
    source = _archive(tmp_path / "s.tar.gz", {"r/config.yaml": b"a"})
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "r").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ArchiveError, match="a symbolic link; unpack writes and removes nothing through a link") as error:
        run_archive.unpack(source, tmp_path / "out", overwrite=True)
    assert str(error.value).startswith(f"{tmp_path / 'out' / 'r'}: ") and "\n" not in str(error.value)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def _tree(folder: Path) -> dict[str, str | bytes | None]:
    """Every path below ``folder`` (links not followed) with its bytes (None: a folder; a link: where it leads)."""
    return {str(p.relative_to(folder)): (f"-> {os.readlink(p)}" if p.is_symlink() else None if p.is_dir()
                                         else p.read_bytes()) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("link", ["grid/r", "grid", "grid/r/checkpoints", "grid/r/checkpoints/linear",
                                  "grid/r/history.csv", "grid/r/checkpoints/linear/last.ckpt",
                                  "grid/r/.config.yaml.unpack-partial"])
def test_unpack_overwrite_refuses_a_link_below_out_and_leaves_its_target_as_it_was(tmp_path: Path,
                                                                                 link: str) -> None:
    # found: with --overwrite a run folder (or the grid folder above it, or its checkpoints folder) linked to a
    # folder outside --out had the archive's files written there and the replaced run's other files removed there
    batch_dir, target = tmp_path / "batch", tmp_path / "outside"
    run = batch_dir / "grid" / "r"
    _fake_run(run, "finished")
    run_archive.pack(batch_dir, tmp_path / "s.tar.gz")
    (run / "history.csv").write_text("stage,epoch\n")  # no longer the archive's state: --overwrite replaces it
    place = batch_dir / link
    if place.suffix in (".csv", ".ckpt", ".unpack-partial"):
        target.mkdir()
        (target / "file").write_bytes(b"not to be written through")
        place.unlink(missing_ok=True)
        place.symlink_to(target / "file")
    else:
        shutil.move(place, target)  # the folder moved out of --out, a link to it left in its place
        place.symlink_to(target, target_is_directory=True)
    outside, inside = _tree(target), _tree(batch_dir)
    assert outside
    with pytest.raises(ArchiveError, match="a symbolic link; unpack writes and removes nothing") as error:
        run_archive.unpack(tmp_path / "s.tar.gz", batch_dir, overwrite=True)
    assert str(error.value).startswith(f"{place}: ") and str(error.value).endswith("nothing unpacked")
    assert "\n" not in str(error.value)
    assert _tree(target) == outside and _tree(batch_dir) == inside
    assert batch.main(["unpack", str(tmp_path / "s.tar.gz"), "--out", str(batch_dir), "--overwrite"]) == 2
    assert _tree(target) == outside and _tree(batch_dir) == inside
    # the link replaced by a real folder (or file): the same archive unpacks
    place.unlink()
    run_archive.unpack(tmp_path / "s.tar.gz", batch_dir, overwrite=True)
    assert (batch_dir / "grid" / "r" / "metrics.json").is_file() and _tree(target) == outside


def test_unpack_refuses_members_that_tarfile_s_data_filter_refuses(tmp_path: Path) -> None:
    # a device file and a hard link, each listed nowhere: refused as what they are, before the manifest is asked
    device = tarfile.TarInfo("r/config.yaml")
    device.type = tarfile.CHRTYPE
    hard = tarfile.TarInfo("r/history.csv")
    hard.type, hard.linkname = tarfile.LNKTYPE, "r/config.yaml"
    for info in (device, hard):
        with pytest.raises(ArchiveError, match=f"member '{info.name}' is not a regular file; refusing to unpack"):
            run_archive.unpack(_archive(tmp_path / "bad.tar.gz", {}, {}, extra=[info]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# one archive per run: a chosen subset packed and unpacked
# ----------------------------------------------------------------------------------------------
def test_pack_with_chosen_runs_packs_only_those_under_their_batch_paths(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # a campaign commits one archive per run, so that a run that did not change adds nothing to its history
    _fake_run(tmp_path / "batch" / "main" / "a", "unfinished")
    _fake_run(tmp_path / "batch" / "main" / "b", "finished")
    runs = run_archive.pack(tmp_path / "batch", tmp_path / "b.tar.gz", runs=["main/b/"])
    assert [(r.path, r.status) for r in runs] == [("main/b", "finished")]
    manifest = run_archive.read_manifest(tmp_path / "b.tar.gz")
    assert [r["path"] for r in manifest["runs"]] == ["main/b"] and all(n.startswith("main/b/") for n in manifest["files"])
    run_archive.pack(tmp_path / "batch", tmp_path / "all.tar.gz")  # its files are those of the whole folder's
    whole = run_archive.read_manifest(tmp_path / "all.tar.gz")
    assert {n: f for n, f in whole["files"].items() if n.startswith("main/b/")} == manifest["files"]
    run_archive.unpack(tmp_path / "b.tar.gz", tmp_path / "restored")  # rpm-batch unpack X --out <batch folder>
    assert sorted(p.name for p in (tmp_path / "restored" / "main").iterdir()) == ["b"]
    assert batch.main(["pack", str(tmp_path / "batch"), "--run", "main/a", "--run", "main/b",
                       "--out", str(tmp_path / "ab.tar.gz")]) == 0
    assert [r["path"] for r in run_archive.read_manifest(tmp_path / "ab.tar.gz")["runs"]] == ["main/a", "main/b"]
    capsys.readouterr()


def test_pack_refuses_a_run_that_is_not_there_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_run(tmp_path / "batch" / "main" / "a", "unfinished")
    (tmp_path / "batch" / "main" / "empty").mkdir()  # no run state: nothing to pack either
    for wrong in ("main/c", "main/empty", "a"):
        with pytest.raises(ArchiveError, match=f"no run folder '{wrong}' to pack \\(the runs there: main/a\\)"):
            run_archive.pack(tmp_path / "batch", tmp_path / "s.tar.gz", runs=["main/a", wrong])
    with pytest.raises(ArchiveError, match="no run chosen"):
        run_archive.pack(tmp_path / "batch", tmp_path / "s.tar.gz", runs=[])
    assert batch.main(["pack", str(tmp_path / "batch"), "--run", "main/c", "--out", str(tmp_path / "s.tar.gz")]) == 2
    line = _one_error_line(capsys, "pack", tmp_path / "batch")
    assert "'main/c'" in line and "Traceback" not in line
    assert not list(tmp_path.glob("*.tar.gz")) and not list(tmp_path.glob(".*partial"))


def test_packing_a_restored_run_again_gives_the_same_files(tmp_path: Path) -> None:
    # A campaign records a run's archive only when the SHA-256 of one of its files changed: packing an unchanged
    # run again, as every slice does (its checkpoints loaded and saved again by --compact and the best weights'
    # reduction), must give the same bytes, or every slice would add every run again.
    _fake_run(tmp_path / "batch" / "main" / "a", "unfinished")
    run_archive.pack(tmp_path / "batch", tmp_path / "first.tar.gz", compact=True)
    run_archive.unpack(tmp_path / "first.tar.gz", tmp_path / "restored")
    run_archive.pack(tmp_path / "restored", tmp_path / "again.tar.gz", compact=True, runs=["main/a"])
    first, again = (run_archive.read_manifest(tmp_path / name) for name in ("first.tar.gz", "again.tar.gz"))
    assert any(name.endswith(".ckpt") for name in first["files"])
    assert again["files"] == first["files"]


def test_unpack_with_chosen_runs_restores_only_those_and_refuses_one_it_lacks(tmp_path: Path) -> None:
    # the campaign's base archive restores only the runs that no archive of their own replaces
    _fake_run(tmp_path / "batch" / "main" / "a", "unfinished")
    _fake_run(tmp_path / "batch" / "main" / "b", "finished")
    run_archive.pack(tmp_path / "batch", tmp_path / "state.tar.gz")
    out = tmp_path / "out"
    run_archive.unpack(tmp_path / "state.tar.gz", out, runs=["main/b"])
    assert sorted(p.name for p in (out / "main").iterdir()) == ["b"] and not list(out.rglob("*partial*"))
    with pytest.raises(ArchiveError, match=r"state.tar.gz: holds no run 'main/c' \(its runs: main/a, main/b\)"):
        run_archive.unpack(tmp_path / "state.tar.gz", tmp_path / "other", runs=["main/a", "main/c"])
    assert not (tmp_path / "other").exists()
    run_archive.unpack(tmp_path / "state.tar.gz", out, runs=["main/a"])  # the other one, beside it
    assert sorted(p.name for p in (out / "main").iterdir()) == ["a", "b"]


# ----------------------------------------------------------------------------------------------
# hostile archives: a manifest nested 100,000 deep, control characters in what is printed
# ----------------------------------------------------------------------------------------------
def test_unpack_refuses_a_deeply_nested_manifest_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    deep = b'{"format": "rpm_lib-run-state", "version": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    source = _archive(tmp_path / "deep.tar.gz", {"r/config.yaml": b"a"}, manifest_text=deep)
    with pytest.raises(ArchiveError) as caught:
        run_archive.read_manifest(source)
    assert str(caught.value) == (f"{source}: rpm_state.json: nested deeper than 200 levels; not a record this tool "
                                 "writes; not an rpm-batch pack archive")
    assert batch.main(["unpack", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "nested deeper than 200 levels" in _one_error_line(capsys, "unpack", source)
    assert not (tmp_path / "out").exists()
    source = _archive(tmp_path / "list.tar.gz", {"r/config.yaml": b"a"}, manifest_text=b"[1]")
    with pytest.raises(ArchiveError, match="rpm_state.json: expected a JSON object, got list"):
        run_archive.read_manifest(source)


def test_unpack_refuses_a_member_150000_folders_deep_at_once_in_one_line(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # found: 68 s to refuse (the check of members below members walked every parent of every name)
    deep = "a/" * 150_000 + "config.yaml"
    source = _archive(tmp_path / "deep.tar.gz", {deep: b"setup: ce\n"})
    began = time.perf_counter()
    with pytest.raises(ArchiveError) as caught:
        run_archive.read_manifest(source)
    assert time.perf_counter() - began < 2.0
    assert str(caught.value) == (f"{source}: member name {shown_value(deep, 200)} has {len(deep)} "
                                 "characters (at most 1024); refusing to unpack")
    assert batch.main(["unpack", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "characters (at most 1024)" in _one_error_line(capsys, "unpack", source)
    assert not (tmp_path / "out").exists()


def test_unpack_prints_the_archive_s_created_text_escaped_and_cut(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    created = "2026-11-28T10:00:00Z\x1b[2J\x1b]0;owned\x07\r\n" + "x" * 10_000
    source = _archive(tmp_path / "s.tar.gz", {"r/config.yaml": b"setup: mlcl\n"}, created=created)
    shown = "2026-11-28T10:00:00Z\\x1b[2J\\x1b]0;owned\\x07\\r\\n" + "x" * 30 + "..."
    assert run_archive.read_manifest(source)["created"] == shown and len(shown) == 80
    assert batch.main(["unpack", str(source), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and out.count("\n") == 1
    assert out.endswith(f"(packed {shown})\n")
    source = _archive(tmp_path / "n.tar.gz", {"r/config.yaml": b"a"}, created=4242)
    assert run_archive.read_manifest(source)["created"] == "?"


def test_unpack_refuses_a_run_folder_name_with_control_characters(tmp_path: Path) -> None:
    source = _archive(tmp_path / "s.tar.gz", {"r\x1b[2J/config.yaml": b"a"})
    with pytest.raises(ArchiveError) as caught:
        run_archive.unpack(source, tmp_path / "out")
    assert str(caught.value) == f"{source}: unsafe member name 'r\\x1b[2J/config.yaml'; refusing to unpack"
    assert not (tmp_path / "out").exists()
