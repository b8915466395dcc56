"""Validation logs each term once per epoch from device-side sums; the values equal those of the per-batch
``self.log`` calls it replaced (``experiments/gpu-profile/bench_validation_logging.py`` holds that old module
and times both)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_per_epoch_validation_logging_equals_the_per_batch_logging_it_replaced(tiny_iraven: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "bench_validation_logging", REPO / "experiments" / "gpu-profile" / "bench_validation_logging.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = bench.main(["--rounds", "1", "--data-root", str(tiny_iraven)])
    assert status == 0, printed.getvalue()
    assert "logged metrics equal: True" in printed.getvalue()
    assert "| per epoch (now) | 4 |" in printed.getvalue()  # loss, answer, aux, accuracy: once each
