r"""Multi-Label Contrastive Loss (MLCL; Małkiński & Mańdziuk, eqs. 4-7), with extra negatives.

Notation (one row per *anchor*: a correctly completed RPM, every augmented view stacked):

* ``z`` (M, d): projections of the correct completions; all views of all RPMs, in any order.
* ``z_neg`` (M, K, d): projections of the K (= 7) wrong completions of anchor i's RPM and view.
* ``rules`` (M, R): multi-hot rule vector Y_i of each anchor (views of one RPM repeat their row).

All vectors are L2-normalised inside, s(u, v) = u . v / tau. For anchor i

.. math::

    P(i) = \{p \ne i : Y_i \cap Y_p \ne \emptyset\}

    L_i = -\frac{1}{|P(i)|} \sum_{p \in P(i)} \log
          \frac{\exp s(z_i, z_p)}{\sum_{a \ne i} \exp s(z_i, z_a) + \sum_{n \in N(i)} \exp s(z_i, z'_n)}

    L = \frac{1}{|A|} \sum_{i \in A} L_i, \qquad A = \{i : |P(i)| > 0\}

with the extra negatives N(i) chosen by ``negatives``:

* ``"batch"`` (paper eqs. 6-7 and the MLCL release): every wrong completion in the batch, M K
  vectors shared by all anchors;
* ``"own"``: only anchor i's own K wrong completions, z_neg[i];
* ``"none"``: no extra negatives, i.e. the multi-label SupCon loss (paper eqs. 4-5); with one-hot
  rules it is SupCon (Khosla et al. 2020) exactly.

Anchors without a positive (an all-zero rule row, or rules no other anchor shares) add nothing
(the release drops them the same way; SupContrast after PR #142 counts them as 0 in the mean
instead). When no anchor has a positive the loss is 0, still attached to the graph. The paper
writes sums over anchors; the mean keeps the scale independent of the batch size.

``numerics``:

* ``"paper"``: one log-sum-exp over the whole denominator, exactly the equation above.
* ``"official"``: the MLCL release's numerics. It stabilises the in-batch terms by their row max
  m_i (which includes the self-similarity, so m_i = 1 / tau) and the extra-negative terms by
  *their own* row max m'_i before adding the two exp-sums. This equals the equation above with
  every extra-negative term multiplied by exp(m_i - m'_i) >= 1, i.e. negatives are up-weighted,
  the hardest one counting as if it were as similar as the anchor itself. The two agree exactly
  when ``negatives="none"`` and whenever the hardest extra negative of every anchor has
  similarity 1 with it (m'_i = m_i); otherwise "official" is larger.

Minimum value: even a perfect embedding has loss >= log(|P(i)|) per anchor (the "log N floor",
SupContrast#98), and identical embeddings give the same value for any rules (SupContrast#118).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rpm_lib.losses.value_checks import check_values
from rpm_lib.method_choices import NEGATIVE_MODES, NUMERICS


def _check_options(temperature: float, negatives: str, numerics: str) -> None:
    if not temperature > 0:
        raise ValueError(f"mlcl_loss: temperature must be > 0, got {temperature}")
    if negatives not in NEGATIVE_MODES:
        raise ValueError(f"mlcl_loss: negatives must be one of {NEGATIVE_MODES}, got {negatives!r}")
    if numerics not in NUMERICS:
        raise ValueError(f"mlcl_loss: numerics must be one of {NUMERICS}, got {numerics!r}")


def _check_inputs(z: torch.Tensor, z_neg: torch.Tensor | None, rules: torch.Tensor, negatives: str) -> None:
    if z.ndim != 2 or z.shape[0] < 1 or z.shape[1] < 1:
        raise ValueError(f"mlcl_loss: z must have shape (M, d) with M, d >= 1, got {tuple(z.shape)}")
    num_anchors, dim = z.shape
    if not z.is_floating_point():
        raise ValueError(f"mlcl_loss: z must be floating point, got {z.dtype}")
    if z_neg is None:
        if negatives != "none":
            raise ValueError(f"mlcl_loss: z_neg is required when negatives={negatives!r} (only 'none' allows None)")
    elif z_neg.ndim != 3 or z_neg.shape[0] != num_anchors or z_neg.shape[1] < 1 or z_neg.shape[2] != dim:
        raise ValueError(
            f"mlcl_loss: z_neg must have shape (M={num_anchors}, K, d={dim}) with K >= 1 (K = 7 wrong "
            f"completions per RPM), got {tuple(z_neg.shape)}"
        )
    if rules.ndim != 2 or rules.shape[0] != num_anchors or rules.shape[1] < 1:
        raise ValueError(
            f"mlcl_loss: rules must have shape (M={num_anchors}, R) with R >= 1, got {tuple(rules.shape)}"
        )
    for name, tensor in (("z_neg", z_neg), ("rules", rules)):
        if tensor is not None and tensor.device != z.device:
            raise ValueError(f"mlcl_loss: {name} is on {tensor.device} but z is on {z.device}")
    if check_values(rules) and bool(((rules != 0) & (rules != 1)).any()):
        raise ValueError("mlcl_loss: rules must be multi-hot (every entry 0 or 1)")


def mlcl_loss(
    z: torch.Tensor,
    z_neg: torch.Tensor | None,
    rules: torch.Tensor,
    temperature: float = 0.07,
    negatives: str = "batch",
    numerics: str = "paper",
) -> torch.Tensor:
    """Multi-label contrastive loss with extra negatives (see the module docstring for the equation).

    Args:
        z: (M, d) float, projections of the correct completions (all views stacked, any order).
        z_neg: (M, K, d) float, projections of the wrong completions of the same RPM and view as
            each row of ``z`` (K = 7). May be ``None`` only when ``negatives="none"``.
        rules: (M, R) multi-hot (0/1, any dtype), the rules of each anchor's RPM.
        temperature: tau > 0.
        negatives: ``"batch"`` | ``"own"`` | ``"none"``, which wrong completions enter each
            anchor's denominator.
        numerics: ``"paper"`` (one log-sum-exp) | ``"official"`` (the release's two-max variant).

    Returns:
        Scalar tensor (float32, or float64 for float64 input): the mean of L_i over the anchors with
        at least one positive; 0 (with a graph) when there are none.

    Raises:
        ValueError: bad shapes, non-multi-hot rules, unknown option or temperature <= 0 (the rule values are
            checked on CPU tensors, on accelerators only with ``RPM_LIB_CHECK_VALUES=1``:
            :mod:`rpm_lib.losses.value_checks`).
    """
    _check_options(temperature, negatives, numerics)
    _check_inputs(z, z_neg, rules, negatives)
    # Half-precision similarities / tau (tau = 0.07 -> logits up to ~14) lose too much: compute in
    # >= fp32, with autocast off so that the matmuls are not cast back down.
    with torch.autocast(device_type=z.device.type, enabled=False):
        return _mlcl_loss(z, z_neg, rules, temperature, negatives, numerics)


def _mlcl_loss(z: torch.Tensor, z_neg: torch.Tensor | None, rules: torch.Tensor, temperature: float,
               negatives: str, numerics: str) -> torch.Tensor:
    """:func:`mlcl_loss` on validated inputs."""
    dtype = torch.promote_types(z.dtype, torch.float32)
    anchors = F.normalize(z.to(dtype), dim=1)
    num_anchors = anchors.shape[0]
    if num_anchors == 1 and negatives == "none":
        return anchors.sum() * 0.0  # empty denominator and no positive: nothing to contrast

    logits = anchors @ anchors.T / temperature  # (M, M)
    self_mask = torch.eye(num_anchors, dtype=torch.bool, device=z.device)
    denominator_logits = logits.masked_fill(self_mask, float("-inf"))  # a != i
    if negatives != "none":
        assert z_neg is not None
        wrong = F.normalize(z_neg.to(dtype), dim=2)
        if negatives == "batch":
            extra = anchors @ wrong.reshape(-1, wrong.shape[-1]).T / temperature  # (M, M K)
        else:
            extra = torch.einsum("md,mkd->mk", anchors, wrong) / temperature  # (M, K)
        if numerics == "official":
            # Release: exp-sums shifted by different maxima -> negatives weighted by exp(m_i - m'_i).
            shift = logits.max(dim=1, keepdim=True).values - extra.max(dim=1, keepdim=True).values
            extra = extra + shift.detach()
        denominator_logits = torch.cat([denominator_logits, extra], dim=1)
    log_denominator = torch.logsumexp(denominator_logits, dim=1, keepdim=True)  # (M, 1), one shared LSE
    log_prob = logits - log_denominator  # (M, M); only off-diagonal positive entries are used

    rule_sets = (rules != 0).to(dtype)
    positives = ((rule_sets @ rule_sets.T) > 0) & ~self_mask
    num_positives = positives.sum(dim=1)
    has_positive = num_positives > 0
    mean_log_prob = torch.where(positives, log_prob, 0.0).sum(dim=1) / num_positives.clamp(min=1)
    per_anchor = torch.where(has_positive, -mean_log_prob, 0.0)
    return per_anchor.sum() / has_positive.sum().clamp(min=1)


def split_completions(embeddings: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split per-completion vectors into the correct one and the wrong ones, for :func:`mlcl_loss`.

    Args:
        embeddings: (N, 8, d) projections of the 8 completions of N RPMs (or views).
        target: (N,) int64, index of the correct completion.

    Returns:
        ``(z, z_neg)``: (N, d) the correct completion, (N, 7, d) the others in their original order.
    """
    if embeddings.ndim != 3:
        raise ValueError(f"split_completions: embeddings must be (N, A, d), got {tuple(embeddings.shape)}")
    num, num_answers, _ = embeddings.shape
    if target.shape != (num,) or target.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"split_completions: target must be integer (N={num},), got {target.dtype} {tuple(target.shape)}")
    if num and check_values(target) and (int(target.min()) < 0 or int(target.max()) >= num_answers):
        raise ValueError(f"split_completions: target values must be in [0, {num_answers - 1}]")
    # Index arithmetic instead of a boolean mask: masked indexing needs the number of selected rows on the host,
    # which stops the CPU until the GPU catches up, once per step.
    target = target.long().unsqueeze(1)  # (N, 1)
    others = torch.arange(num_answers - 1, device=target.device).unsqueeze(0)  # (1, A-1)
    others = others + (others >= target).long()  # (N, A-1): every index but the target's, in order
    dim = embeddings.shape[-1]
    z = embeddings.gather(1, target.unsqueeze(2).expand(-1, 1, dim)).squeeze(1)
    z_neg = embeddings.gather(1, others.unsqueeze(2).expand(-1, -1, dim))
    return z, z_neg


class MLCLLoss(nn.Module):
    """Module wrapper of :func:`mlcl_loss` (SupContrast style).

    Args:
        temperature: tau (0.07 in the paper).
        negatives: ``"batch"`` (paper, default) | ``"own"`` | ``"none"``.
        numerics: ``"paper"`` (default) | ``"official"``.

    Example:
        >>> loss_fn = MLCLLoss()
        >>> z, z_neg = torch.randn(6, 128), torch.randn(6, 7, 128)
        >>> rules = torch.tensor([[1, 0], [1, 1], [0, 1], [1, 0], [1, 1], [0, 1]])
        >>> loss_fn(z, z_neg, rules).ndim
        0
    """

    def __init__(self, temperature: float = 0.07, negatives: str = "batch", numerics: str = "paper") -> None:
        super().__init__()
        _check_options(temperature, negatives, numerics)
        self.temperature = temperature
        self.negatives = negatives
        self.numerics = numerics

    def forward(self, z: torch.Tensor, z_neg: torch.Tensor | None, rules: torch.Tensor) -> torch.Tensor:
        return mlcl_loss(z, z_neg, rules, self.temperature, self.negatives, self.numerics)

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, negatives={self.negatives!r}, numerics={self.numerics!r}"
