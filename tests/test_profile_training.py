"""`bench/profile_training.py` on a tiny CPU config: the three measured cases (encoder only, manual loop with the
real DataLoader, Lightning fit) report positive speeds, the CUDA-only parts say they were skipped, and a bad
override is one `error:` line with exit status 2, so the GPU profiler cannot rot between lent-GPU sessions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "profile_training.py"
SKIPPED = "skipped on CPU (no CUDA)"


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=timeout)


def tiny(tmp_path: Path) -> list[str]:
    """The tiny CPU config; the data are generated inside tmp_path by the config's generate=true."""
    return [f"data_root={tmp_path / 'iraven'}", "generate=true", "generate_num_per_config=10", "image_size=32",
            "batch_size=4", "max_epochs=1", "num_workers=0", "progress_bar=false", "accelerator=cpu", "encoder=scl",
            "setup=ce_aux_sparse"]


def test_tiny_cpu_profile_measures_three_cases_and_marks_the_cuda_parts_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # one torch thread: on a shared 2-core machine two threads make the timings (not the checks) erratic
    # matmul_precision: the setting bench/gpu_session.sh's fp32_tf32 profile uses, set for the bare steps too
    done = _run(["--steps", "3", "--warmup", "1", "--threads", "1", "--out", str(out), *tiny(tmp_path),
                 "matmul_precision=high"], timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "profile.json").read_text())
    assert report["float32_matmul_precision"] == "high"
    cases = report["cases"]
    for key in ("encoder_only", "manual_loop", "lightning_fit"):
        assert cases[key]["status"] == "ok", cases[key]
        assert cases[key]["rpms_per_s"] > 0 and cases[key]["ms_per_step"] > 0
        assert cases[key].get("steps", 3) == 3
    assert cases["manual_loop"]["loader_wait_ms_per_step"] >= 0
    fit = cases["lightning_fit"]
    assert fit["validation"]["batches"] >= 1 and fit["host_actions_ms_per_step"]
    assert cases["encoder_only_compiled"]["status"] == "skipped"
    assert cases["lightning_fit_synced"] == {"status": "skipped", "reason": SKIPPED}
    profiled = cases["lightning_profiled"]
    assert profiled["status"] == "ok" and len(profiled["top_cpu_ops"]) == 15
    for key in ("gpu_busy_fraction", "sync_calls_per_step", "sync_debug", "chrome_trace"):
        assert profiled[key] == {"status": "skipped", "reason": SKIPPED}, key
    assert not list(out.glob("trace_lightning.json*"))
    assert any(line.startswith("Lightning overhead (c - b): ") for line in report["verdict"])
    assert "| c. Lightning fit (make_trainer) |" in done.stdout and SKIPPED in done.stdout


def test_a_bad_override_is_one_error_line_naming_the_field_and_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _run(["--out", str(out), *tiny(tmp_path), "batch_size=-1"], timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("profile_training: error: "), done.stderr
    assert "batch_size" in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not out.exists() and not (tmp_path / "iraven").exists()  # refused before generating or writing


def test_whole_step_compilation_captures_the_step_on_the_cpu(tmp_path: Path) -> None:
    # aot_eager traces the forward and AOTAutograd's backward without generating code: the whole-step case works,
    # quickly; the speed of the generated code is a GPU measurement (docs/reproduction-gpu.md).
    out = tmp_path / "out"
    done = _run(["--steps", "2", "--warmup", "1", "--threads", "1", "--cases", "a", "--compile", "--compile-step",
                 "--compile-backend", "aot_eager", "--out", str(out), *tiny(tmp_path)], timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cases = json.loads((out / "profile.json").read_text())["cases"]
    for key in ("encoder_only", "encoder_only_compiled", "step_compiled"):
        assert cases[key]["status"] == "ok" and cases[key]["ms_per_step"] > 0, cases[key]
    assert cases["step_compiled_cudagraphs"] == {"status": "skipped", "reason": "CUDA graphs need CUDA and inductor"}
    assert "| a. whole forward (stage_losses) compiled |" in done.stdout
