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
import re
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from rpm_lib import typed_values
from rpm_lib.method_choices import (ANSWER_LOSS_NAMES, AUGMENT_RECIPES, BUILT_IN_ENCODERS, NEGATIVE_MODES, NUMERICS,
                                    RULE_POOLINGS)
from rpm_lib.rule_encodings import RuleEncoding, default_sparse, rule_encoding
from rpm_lib.training.config_values import (COMPILE_MODES, COMPILE_SCOPES, DATA_CHECKS, DATASETS, ENCODER_MODES,
                                            EVALUATION, FIXED_SETTING, HEAD_VIEWS, LENGTH, LR_SCHEDULES,
                                            MATMUL_PRECISIONS, MEMORY_FORMATS, PRECISIONS, RULE_ENCODINGS,
                                            RUN_CONTROL, TRAINED, ConfigError, check_field_constraints,
                                            check_generate_regime, check_known, field, normalise_configurations,
                                            normalise_test_data_roots, parse_overrides, plain, read_yaml_mapping,
                                            suggest)
from rpm_lib.training.objectives import OBJECTIVES
from rpm_lib.training.setups import SETUPS, STAGE_KINDS, setup_help

#: The field a value error names first (``config field 'lr': ...``, ``config fields 'a' and 'b': ...``).
_NAMED_FIELD = re.compile(r"config fields? '([^']+)'")


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run needs. Paper defaults for I-RAVEN (batch 128, lr 0.002, <= 100 epochs).

    Construct with keywords, from YAML (:meth:`from_yaml`), from a dict (:meth:`from_dict`), or apply
    ``key=value`` strings with :meth:`with_overrides`. Invalid values raise :class:`ConfigError`.
    """

    # --- run -------------------------------------------------------------------------------------
    run_dir: str = field("runs/train", "output folder: config.yaml, checkpoints/, history.csv, metrics.json, "
                         "predictions.npz", "run", RUN_CONTROL)
    seed: int = field(0, "master seed: weights, sampler order, answer shuffling and augmentation are pure "
                      "functions of (seed, epoch, index)", "run", FIXED_SETTING, minimum=0)
    resume: bool = field(False, "continue from <run_dir>/checkpoints (finished stages are skipped, the "
                         "interrupted one restarts from its last.ckpt)", "run", RUN_CONTROL)
    overwrite: bool = field(False, "delete existing checkpoints/results in run_dir instead of refusing to start",
                            "run", RUN_CONTROL)
    restart_stage: bool = field(False, "when resuming: a stage whose progress.json records steps but whose "
                                "checkpoints/<stage>/last.ckpt is missing or damaged trains again from step 0 (a note; "
                                "recorded as 'restarted' in its progress.json entry) instead of being refused; a "
                                "stage with a good last.ckpt resumes from it all the same", "run", RUN_CONTROL)
    progress_bar: bool = field(True, "show progress bars (turn off for headless / SLURM logs)", "run", RUN_CONTROL)
    save_predictions: bool = field(True, "write per-sample test predictions to <run_dir>/predictions.npz", "run",
                                   RUN_CONTROL)
    log_every_n_steps: int = field(50, "Lightning logging interval in optimiser steps", "run", RUN_CONTROL, minimum=1)
    logger: str = field("csv", "experiment log besides history.csv (always written): csv (history.csv only) or "
                        "tensorboard (also TensorBoard event files in <run_dir>/tensorboard/<stage>; needs "
                        "pip install 'rpm_lib[tensorboard]')", "run", RUN_CONTROL, choices=("csv", "tensorboard"))
    time_budget: Union[float, None] = field(None, "wall-clock seconds this call may run (from its start): it stops "
                                            "at a step boundary before the budget ends, leaves a resumable state, "
                                            "marks progress.json 'unfinished' (rpm-train exits with 75); rerun "
                                            "with resume=true to continue; null = no limit", "run", RUN_CONTROL,
                                            exclusive_minimum=0.0)

    # --- data ------------------------------------------------------------------------------------
    dataset: str = field("iraven", "dataset family: iraven (I-RAVEN / RAVEN file layout) or pgm", "data", TRAINED,
                         choices=DATASETS)
    data_root: str = field("data/iraven", "dataset folder: raw files or an 80 px cache made by "
                           "`rpm-data prepare`", "data", RUN_CONTROL)
    data_check: str = field("exact", "what a resumed run demands of its data: exact (the data fingerprint recorded "
                            "when the run started: every pixel) or problems (for a cache: the same problems, "
                            "whose pixels another OpenCV version drew; the change is recorded in progress.json)",
                            "data", RUN_CONTROL, choices=DATA_CHECKS)
    test_data_roots: Union[list[str], None] = field(None, "extra test sets: after training, the final model is "
                                                    "evaluated on the test split of each of these folders (raw or "
                                                    "cache) and each is reported in metrics.json test_sets, labelled "
                                                    "in- or out-of-distribution from regime.json "
                                                    "(docs/generalisation.md); null = none", "data", RUN_CONTROL)
    pgm_regime: str = field("neutral", "PGM regime to train and test on (dataset=pgm only)", "data", TRAINED)
    configurations: Union[list[str], None] = field(None, "I-RAVEN configurations to use (folder or short "
                                                   "names, e.g. [Center, 2x2Grid]); null = all 7", "data", TRAINED)
    image_size: int = field(80, "panel side in pixels fed to the encoder", "data", TRAINED, minimum=8)
    rule_encoding: str = field("auto", "rule vector for the auxiliary loss and the MLCL positives: auto "
                               "(dense for ce_aux_dense, sparse38 / sparse50 otherwise), dense, sparse38, "
                               "sparse40 (RAVEN), sparse50 (PGM)", "data", TRAINED, choices=RULE_ENCODINGS)
    generate: bool = field(False, "first generate generate_num_per_config balanced I-RAVEN problems per "
                           "configuration (in the regime generate_regime) into data_root (resumable; existing "
                           "problems are kept; skipped for a cache; dataset=iraven only)", "data", FIXED_SETTING)
    generate_num_per_config: int = field(100, "problems per configuration to generate (split 60/20/20 by "
                                         "index)", "data", TRAINED, minimum=10)
    generate_seed: int = field(0, "generator seed", "data", TRAINED, minimum=0)
    generate_regime: str = field("I-RAVEN", "generalisation regime of the generated data (e.g. A/Color: the "
                                 "held-out attribute follows one rule in train/val and other rules in test); "
                                 "only with generate=true", "data", TRAINED)
    generate_workers: int = field(0, "generator worker processes (0 = in-process)", "data", RUN_CONTROL, minimum=0)
    max_train_samples: Union[int, None] = field(None, "use a seeded random subset of this many training "
                                                "problems (null = all)", "data", TRAINED, minimum=1)
    max_val_samples: Union[int, None] = field(None, "same for validation", "data", TRAINED, minimum=1)
    max_test_samples: Union[int, None] = field(None, "same for test", "data", TRAINED, minimum=1)
    num_workers: int = field(0, "DataLoader worker processes per device", "data", RUN_CONTROL, minimum=0)

    # --- model -----------------------------------------------------------------------------------
    encoder: str = field("scl", "encoder name from rpm_lib.encoders.list_encoders() (scl, copinet, hrinet, "
                         "wren)", "model", TRAINED)
    encoder_kwargs: dict[str, Any] = field({}, "extra keyword arguments for create_encoder (image_size is "
                                           "taken from the image_size field)", "model", TRAINED)
    rule_pooling: str = field("mean", "rule head pooling over the 8 completions: mean (answer-order invariant; "
                              "the default because answers are shuffled) or concat (order-dependent, as in the "
                              "released MLCL code)", "model", TRAINED, choices=RULE_POOLINGS)
    projection_dim: int = field(128, "output size of the MLCL projection head", "model", TRAINED, minimum=1)

    # --- objective -------------------------------------------------------------------------------
    setup: str = field("mlcl", setup_help(), "objective", TRAINED, choices=tuple(SETUPS))
    beta: float = field(10.0, "weight of the auxiliary rule loss (0 disables the rule head)", "objective", TRAINED,
                        minimum=0.0)
    gamma: float = field(1.0, "weight of the multi-label contrastive loss (mlcl setups; 0 disables it)",
                         "objective", TRAINED, minimum=0.0)
    temperature: float = field(0.07, "MLCL temperature tau", "objective", TRAINED, exclusive_minimum=0.0)
    negatives: str = field("batch", "MLCL extra negatives (wrong completions): batch (all in the batch), own "
                           "(the anchor's own RPM), none (ablation)", "objective", TRAINED,
                           choices=NEGATIVE_MODES)
    mlcl_numerics: str = field("paper", "MLCL log-sum-exp: paper (one shared normaliser) or official "
                               "(the released code's two-max variant)", "objective", TRAINED,
                               choices=NUMERICS)
    answer_loss: str = field("ce", "answer loss on the scoring head: ce (paper) or copinet_contrast (BCE on "
                             "one-hot, as the CoPINet release)", "objective", TRAINED,
                             choices=ANSWER_LOSS_NAMES)
    augment: str = field("auto", "augmentation recipe of rpm_lib.augment for training views: auto "
                         "(official for mlcl_aug, none otherwise), none, or a recipe name", "objective", TRAINED)

    # --- optimisation ----------------------------------------------------------------------------
    batch_size: int = field(128, "RPMs per optimiser step per device (views multiply it for the encoder)",
                            "optimisation", TRAINED, minimum=1)
    lr: float = field(0.002, "Adam learning rate of the first stage", "optimisation", TRAINED, exclusive_minimum=0.0)
    adam_beta1: float = field(0.9, "Adam beta1", "optimisation", TRAINED, minimum=0.0)
    adam_beta2: float = field(0.999, "Adam beta2", "optimisation", TRAINED, minimum=0.0)
    adam_eps: float = field(1e-8, "Adam epsilon", "optimisation", TRAINED, exclusive_minimum=0.0)
    weight_decay: float = field(0.0, "Adam (L2) weight decay", "optimisation", TRAINED, minimum=0.0)
    max_epochs: int = field(100, "epoch limit of the first stage", "optimisation", LENGTH, minimum=1)
    max_steps: int = field(-1, "optimiser-step limit per stage (-1 = none; for tiny runs)", "optimisation", LENGTH,
                           minimum=-1)
    patience: int = field(10, "early stopping: epochs without val-loss improvement before a stage ends",
                          "optimisation", LENGTH, minimum=1)
    min_delta: float = field(0.0, "early stopping: smallest val-loss decrease that counts", "optimisation", LENGTH,
                             minimum=0.0)
    restore_best: bool = field(True, "at the end of every stage reload the weights with the lowest val loss",
                               "optimisation", TRAINED)
    gradient_clip_val: Union[float, None] = field(None, "clip gradient norm to this value (null = off)",
                                                  "optimisation", TRAINED, exclusive_minimum=0.0)
    linear_eval_epochs: Union[int, None] = field(None, "epoch limit of linear evaluation (mlcl setups; null "
                                                 "= max_epochs)", "optimisation", LENGTH, minimum=1)
    linear_eval_lr: Union[float, None] = field(None, "learning rate of linear evaluation (null = lr)",
                                               "optimisation", TRAINED, exclusive_minimum=0.0)
    linear_eval_batch_size: Union[int, None] = field(None, "batch size of linear evaluation (null = "
                                                     "batch_size)", "optimisation", TRAINED, minimum=1)
    finetune: bool = field(False, "stage 3: after the last stage, fine-tune encoder + scoring head with the "
                           "answer loss (as the official code does)", "optimisation", TRAINED)
    finetune_epochs: Union[int, None] = field(None, "epoch limit of fine-tuning (null = max_epochs)",
                                              "optimisation", LENGTH, minimum=1)
    finetune_lr: float = field(3e-4, "learning rate of fine-tuning (the release's 3e-4)", "optimisation", TRAINED,
                               exclusive_minimum=0.0)
    max_total_epochs: Union[int, None] = field(None, "epoch limit of all stages together: a stage starts with "
                                               "what earlier stages left and a stage left none does not run (the "
                                               "release's Trainer: 30 over its three phases); null = none",
                                               "optimisation", TRAINED, minimum=1)
    lr_schedule: str = field("constant", "learning rate within a stage: constant (the paper) or plateau "
                             "(ReduceLROnPlateau on the val loss, restarted with every stage, as the release)",
                             "optimisation", TRAINED, choices=LR_SCHEDULES)
    lr_plateau_factor: float = field(0.1, "plateau schedule: factor applied to the lr on a plateau (the "
                                     "release's 0.1)", "optimisation", TRAINED, exclusive_minimum=0.0)
    lr_plateau_patience: int = field(5, "plateau schedule: epochs without val-loss improvement before the lr "
                                     "drops (the release's 5)", "optimisation", TRAINED, minimum=0)
    linear_eval_encoder_mode: str = field("eval", "mode of the frozen encoder in linear evaluation: eval (its "
                                          "BatchNorm statistics stay as pre-training left them: fixed features, "
                                          "the paper's protocol) or train (BatchNorm normalises with batch "
                                          "statistics and keeps updating them, as the release's head training)",
                                          "optimisation", TRAINED, choices=ENCODER_MODES)
    linear_eval_feature_cache: bool = field(True, "linear evaluation computes the frozen encoder's embeddings of "
                                            "the training and validation problems once and trains the head on "
                                            "them, instead of a forward pass of every problem in every epoch (the "
                                            "same numbers up to rounding; with linear_eval_encoder_mode=eval and "
                                            "head_views=single, on one process)", "optimisation", TRAINED)
    head_views: str = field("single", "training batches of linear evaluation and fine-tuning: single (one view; "
                            "un-augmented for linear evaluation, the setup's augmentation for fine-tuning) or "
                            "pretrain (the pre-training views and augmentation, e.g. two augmented views for "
                            "mlcl_aug, as the release's phases 2 and 3)", "optimisation", TRAINED, choices=HEAD_VIEWS)
    bn_recalibration_batches: int = field(50, "contrastive setups: before every validation of pre-training and "
                                          "before linear evaluation (encoder in eval mode), re-estimate the "
                                          "encoder's BatchNorm statistics as the average over this many "
                                          "un-augmented training batches (a fixed seeded set) instead of the "
                                          "running averages left by training on augmented views; 0 = keep "
                                          "those (the release)", "optimisation", TRAINED, minimum=0)

    # --- hardware --------------------------------------------------------------------------------
    accelerator: str = field("auto", "Lightning accelerator: auto, cpu, gpu, cuda, mps", "hardware", RUN_CONTROL,
                             choices=("auto", "cpu", "gpu", "cuda", "mps", "tpu"))
    devices: Union[int, str, list[int]] = field("auto", "devices per node: auto, a count, or a list of ids",
                                                "hardware", RUN_CONTROL)
    num_nodes: int = field(1, "number of nodes (multi-node DDP)", "hardware", RUN_CONTROL, minimum=1)
    strategy: str = field("auto", "Lightning strategy: auto, ddp, ddp_spawn, ddp_notebook, ...", "hardware",
                          RUN_CONTROL)
    precision: str = field("auto", "auto (bf16-mixed on GPUs that support it, else 16-mixed; 32-true on "
                           "CPU) or a Lightning precision string", "hardware", FIXED_SETTING, choices=PRECISIONS)
    matmul_precision: str = field("auto", "float32 matrix multiplications: auto (what the process has set; "
                                  "PyTorch's default is highest), highest (full fp32), high (TF32 on NVIDIA GPUs "
                                  "since Ampere) or medium (bf16 where supported). It matters with "
                                  "precision=32-true: the mixed precisions multiply in bf16/fp16 anyway, and cuDNN "
                                  "convolutions already use TF32 by PyTorch's default", "hardware", FIXED_SETTING,
                                  choices=MATMUL_PRECISIONS)
    memory_format: str = field("auto", "encoder tensor layout: auto (channels_last, the faster on CPU and CUDA), "
                               "channels_last or contiguous", "hardware", FIXED_SETTING,
                               choices=MEMORY_FORMATS)
    sync_batchnorm: bool = field(False, "synchronise BatchNorm statistics across DDP processes", "hardware", TRAINED)
    deterministic: bool = field(False, "torch deterministic algorithms (slower on GPU)", "hardware", FIXED_SETTING)
    fused_adam: bool = field(True, "on CUDA, Adam as one fused kernel over all parameters instead of a few "
                             "per parameter (the H200 profile: a step is bound by the host's kernel launches); "
                             "ignored on CPU", "hardware", RUN_CONTROL)
    compile: bool = field(False, "torch.compile the encoder (in place: checkpoints keep their keys), or what "
                          "compile_scope names; the first steps of every stage pay the compilation; measure with "
                          "experiments/gpu-profile/profile_training.py --compile before turning it on", "hardware",
                          RUN_CONTROL)
    compile_scope: str = field("encoder", "with compile=true: encoder, or step (the whole forward of a training or "
                               "validation step: encoder, heads and losses, so their backward is compiled too)",
                               "hardware", RUN_CONTROL, choices=COMPILE_SCOPES)
    compile_mode: str = field("default", "with compile=true: torch.compile mode; reduce-overhead replays a step's "
                              "kernels as CUDA graphs (for a step bound by the host's kernel launches; CUDA only)",
                              "hardware", RUN_CONTROL, choices=COMPILE_MODES)

    # --- limits ----------------------------------------------------------------------------------
    limit_train_batches: Union[int, float] = field(1.0, "batches per training epoch: fraction (float) or "
                                                   "count (int)", "limits", TRAINED, minimum=0)
    limit_val_batches: Union[int, float] = field(1.0, "batches per validation: fraction or count (must be "
                                                 "> 0: early stopping needs a val loss)", "limits", TRAINED,
                                                 exclusive_minimum=0)
    limit_test_batches: Union[int, float] = field(1.0, "batches of the final test: fraction or count",
                                                  "limits", EVALUATION, exclusive_minimum=0)

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
                raise ConfigError(f"{source}: unknown config field {key!r}{suggest(str(key), names)}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: list[str] | None = None) -> "TrainConfig":
        """Read a YAML file (a mapping of fields), then apply ``key=value`` overrides."""
        values = read_yaml_mapping(path)
        overridden = parse_overrides(overrides or [])
        values.update(overridden)
        try:
            return cls.from_dict(values, source=str(path))
        except ConfigError as error:
            # a value the file gave (a hand-edited or truncated config.yaml of a run folder): name the file
            named = _NAMED_FIELD.match(str(error))
            if named is None or named.group(1) in overridden:
                raise
            raise ConfigError(f"config file {path}: {error}") from None

    def with_overrides(self, overrides: list[str] | dict[str, Any]) -> "TrainConfig":
        """A copy with ``["key=value", ...]`` (values parsed as YAML) or a dict of values applied."""
        values = self.to_dict()
        values.update(parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides))
        return type(self).from_dict(values, source="overrides")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

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
        if self.restart_stage and not self.resume:
            notes.append("restart_stage=true takes effect only with resume=true")
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
        if SETUPS[self.setup].rule_kind == "dense":
            return "dense"
        return default_sparse(self.dataset)

    @property
    def rule_spec(self) -> RuleEncoding:
        """The run's rule encoding from the registry: width, sample key, encoder, decoder and slot names."""
        return rule_encoding(self.resolved_rule_encoding, self.dataset)

    @property
    def resolved_augment(self) -> str:
        """``augment`` with ``auto`` resolved: the setup's (``official`` for mlcl_aug, ``none`` otherwise)."""
        if self.augment != "auto":
            return self.augment
        return SETUPS[self.setup].augment

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
            check_field_constraints(f.name, getattr(self, f.name), f.metadata)

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
        # a stage without the answer loss trains the setup's objectives only: one of their weights must be > 0
        weights = [o.weight_field for name, o in OBJECTIVES.items() if name in spec.objectives and o.weight_field]
        for kind in (STAGE_KINDS[name] for name in spec.stages):
            if not kind.answer and weights and all(getattr(self, name) == 0 for name in weights):
                fields = " and ".join(repr(name) for name in weights)
                count = "it is" if len(weights) == 1 else "both are" if len(weights) == 2 else "all are"
                raise ConfigError(f"config field{'s' * (len(weights) > 1)} {fields}: {count} 0, so "
                                  f"{kind.description} would have no loss")
        if self.generate and self.dataset != "iraven":
            raise ConfigError("config field 'generate': the built-in generator only makes I-RAVEN (dataset=iraven)")
        check_generate_regime(self.generate_regime, self.generate)
        if "image_size" in self.encoder_kwargs:
            raise ConfigError("config field 'encoder_kwargs': do not set image_size here; use the image_size field")
        if self.lr_plateau_factor >= 1:
            raise ConfigError(f"config field 'lr_plateau_factor': must be < 1 (it lowers the lr), got "
                              f"{self.lr_plateau_factor!r}")
        if self.resume and self.overwrite:
            raise ConfigError("config fields 'resume' and 'overwrite': choose one (both are true)")
        from rpm_lib.rules import PGM_REGIMES

        if self.encoder not in BUILT_IN_ENCODERS:
            from rpm_lib.encoders import list_encoders  # torch: only for a name rpm_lib does not register itself

            check_known("encoder", "encoder", self.encoder, list_encoders())
        if self.dataset == "pgm":
            check_known("pgm_regime", "regime", self.pgm_regime, list(PGM_REGIMES))
        if self.resolved_augment != "none":
            check_known("augment", "recipe", self.resolved_augment, list(AUGMENT_RECIPES), extra="auto, none, ")


def _fields_whose(role: str, value: bool = True) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(TrainConfig) if f.metadata[role] is value)


#: Fields that may change between an interrupted run and its resumption (everything else must match).
RESUMABLE_CHANGES: frozenset[str] = _fields_whose("resumable")
#: Resumable fields that would change how much a run trains: set on a finished run, they change nothing (a note).
FINISHED_RUN_IGNORES: frozenset[str] = _fields_whose("finished_run_ignores")
#: Fields that say how or where a run ran, not what it trained: ``run.json`` may differ from ``metrics.json``
#: there (a batch moved to another machine, resumed with other workers) and seeds may differ there within one
#: Table 1 row. Every other recorded field must agree (``load_run``) / separates rows (``table1``).
NOT_COMPARED: frozenset[str] = _fields_whose("compared", False)


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
