"""The setup registry: every setup, stage kind and objective is registered once, and what derives from it (the
config's choices and help, rpm-train's description, the model's heads and what a stage freezes) follows it."""
from __future__ import annotations

import dataclasses

import pytest

from rpm_lib.training import cli
from rpm_lib.training.config import TrainConfig
from rpm_lib.training.objectives import OBJECTIVES
from rpm_lib.training.plans import STAGE_BUILDERS, protocol_of, stage_plan, trained_objectives
from rpm_lib.training.setups import PROTOCOLS, SETUPS, STAGE_KINDS, STAGES


def test_every_setup_names_registered_stages_and_objectives() -> None:
    assert STAGES == ("supervised", "pretrain", "linear", "finetune")  # the stages' seeds derive from this order
    assert tuple(STAGE_BUILDERS) == STAGES
    assert {kind.protocol for kind in STAGE_KINDS.values()} <= set(PROTOCOLS)
    for name, spec in SETUPS.items():
        assert spec.name == name and spec.stages and set(spec.stages) <= set(STAGES) - {"finetune"}
        assert set(spec.objectives) <= set(OBJECTIVES) - {"answer"}
        needs_rules = any(OBJECTIVES[o].needs_rules for o in spec.objectives)
        assert (spec.rule_kind is not None) == needs_rules, name
        for kind in (STAGE_KINDS[s] for s in spec.stages):
            assert kind.answer or spec.objectives, f"{name}: stage {kind.name} would train nothing"


def test_config_and_cli_list_the_registered_setups() -> None:
    setup = next(f for f in dataclasses.fields(TrainConfig) if f.name == "setup")
    assert setup.metadata["choices"] == tuple(SETUPS)
    assert all(name in setup.metadata["help"] for name in SETUPS)
    assert f"setups ({', '.join(SETUPS)})" in cli.build_parser().description


@pytest.mark.parametrize("setup", list(SETUPS))
def test_the_heads_follow_the_objectives_a_run_trains(setup: str) -> None:
    import torch

    from rpm_lib.training.module import RpmModule

    for beta, gamma in ((10.0, 1.0), (0.0, 1.0), (10.0, 0.0)):
        if SETUPS[setup].contrastive and beta == gamma == 0:
            continue
        config = TrainConfig(setup=setup, beta=beta, gamma=gamma, image_size=32, progress_bar=False)
        module = RpmModule(config, config.rule_spec.width)
        trained = trained_objectives(config)
        for objective in OBJECTIVES.values():
            assert (getattr(module, objective.head) is not None) == (objective.name in trained), (objective.name,
                                                                                                 beta, gamma)
        for plan in stage_plan(config):
            module.set_stage(plan)
            grads = {name.split(".")[0] for name, p in module.named_parameters() if p.requires_grad}
            expected = {o.head for o in OBJECTIVES.values() if plan.weight(o.name) > 0}
            assert grads == expected | ({"encoder"} if plan.train_encoder else set()), plan.name
            assert isinstance(module.scoring_head, torch.nn.Module)


def test_protocol_is_that_of_the_last_stage_that_trained() -> None:
    assert protocol_of(TrainConfig(setup="ce"), []) == "supervised"
    assert protocol_of(TrainConfig(setup="mlcl"), []) == "untrained_head"
    assert protocol_of(TrainConfig(setup="ce"), ["supervised", "finetune"]) == "fine_tuned"
