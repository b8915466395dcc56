"""Seeds derived from (master seed, stream name, keys): every random draw in training is a pure function of them.

Streams in use: ``sampler`` (epoch order), ``answers`` (answer shuffling of one training sample),
``augment`` (augmentation of one sample), ``global_rng`` (dropout etc., reseeded every epoch),
``scoring_head`` (the fresh linear head of linear evaluation), ``subset`` (``max_*_samples``).
"""
from __future__ import annotations

import zlib

import numpy as np


def derive_seed(seed: int, stream: str, *keys: int) -> int:
    """A 32-bit seed, a deterministic function of ``seed`` (>= 0), ``stream`` and the integer ``keys`` (>= 0).

    Different streams or keys give statistically independent seeds (``numpy.random.SeedSequence``).
    """
    if seed < 0 or any(int(k) < 0 for k in keys):
        raise ValueError(f"derive_seed: seed and keys must be >= 0, got seed={seed}, keys={keys}")
    entropy = [int(seed), zlib.crc32(stream.encode()), *(int(k) for k in keys)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])
