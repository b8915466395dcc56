"""``generate=true``: make a small balanced I-RAVEN (or one of its generalisation regimes) in ``data_root`` with the
built-in generator."""
from __future__ import annotations

from pathlib import Path

from rpm_lib.training.config import ConfigError, TrainConfig


def ensure_generated(config: TrainConfig) -> bool:
    """Generate ``generate_num_per_config`` problems per configuration of regime ``generate_regime`` (6/2/2 split)
    into ``config.data_root`` if asked.

    Runs only when ``config.generate`` is true and ``data_root`` is not an ``rpm-data`` cache. The generator
    is resumable and deterministic (problem k of configuration c depends on (seed, c, k) only), so an
    interrupted generation is completed and an existing complete folder is left untouched.

    Returns:
        True when the generator ran (possibly writing nothing because every file existed).
    """
    if not config.generate:
        return False
    from rpm_lib.data import is_cache
    from rpm_lib.data.records import GeneratorSettingsError
    from rpm_lib.generator.writer import write_dataset

    root = Path(config.data_root)
    if root.exists() and is_cache(root):
        return False
    try:
        write_dataset(
            root,
            configurations=config.configurations or "all",
            count=config.generate_num_per_config,
            seed=config.generate_seed,
            mode="balanced",
            regime=config.generate_regime,  # the generator refuses a folder holding another regime or seed
            workers=max(1, config.generate_workers),
            write_xml=False,  # the readers use only the .npz files; skipping .xml saves ~25 %
            progress=config.progress_bar,
        )
    except GeneratorSettingsError as error:  # data_root holds problems of other settings: one line, no traceback
        raise ConfigError(f"config field 'data_root': {error}") from None
    return True
