"""mlcl_loss against a plain per-anchor loop of the paper's equations, SupCon, and degenerate cases."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from rpm_lib.losses import NEGATIVE_MODES, MLCLLoss, mlcl_loss, split_completions

TAU = 0.07


def loop_mlcl(z: torch.Tensor, z_neg: torch.Tensor, rules: torch.Tensor, tau: float, negatives: str,
              official: bool = False) -> float:
    """The paper's eqs. 5-8, one anchor at a time in plain Python floats (float64).

    ``official=True`` applies the release's weighting exp(m_i - m'_i) to the extra-negative terms.
    """
    zs = F.normalize(z.double(), dim=1).tolist()
    negs = F.normalize(z_neg.double(), dim=2).tolist()
    labels = (rules != 0).tolist()
    num = len(zs)

    def sim(u: list[float], v: list[float]) -> float:
        return sum(a * b for a, b in zip(u, v)) / tau

    total, counted = 0.0, 0
    for i in range(num):
        positives = [p for p in range(num) if p != i and any(a and b for a, b in zip(labels[i], labels[p]))]
        if not positives:
            continue
        denominator = sum(math.exp(sim(zs[i], zs[a])) for a in range(num) if a != i)
        if negatives == "batch":
            extra = [n for rpm in negs for n in rpm]
        elif negatives == "own":
            extra = negs[i]
        else:
            extra = []
        if extra:
            weight = 1.0
            if official:
                m_batch = max(sim(zs[i], zs[a]) for a in range(num))
                m_neg = max(sim(zs[i], n) for n in extra)
                weight = math.exp(m_batch - m_neg)
            denominator += weight * sum(math.exp(sim(zs[i], n)) for n in extra)
        anchor_loss = -sum(sim(zs[i], zs[p]) - math.log(denominator) for p in positives) / len(positives)
        total += anchor_loss
        counted += 1
    return total / counted if counted else 0.0


def random_batch(seed: int, num_rpms: int = 5, views: int = 2, dim: int = 8, num_rules: int = 6):
    """Random projections and sparse rules; RPM 0 has no rule, RPM 1 a rule nobody else has."""
    generator = torch.Generator().manual_seed(seed)
    rules = (torch.rand(num_rpms, num_rules, generator=generator) < 0.3).float()
    rules[:, -1] = 0
    rules[0] = 0
    rules[1] = 0
    rules[1, -1] = 1
    rules[2:, 0] = 1  # the others share rule 0, so they have positives even with one view
    z = torch.randn(views * num_rpms, dim, generator=generator, dtype=torch.float64)
    z_neg = torch.randn(views * num_rpms, 7, dim, generator=generator, dtype=torch.float64)
    return z, z_neg, rules.repeat(views, 1)


@pytest.mark.parametrize("views", [1, 2])
@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
def test_matches_per_anchor_loop(negatives: str, views: int) -> None:
    for seed in range(3):
        z, z_neg, rules = random_batch(seed, views=views)
        expected = loop_mlcl(z, z_neg, rules, TAU, negatives)
        actual = mlcl_loss(z, z_neg, rules, temperature=TAU, negatives=negatives)
        assert actual.dtype == torch.float64
        assert actual.item() == pytest.approx(expected, rel=1e-8, abs=1e-8)


def test_negative_modes_order_the_loss() -> None:
    """More negatives in the denominator can only raise the loss: none < own < batch."""
    z, z_neg, rules = random_batch(0)
    values = [mlcl_loss(z, z_neg, rules, negatives=mode).item() for mode in ("none", "own", "batch")]
    assert values[0] < values[1] < values[2]


def supcon_reference(features: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """A tiny SupCon (Khosla et al. 2020), SupContrast layout: features (bsz, n_views, dim), labels (bsz,)."""
    bsz, n_views, _ = features.shape
    contrast = F.normalize(torch.cat(torch.unbind(features, dim=1)), dim=1)
    logits = contrast @ contrast.T / tau
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    same_label = (labels[:, None] == labels[None, :]).repeat(n_views, n_views).double()
    not_self = 1.0 - torch.eye(bsz * n_views, dtype=torch.float64)
    same_label = same_label * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    return -((same_label * log_prob).sum(1) / same_label.sum(1)).mean()


def test_reduces_to_supcon_with_one_hot_labels_and_no_negatives() -> None:
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(6, 2, 16, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 0, 1, 0])
    z = torch.cat(torch.unbind(features, dim=1))
    one_hot = F.one_hot(labels, 3).repeat(2, 1)
    expected = supcon_reference(features, labels, TAU)
    for z_neg in (None, torch.randn(12, 7, 16, dtype=torch.float64)):  # ignored when negatives="none"
        actual = mlcl_loss(z, z_neg, one_hot, temperature=TAU, negatives="none")
        assert actual.item() == pytest.approx(expected.item(), rel=1e-10)


@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
@pytest.mark.parametrize("numerics", ["paper", "official"])
def test_invariant_to_anchor_order(negatives: str, numerics: str) -> None:
    z, z_neg, rules = random_batch(4)
    order = torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(0))
    before = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics=numerics)
    after = mlcl_loss(z[order], z_neg[order], rules[order], negatives=negatives, numerics=numerics)
    assert after.item() == pytest.approx(before.item(), rel=1e-12)


@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
def test_identical_embeddings_give_log_of_denominator_size(negatives: str) -> None:
    """All similarities equal -> every log-probability is -log(#denominator terms), whatever the rules."""
    num, dim = 6, 5
    z = torch.ones(num, dim, dtype=torch.float64, requires_grad=True)
    z_neg = torch.ones(num, 7, dim, dtype=torch.float64, requires_grad=True)
    terms = {"batch": num - 1 + 7 * num, "own": num - 1 + 7, "none": num - 1}[negatives]
    for rules in (torch.ones(num, 3), torch.tensor([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 1], [0, 0, 1], [0, 0, 0]])):
        loss = mlcl_loss(z, z_neg, rules, negatives=negatives)
        assert loss.item() == pytest.approx(math.log(terms), rel=1e-12)
        z.grad = z_neg.grad = None
        loss.backward()
        assert torch.isfinite(z.grad).all()
        assert negatives == "none" or torch.isfinite(z_neg.grad).all()


@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
@pytest.mark.parametrize("numerics", ["paper", "official"])
def test_anchors_without_positives_add_nothing_and_never_nan(negatives: str, numerics: str) -> None:
    z, z_neg, rules = random_batch(5, views=1)
    z.requires_grad_(True)
    z_neg.requires_grad_(True)
    loss = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics=numerics)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
    assert negatives == "none" or torch.isfinite(z_neg.grad).all()
    # Anchors 0 (no rule) and 1 (a rule nobody else has) have no positive: they are skipped as
    # anchors but still sit in the other anchors' denominators, as in the loop.
    assert loss.item() == pytest.approx(loop_mlcl(z.detach(), z_neg.detach(), rules, TAU, negatives,
                                                  official=numerics == "official"), rel=1e-8)


@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
def test_no_anchor_with_a_positive_gives_zero_with_a_graph(negatives: str) -> None:
    z = torch.randn(4, 8, requires_grad=True)
    z_neg = torch.randn(4, 7, 8, requires_grad=True)
    rules = torch.eye(4)  # every RPM has its own rule, nothing is shared
    rules[3] = 0
    loss = mlcl_loss(z, z_neg, rules, negatives=negatives)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(z.grad, torch.zeros_like(z))


def test_single_anchor_without_negatives() -> None:
    z = torch.randn(1, 8, requires_grad=True)
    loss = mlcl_loss(z, None, torch.ones(1, 3), negatives="none")
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(z.grad).all()


@pytest.mark.parametrize("negatives", NEGATIVE_MODES)
def test_optimisation_lowers_the_loss(negatives: str) -> None:
    generator = torch.Generator().manual_seed(7)
    rules = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 0, 1]]).repeat(2, 1)
    z = torch.randn(12, 16, generator=generator).requires_grad_(True)
    z_neg = torch.randn(12, 7, 16, generator=generator).requires_grad_(True)
    optimiser = torch.optim.SGD([z, z_neg], lr=0.5)
    initial = mlcl_loss(z, z_neg, rules, negatives=negatives).item()
    for _ in range(50):
        optimiser.zero_grad()
        loss = mlcl_loss(z, z_neg, rules, negatives=negatives)
        loss.backward()
        optimiser.step()
    final = mlcl_loss(z, z_neg, rules, negatives=negatives).item()
    assert final < 0.8 * initial


class TestOfficialNumerics:
    def test_identical_to_paper_without_negatives(self) -> None:
        z, z_neg, rules = random_batch(8)
        paper = mlcl_loss(z, z_neg, rules, negatives="none", numerics="paper")
        official = mlcl_loss(z, z_neg, rules, negatives="none", numerics="official")
        assert official.item() == pytest.approx(paper.item(), rel=1e-12)

    @pytest.mark.parametrize("negatives", ["batch", "own"])
    def test_equals_paper_loop_with_negatives_weighted_by_max_gap(self, negatives: str) -> None:
        z, z_neg, rules = random_batch(9)
        official = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics="official")
        paper = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics="paper")
        assert official.item() == pytest.approx(loop_mlcl(z, z_neg, rules, TAU, negatives, official=True), rel=1e-8)
        # Random negatives are far less similar than the anchor itself: the release up-weights them.
        assert official.item() > paper.item() + 1.0

    @pytest.mark.parametrize("negatives", ["batch", "own"])
    def test_agrees_with_paper_when_hardest_negative_is_the_anchor(self, negatives: str) -> None:
        z, z_neg, rules = random_batch(10)
        z_neg = z_neg.clone()
        z_neg[:, 0] = 2.5 * z  # same direction -> similarity 1 = the self-similarity, m'_i = m_i
        official = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics="official")
        paper = mlcl_loss(z, z_neg, rules, negatives=negatives, numerics="paper")
        assert official.item() == pytest.approx(paper.item(), rel=1e-10)


def test_half_precision_input_is_computed_in_float32() -> None:
    z, z_neg, rules = random_batch(11)
    loss = mlcl_loss(z.bfloat16(), z_neg.bfloat16(), rules)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(mlcl_loss(z.bfloat16().double(), z_neg.bfloat16().double(), rules).item(),
                                        rel=1e-5)


def test_autocast_does_not_lower_the_precision() -> None:
    z, z_neg, rules = random_batch(15)
    z, z_neg = z.float(), z_neg.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = mlcl_loss(z, z_neg, rules)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(mlcl_loss(z, z_neg, rules).item(), rel=1e-6)


def test_module_wrapper_matches_function() -> None:
    z, z_neg, rules = random_batch(12)
    module = MLCLLoss(temperature=0.1, negatives="own", numerics="official")
    assert module(z, z_neg, rules).item() == mlcl_loss(z, z_neg, rules, 0.1, "own", "official").item()
    assert "negatives='own'" in repr(module)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda z, n, r: (z[0], n, r), "z must have shape"),
        (lambda z, n, r: (z, n[:, :, :4], r), "z_neg must have shape"),
        (lambda z, n, r: (z, n[:-1], r), "z_neg must have shape"),
        (lambda z, n, r: (z, None, r), "z_neg is required"),
        (lambda z, n, r: (z, n, r[:-1]), "rules must have shape"),
        (lambda z, n, r: (z, n, r[:, 0]), "rules must have shape"),
        (lambda z, n, r: (z, n, 2 * r), "multi-hot"),
        (lambda z, n, r: (z.long(), n, r), "floating point"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, message: str) -> None:
    z, z_neg, rules = random_batch(13)
    with pytest.raises(ValueError, match=message):
        mlcl_loss(*change(z, z_neg, rules))


@pytest.mark.parametrize(
    "kwargs, message",
    [({"temperature": 0.0}, "temperature"), ({"negatives": "all"}, "negatives"), ({"numerics": "fast"}, "numerics")],
)
def test_bad_options_raise(kwargs: dict, message: str) -> None:
    z, z_neg, rules = random_batch(14)
    with pytest.raises(ValueError, match=message):
        mlcl_loss(z, z_neg, rules, **kwargs)
    with pytest.raises(ValueError, match=message):
        MLCLLoss(**kwargs)


def test_split_completions_picks_the_target() -> None:
    embeddings = torch.arange(3 * 8 * 2, dtype=torch.float32).reshape(3, 8, 2)
    target = torch.tensor([0, 5, 7])
    z, z_neg = split_completions(embeddings, target)
    assert z.shape == (3, 2) and z_neg.shape == (3, 7, 2)
    for row, answer in enumerate(target.tolist()):
        assert torch.equal(z[row], embeddings[row, answer])
        others = [k for k in range(8) if k != answer]
        assert torch.equal(z_neg[row], embeddings[row, others])
    with pytest.raises(ValueError, match="target values"):
        split_completions(embeddings, torch.tensor([0, 8, 1]))
