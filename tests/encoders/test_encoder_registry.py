"""The encoder registry: register, create, list, errors."""
from __future__ import annotations

import pytest
import torch

from rpm_lib.encoders import Encoder, create_encoder, list_encoders, register_encoder
from rpm_lib.encoders import base


def test_paper_encoders_are_registered() -> None:
    assert {"scl", "copinet", "hrinet", "wren"} <= set(list_encoders())
    assert list_encoders() == sorted(list_encoders())


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown encoder 'resnet'.*copinet.*hrinet.*scl.*wren"):
        create_encoder("resnet")


def test_register_create_and_reject_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_ENCODERS", dict(base._ENCODERS))

    @register_encoder("mean_pixel")
    class MeanPixel(Encoder):
        couples_candidates = False

        def __init__(self, image_size: int = 8, scale: float = 1.0) -> None:
            super().__init__(image_size)
            self.embedding_dim = 1
            self.scale = scale

        def embed(self, panels: torch.Tensor) -> torch.Tensor:
            return self.scale * panels[:, 8:].mean(dim=(-2, -1)).unsqueeze(-1)

    assert "mean_pixel" in list_encoders()
    encoder = create_encoder("mean_pixel", scale=2.0)
    assert isinstance(encoder, MeanPixel)
    assert encoder(torch.ones(3, 16, 8, 8)).shape == (3, 8, 1)
    assert torch.all(encoder(torch.ones(1, 16, 8, 8)) == 2.0)
    with pytest.raises(ValueError, match="already registered"):
        register_encoder("mean_pixel")(MeanPixel)


def test_kwargs_reach_the_constructor() -> None:
    with pytest.raises(TypeError):
        create_encoder("scl", no_such_option=1)
    assert create_encoder("scl", image_size=64).image_size == 64


def test_the_encoders_a_config_accepts_without_torch_are_the_ones_rpm_lib_registers() -> None:
    # TrainConfig accepts these names without importing the encoders (rpm_lib.method_choices): a name listed there but
    # not registered would pass the config and fail at training
    from rpm_lib.method_choices import BUILT_IN_ENCODERS

    assert list_encoders() == sorted(BUILT_IN_ENCODERS)
