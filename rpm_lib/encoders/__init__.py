"""Encoders: (B, 16, H, W) panels in [0, 1] -> (B, 8, D), one embedding per completed matrix.

Registered names (``create_encoder(name, **kwargs)``), sizes at 80 px:

============ ====== ============ ======= ==============================================
name         D      parameters   coupled notes
============ ====== ============ ======= ==============================================
``scl``      400    529,293      no      SCL, MLCL-release variant
``copinet``  256    1,685,692    yes     CoPINet without its scorer
``hrinet``   1024   13,221,824   no      SRAN hierarchy, the paper's 4-layer CNN backbone
                                         (``backbone="resnet18"``: 46,667,520)
``wren``     256    1,212,832    no      WReN up to f's hidden layer (cheap baseline)
``predrnet`` 256    1,277,632    no      PredRNet up to its classifier's hidden layer
                                         (Yang et al. 2023; not in the MLCL paper)
============ ====== ============ ======= ==============================================

"coupled" is ``Encoder.couples_candidates``: whether embedding k also depends on the other choices.
"""
from rpm_lib.encoders.base import Encoder, create_encoder, list_encoders, register_encoder
from rpm_lib.encoders.copinet import CoPINetEncoder
from rpm_lib.encoders.hrinet import HriNetEncoder
from rpm_lib.encoders.predrnet import PredRNetEncoder
from rpm_lib.encoders.scl import SCLEncoder
from rpm_lib.encoders.wren import WReNEncoder

__all__ = [
    "Encoder",
    "register_encoder",
    "create_encoder",
    "list_encoders",
    "SCLEncoder",
    "CoPINetEncoder",
    "HriNetEncoder",
    "WReNEncoder",
    "PredRNetEncoder",
]
