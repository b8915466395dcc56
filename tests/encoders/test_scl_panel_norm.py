"""SCL's panel standardisation (rpm_lib's default, `panel_norm="completion"`) and the release's `"none"`."""
from __future__ import annotations

import pytest
import torch

from rpm_lib.encoders import create_encoder
from rpm_lib.encoders.scl import PANEL_NORMS, standardize_panels


def test_standardize_panels_gives_zero_mean_unit_std_over_the_nine_panels() -> None:
    x = torch.randn(2, 8, 9, 80, dtype=torch.float64) * 5 + 3
    y = standardize_panels(x, eps=0.0)
    assert torch.allclose(y.mean(dim=2), torch.zeros(2, 8, 80, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(y.std(dim=2), torch.ones(2, 8, 80, dtype=torch.float64), atol=1e-12)


def test_constant_features_stay_finite() -> None:
    y = standardize_panels(torch.ones(1, 8, 9, 4))
    assert torch.isfinite(y).all() and (y == 0).all()


@pytest.mark.parametrize("panel_norm", PANEL_NORMS)
def test_both_variants_keep_completions_independent(panel_norm: str) -> None:
    torch.manual_seed(0)
    encoder = create_encoder("scl", image_size=32, panel_norm=panel_norm).eval()
    panels = torch.rand(2, 16, 32, 32)
    changed = panels.clone()
    changed[:, 8 + 3] = torch.rand(2, 32, 32)  # candidate 3 only
    with torch.no_grad():
        before, after = encoder(panels), encoder(changed)
    others = [k for k in range(8) if k != 3]
    assert torch.allclose(before[:, others], after[:, others], atol=1e-6)
    assert not torch.allclose(before[:, 3], after[:, 3])


def test_none_is_the_release_network_and_differs_from_the_default() -> None:
    torch.manual_seed(0)
    default = create_encoder("scl", image_size=32).eval()
    release = create_encoder("scl", image_size=32, panel_norm="none").eval()
    release.load_state_dict(default.state_dict())  # same parameters: the variant adds none
    panels = torch.rand(2, 16, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(default(panels), release(panels))
    assert default.panel_norm == "completion" and release.panel_norm == "none"


def test_unknown_panel_norm_is_rejected() -> None:
    with pytest.raises(ValueError, match="panel_norm must be one of"):
        create_encoder("scl", panel_norm="batch")
