"""The encoder contract and the encoder registry.

An *encoder* maps the 16 panels of one RPM (8 context panels, row-major, then 8 choices) to one
embedding per *completed matrix*: the context with choice ``k`` filled into the missing cell.

    panels      float (B, 16, H, W), values in [0, 1]
    embeddings  float (B, 8, D),  D = encoder.embedding_dim

Every encoder declares ``couples_candidates``: ``False`` when embedding ``k`` depends only on the
context and choice ``k`` (in eval mode, where BatchNorm uses running statistics), ``True`` when it
also depends on the other choices (CoPINet subtracts a function of the sum over all choices).

Registry (timm style)::

    @register_encoder("scl")
    class SCLEncoder(Encoder): ...

    encoder = create_encoder("scl", image_size=80)
    list_encoders()  # ['copinet', 'hrinet', 'scl', 'wren']
"""
from __future__ import annotations

import abc
from typing import Callable, TypeVar

import torch
from torch import nn

#: Panels per RPM: 8 context panels followed by 8 choices.
NUM_PANELS: int = 16
#: Context panels (the 3x3 matrix without its last cell).
NUM_CONTEXT: int = 8
#: Answer choices, hence completed matrices per RPM.
NUM_CANDIDATES: int = 8


class Encoder(nn.Module, abc.ABC):
    """Base class: validates the panels, then calls :meth:`embed`.

    Subclasses set ``embedding_dim`` (D) and ``couples_candidates`` and implement :meth:`embed`.

    Attributes:
        embedding_dim: D, the size of one completed matrix's embedding.
        couples_candidates: whether embedding ``k`` depends on choices other than ``k``.
        image_size: the panel side length S (pixels) the encoder was built for.
    """

    embedding_dim: int
    couples_candidates: bool = False

    def __init__(self, image_size: int) -> None:
        super().__init__()
        if image_size <= 0:
            raise ValueError(f"{type(self).__name__}: image_size must be positive, got {image_size}")
        self.image_size = int(image_size)

    def forward(self, panels: torch.Tensor) -> torch.Tensor:
        """Embed every completed matrix.

        Args:
            panels: float (B, 16, S, S) in [0, 1], S = ``image_size``.

        Returns:
            float (B, 8, D): row ``k`` embeds the context completed with choice ``k``.

        Raises:
            ValueError: wrong rank, panel count, panel size or a non-floating dtype.
        """
        self._check_panels(panels)
        return self.embed(panels)

    @abc.abstractmethod
    def embed(self, panels: torch.Tensor) -> torch.Tensor:
        """(B, 16, S, S) -> (B, 8, D); the input has already been validated."""

    def _check_panels(self, panels: torch.Tensor) -> None:
        name = type(self).__name__
        if not isinstance(panels, torch.Tensor):
            raise ValueError(f"{name}: panels must be a torch.Tensor, got {type(panels).__name__}")
        if not panels.is_floating_point():
            raise ValueError(
                f"{name}: panels must be floating point in [0, 1], got dtype {panels.dtype} "
                "(convert uint8 panels with panels.float() / 255)"
            )
        expected = (NUM_PANELS, self.image_size, self.image_size)
        if panels.ndim != 4 or tuple(panels.shape[1:]) != expected:
            raise ValueError(
                f"{name}: panels must have shape (B, {NUM_PANELS}, {self.image_size}, {self.image_size}), "
                f"got {tuple(panels.shape)}"
            )


EncoderT = TypeVar("EncoderT", bound=type)

_ENCODERS: dict[str, Callable[..., Encoder]] = {}


def register_encoder(name: str) -> Callable[[EncoderT], EncoderT]:
    """Class decorator: make ``create_encoder(name, **kwargs)`` build ``cls(**kwargs)``.

    Raises:
        ValueError: the name is empty or already registered.
    """
    if not name:
        raise ValueError("register_encoder: the name must be a non-empty string")

    def decorator(cls: EncoderT) -> EncoderT:
        if name in _ENCODERS:
            raise ValueError(f"register_encoder: an encoder named {name!r} is already registered")
        _ENCODERS[name] = cls
        return cls

    return decorator


def list_encoders() -> list[str]:
    """Names of all registered encoders, sorted."""
    return sorted(_ENCODERS)


def create_encoder(name: str, **kwargs: object) -> Encoder:
    """Build the encoder registered as ``name`` with keyword arguments ``kwargs``.

    Weights are initialised from torch's global RNG: call ``torch.manual_seed`` first for
    reproducible weights.

    Raises:
        ValueError: unknown name (the message lists the registered names).
    """
    try:
        factory = _ENCODERS[name]
    except KeyError:
        raise ValueError(f"unknown encoder {name!r}; registered encoders: {', '.join(list_encoders())}") from None
    return factory(**kwargs)
