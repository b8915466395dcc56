"""The objective registry: the loss terms a stage can weight, the head each one trains, the field of its weight.

=============  ====================  ==============  ==========================================================
objective      head (RpmModule attr)  weight field    term
=============  ====================  ==============  ==========================================================
``answer``     ``scoring_head``       (1.0)           ``ANSWER_LOSSES[answer_loss]`` on scores (N, 8), + accuracy
``aux``        ``rule_head``          ``beta``        :func:`rpm_lib.losses.rule_loss` on rule logits (N, R)
``mlcl``       ``projection_head``    ``gamma``       :func:`rpm_lib.losses.mlcl_loss` (gathered under DDP)
=============  ====================  ==============  ==========================================================

A stage's loss is the weighted sum of its objectives' terms (``StagePlan.weights``), added in this registry's
order; the model builds the head of every objective some stage of its run trains, and a stage freezes the heads of
the objectives it does not train. A new objective is its loss (a module of :mod:`rpm_lib.losses`) plus one entry
here; a setup uses it by naming it in its ``SetupSpec.objectives`` (:mod:`rpm_lib.training.setups`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# The registry is read with the config (TrainConfig checks the objectives' weight fields, plans weight the stages);
# the heads and losses, and torch with them, are imported when a model is built or a term computed, so that reading
# a config does not load torch.
if TYPE_CHECKING:
    import torch
    from torch import nn

#: ``term(model, embeddings (N, 8, D), target (N,), rules (N, R) or None) -> (value, to_backward, extra parts)``:
#: ``value`` is the term (a scalar with its graph), ``to_backward`` what is back-propagated (``value`` but for a
#: term gathered across processes), ``extra`` further logged values (``accuracy``). ``model`` is the RpmModule.
Term = Callable[[Any, "torch.Tensor", "torch.Tensor", "torch.Tensor | None"],
                "tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]"]
#: ``make_head(config, embedding_dim D, num_rules R) -> nn.Module``.
HeadFactory = Callable[[Any, int, int], "nn.Module"]


@dataclasses.dataclass(frozen=True)
class Objective:
    """One loss term a stage can train.

    Attributes:
        name: the term's key in ``StagePlan.weights``, in logs (``train/<name>``, ``val/<name>``) and history.csv.
        head: the RpmModule attribute holding the head it trains.
        make_head: builds that head.
        weight_field: the TrainConfig field holding its weight in the stages that train the setup's objectives
            (``None``: weight 1).
        needs_rules: batches must carry rule vectors.
        term: computes it (see :data:`Term`).
    """

    name: str
    head: str
    make_head: HeadFactory
    weight_field: str | None
    needs_rules: bool
    term: Term


def _answer(model: Any, embeddings: torch.Tensor, target: torch.Tensor, rules: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    from rpm_lib.losses import ANSWER_LOSSES

    scores = model.scoring_head(embeddings).float()
    answer = ANSWER_LOSSES[model.config.answer_loss](scores, target)
    return answer, answer, {"accuracy": (scores.argmax(dim=1) == target).float().mean()}


def _aux(model: Any, embeddings: torch.Tensor, target: torch.Tensor, rules: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    from rpm_lib.losses import rule_loss

    assert model.rule_head is not None and rules is not None
    aux = rule_loss(model.rule_head(embeddings).float(), rules)
    return aux, aux, {}


def _mlcl(model: Any, embeddings: torch.Tensor, target: torch.Tensor, rules: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    from rpm_lib.losses import split_completions
    from rpm_lib.training.distributed import gathered_mlcl_loss

    assert model.projection_head is not None and rules is not None
    projections = model.projection_head(embeddings).float()  # (N, 8, P)
    z, z_neg = split_completions(projections, target)
    config = model.config
    # the backward term is scaled by the world size under DDP (rpm_lib.training.distributed)
    value, to_backward = gathered_mlcl_loss(z, z_neg, rules, temperature=config.temperature,
                                            negatives=config.negatives, numerics=config.mlcl_numerics)
    return value, to_backward, {}


def _scoring_head(config: Any, dim: int, num_rules: int) -> nn.Module:
    from rpm_lib.heads import ScoringHead

    return ScoringHead(dim)


def _rule_head(config: Any, dim: int, num_rules: int) -> nn.Module:
    from rpm_lib.heads import RuleHead

    return RuleHead(dim, num_rules, pooling=config.rule_pooling)


def _projection_head(config: Any, dim: int, num_rules: int) -> nn.Module:
    from rpm_lib.heads import ProjectionHead

    return ProjectionHead(dim, config.projection_dim)


#: Objectives in the order their terms are added (and their heads built: the initial weights depend on it).
OBJECTIVES: dict[str, Objective] = {objective.name: objective for objective in (
    Objective("answer", "scoring_head", _scoring_head, weight_field=None, needs_rules=False, term=_answer),
    Objective("aux", "rule_head", _rule_head, weight_field="beta", needs_rules=True, term=_aux),
    Objective("mlcl", "projection_head", _projection_head, weight_field="gamma", needs_rules=True, term=_mlcl),
)}
