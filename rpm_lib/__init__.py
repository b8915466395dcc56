"""rpm_lib: a research toolkit for Raven's Progressive Matrices (RPMs).

Subpackages
-----------
- ``rpm_lib.rules``      rule vocabularies and dense / sparse rule encodings (RAVEN, PGM)
- ``rpm_lib.data``       RAVEN / I-RAVEN / PGM readers, the 80 px memory-mapped cache
- ``rpm_lib.generator``  the built-in I-RAVEN (and original RAVEN) generator
- ``rpm_lib.encoders``   SCL, CoPINet, HriNet, WReN behind ``create_encoder``
- ``rpm_lib.heads``      scoring, rule and projection heads
- ``rpm_lib.losses``     cross-entropy, auxiliary rule loss, the multi-label contrastive loss
- ``rpm_lib.augment``    one geometric transform for all 16 panels (albumentations 2.0.8)
- ``rpm_lib.training``   the paper's setups on Lightning, config dataclass, ``rpm-train``
"""
import os as _os

# albumentations phones home on import unless told not to; we never want that.
_os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"
