"""The one error type of the data layer."""
from __future__ import annotations


class DataFormatError(ValueError):
    """A dataset folder, file name or file content is not what RAVEN / I-RAVEN / PGM readers expect.

    The message always names the offending path (folder or file) and what is wrong with it.
    """
