"""Heads: shapes, answer-order (in)variance of the rule head, sizes of the MLCL release's heads."""
from __future__ import annotations

import pytest
import torch

from rpm_lib.heads import ProjectionHead, RuleHead, ScoringHead


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def embeddings(batch: int = 3, dim: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 8, dim, generator=torch.Generator().manual_seed(seed))


def test_scoring_head_scores_each_completion_independently() -> None:
    torch.manual_seed(0)
    head = ScoringHead(16)
    x = embeddings()
    scores = head(x)
    assert scores.shape == (3, 8)
    torch.testing.assert_close(scores[:, 2], head(x[:, 2:3])[:, 0])
    with pytest.raises(ValueError, match=r"\(\.\.\., 16\)"):
        head(torch.randn(3, 8, 15))


def test_rule_head_mean_pooling_is_invariant_to_answer_order() -> None:
    torch.manual_seed(0)
    head = RuleHead(16, num_rules=40).eval()
    x = embeddings()
    order = torch.tensor([6, 2, 0, 7, 1, 3, 5, 4])
    logits = head(x)
    assert logits.shape == (3, 40)
    torch.testing.assert_close(head(x[:, order]), logits)


def test_rule_head_concat_pooling_depends_on_answer_order() -> None:
    """The release's summary layer: the same RPM with shuffled answers gets different rule logits."""
    torch.manual_seed(0)
    head = RuleHead(16, num_rules=9, pooling="concat").eval()
    x = embeddings()
    logits = head(x)
    assert logits.shape == (3, 9)
    assert not torch.allclose(head(x[:, torch.tensor([1, 0, 2, 3, 4, 5, 6, 7])]), logits)
    with pytest.raises(ValueError, match=r"\(B, 8, 16\)"):
        head(torch.randn(3, 7, 16))


def test_rule_head_rejects_unknown_pooling() -> None:
    with pytest.raises(ValueError, match="pooling"):
        RuleHead(16, 9, pooling="max")


def test_projection_head_maps_last_axis_to_128() -> None:
    torch.manual_seed(0)
    head = ProjectionHead(16)
    x = torch.randn(2, 2, 8, 16)
    out = head(x)
    assert out.shape == (2, 2, 8, 128)
    torch.testing.assert_close(out[1, 0, 3], head(x[1, 0, 3]))


@pytest.mark.parametrize("dim, expected", [(400, 211_728), (256, 98_688), (1024, 1_180_800)])
def test_projection_head_size_matches_release(dim: int, expected: int) -> None:
    assert count_parameters(ProjectionHead(dim)) == expected


def test_head_sizes_match_release_for_scl() -> None:
    assert count_parameters(ScoringHead(400)) == 401
    assert count_parameters(RuleHead(400, 40, pooling="concat")) == 189_280
