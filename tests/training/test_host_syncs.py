"""No per-step device-to-host read from the library's logging: on a GPU every such read makes the host wait for
the step to finish before it can queue the next one (a GPU idled ~45 % of each step when it did).

Counted on the CPU: the ``Tensor.item`` calls made inside Lightning's logger connector (where logged values are
converted for the progress bar and loggers) do not grow with the number of steps when there is no progress bar.
"""
from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest
import torch

from rpm_lib.training import trainer as trainer_module
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.run import train


def _logging_reads(monkeypatch: pytest.MonkeyPatch, config: TrainConfig) -> int:
    original = torch.Tensor.item
    count = 0

    def counting_item(self: torch.Tensor):  # type: ignore[no-untyped-def]
        nonlocal count
        frame = sys._getframe(1)
        while frame is not None:
            if "logger_connector" in frame.f_code.co_filename:
                count += 1
                break
            frame = frame.f_back
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(torch.Tensor, "item", counting_item)
        train(config)
    return count


def test_logging_reads_no_value_back_per_step_without_a_progress_bar(tiny_config: Callable[..., TrainConfig],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def reads(steps: int, progress_bar: bool) -> int:
        config = tiny_config(setup="ce_aux_sparse", max_steps=steps, progress_bar=progress_bar, log_every_n_steps=50,
                             run_dir=f"{tiny_config().run_dir}-{steps}-{progress_bar}")
        return _logging_reads(monkeypatch, config)

    assert reads(2, progress_bar=False) == reads(8, progress_bar=False)
    # The counter sees them: with a progress bar the step loss is read back every step (drawn here as on a terminal).
    monkeypatch.setattr(trainer_module, "progress_shown", lambda: True)
    assert reads(8, progress_bar=True) >= reads(2, progress_bar=True) + 6


def test_the_progress_bar_is_drawn_on_a_terminal_or_in_a_notebook_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's bar redraws every step on any stream: a SLURM or CI log filled with carriage returns
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not trainer_module.progress_shown()
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert trainer_module.progress_shown()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert trainer_module.progress_shown()
