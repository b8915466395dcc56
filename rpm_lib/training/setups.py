"""The paper's five training setups and the stages each one runs.

======================  =====================================================================
setup                   stages
======================  =====================================================================
``ce``                  supervised: encoder + scoring head, cross-entropy
``ce_aux_dense``        supervised: CE + beta * BCE(rule head, dense meta-target)
``ce_aux_sparse``       supervised: CE + beta * BCE(rule head, sparse-38 / sparse-50 code)
``mlcl``                pretrain: gamma * MLCL + beta * aux (encoder, projection, rule head);
                        linear: frozen encoder (eval mode), fresh linear scoring head, CE
``mlcl_aug``            as ``mlcl`` with two augmented views per RPM in pre-training
======================  =====================================================================

Any setup can append ``finetune`` (``config.finetune``): encoder + scoring head, answer loss only.
What a run's final weights measure is its *protocol* (:data:`PROTOCOLS`, :func:`protocol_of`): a contrastive
run that ends after linear evaluation reports the paper's Table 1 protocol; one that ran ``finetune`` reports a
fine-tuned encoder (the release's phase 3), which is never a Table 1 number.
Ablations are config values: ``beta=0`` (contrastive only), ``gamma=0`` (auxiliary only),
``negatives=none`` (no wrong completions in the MLCL denominator), sweeps over ``beta`` / ``batch_size``.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rpm_lib.training.config import TrainConfig

#: Stage names, in the order they run.
STAGES: tuple[str, ...] = ("supervised", "pretrain", "linear", "finetune")

#: What the final weights of a run measure, by the last stage that trained: ``linear_evaluation`` (frozen
#: pre-trained encoder + linear scoring head: the paper's protocol for the MLCL rows of Table 1),
#: ``fine_tuned`` (the encoder was trained end to end with the answer loss after pre-training: the release's
#: phase 3), ``supervised`` (a supervised setup trained end to end; the CE rows of Table 1),
#: ``untrained_head`` (``max_total_epochs`` ended a contrastive run before its scoring head trained: chance).
PROTOCOLS: tuple[str, ...] = ("linear_evaluation", "fine_tuned", "supervised", "untrained_head")


@dataclasses.dataclass(frozen=True)
class SetupSpec:
    """What a setup trains.

    Attributes:
        name: config value of ``setup``.
        label: the paper's name (Table 1 rows).
        auxiliary: uses the rule head and the auxiliary BCE loss (weight ``beta``).
        contrastive: MLCL pre-training followed by linear evaluation.
        rule_kind: ``"dense"``, ``"sparse"`` or ``None`` (no rules needed).
        num_views: views per RPM in the first stage (2 only for ``mlcl_aug``).
    """

    name: str
    label: str
    auxiliary: bool
    contrastive: bool
    rule_kind: str | None
    num_views: int


SETUPS: dict[str, SetupSpec] = {
    "ce": SetupSpec("ce", "CE", auxiliary=False, contrastive=False, rule_kind=None, num_views=1),
    "ce_aux_dense": SetupSpec("ce_aux_dense", "CE+AUX-dense", auxiliary=True, contrastive=False, rule_kind="dense",
                              num_views=1),
    "ce_aux_sparse": SetupSpec("ce_aux_sparse", "CE+AUX-sparse", auxiliary=True, contrastive=False,
                               rule_kind="sparse", num_views=1),
    "mlcl": SetupSpec("mlcl", "MLCL", auxiliary=True, contrastive=True, rule_kind="sparse", num_views=1),
    "mlcl_aug": SetupSpec("mlcl_aug", "MLCL+AUG", auxiliary=True, contrastive=True, rule_kind="sparse",
                          num_views=2),
}


#: When a stage re-estimates the encoder's BatchNorm statistics (``StagePlan.bn_recalibration``): ``none``;
#: ``before_validation`` (pre-training: the validation loss that picks the encoder for linear evaluation is
#: measured with statistics of the current weights on plain images); ``at_start`` (linear evaluation with the
#: frozen encoder in eval mode: once, before the scoring head trains; the statistics then stay fixed).
BN_RECALIBRATIONS: tuple[str, ...] = ("none", "before_validation", "at_start")


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One ``Trainer.fit`` call.

    Attributes:
        name: one of :data:`STAGES`.
        max_epochs: epoch limit (early stopping may end it sooner).
        lr: Adam learning rate (the optimiser is rebuilt at every stage).
        batch_size: RPMs per step per device.
        train_encoder: encoder parameters are optimised; otherwise frozen *and* in eval mode.
        answer_weight: weight of the answer loss (CE) on the scoring head; 0 = scoring head frozen.
        aux_weight: weight of the rule BCE loss (0 = rule head unused).
        contrastive_weight: weight of the MLCL loss (0 = projection head unused).
        num_views: views per RPM (2 = two augmented views).
        augment: augmentation recipe for training batches (``"none"`` = identity).
        reset_scoring_head: re-initialise the scoring head before the stage (linear evaluation).
        encoder_train_mode: a frozen encoder stays in train mode (BatchNorm uses batch statistics and updates
            its running ones), as the release's head training; otherwise a frozen encoder is in eval mode.
        bn_recalibration: when the encoder's BatchNorm statistics are re-estimated on un-augmented training
            batches (:mod:`rpm_lib.training.batchnorm`): one of :data:`BN_RECALIBRATIONS`.
        cached_features: the frozen encoder's embeddings are computed once when the stage starts and the head
            trains on them (:mod:`rpm_lib.training.feature_cache`).
    """

    name: str
    max_epochs: int
    lr: float
    batch_size: int
    train_encoder: bool
    answer_weight: float
    aux_weight: float
    contrastive_weight: float
    num_views: int
    augment: str
    reset_scoring_head: bool = False
    encoder_train_mode: bool = False
    bn_recalibration: str = "none"
    cached_features: bool = False

    @property
    def trains_scoring_head(self) -> bool:
        return self.answer_weight > 0

    @property
    def trains_rule_head(self) -> bool:
        return self.aux_weight > 0

    @property
    def trains_projection_head(self) -> bool:
        return self.contrastive_weight > 0


def uses_rule_head(config: "TrainConfig") -> bool:
    """Whether the model has a (trained) rule head: auxiliary setups with ``beta > 0``."""
    return SETUPS[config.setup].auxiliary and config.beta > 0


def uses_projection_head(config: "TrainConfig") -> bool:
    """Whether the model has an MLCL projection head: contrastive setups with ``gamma > 0``."""
    return SETUPS[config.setup].contrastive and config.gamma > 0


def needs_rules(config: "TrainConfig") -> bool:
    """Whether batches must carry rule vectors (aux loss or MLCL positives)."""
    return uses_rule_head(config) or uses_projection_head(config)


def stage_plan(config: "TrainConfig") -> list[StagePlan]:
    """The stages ``config`` runs, in order."""
    spec = SETUPS[config.setup]
    augment = config.resolved_augment
    pretrain_views = config.head_views == "pretrain"
    recalibrate = config.bn_recalibration_batches > 0
    stages: list[StagePlan] = []
    if spec.contrastive:
        stages.append(StagePlan(
            name="pretrain", max_epochs=config.max_epochs, lr=config.lr, batch_size=config.batch_size,
            train_encoder=True, answer_weight=0.0, aux_weight=config.beta, contrastive_weight=config.gamma,
            num_views=spec.num_views, augment=augment,
            bn_recalibration="before_validation" if recalibrate else "none",
        ))
        stages.append(StagePlan(
            name="linear", max_epochs=config.linear_eval_epochs or config.max_epochs,
            lr=config.linear_eval_lr or config.lr, batch_size=config.linear_eval_batch_size or config.batch_size,
            train_encoder=False, answer_weight=1.0, aux_weight=0.0, contrastive_weight=0.0,
            num_views=spec.num_views if pretrain_views else 1, augment=augment if pretrain_views else "none",
            reset_scoring_head=True, encoder_train_mode=config.linear_eval_encoder_mode == "train",
            # a frozen encoder in train mode normalises with batch statistics: nothing to re-estimate
            bn_recalibration="at_start" if recalibrate and config.linear_eval_encoder_mode == "eval" else "none",
            # fixed embeddings: a frozen encoder in eval mode on one un-augmented view
            cached_features=(config.linear_eval_feature_cache and config.linear_eval_encoder_mode == "eval"
                             and not pretrain_views),
        ))
    else:
        stages.append(StagePlan(
            name="supervised", max_epochs=config.max_epochs, lr=config.lr, batch_size=config.batch_size,
            train_encoder=True, answer_weight=1.0, aux_weight=config.beta if spec.auxiliary else 0.0,
            contrastive_weight=0.0, num_views=spec.num_views, augment=augment,
        ))
    if config.finetune:
        stages.append(StagePlan(
            name="finetune", max_epochs=config.finetune_epochs or config.max_epochs, lr=config.finetune_lr,
            batch_size=config.batch_size,
            train_encoder=True, answer_weight=1.0, aux_weight=0.0, contrastive_weight=0.0,
            num_views=spec.num_views if pretrain_views else 1, augment=augment,
        ))
    return stages


def within_total_epochs(plan: StagePlan, epochs_done: int, config: "TrainConfig") -> StagePlan | None:
    """``plan`` with its epoch limit cut to what ``max_total_epochs`` leaves after ``epochs_done`` epochs of
    earlier stages; ``None`` when nothing is left (the stage does not run). Unchanged without a total limit."""
    if config.max_total_epochs is None:
        return plan
    left = config.max_total_epochs - epochs_done
    if left <= 0:
        return None
    return dataclasses.replace(plan, max_epochs=min(plan.max_epochs, left))


def protocol_of(config: "TrainConfig", stages_run: list[str]) -> str:
    """The :data:`PROTOCOLS` entry of a run whose stages ``stages_run`` (names, in order) trained."""
    if "finetune" in stages_run:
        return "fine_tuned"
    if not SETUPS[config.setup].contrastive:
        return "supervised"
    return "linear_evaluation" if "linear" in stages_run else "untrained_head"
