"""The one training configuration: a dataclass read from / written to YAML, with key=value overrides.

The same :class:`TrainConfig` drives notebooks (``train(TrainConfig(...))``), the ``rpm-train`` CLI
(``rpm-train --config configs/iraven.yaml setup=mlcl_aug beta=15``) and SLURM / torchrun jobs, and
is written as ``<run_dir>/config.yaml`` so every run can be re-run exactly.

Every field carries metadata: ``help`` (meaning and unit), ``group`` (for ``--help``), and optional
``choices`` / ``minimum`` / ``exclusive_minimum`` constraints. Validation happens on construction;
every problem raises :class:`ConfigError` naming the field.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from rpm_lib import typed_values
from rpm_lib.heads import RULE_POOLINGS
from rpm_lib.losses import ANSWER_LOSSES, NEGATIVE_MODES, NUMERICS
from rpm_lib.rule_encodings import ENCODING_NAMES, RuleEncoding, default_sparse, rule_encoding
from rpm_lib.training.setups import SETUPS

#: Rule encodings (:mod:`rpm_lib.rule_encodings`): ``auto`` picks dense for ``ce_aux_dense`` and the dataset's
#: sparse code otherwise.
RULE_ENCODINGS: tuple[str, ...] = ("auto", *ENCODING_NAMES)
#: Encoder tensor layouts (``auto`` resolves in ``rpm_lib.training.module.resolve_memory_format_for``).
MEMORY_FORMATS: tuple[str, ...] = ("auto", "channels_last", "contiguous")
DATASETS: tuple[str, ...] = ("iraven", "pgm")
#: What a resumed run demands of its data (``data_check``; ``rpm_lib.training.run.ProgressRecord.check_data``).
DATA_CHECKS: tuple[str, ...] = ("exact", "problems")
#: Learning-rate schedules within a stage (``lr_schedule``); the optimiser and schedule restart with every stage.
LR_SCHEDULES: tuple[str, ...] = ("constant", "plateau")
#: Mode of the frozen encoder in linear evaluation (``linear_eval_encoder_mode``).
ENCODER_MODES: tuple[str, ...] = ("eval", "train")
#: Training views of the stages after pre-training (``head_views``).
HEAD_VIEWS: tuple[str, ...] = ("single", "pretrain")
#: Lightning precision strings accepted by the ``precision`` field (``auto``: bf16/fp16 mixed on GPU, fp32 on CPU).
PRECISIONS: tuple[str, ...] = ("auto", "32-true", "32", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64-true")
#: ``torch.set_float32_matmul_precision`` values (``matmul_precision``); ``auto`` leaves the process's own setting.
MATMUL_PRECISIONS: tuple[str, ...] = ("auto", "highest", "high", "medium")
#: What ``compile=true`` compiles (``compile_scope``): the encoder in place, or the whole forward of a step.
COMPILE_SCOPES: tuple[str, ...] = ("encoder", "step")
#: ``torch.compile`` modes (``compile_mode``); ``reduce-overhead`` replays the compiled kernels as CUDA graphs.
COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead")


class ConfigError(ValueError):
    """A configuration value, key or file is invalid; the message names the field (or file)."""


def _field(default: Any = dataclasses.MISSING, help: str = "", group: str = "run", **constraints: Any) -> Any:
    """A dataclass field with ``help`` / ``group`` / constraint metadata; list/dict defaults are copied."""
    metadata = {"help": help, "group": group, **constraints}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run needs. Paper defaults for I-RAVEN (batch 128, lr 0.002, <= 100 epochs).

    Construct with keywords, from YAML (:meth:`from_yaml`), from a dict (:meth:`from_dict`), or apply
    ``key=value`` strings with :meth:`with_overrides`. Invalid values raise :class:`ConfigError`.
    """

    # --- run -------------------------------------------------------------------------------------
    run_dir: str = _field("runs/train", "output folder: config.yaml, checkpoints/, history.csv, metrics.json, "
                          "predictions.npz", "run")
    seed: int = _field(0, "master seed: weights, sampler order, answer shuffling and augmentation are pure "
                       "functions of (seed, epoch, index)", "run", minimum=0)
    resume: bool = _field(False, "continue from <run_dir>/checkpoints (finished stages are skipped, the "
                          "interrupted one restarts from its last.ckpt)", "run")
    overwrite: bool = _field(False, "delete existing checkpoints/results in run_dir instead of refusing to start",
                             "run")
    progress_bar: bool = _field(True, "show progress bars (turn off for headless / SLURM logs)", "run")
    save_predictions: bool = _field(True, "write per-sample test predictions to <run_dir>/predictions.npz", "run")
    log_every_n_steps: int = _field(50, "Lightning logging interval in optimiser steps", "run", minimum=1)
    logger: str = _field("csv", "experiment log besides history.csv (always written): csv (history.csv only) or "
                         "tensorboard (also TensorBoard event files in <run_dir>/tensorboard/<stage>; needs "
                         "pip install 'rpm_lib[tensorboard]')", "run", choices=("csv", "tensorboard"))
    time_budget: Union[float, None] = _field(None, "wall-clock seconds this call may run (from its start): it stops "
                                             "at a step boundary before the budget ends, leaves a resumable state, "
                                             "marks progress.json 'unfinished' (rpm-train exits with 75); rerun "
                                             "with resume=true to continue; null = no limit", "run",
                                             exclusive_minimum=0.0)

    # --- data ------------------------------------------------------------------------------------
    dataset: str = _field("iraven", "dataset family: iraven (I-RAVEN / RAVEN file layout) or pgm", "data",
                          choices=DATASETS)
    data_root: str = _field("data/iraven", "dataset folder: raw files or an 80 px cache made by "
                            "`rpm-data prepare`", "data")
    data_check: str = _field("exact", "what a resumed run demands of its data: exact (the data fingerprint recorded "
                             "when the run started: every pixel) or problems (for a cache: the same problems, "
                             "whose pixels another OpenCV version drew; the change is recorded in progress.json)",
                             "data", choices=DATA_CHECKS)
    test_data_roots: Union[list[str], None] = _field(None, "extra test sets: after training, the final model is "
                                                     "evaluated on the test split of each of these folders (raw or "
                                                     "cache) and each is reported in metrics.json test_sets, labelled "
                                                     "in- or out-of-distribution from regime.json "
                                                     "(docs/generalisation.md); null = none", "data")
    pgm_regime: str = _field("neutral", "PGM regime to train and test on (dataset=pgm only)", "data")
    configurations: Union[list[str], None] = _field(None, "I-RAVEN configurations to use (folder or short "
                                                    "names, e.g. [Center, 2x2Grid]); null = all 7", "data")
    image_size: int = _field(80, "panel side in pixels fed to the encoder", "data", minimum=8)
    rule_encoding: str = _field("auto", "rule vector for the auxiliary loss and the MLCL positives: auto "
                                "(dense for ce_aux_dense, sparse38 / sparse50 otherwise), dense, sparse38, "
                                "sparse40 (RAVEN), sparse50 (PGM)", "data", choices=RULE_ENCODINGS)
    generate: bool = _field(False, "first generate generate_num_per_config balanced I-RAVEN problems per "
                            "configuration (in the regime generate_regime) into data_root (resumable; existing "
                            "problems are kept; skipped for a cache; dataset=iraven only)", "data")
    generate_num_per_config: int = _field(100, "problems per configuration to generate (split 60/20/20 by "
                                          "index)", "data", minimum=10)
    generate_seed: int = _field(0, "generator seed", "data", minimum=0)
    generate_regime: str = _field("I-RAVEN", "generalisation regime of the generated data (e.g. A/Color: the "
                                  "held-out attribute follows one rule in train/val and other rules in test); "
                                  "only with generate=true", "data")
    generate_workers: int = _field(0, "generator worker processes (0 = in-process)", "data", minimum=0)
    max_train_samples: Union[int, None] = _field(None, "use a seeded random subset of this many training "
                                                 "problems (null = all)", "data", minimum=1)
    max_val_samples: Union[int, None] = _field(None, "same for validation", "data", minimum=1)
    max_test_samples: Union[int, None] = _field(None, "same for test", "data", minimum=1)
    num_workers: int = _field(0, "DataLoader worker processes per device", "data", minimum=0)

    # --- model -----------------------------------------------------------------------------------
    encoder: str = _field("scl", "encoder name from rpm_lib.encoders.list_encoders() (scl, copinet, hrinet, "
                          "wren)", "model")
    encoder_kwargs: dict[str, Any] = _field({}, "extra keyword arguments for create_encoder (image_size is "
                                            "taken from the image_size field)", "model")
    rule_pooling: str = _field("mean", "rule head pooling over the 8 completions: mean (answer-order invariant; "
                               "the default because answers are shuffled) or concat (order-dependent, as in the "
                               "released MLCL code)", "model", choices=RULE_POOLINGS)
    projection_dim: int = _field(128, "output size of the MLCL projection head", "model", minimum=1)

    # --- objective -------------------------------------------------------------------------------
    setup: str = _field("mlcl", "training setup: ce, ce_aux_dense, ce_aux_sparse, mlcl (contrastive "
                        "pre-training + linear evaluation), mlcl_aug (mlcl with two augmented views)",
                        "objective", choices=tuple(SETUPS))
    beta: float = _field(10.0, "weight of the auxiliary rule loss (0 disables the rule head)", "objective",
                         minimum=0.0)
    gamma: float = _field(1.0, "weight of the multi-label contrastive loss (mlcl setups; 0 disables it)",
                          "objective", minimum=0.0)
    temperature: float = _field(0.07, "MLCL temperature tau", "objective", exclusive_minimum=0.0)
    negatives: str = _field("batch", "MLCL extra negatives (wrong completions): batch (all in the batch), own "
                            "(the anchor's own RPM), none (ablation)", "objective",
                            choices=NEGATIVE_MODES)
    mlcl_numerics: str = _field("paper", "MLCL log-sum-exp: paper (one shared normaliser) or official "
                                "(the released code's two-max variant)", "objective",
                                choices=NUMERICS)
    answer_loss: str = _field("ce", "answer loss on the scoring head: ce (paper) or copinet_contrast (BCE on "
                              "one-hot, as the CoPINet release)", "objective",
                              choices=tuple(ANSWER_LOSSES))
    augment: str = _field("auto", "augmentation recipe of rpm_lib.augment for training views: auto "
                          "(official for mlcl_aug, none otherwise), none, or a recipe name", "objective")

    # --- optimisation ----------------------------------------------------------------------------
    batch_size: int = _field(128, "RPMs per optimiser step per device (views multiply it for the encoder)",
                             "optimisation", minimum=1)
    lr: float = _field(0.002, "Adam learning rate of the first stage", "optimisation", exclusive_minimum=0.0)
    adam_beta1: float = _field(0.9, "Adam beta1", "optimisation", minimum=0.0)
    adam_beta2: float = _field(0.999, "Adam beta2", "optimisation", minimum=0.0)
    adam_eps: float = _field(1e-8, "Adam epsilon", "optimisation", exclusive_minimum=0.0)
    weight_decay: float = _field(0.0, "Adam (L2) weight decay", "optimisation", minimum=0.0)
    max_epochs: int = _field(100, "epoch limit of the first stage", "optimisation", minimum=1)
    max_steps: int = _field(-1, "optimiser-step limit per stage (-1 = none; for tiny runs)", "optimisation",
                            minimum=-1)
    patience: int = _field(10, "early stopping: epochs without val-loss improvement before a stage ends",
                           "optimisation", minimum=1)
    min_delta: float = _field(0.0, "early stopping: smallest val-loss decrease that counts", "optimisation",
                              minimum=0.0)
    restore_best: bool = _field(True, "at the end of every stage reload the weights with the lowest val loss",
                                "optimisation")
    gradient_clip_val: Union[float, None] = _field(None, "clip gradient norm to this value (null = off)",
                                                   "optimisation", exclusive_minimum=0.0)
    linear_eval_epochs: Union[int, None] = _field(None, "epoch limit of linear evaluation (mlcl setups; null "
                                                  "= max_epochs)", "optimisation", minimum=1)
    linear_eval_lr: Union[float, None] = _field(None, "learning rate of linear evaluation (null = lr)",
                                                "optimisation", exclusive_minimum=0.0)
    linear_eval_batch_size: Union[int, None] = _field(None, "batch size of linear evaluation (null = "
                                                      "batch_size)", "optimisation", minimum=1)
    finetune: bool = _field(False, "stage 3: after the last stage, fine-tune encoder + scoring head with the "
                            "answer loss (as the official code does)", "optimisation")
    finetune_epochs: Union[int, None] = _field(None, "epoch limit of fine-tuning (null = max_epochs)",
                                               "optimisation", minimum=1)
    finetune_lr: float = _field(3e-4, "learning rate of fine-tuning (the release's 3e-4)", "optimisation",
                                exclusive_minimum=0.0)
    max_total_epochs: Union[int, None] = _field(None, "epoch limit of all stages together: a stage starts with "
                                                "what earlier stages left and a stage left none does not run (the "
                                                "release's Trainer: 30 over its three phases); null = none",
                                                "optimisation", minimum=1)
    lr_schedule: str = _field("constant", "learning rate within a stage: constant (the paper) or plateau "
                              "(ReduceLROnPlateau on the val loss, restarted with every stage, as the release)",
                              "optimisation", choices=LR_SCHEDULES)
    lr_plateau_factor: float = _field(0.1, "plateau schedule: factor applied to the lr on a plateau (the "
                                      "release's 0.1)", "optimisation", exclusive_minimum=0.0)
    lr_plateau_patience: int = _field(5, "plateau schedule: epochs without val-loss improvement before the lr "
                                      "drops (the release's 5)", "optimisation", minimum=0)
    linear_eval_encoder_mode: str = _field("eval", "mode of the frozen encoder in linear evaluation: eval (its "
                                           "BatchNorm statistics stay as pre-training left them: fixed features, "
                                           "the paper's protocol) or train (BatchNorm normalises with batch "
                                           "statistics and keeps updating them, as the release's head training)",
                                           "optimisation", choices=ENCODER_MODES)
    linear_eval_feature_cache: bool = _field(True, "linear evaluation computes the frozen encoder's embeddings of "
                                             "the training and validation problems once and trains the head on "
                                             "them, instead of a forward pass of every problem in every epoch (the "
                                             "same numbers up to rounding; with linear_eval_encoder_mode=eval and "
                                             "head_views=single, on one process)", "optimisation")
    head_views: str = _field("single", "training batches of linear evaluation and fine-tuning: single (one view; "
                             "un-augmented for linear evaluation, the setup's augmentation for fine-tuning) or "
                             "pretrain (the pre-training views and augmentation, e.g. two augmented views for "
                             "mlcl_aug, as the release's phases 2 and 3)", "optimisation", choices=HEAD_VIEWS)
    bn_recalibration_batches: int = _field(50, "contrastive setups: before every validation of pre-training and "
                                           "before linear evaluation (encoder in eval mode), re-estimate the "
                                           "encoder's BatchNorm statistics as the average over this many "
                                           "un-augmented training batches (a fixed seeded set) instead of the "
                                           "running averages left by training on augmented views; 0 = keep "
                                           "those (the release)", "optimisation", minimum=0)

    # --- hardware --------------------------------------------------------------------------------
    accelerator: str = _field("auto", "Lightning accelerator: auto, cpu, gpu, cuda, mps", "hardware",
                              choices=("auto", "cpu", "gpu", "cuda", "mps", "tpu"))
    devices: Union[int, str, list[int]] = _field("auto", "devices per node: auto, a count, or a list of ids",
                                                  "hardware")
    num_nodes: int = _field(1, "number of nodes (multi-node DDP)", "hardware", minimum=1)
    strategy: str = _field("auto", "Lightning strategy: auto, ddp, ddp_spawn, ddp_notebook, ...", "hardware")
    precision: str = _field("auto", "auto (bf16-mixed on GPUs that support it, else 16-mixed; 32-true on "
                            "CPU) or a Lightning precision string", "hardware", choices=PRECISIONS)
    matmul_precision: str = _field("auto", "float32 matrix multiplications: auto (what the process has set; "
                                   "PyTorch's default is highest), highest (full fp32), high (TF32 on NVIDIA GPUs "
                                   "since Ampere) or medium (bf16 where supported). It matters with "
                                   "precision=32-true: the mixed precisions multiply in bf16/fp16 anyway, and cuDNN "
                                   "convolutions already use TF32 by PyTorch's default", "hardware",
                                   choices=MATMUL_PRECISIONS)
    memory_format: str = _field("auto", "encoder tensor layout: auto (channels_last, the faster on CPU and CUDA), "
                                "channels_last or contiguous", "hardware",
                                choices=MEMORY_FORMATS)
    sync_batchnorm: bool = _field(False, "synchronise BatchNorm statistics across DDP processes", "hardware")
    deterministic: bool = _field(False, "torch deterministic algorithms (slower on GPU)", "hardware")
    fused_adam: bool = _field(True, "on CUDA, Adam as one fused kernel over all parameters instead of a few "
                              "per parameter (the H200 profile: a step is bound by the host's kernel launches); "
                              "ignored on CPU", "hardware")
    compile: bool = _field(False, "torch.compile the encoder (in place: checkpoints keep their keys), or what "
                           "compile_scope names; the first steps of every stage pay the compilation; measure with "
                           "bench/profile_training.py --compile before turning it on", "hardware")
    compile_scope: str = _field("encoder", "with compile=true: encoder, or step (the whole forward of a training or "
                                "validation step: encoder, heads and losses, so their backward is compiled too)",
                                "hardware", choices=COMPILE_SCOPES)
    compile_mode: str = _field("default", "with compile=true: torch.compile mode; reduce-overhead replays a step's "
                               "kernels as CUDA graphs (for a step bound by the host's kernel launches; CUDA only)",
                               "hardware", choices=COMPILE_MODES)

    # --- limits ----------------------------------------------------------------------------------
    limit_train_batches: Union[int, float] = _field(1.0, "batches per training epoch: fraction (float) or "
                                                     "count (int)", "limits", minimum=0)
    limit_val_batches: Union[int, float] = _field(1.0, "batches per validation: fraction or count (must be "
                                                   "> 0: early stopping needs a val loss)", "limits",
                                                   exclusive_minimum=0)
    limit_test_batches: Union[int, float] = _field(1.0, "batches of the final test: fraction or count",
                                                    "limits", exclusive_minimum=0)

    def __post_init__(self) -> None:
        self._coerce_and_check_types()
        self._check_constraints()
        self._normalise()
        self._check_cross_field()

    # ------------------------------------------------------------------------------------------
    # construction helpers
    # ------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> "TrainConfig":
        """Build from a mapping; unknown keys raise :class:`ConfigError` with a close-match suggestion."""
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a mapping of field: value, got {type(values).__name__}")
        names = cls.field_names()
        for key in values:
            if key not in names:
                raise ConfigError(f"{source}: unknown config field {key!r}{_suggest(str(key), names)}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> "TrainConfig":
        """Read a YAML file (a mapping of fields), then apply ``key=value`` overrides."""
        from rpm_lib.typed_values import load_yaml_file_text, yaml_problem

        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a folder, not a YAML file")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            values = load_yaml_file_text(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"config file {path}: {yaml_problem(error)}") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"config file {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path}: expected a mapping of field: value, got {type(values).__name__}")
        values.update(parse_overrides(overrides or []))
        return cls.from_dict(values, source=str(path))

    def with_overrides(self, overrides: list[str] | dict[str, Any]) -> "TrainConfig":
        """A copy with ``["key=value", ...]`` (values parsed as YAML) or a dict of values applied."""
        values = self.to_dict()
        values.update(parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides))
        return type(self).from_dict(values, source="overrides")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_yaml(self, path: str | Path | None = None) -> str:
        """YAML text of all fields (in declaration order); also written to ``path`` when given."""
        text = yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    # ------------------------------------------------------------------------------------------
    # derived values
    # ------------------------------------------------------------------------------------------
    @property
    def trains_on_cuda(self) -> bool:
        """The accelerator asks for (or allows) CUDA and a CUDA device is present: the one test every hardware
        default (precision, memory format, pinned memory, evaluation device) is resolved from."""
        import torch

        return self.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()

    def unused_settings(self) -> list[str]:
        """Settings away from their defaults that change nothing in this run, one sentence each (a note, not an
        error: a YAML may keep them for the machine or the run where they apply)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        notes = []
        if not self.compile:
            changed = [f"{name}={getattr(self, name)}" for name in ("compile_scope", "compile_mode")
                       if getattr(self, name) != defaults[name]]
            if changed:
                notes.append(f"{' and '.join(changed)} {'takes' if len(changed) == 1 else 'take'} effect only with "
                             "compile=true")
        elif self.compile_mode == "reduce-overhead" and not self.trains_on_cuda:
            notes.append("compile_mode=reduce-overhead replays CUDA graphs only on a CUDA GPU; here the step is "
                         "compiled without them")
        return notes

    @property
    def resolved_rule_encoding(self) -> str:
        """``rule_encoding`` with ``auto`` resolved: dense / sparse38 / sparse40 / sparse50."""
        if self.rule_encoding != "auto":
            return self.rule_encoding
        if self.setup == "ce_aux_dense":
            return "dense"
        return default_sparse(self.dataset)

    @property
    def rule_spec(self) -> RuleEncoding:
        """The run's rule encoding from the registry: width, sample key, encoder, decoder and slot names."""
        return rule_encoding(self.resolved_rule_encoding, self.dataset)

    @property
    def resolved_augment(self) -> str:
        """``augment`` with ``auto`` resolved: ``official`` for mlcl_aug, ``none`` otherwise."""
        if self.augment != "auto":
            return self.augment
        return "official" if self.setup == "mlcl_aug" else "none"

    # ------------------------------------------------------------------------------------------
    # validation
    # ------------------------------------------------------------------------------------------
    def _coerce_and_check_types(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            setattr(self, f.name, typed_values.coerce(f.name, value, hints[f.name], error=ConfigError))

    def _check_constraints(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            meta = f.metadata
            if "choices" in meta and value not in meta["choices"]:
                raise ConfigError(
                    f"config field {f.name!r}: {value!r} is not one of {', '.join(map(str, meta['choices']))}"
                    f"{_suggest(str(value), [str(c) for c in meta['choices']])}"
                )
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):  # nan passes every comparison below; inf is never meant
                    raise ConfigError(f"config field {f.name!r}: must be a finite number, got {value!r}")
                if "minimum" in meta and value < meta["minimum"]:
                    raise ConfigError(f"config field {f.name!r}: must be >= {meta['minimum']}, got {value!r}")
                if "exclusive_minimum" in meta and value <= meta["exclusive_minimum"]:
                    raise ConfigError(
                        f"config field {f.name!r}: must be > {meta['exclusive_minimum']}, got {value!r}"
                    )

    def _normalise(self) -> None:
        if self.configurations is not None:
            self.configurations = normalise_configurations(self.configurations)
        if self.test_data_roots is not None:
            self.test_data_roots = normalise_test_data_roots(self.test_data_roots)
        if isinstance(self.devices, str) and self.devices != "auto":
            raise ConfigError(f"config field 'devices': expected 'auto', a count or a list of ids, got {self.devices!r}")
        if isinstance(self.devices, int) and self.devices < 1 and self.devices != -1:
            raise ConfigError(f"config field 'devices': must be >= 1 (or -1 = all), got {self.devices}")
        if self.precision == "32":
            self.precision = "32-true"

    def _check_cross_field(self) -> None:
        spec = SETUPS[self.setup]
        encoding = self.resolved_rule_encoding
        try:
            rule_encoding(encoding, self.dataset)
        except ValueError as error:
            raise ConfigError(f"config field 'rule_encoding': {error}") from None
        if spec.rule_kind == "dense" and encoding != "dense":
            raise ConfigError(f"config field 'rule_encoding': setup {self.setup} needs dense rules, got {encoding}")
        if spec.rule_kind == "sparse" and encoding == "dense":
            raise ConfigError(f"config field 'rule_encoding': setup {self.setup} needs a sparse code, got dense")
        if spec.contrastive and self.beta == 0 and self.gamma == 0:
            raise ConfigError("config fields 'beta' and 'gamma': both are 0, so pre-training would have no loss")
        if self.generate and self.dataset != "iraven":
            raise ConfigError("config field 'generate': the built-in generator only makes I-RAVEN (dataset=iraven)")
        _check_generate_regime(self.generate_regime, self.generate)
        if "image_size" in self.encoder_kwargs:
            raise ConfigError("config field 'encoder_kwargs': do not set image_size here; use the image_size field")
        if self.lr_plateau_factor >= 1:
            raise ConfigError(f"config field 'lr_plateau_factor': must be < 1 (it lowers the lr), got "
                              f"{self.lr_plateau_factor!r}")
        if self.resume and self.overwrite:
            raise ConfigError("config fields 'resume' and 'overwrite': choose one (both are true)")
        from rpm_lib.encoders import list_encoders
        from rpm_lib.rules import PGM_REGIMES

        _check_known("encoder", "encoder", self.encoder, list_encoders())
        if self.dataset == "pgm":
            _check_known("pgm_regime", "regime", self.pgm_regime, list(PGM_REGIMES))
        if self.resolved_augment != "none":
            from rpm_lib.augment import RECIPES  # albumentations is slow to import: only when augmenting

            _check_known("augment", "recipe", self.resolved_augment, list(RECIPES), extra="auto, none, ")


# ----------------------------------------------------------------------------------------------
# overrides and type coercion
# ----------------------------------------------------------------------------------------------
def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["lr=0.001", "configurations=[Center, L-R]"]`` -> ``{"lr": 0.001, ...}`` (values parsed as YAML).

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    values: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value")
        # The raw text is kept beside the YAML value; coercion decides per field type which one fits.
        values[key] = typed_values.from_text(raw)
    return values


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------------------------
# checks that need other rpm_lib modules
# ----------------------------------------------------------------------------------------------
def normalise_configurations(names: list[str]) -> list[str]:
    """Map short names (``Center``, ``2x2Grid``, ...) and folder names to folder names; keep order.

    Raises:
        ConfigError: an unknown name or a duplicate.
    """
    from rpm_lib.rules import CONFIGURATIONS, SHORT_NAMES, resolve_configuration, resolve_configurations

    for name in names:
        try:
            resolve_configuration(name)
        except ValueError:
            options = list(CONFIGURATIONS) + list(SHORT_NAMES.values())
            raise ConfigError(f"config field 'configurations': unknown configuration {name!r}{_suggest(name, options)}"
                              f"; known: {', '.join(SHORT_NAMES.values())}") from None
    try:
        return resolve_configurations(names, allow_duplicates=False)
    except ValueError as error:
        raise ConfigError(f"config field 'configurations': {error}") from None


def normalise_test_data_roots(roots: list[str]) -> list[str] | None:
    """``test_data_roots`` checked: non-empty path strings, each once; an empty list means none (``None``).

    Existence is checked by ``train`` (before training), not here: a config may be written before its data.

    Raises:
        ConfigError: an empty entry or a duplicate.
    """
    seen: set[str] = set()
    for root in roots:
        if not root.strip():
            raise ConfigError("config field 'test_data_roots': an entry is empty; give a dataset folder or cache")
        key = str(Path(root))
        if key in seen:
            raise ConfigError(f"config field 'test_data_roots': {root} is listed twice")
        seen.add(key)
    return list(roots) or None


def _check_generate_regime(name: str, generate: bool) -> None:
    """``generate_regime`` must name a known regime, and a non-default one only makes sense with ``generate``."""
    from rpm_lib.generator.regimes import IRAVEN, REGIMES

    _check_known("generate_regime", "regime", name, list(REGIMES))
    if name != IRAVEN.name and not generate:
        raise ConfigError(f"config field 'generate_regime': {name} has no effect without generate=true (data_root "
                          "is used as it is); set generate=true or leave generate_regime at its default")


def _check_known(field: str, what: str, value: str, known: list[str], extra: str = "") -> None:
    """Raise ConfigError naming ``field`` when ``value`` is not one of ``known`` (with a close match)."""
    if value not in known:
        raise ConfigError(f"config field '{field}': unknown {what} {value!r}{_suggest(value, known)}; "
                          f"known: {extra}{', '.join(known)}")


def field_help() -> list[tuple[str, str, str, str, str]]:
    """(group, name, type, default, help) for every field, in declaration order (used by ``--help``)."""
    hints = typing.get_type_hints(TrainConfig)
    rows = []
    for f in dataclasses.fields(TrainConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        text = f.metadata["help"]
        if "choices" in f.metadata:
            text += f" [choices: {', '.join(map(str, f.metadata['choices']))}]"
        rows.append((f.metadata["group"], f.name, typed_values.type_name(hints[f.name]), yaml.safe_dump(default,
                     default_flow_style=True).strip().removesuffix("...").strip(), text))
    return rows
