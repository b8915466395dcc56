"""A run's stage plans: each stage kind of :mod:`rpm_lib.training.setups` built from a :class:`TrainConfig`.

:func:`stage_plan` lists the :class:`StagePlan` of every stage a config runs (the setup's stages, then
``finetune`` with ``config.finetune``); :func:`within_total_epochs` cuts them to ``max_total_epochs``;
:func:`protocol_of` says what the final weights of a run measure; :func:`trained_objectives` says which
objectives (and so which heads, :mod:`rpm_lib.training.objectives`) a run's model needs.
A new stage kind is a :data:`rpm_lib.training.setups.STAGE_KINDS` entry plus its builder in :data:`STAGE_BUILDERS`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rpm_lib.training.config import TrainConfig
from rpm_lib.training.objectives import OBJECTIVES
from rpm_lib.training.setups import SETUPS, STAGE_KINDS, STAGES, SetupSpec, StagePlan


def setup_weights(config: TrainConfig, spec: SetupSpec) -> dict[str, float]:
    """The weights of the setup's objectives (``SetupSpec.objectives``), from their config fields."""
    weights = {}
    for name in spec.objectives:
        field = OBJECTIVES[name].weight_field
        weights[name] = 1.0 if field is None else getattr(config, field)
    return weights


def _supervised(config: TrainConfig, spec: SetupSpec) -> StagePlan:
    return StagePlan(
        name="supervised", max_epochs=config.max_epochs, lr=config.lr, batch_size=config.batch_size,
        train_encoder=True, weights={"answer": 1.0, **setup_weights(config, spec)}, num_views=spec.num_views,
        augment=config.resolved_augment,
    )


def _pretrain(config: TrainConfig, spec: SetupSpec) -> StagePlan:
    return StagePlan(
        name="pretrain", max_epochs=config.max_epochs, lr=config.lr, batch_size=config.batch_size,
        train_encoder=True, weights=setup_weights(config, spec), num_views=spec.num_views,
        augment=config.resolved_augment,
        bn_recalibration="before_validation" if config.bn_recalibration_batches > 0 else "none",
    )


def _linear(config: TrainConfig, spec: SetupSpec) -> StagePlan:
    pretrain_views = config.head_views == "pretrain"
    encoder_eval = config.linear_eval_encoder_mode == "eval"
    return StagePlan(
        name="linear", max_epochs=config.linear_eval_epochs or config.max_epochs,
        lr=config.linear_eval_lr or config.lr, batch_size=config.linear_eval_batch_size or config.batch_size,
        train_encoder=False, weights={"answer": 1.0},
        num_views=spec.num_views if pretrain_views else 1,
        augment=config.resolved_augment if pretrain_views else "none",
        reset_scoring_head=True, encoder_train_mode=not encoder_eval,
        # a frozen encoder in train mode normalises with batch statistics: nothing to re-estimate
        bn_recalibration="at_start" if config.bn_recalibration_batches > 0 and encoder_eval else "none",
        # fixed embeddings: a frozen encoder in eval mode on one un-augmented view
        cached_features=config.linear_eval_feature_cache and encoder_eval and not pretrain_views,
    )


def _finetune(config: TrainConfig, spec: SetupSpec) -> StagePlan:
    return StagePlan(
        name="finetune", max_epochs=config.finetune_epochs or config.max_epochs, lr=config.finetune_lr,
        batch_size=config.batch_size, train_encoder=True, weights={"answer": 1.0},
        num_views=spec.num_views if config.head_views == "pretrain" else 1, augment=config.resolved_augment,
    )


#: Stage kind -> its plan from a config and the run's setup.
STAGE_BUILDERS: dict[str, Callable[[TrainConfig, SetupSpec], StagePlan]] = {
    "supervised": _supervised, "pretrain": _pretrain, "linear": _linear, "finetune": _finetune,
}
assert tuple(STAGE_BUILDERS) == STAGES, "every stage kind needs a builder"


def stage_plan(config: TrainConfig) -> list[StagePlan]:
    """The stages ``config`` runs, in order."""
    spec = SETUPS[config.setup]
    names = [*spec.stages, *(["finetune"] if config.finetune else [])]
    return [STAGE_BUILDERS[name](config, spec) for name in names]


def trained_objectives(config: TrainConfig) -> list[str]:
    """The objectives some stage of ``config`` trains (weight > 0), in registry order: the model's heads."""
    weights = [plan.weights for plan in stage_plan(config)]
    return [name for name in OBJECTIVES if any(w.get(name, 0.0) > 0 for w in weights)]


def within_total_epochs(plan: StagePlan, epochs_done: int, config: TrainConfig) -> StagePlan | None:
    """``plan`` with its epoch limit cut to what ``max_total_epochs`` leaves after ``epochs_done`` epochs of
    earlier stages; ``None`` when nothing is left (the stage does not run). Unchanged without a total limit."""
    if config.max_total_epochs is None:
        return plan
    left = config.max_total_epochs - epochs_done
    if left <= 0:
        return None
    return dataclasses.replace(plan, max_epochs=min(plan.max_epochs, left))


def protocol_of(config: TrainConfig, stages_run: list[str]) -> str:
    """The :data:`~rpm_lib.training.setups.PROTOCOLS` entry of a run whose stages ``stages_run`` (names, in order)
    trained: the protocol of the last of them (of the setup's first stage when none trained)."""
    last = stages_run[-1] if stages_run else SETUPS[config.setup].stages[0]
    return STAGE_KINDS[last].protocol
