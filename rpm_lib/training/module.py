"""The LightningModule: one encoder, its heads, and the losses of the current stage.

One :class:`RpmModule` lives through all stages of a run (see :mod:`rpm_lib.training.setups`);
:meth:`RpmModule.set_stage` switches what is trained:

* parts a stage does not train are frozen (``requires_grad=False``) **and kept in eval mode**, so
  BatchNorm running statistics and dropout of a frozen encoder do not move during linear evaluation
  (the MLCL release only set ``requires_grad``; its BN statistics kept changing, which
  ``linear_eval_encoder_mode="train"`` reproduces);
* in contrastive setups the encoder's BatchNorm statistics are re-estimated on un-augmented training problems
  before every pre-training validation and before linear evaluation (``bn_recalibration_batches``,
  :mod:`rpm_lib.training.batchnorm`), so evaluation never normalises with averages of augmented batches;
* linear evaluation embeds its problems once when it starts and trains the head on those embeddings; its batches
  then carry only ``index`` (``linear_eval_feature_cache``, :mod:`rpm_lib.training.feature_cache`);
* the optimiser (Adam, betas / eps from the config) is rebuilt for every stage over the trainable
  parameters only, with the ``lr_schedule`` (constant, or ReduceLROnPlateau on ``val/loss``) restarted at the
  stage's lr.

Batch layout (from :class:`rpm_lib.training.datamodule.RpmDataModule`):
``panels`` uint8 (B, 16, S, S) or (B, V, 16, S, S) for V views, ``target`` int64 (B,), ``rules`` float32
(B, R) in the configured encoding, ``configuration`` int64 (B,), ``index`` int64 (B,).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import lightning as L
import torch
from torch import nn

from rpm_lib.encoders import create_encoder
from rpm_lib.heads import ScoringHead
from rpm_lib.training.batchnorm import recalibrate_batchnorm
from rpm_lib.training.config import ConfigError, TrainConfig
from rpm_lib.training.config_values import resolve_memory_format_for
from rpm_lib.training import feature_cache
from rpm_lib.data.seeding import derive_seed
from rpm_lib.training.objectives import OBJECTIVES
from rpm_lib.training.plans import trained_objectives
from rpm_lib.training.setups import STAGES, StagePlan


def resolve_memory_format(config: TrainConfig) -> str:
    """``config.memory_format`` with ``auto`` resolved for the device the run trains on."""
    return resolve_memory_format_for(config.memory_format)


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` inside the block, the previous value after it.

    The setting is global to the process: a run sets it for itself and gives it back, so a notebook's later cells
    compute as before. ``auto`` changes nothing.
    """
    previous = torch.get_float32_matmul_precision()
    if precision != "auto":
        torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)



def _encoder_of(config: TrainConfig) -> nn.Module:
    """The run's encoder; one that cannot be built from the config's fields is a ``ConfigError`` naming them.

    An encoder checks its own arguments when it is built (WReN's and HriNet's panel CNN needs at least 31 px; an
    ``encoder_kwargs`` key the encoder does not take): ``rpm-train encoder=wren image_size=16`` ended in a traceback.
    """
    try:
        return create_encoder(config.encoder, image_size=config.image_size, **config.encoder_kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"config fields 'encoder' ({config.encoder}), 'image_size' ({config.image_size}) and "
                          f"'encoder_kwargs' ({config.encoder_kwargs}): {error}") from error


def _batch_size(batch: dict[str, Any]) -> int:
    """Problems in a batch: its ``target``'s length, or its ``index``'s for a batch of a cached stage."""
    return int((batch["target"] if "target" in batch else batch["index"]).shape[0])


class RpmModule(L.LightningModule):
    """Encoder + scoring head (+ rule head, + projection head), trained stage by stage.

    Args:
        config: the run configuration.
        num_rules: R, length of the rule vectors (for the rule head).

    Attributes:
        encoder: ``rpm_lib.encoders`` encoder, (B, 16, S, S) float -> (B, 8, D).
        scoring_head: (B, 8, D) -> (B, 8) answer logits.
        rule_head: (B, 8, D) -> (B, R) rule logits, or ``None`` when the setup has no auxiliary loss.
        projection_head: (..., D) -> (..., P) MLCL projections, or ``None`` outside MLCL.
        plan: the current :class:`StagePlan` (``None`` before :meth:`set_stage`).
    """

    def __init__(self, config: TrainConfig, num_rules: int) -> None:
        super().__init__()
        self.config = config
        self.num_rules = num_rules
        self.encoder = _encoder_of(config)
        if resolve_memory_format(config) == "channels_last":
            # 4-D weights in NHWC: cuDNN's (and oneDNN's) fast convolution layout; activations follow the weights.
            self.encoder = self.encoder.to(memory_format=torch.channels_last)
        #: ``_stage_losses`` compiled (``compile_scope="step"``), else None.
        self._compiled_losses: Callable[..., Any] | None = None
        if config.compile:
            mode = None if config.compile_mode == "default" else config.compile_mode
            if config.compile_scope == "encoder":
                # In place (nn.Module.compile): parameter names, state_dict keys and checkpoints stay those of the
                # plain encoder, so runs with and without compilation resume each other's checkpoints.
                self.encoder.compile(mode=mode)
            else:
                # A function of tensors only: given the batch dict, the compiler would guard on its other values
                # (the problems' source ids) as constants and compile again for every batch.
                self._compiled_losses = torch.compile(self._stage_losses, mode=mode)
        # The head of every objective a stage of this run trains (scoring_head, rule_head, projection_head), in the
        # registry's order (the initial weights depend on it); the others are None.
        trained = trained_objectives(config)
        for objective in OBJECTIVES.values():
            setattr(self, objective.head, objective.make_head(config, self.encoder.embedding_dim, num_rules)
                    if objective.name in trained else None)
        self.plan: StagePlan | None = None
        self._frozen: list[nn.Module] = []  # not trained and kept in eval mode
        self._no_grad: list[nn.Module] = []  # not trained (a superset of _frozen: see StagePlan.encoder_train_mode)
        self._epoch_loss_sum: torch.Tensor | float = 0.0
        self._epoch_loss_count = 0
        self._epoch_parts: dict[str, torch.Tensor | float] = {}  # name -> sum of term * batch size this epoch
        self._val_sums: dict[str, torch.Tensor | float] = {}  # the same for the current validation
        self._val_count = 0
        #: split -> the frozen encoder's embeddings, while a stage trains on them (plan.cached_features)
        self._features: dict[str, feature_cache.SplitFeatures] | None = None

    # ------------------------------------------------------------------------------------------
    # stages
    # ------------------------------------------------------------------------------------------
    def set_stage(self, plan: StagePlan) -> None:
        """Freeze / unfreeze the parts for ``plan`` (and re-initialise the scoring head if it asks to)."""
        for objective in OBJECTIVES.values():
            if plan.weight(objective.name) > 0 and getattr(self, objective.head) is None:
                raise ValueError(f"stage {plan.name}: needs a {objective.head.replace('_', ' ')}, but the model has "
                                 f"none ({objective.weight_field}=0?)")
        self.plan = plan
        self._features = None  # computed by the stage that uses them, when it starts
        if plan.reset_scoring_head:
            # A fresh linear head from a seed of its own, so it is the same whether or not earlier stages ran here.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(self.config.seed, "scoring_head", STAGES.index(plan.name)))
                self.scoring_head = ScoringHead(self.encoder.embedding_dim).to(self.device)
        trained = {"encoder": plan.train_encoder}
        for objective in OBJECTIVES.values():  # a head trains when the stage weights its objective
            trained[objective.head] = trained.get(objective.head, False) or plan.weight(objective.name) > 0
        self._frozen = []
        self._no_grad = []
        for name, is_trained in trained.items():
            part = getattr(self, name)
            if part is None:
                continue
            part.requires_grad_(is_trained)
            if not is_trained:
                self._no_grad.append(part)
                if not (name == "encoder" and plan.encoder_train_mode):
                    self._frozen.append(part)
        self.train(self.training)

    def train(self, mode: bool = True) -> "RpmModule":
        """As ``nn.Module.train``, but parts frozen in this stage always stay in eval mode."""
        super().train(mode)
        for part in getattr(self, "_frozen", []):
            part.eval()
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    # ------------------------------------------------------------------------------------------
    # forward
    # ------------------------------------------------------------------------------------------
    @staticmethod
    def to_float(panels: torch.Tensor) -> torch.Tensor:
        """uint8 [0, 255] -> float32 [0, 1] (float input is passed through)."""
        return panels.float().div_(255.0) if panels.dtype == torch.uint8 else panels

    def _as_encoder_input(self, panels: torch.Tensor) -> torch.Tensor:
        """panels uint8/float (N, 16, S, S) -> float in the encoder's parameter dtype."""
        x = self.to_float(panels)
        weight = next(self.encoder.parameters(), None)
        if weight is not None and weight.dtype != x.dtype:  # "16-true" / "bf16-true" / "64-true" precision
            x = x.to(weight.dtype)
        return x

    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        """panels uint8/float (N, 16, S, S) -> embeddings (N, 8, D); no graph through a frozen encoder."""
        x = self._as_encoder_input(panels)
        if self.encoder in self._no_grad:
            with torch.no_grad():
                return self.encoder(x)
        return self.encoder(x)

    def forward(self, panels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every head's output for panels (N, 16, S, S): ``scores`` (N, 8), ``rule_logits`` (N, R) if any,
        ``embeddings`` (N, 8, D)."""
        embeddings = self.embed(panels)
        out = {"embeddings": embeddings, "scores": self.scoring_head(embeddings)}
        if self.rule_head is not None:
            out["rule_logits"] = self.rule_head(embeddings)
        return out

    # ------------------------------------------------------------------------------------------
    # losses
    # ------------------------------------------------------------------------------------------
    def stage_losses(self, batch: dict[str, Any], split: str = "train"
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The current stage's weighted loss on one batch (compiled with ``compile=true compile_scope=step``).

        Args:
            batch: ``panels`` (B, 16, S, S) or (B, V, 16, S, S) float, ``target`` (B,) int64, ``rules`` (B, R)
                float when the setup uses rule labels; other keys are ignored. While the stage trains on cached
                embeddings, only ``index`` (B,): the embeddings and targets of ``split`` are looked up.
            split: ``train`` or ``val`` (which cached embeddings a batch of indices refers to).

        Returns:
            ``(to_backward, value, parts)``: the loss to back-propagate (the MLCL term is scaled by the
            world size under DDP, see :mod:`rpm_lib.training.distributed`), its value for logging, and the
            unweighted terms (``answer``, ``aux``, ``mlcl``) plus ``accuracy`` when the scoring head is used.
        """
        if self._features is not None:
            embeddings, target = self._features[split].lookup(batch["index"])
            return self._losses(embeddings, target, None)
        panels, target, rules = batch["panels"], batch["target"], batch.get("rules")
        if self._compiled_losses is None:
            return self._stage_losses(panels, target, rules)
        if self.config.compile_mode == "reduce-overhead":
            # CUDA graphs reuse their output memory at the next replay: a new step begins here, and what the
            # previous one returned has been consumed (summed into the epoch's totals, back-propagated).
            torch.compiler.cudagraph_mark_step_begin()
        return self._compiled_losses(panels, target, rules)

    def _stage_losses(self, panels: torch.Tensor, target: torch.Tensor, rules: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if panels.ndim == 5:  # (B, V, 16, S, S): views of one RPM are adjacent after flattening
            views = panels.shape[1]
            panels = panels.flatten(0, 1)
            target = target.repeat_interleave(views)
            rules = rules.repeat_interleave(views, dim=0) if rules is not None else None
        return self._losses(self.embed(panels), target, rules)

    def _losses(self, embeddings: torch.Tensor, target: torch.Tensor, rules: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The stage's terms on embeddings (N, 8, D) of N problems (views flattened), targets (N,), rules (N, R)."""
        plan = self._require_plan()
        parts: dict[str, torch.Tensor] = {}
        to_backward = embeddings.new_zeros((), dtype=torch.float32)
        value = embeddings.new_zeros((), dtype=torch.float32)
        for objective in OBJECTIVES.values():  # the weighted sum, term by term in the registry's order
            weight = plan.weight(objective.name)
            if weight > 0:
                term, term_backward, extra = objective.term(self, embeddings, target, rules)
                parts[objective.name] = term.detach()
                parts.update(extra)
                to_backward = to_backward + weight * term_backward
                value = value + weight * term.detach()
        return to_backward, value, parts

    def _require_plan(self) -> StagePlan:
        if self.plan is None:
            raise RuntimeError("RpmModule: call set_stage(plan) before training")
        return self.plan

    # ------------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # train() sets it around the whole run; this covers the processes ddp_spawn starts, which train() never enters.
        if self.config.matmul_precision != "auto":
            torch.set_float32_matmul_precision(self.config.matmul_precision)
        if self._require_plan().bn_recalibration == "at_start":
            self.recalibrate_encoder_batchnorm()
        if self._require_plan().cached_features:
            self._cache_features()

    def on_fit_end(self) -> None:
        self._release_features()

    def _release_features(self) -> None:
        self._features = None
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "index_only"):
            datamodule.index_only = False

    def _cache_features(self) -> None:
        """Embed the stage's training and validation problems once (:mod:`rpm_lib.training.feature_cache`); the
        datamodule's batches then carry only indices. Says why on stderr when it keeps the plain stage."""
        datamodule = self.trainer.datamodule

        def plain(why: str) -> None:
            if self.trainer.is_global_zero:
                print(f"rpm-train: note: linear evaluation passes every problem through the frozen encoder in every "
                      f"epoch: {why}", file=sys.stderr)

        if not hasattr(datamodule, "feature_loader"):
            return plain("the embeddings are cached through an RpmDataModule")
        if self.trainer.world_size > 1:
            return plain(f"the embeddings are cached on one process only, not {self.trainer.world_size}")
        problems = len(datamodule.train_set) + len(datamodule.val_set)
        size = feature_cache.cache_bytes(problems, self.encoder.embedding_dim, 4)
        if size > feature_cache.MAX_CACHE_BYTES:
            return plain(f"the embeddings of {problems} problems would take {size / 2**30:.1f} GiB "
                         f"(at most {feature_cache.MAX_CACHE_BYTES / 2**30:.0f})")
        self.encoder.eval()
        context = self.trainer.precision_plugin.forward_context
        self._features = {split: feature_cache.compute_split(datamodule.feature_loader(split), self.embed,
                                                             self.device, context)
                          for split in ("train", "val")}
        datamodule.index_only = True

    def batches_before_validation(self) -> int:
        """Batches forwarded before each validation of this stage (re-estimating BatchNorm statistics), for the time
        budget's prediction of a validation it has not measured yet."""
        if self._require_plan().bn_recalibration != "before_validation":
            return 0
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None and hasattr(datamodule, "bn_recalibration_loader"):
            return len(datamodule.bn_recalibration_loader())  # fewer than configured when the split is small
        return self.config.bn_recalibration_batches

    def on_validation_epoch_start(self) -> None:
        self._val_sums, self._val_count = {}, 0
        # Lightning's sanity check validates a few batches whose results are discarded: not worth a re-estimate.
        if (self._require_plan().bn_recalibration == "before_validation" and self._trainer is not None
                and not self.trainer.sanity_checking):
            self.recalibrate_encoder_batchnorm()

    def recalibrate_encoder_batchnorm(self, batches: Iterable[dict[str, Any]] | None = None) -> int:
        """Re-estimate the encoder's BatchNorm statistics (:func:`rpm_lib.training.batchnorm.recalibrate_batchnorm`)
        on ``batches`` (dicts with ``panels`` uint8 (B, 16, S, S)); default: the datamodule's
        ``bn_recalibration_loader()``. Runs under the trainer's precision (autocast), as validation does.
        Returns the number of batches used."""
        if batches is None:
            datamodule = self.trainer.datamodule
            if not hasattr(datamodule, "bn_recalibration_loader"):
                raise RuntimeError("RpmModule: re-estimating BatchNorm statistics reads training problems through "
                                   "an RpmDataModule; fit with one, or set bn_recalibration_batches=0")
            batches = datamodule.bn_recalibration_loader()

        def forward(batch: dict[str, Any]) -> None:
            panels = batch["panels"].to(self.device, non_blocking=True)
            context = (self.trainer.precision_plugin.forward_context() if self._trainer is not None
                       else contextlib.nullcontext())
            with context:
                self.encoder(self._as_encoder_input(panels))

        return recalibrate_batchnorm(self.encoder, batches, forward)

    def on_train_epoch_start(self) -> None:
        self._epoch_loss_sum, self._epoch_loss_count, self._epoch_parts = 0.0, 0, {}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout etc. draw from the global RNG, which Lightning and DataLoaders also consume at moments that
        # differ between a fresh and a resumed run. Reseeding from (seed, stage, step, rank) before every step
        # makes the draws identical either way.
        plan = self._require_plan()
        torch.manual_seed(derive_seed(self.config.seed, "global_rng", STAGES.index(plan.name), self.global_step,
                                      self.global_rank))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        to_backward, value, parts = self.stage_losses(batch, "train")
        size = _batch_size(batch)
        # Sums kept as tensors (no device sync per step) and logged once per epoch (on_train_epoch_end): every
        # self.log call costs the host about a millisecond of Lightning bookkeeping.
        self._epoch_loss_sum = self._epoch_loss_sum + value.detach() * size
        self._epoch_loss_count += size
        for name, term in parts.items():
            self._epoch_parts[name] = self._epoch_parts.get(name, 0.0) + term.detach() * size
        if self.config.progress_bar:
            # A step value on the progress bar is read back every step (Lightning calls .item() on it), which
            # makes the host wait for the GPU: only when a person watches the bar.
            self.log("train/loss", value, on_step=True, on_epoch=False, prog_bar=True, batch_size=size)
        return to_backward

    def on_train_epoch_end(self) -> None:
        # Training logs are this process's view (no all-reduce under DDP); validation logs are synced.
        if not self._epoch_loss_count:
            return
        count = self._epoch_loss_count
        self.log("train/epoch_loss", self._epoch_loss_sum / count, on_step=False, on_epoch=True)
        for name, total in self._epoch_parts.items():
            self.log(f"train/{name}", total / count, on_step=False, on_epoch=True)

    def epoch_train_loss(self) -> float:
        """Mean training loss of the current epoch so far on this process (NaN before the first step)."""
        return float(self._epoch_loss_sum) / self._epoch_loss_count if self._epoch_loss_count else float("nan")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        _to_backward, value, parts = self.stage_losses(batch, "val")
        size = _batch_size(batch)
        # Sums on the device, logged once in on_validation_epoch_end: Lightning's bookkeeping of a self.log call per
        # term and batch cost the host 1.6 ms per validation batch (4 terms;
        # experiments/gpu-profile/bench_validation_logging.py on the CPU), and an SCL validation batch on an H100 waits on the host (12 ms against 20.6 ms for a whole
        # training step).
        for name, term in (("loss", value), *parts.items()):
            self._val_sums[name] = self._val_sums.get(name, 0.0) + term.detach().float() * size
        self._val_count += size

    def on_validation_epoch_end(self) -> None:
        # The size-weighted mean of each term over this process's batches; sync_dist averages the processes' means,
        # which equals the mean over all batches because every process validates the same number (padded sampler).
        if not self._val_count:
            return
        for name, total in self._val_sums.items():
            self.log(f"val/{name}", total / self._val_count, on_step=False, on_epoch=True, sync_dist=True,
                     prog_bar=name in ("loss", "accuracy"))

    def configure_optimizers(self) -> torch.optim.Optimizer | dict[str, Any]:
        """The stage's Adam; with ``lr_schedule="plateau"`` a Lightning dict that adds ReduceLROnPlateau on
        ``val/loss`` (checked after every validation, as the release's scheduler)."""
        optimizer = self.make_optimizer()
        cfg = self.config
        if cfg.lr_schedule == "constant":
            return optimizer
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=cfg.lr_plateau_factor,
                                                               patience=cfg.lr_plateau_patience)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "monitor": "val/loss", "interval": "epoch", "frequency": 1}}

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam over the current stage's trainable parameters at the stage's lr (no schedule)."""
        plan = self._require_plan()
        params = self.trainable_parameters()
        if not params:
            raise RuntimeError(f"stage {plan.name}: nothing to train")
        cfg = self.config
        # One fused kernel for the whole update on CUDA: per-parameter (foreach) Adam issues several launches per
        # tensor and reads its step counters back to the host, and an SCL step is bound by launches, not FLOPs.
        fused = bool(cfg.fused_adam) and all(p.is_cuda for p in params)
        return torch.optim.Adam(params, lr=plan.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                                weight_decay=cfg.weight_decay, fused=fused or None)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rpm_config"] = self.config.to_dict()
        checkpoint["rpm_stage"] = self.plan.name if self.plan is not None else None
        checkpoint["rpm_num_rules"] = self.num_rules
        # The running mean of the epoch's training loss (history.csv): a checkpoint written mid-epoch by the time
        # budget must carry it, or a resumed epoch would report the mean of its second part only.
        checkpoint["rpm_epoch_loss"] = [float(self._epoch_loss_sum), self._epoch_loss_count]
        checkpoint["rpm_epoch_parts"] = {name: float(total) for name, total in self._epoch_parts.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        loss_sum, count = checkpoint.get("rpm_epoch_loss", (0.0, 0))
        # A Python float (the module may not be on its device yet): adding a float32 loss to it rounds exactly as
        # the uninterrupted float32 sum did, since the float holds a float32 value.
        self._epoch_loss_sum = float(loss_sum)
        self._epoch_loss_count = int(count)
        self._epoch_parts = {str(k): float(v) for k, v in checkpoint.get("rpm_epoch_parts", {}).items()}
