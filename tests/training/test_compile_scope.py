"""``compile=true``: ``compile_scope`` says what is compiled (the encoder in place, or the whole forward of a step),
``compile_mode`` how. Here the compiler's backend runs the captured graphs eagerly (no code generation on the CPU
test machine), so the runs must give exactly the eager numbers, and the graphs captured say what was compiled."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.run import train


class CountingCompiler:
    """Stands in for ``torch.compile``: records what is compiled and with which mode, counts the graphs captured,
    and runs every graph as it was traced."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, str | None]] = []
        self.graphs = 0
        self.real = torch.compile

    def backend(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        return graph.forward

    def __call__(self, model: Callable[..., Any], *, mode: str | None = None, **options: Any) -> Callable[..., Any]:
        self.compiled.append((getattr(model, "__name__", type(model).__name__), mode))
        return self.real(model, backend=self.backend)


@pytest.fixture
def compiler(monkeypatch: pytest.MonkeyPatch) -> CountingCompiler:
    torch._dynamo.reset()
    counting = CountingCompiler()
    monkeypatch.setattr(torch, "compile", counting)
    yield counting
    torch._dynamo.reset()


def _history(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "history.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("setup, epochs", [("ce_aux_sparse", 2), ("mlcl_aug", 1)])  # MLCL+AUG: 2 stages, 2 views
def test_the_compiled_step_trains_exactly_as_the_eager_one(tiny_config, tmp_path, compiler, setup, epochs):
    fields = dict(setup=setup, max_epochs=epochs, max_steps=-1, limit_train_batches=2, limit_val_batches=2,
                  linear_eval_epochs=1, bn_recalibration_batches=2)
    eager = train(tiny_config(run_dir=str(tmp_path / "eager"), **fields))
    assert compiler.compiled == [] and compiler.graphs == 0
    compiled = train(tiny_config(run_dir=str(tmp_path / "compiled"), compile=True, compile_scope="step", **fields))
    # One function compiled (per stage's module): the step's forward, never the encoder alone.
    assert {name for name, _mode in compiler.compiled} == {"_stage_losses"}
    assert all(mode is None for _name, mode in compiler.compiled)
    assert compiler.graphs > 0
    for key in ("test_accuracy", "val_accuracy"):
        assert compiled[key] == eager[key], key
    eager_rows, compiled_rows = _history(tmp_path / "eager"), _history(tmp_path / "compiled")
    assert len(compiled_rows) == len(eager_rows) >= 2
    for eager_row, compiled_row in zip(eager_rows, compiled_rows):
        assert eager_row["train_loss"] and eager_row["val_loss"], eager_row
        for column in ("train_loss", "val_loss", "val_accuracy"):  # no accuracy in MLCL pre-training
            assert compiled_row[column] == eager_row[column], (column, eager_row, compiled_row)


@pytest.mark.parametrize("setup, cache, graphs", [("ce_aux_sparse", True, 2), ("mlcl_aug", False, 4),
                                                  ("mlcl_aug", True, 2)])
def test_a_step_is_one_graph_per_stage_and_mode_compiled_once(tiny_config, tmp_path, compiler, monkeypatch, setup,
                                                               cache, graphs):
    # The losses' value checks read tensors back to the host (a graph break) on the CPU only; on CUDA they are off.
    from rpm_lib.losses import cross_entropy, mlcl, rule

    for module in (cross_entropy, mlcl, rule):
        monkeypatch.setattr(module, "check_values", lambda tensor: False)
    fields = dict(setup=setup, compile=True, compile_scope="step", limit_val_batches=2, max_steps=-1,
                  limit_train_batches=3, linear_eval_epochs=1, bn_recalibration_batches=2,
                  linear_eval_feature_cache=cache)
    train(tiny_config(run_dir=str(tmp_path / "three"), max_epochs=3, **fields))
    # Training and validation, for each stage (MLCL+AUG: pre-training, linear evaluation): the whole forward in one
    # graph each, made in the first epoch and reused by every other batch (other problems, answer orders) and epoch.
    # With cached embeddings, linear evaluation trains its head outside the compiled forward: no graph of its own.
    assert compiler.graphs == graphs


def test_reduce_overhead_marks_every_step_for_cuda_graphs(tiny_config, tmp_path, compiler, monkeypatch):
    marks: list[bool] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(True))
    calls: list[bool] = []
    from rpm_lib.training.module import RpmModule

    original = RpmModule._stage_losses

    def counted(self, *args):
        calls.append(True)
        return original(self, *args)

    monkeypatch.setattr(RpmModule, "_stage_losses", counted)
    train(tiny_config(setup="ce", compile=True, compile_scope="step", compile_mode="reduce-overhead", max_steps=3))
    assert {mode for _name, mode in compiler.compiled} == {"reduce-overhead"}
    # Every call of the compiled step (training and validation batches) begins a CUDA-graph step; a graph's
    # function body runs only while it is captured, so there are at least as many marks as traced calls.
    assert len(marks) >= 3 + 1 and len(marks) >= len(calls)


def test_the_encoder_scope_compiles_the_encoder_in_place(tiny_config, compiler):
    train(tiny_config(setup="ce", compile=True, compile_mode="reduce-overhead"))
    assert compiler.compiled == [("_call_impl", "reduce-overhead")]


def test_unknown_scope_or_mode_is_one_line_naming_the_field(tiny_iraven):
    for field, value in (("compile_scope", "heads"), ("compile_mode", "max-autotune")):
        with pytest.raises(ConfigError, match=field):
            TrainConfig(data_root=str(tiny_iraven), **{field: value})
