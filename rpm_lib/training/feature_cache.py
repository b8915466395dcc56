"""Linear evaluation on embeddings computed once: the frozen encoder's output does not change while it is frozen.

Linear evaluation trains a fresh scoring head on a frozen encoder in eval mode, on un-augmented single views.
Run as a plain stage, every epoch passes every training and validation problem through the encoder again, only to
get the same embeddings: up to 100 epochs of forward passes for a head with one linear layer. Here the stage
computes the embeddings of its training and validation problems once when it starts (after the BatchNorm
statistics are re-estimated), keeps them on the device, and its batches carry only the problems' dataset indices
(:class:`IndexOnly`), through the same sampler, so the order of batches, early stopping and an exact resume are
those of the plain stage.

The embeddings are computed in the files' answer order, and each batch's loss and accuracy are computed in that
order too. This gives what the stage's shuffled answer order gives, because every encoder is equivariant in the
choices (permuting the 8 candidate panels permutes its 8 embeddings: ``tests/encoders/test_encoders.py``,
``test_permuting_candidates_permutes_embeddings``), the scoring head scores
each choice on its own, and the cross-entropy and the argmax do not depend on the order of the choices. Only
floating-point rounding can differ.

Used for a stage whose plan asks for it (``StagePlan.cached_features``: the linear stage with
``linear_eval_feature_cache=true``, encoder in eval mode, one un-augmented view), on a single process, when the
embeddings fit in :data:`MAX_CACHE_BYTES`; otherwise the stage runs plain and says why.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

#: The largest cache kept (bytes of embeddings, train and val together); a larger one runs the plain stage.
MAX_CACHE_BYTES = 4 * 1024**3


@dataclass
class SplitFeatures:
    """One split's embeddings, addressed by dataset index.

    Attributes:
        embeddings: (N, 8, D) on the training device, in the dtype the encoder produced (bf16 under bf16 autocast),
            the 8 choices in file order.
        targets: (N,) int64, the correct choice in file order.
        rows: (L,) int64 on the device: dataset index -> row of ``embeddings``; N (one past the last row) for an
            index not in the split's view, e.g. outside a ``max_train_samples`` subset, so that looking it up fails
            (IndexError on the CPU, a device-side assertion on a GPU) instead of reading another problem's row.
    """

    embeddings: torch.Tensor
    targets: torch.Tensor
    rows: torch.Tensor

    def lookup(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dataset indices (B,) -> their embeddings (B, 8, D) and targets (B,).

        No check reads the indices back to the host (that would wait for the GPU at every step): an index outside
        the cache is out of range for ``embeddings`` and fails there."""
        rows = self.rows[index.to(self.rows.device)]
        return self.embeddings[rows], self.targets[rows]


def compute_split(batches: Iterable[dict[str, Any]], embed: Callable[[torch.Tensor], torch.Tensor],
                  device: torch.device, context: Callable[[], contextlib.AbstractContextManager[Any]]
                  ) -> SplitFeatures:
    """Embed every batch (``panels`` uint8 (B, 16, S, S) in file answer order, ``target`` (B,), ``index`` (B,)).

    Args:
        batches: the split's view, un-augmented, answer order ``"none"``.
        embed: panels on the device -> embeddings (B, 8, D) (the module's frozen encoder).
        device: where the embeddings are kept.
        context: the precision context the stage's forward passes run in (autocast), entered per batch.
    """
    embeddings, targets, indices = [], [], []
    with torch.no_grad():
        for batch in batches:
            panels = batch["panels"].to(device, non_blocking=True)
            with context():
                embeddings.append(embed(panels))
            targets.append(batch["target"].to(device))
            indices.append(batch["index"].to(device))
    index = torch.cat(indices)
    rows = torch.full((int(index.max()) + 1,), len(index), dtype=torch.int64, device=device)
    rows[index] = torch.arange(len(index), device=device)
    return SplitFeatures(torch.cat(embeddings), torch.cat(targets).long(), rows)


def cache_bytes(problems: int, embedding_dim: int, element_size: int) -> int:
    """Bytes the embeddings of ``problems`` RPMs take (8 choices each)."""
    return problems * 8 * embedding_dim * element_size


class IndexOnly(Dataset):
    """A view's items reduced to their dataset index: what a batch of a cached stage carries.

    Args:
        view: the split's view (``SeededSamples``: its ``dataset_index(position)`` and length are used, nothing
            is read from disk).
    """

    def __init__(self, view: Any) -> None:
        self.view = view

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, int]:
        _epoch, position = key if isinstance(key, tuple) else (0, key)
        return {"index": self.view.dataset_index(int(position))}
