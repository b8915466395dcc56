"""The names a config chooses among for the method's parts, without importing torch.

``TrainConfig`` checks its fields against these, and the parts that implement them (heads, losses) import them from
here, so that reading a config (``rpm-batch``'s own process, its live progress, ``rpm-batch status``) never loads
torch.
"""
from __future__ import annotations

#: :class:`rpm_lib.heads.RuleHead` pooling over the 8 completions (config field ``rule_pooling``).
RULE_POOLINGS: tuple[str, ...] = ("mean", "concat")
#: :func:`rpm_lib.losses.mlcl_loss` negatives (config field ``negatives``).
NEGATIVE_MODES: tuple[str, ...] = ("batch", "own", "none")
#: :func:`rpm_lib.losses.mlcl_loss` numerics (config field ``mlcl_numerics``).
NUMERICS: tuple[str, ...] = ("paper", "official")
#: The keys of :data:`rpm_lib.losses.ANSWER_LOSSES` (config field ``answer_loss``).
ANSWER_LOSS_NAMES: tuple[str, ...] = ("ce", "copinet_contrast")
#: Encoders rpm_lib registers itself (config field ``encoder``): a config naming one of these is checked without
#: importing the encoders; any other name is looked up in the registry (:func:`rpm_lib.encoders.list_encoders`),
#: which holds these and the ones a user registers.
BUILT_IN_ENCODERS: tuple[str, ...] = ("scl", "copinet", "hrinet", "wren", "predrnet")
#: The keys of :data:`rpm_lib.augment.RECIPES` (config field ``augment``, besides ``auto``).
AUGMENT_RECIPES: tuple[str, ...] = ("official", "position_preserving", "none", "release", "release_position_preserving")
