"""The LightningDataModule of one training stage: train / val / test loaders over
:mod:`rpm_lib.training.samples` (datasets, deterministic sampling, resumable loading), with the feature-cache,
BatchNorm re-estimate and extra-test-set loaders the module and the final evaluation ask for.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset, Subset

from rpm_lib.data.seeding import derive_seed
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.feature_cache import IndexOnly
from rpm_lib.training.samples import EpochSampler, ResumableLoader, SeededSamples, make_dataset, subset_positions
from rpm_lib.training.setups import StagePlan


# ----------------------------------------------------------------------------------------------
# the DataModule
# ----------------------------------------------------------------------------------------------
class RpmDataModule(L.LightningDataModule):
    """Train / val / test data of one stage.

    Args:
        config: the run configuration.
        plan: the stage (batch size, number of views, augmentation recipe).
        fingerprint: called with ``data_root`` once the data exist (after generation), before training reads
            them: ``train`` records the data's fingerprint there, or refuses data other than a resumed run's.
    """

    def __init__(self, config: TrainConfig, plan: StagePlan,
                 fingerprint: Callable[[str | Path], Any] | None = None) -> None:
        super().__init__()
        self.config = config
        self.plan = plan
        self.fingerprint = fingerprint
        self.rule_key = config.rule_spec.sample_key
        self.train_set: SeededSamples | None = None
        self.val_set: SeededSamples | None = None
        self._recalibration_set: Dataset | None = None
        #: Set by the module when it trains on cached embeddings: the train / val batches carry only ``index``.
        self.index_only = False

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node before the others read the folder.
        from rpm_lib.training.generation import ensure_generated

        ensure_generated(self.config)

    def make_split(self, split: str, *, training: bool = False, root: str | Path | None = None,
                   answer_order: str | None = None) -> SeededSamples:
        """The view of ``split``: training = this stage's views + augmentation and seeded answer shuffling.

        ``root``: read ``split`` of another folder (an extra test set) instead of ``data_root``. ``answer_order``:
        instead of ``random`` (training) / ``fixed`` (evaluation), e.g. ``none`` for the files' order.
        """
        cfg = self.config
        limit = {"train": cfg.max_train_samples, "val": cfg.max_val_samples, "test": cfg.max_test_samples}[split]
        augmenter = None
        if training and self.plan.augment != "none":
            from rpm_lib.augment import RpmAugment

            augmenter = RpmAugment(self.plan.augment, seed=cfg.seed, save_applied_params=False)
        base = make_dataset(cfg, split, num_views=self.plan.num_views if training else 1, transform=augmenter,
                            answer_order=answer_order or ("random" if training else "fixed"), root=root)
        if len(base) == 0:
            field = "data_root" if root is None else "test_data_roots"
            raise ConfigError(f"config field '{field}': no {split} problems found in {root or cfg.data_root}")
        positions = subset_positions(len(base), limit, cfg.seed, split)
        return SeededSamples(base, self.rule_key, positions)

    def setup(self, stage: str | None = None) -> None:
        if self.fingerprint is not None:
            self.fingerprint(self.config.data_root)
        if self.train_set is None:
            self.train_set = self.make_split("train", training=True)
            self.val_set = self.make_split("val")
            # The test split is read only after the last stage: find out now that it is missing, not hours later.
            if len(make_dataset(self.config, "test")) == 0:
                raise ConfigError(f"config field 'data_root': no test problems found in {self.config.data_root}")

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool, rank: int, world: int,
                batches_done: Callable[[], int] | None = None) -> DataLoader:
        sampler = EpochSampler(len(dataset), self.config.seed, shuffle=shuffle, rank=rank, world_size=world)
        # A size-1 last batch breaks BatchNorm1d in train mode; drop the ragged end when there is more than one batch.
        drop_last = shuffle and len(sampler) > batch_size
        # index-only batches read nothing: worker processes would only add start-up time
        workers = 0 if isinstance(dataset, IndexOnly) else self.config.num_workers
        common = dict(batch_size=batch_size, sampler=sampler, drop_last=drop_last, num_workers=workers,
                      persistent_workers=workers > 0, pin_memory=_pin_memory(self.config))
        if batches_done is not None:
            return ResumableLoader(dataset, batches_done=batches_done, **common)
        return DataLoader(dataset, **common)

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None
        rank, world = self._world()
        dataset = IndexOnly(self.train_set) if self.index_only else self.train_set
        loader = self._loader(dataset, self.plan.batch_size, True, rank, world, self._batches_done)
        if self.trainer is not None:
            # Lightning creates the first epoch's iterator before it tells the sampler the epoch; worker processes
            # then fetch their first indices at once. A resumed run must not fetch epoch 0's order for epoch e.
            loader.sampler.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)
        return loader

    def _batches_done(self) -> int:
        """Training batches the trainer has finished in its current epoch (asked when a checkpoint is written)."""
        assert self.trainer is not None
        # The time budget writes its checkpoint in on_train_batch_end, before Lightning counts the batch as
        # completed; `processed` already counts it there, and equals `completed` at an epoch's end.
        return int(self.trainer.fit_loop.epoch_loop.batch_progress.current.processed)

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        rank, world = self._world()
        dataset = IndexOnly(self.val_set) if self.index_only else self.val_set
        return self._loader(dataset, self.plan.batch_size, False, rank, world)

    def feature_loader(self, split: str) -> DataLoader:
        """The problems of this stage's ``train`` or ``val`` view (the same subset), un-augmented, one view, in file
        answer order, in dataset order: what the feature cache embeds (:mod:`rpm_lib.training.feature_cache`)."""
        return DataLoader(self.make_split(split, answer_order="none"), batch_size=self.plan.batch_size, shuffle=False,
                          num_workers=self.config.num_workers, pin_memory=_pin_memory(self.config))

    def bn_recalibration_loader(self) -> DataLoader:
        """Un-augmented single-view training problems for re-estimating BatchNorm statistics
        (``config.bn_recalibration_batches`` batches of the stage's batch size, fewer when the split is smaller).

        The problems are a seeded subset of the training split, the same at every call, so the statistics are a
        function of the weights only (resuming a run re-estimates exactly the same values). Every DDP process
        reads all of them, so every process computes the same statistics without communicating.
        """
        if self._recalibration_set is None:
            view = self.make_split("train")
            count = min(len(view), self.config.bn_recalibration_batches * self.plan.batch_size)
            rng = np.random.default_rng(derive_seed(self.config.seed, "bn_recalibration"))
            positions = np.sort(rng.choice(len(view), size=count, replace=False))
            self._recalibration_set = Subset(view, positions.tolist())
        return DataLoader(self._recalibration_set, batch_size=self.plan.batch_size, shuffle=False,
                          num_workers=self.config.num_workers, pin_memory=_pin_memory(self.config))

    def eval_dataloader(self, split: str, root: str | Path | None = None) -> DataLoader:
        """Unsharded loader over a whole val / test split (final evaluation runs on one process), of ``data_root``
        or of another folder ``root`` (an extra test set)."""
        return self._loader(self.make_split(split, root=root), self.plan.batch_size, False, 0, 1)


def _pin_memory(config: TrainConfig) -> bool:
    return config.trains_on_cuda
