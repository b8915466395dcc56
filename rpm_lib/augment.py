"""RPM augmentation: one random geometric transform, applied identically to all 16 panels.

The MLCL paper augments an RPM with "vertical flip, horizontal flip, rotation by a random angle,
transposition, grid shuffle (2x2 / 3x3) and roll (vertical, horizontal, both)", always the *same*
transform for every panel so the rules and the answer index stay valid. We run albumentations 2.0.8 on
the panels stacked as channels, an ``(S, S, 16)`` uint8 image: albumentations draws one set of parameters
per call and applies it to every channel, which makes "same transform for all panels" hold by
construction (verified pixel-exactly in ``tests/test_augment.py``).

Contract (``docs/architecture.md``)::

    aug = RpmAugment("official", seed=0)
    out = aug(panels, preserve_position=False)   # panels, out: np.ndarray uint8 (16, S, S)

``preserve_position=True`` (RPMs with Progression / Arithmetic on Position; the dataset computes the flag
with ``rules.requires_position_preserving``) switches to a recipe without grid shuffle and roll, which
would move objects between positions and break such rules.

Recipes (``RECIPES``)
---------------------
``"official"``
    The authors' pipeline (docs/augmentation.md), with probabilities as in their code: the whole pipeline runs
    with p=0.5; inside it VerticalFlip, HorizontalFlip, RandomRotate90, Rotate (+-90 deg) and Transpose,
    each p=0.25; OneOf(p=0.25)[grid 2x2, grid 3x3]; OneOf(p=0.5)[roll both axes (weight 0.4),
    horizontal roll (0.3), vertical roll (0.3)]. Two deliberate changes from the release (``"release"``
    below): rotation fills the uncovered corners with white (255, the RPM background) instead of the
    release's reflection padding, which copies shapes into the corners, and every roll draws its offsets
    over the full panel.
``"release"``
    The MLCL release's pipeline exactly (``config/mlcl/raven/dataset/base.yaml`` of mikomel/mlcl): as
    ``"official"`` but rotation pads with ``BORDER_REFLECT_101`` (the albumentations 1.1 default the release
    ran with) and roll offsets drawn as the release's ``random.randint``: uniform in [0, 80] px inclusive
    (its panels are 80 px, where 80 and 0 are the same shift), except the horizontal offset of the
    both-axes roll, which is at most 10 px. Its position-preserving fallback is
    ``"release_position_preserving"``.
``"position_preserving"``
    The same flips / rot90 / rotation / transpose with the same probabilities; no grid shuffle, no roll.
``"none"``
    Identity (returns a copy).

``single_transform(name)`` builds an augmenter that always applies exactly one transform (for figures):
``vflip``, ``hflip``, ``rot90``, ``rotate``, ``transpose``, ``grid2``, ``grid3``, ``roll_v``, ``roll_h``,
``roll_vh``.

Randomness and DataLoader workers
---------------------------------
An ``RpmAugment`` owns ONE ``random.Random`` + ONE ``np.random.Generator`` that drive every transform in
its pipelines; ``aug.reseed(seed)`` resets them. ``rpm_lib.data`` datasets call ``reseed`` before every
sample with a seed derived from ``(seed, epoch, index)``, so what a sample gets does not depend on the
DataLoader worker that reads it, and needs no ``worker_init_fn`` (docs/augmentation.md, "Randomness and
DataLoader workers").
"""
from __future__ import annotations

import functools
import math
import os
import random
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterator, Literal, NamedTuple

# albumentations fetches its PyPI page on import unless told not to.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from albumentations.core.transforms_interface import BaseTransformInitSchema  # noqa: E402
from pydantic import Field  # noqa: E402  (albumentations 2.0.8's schema library; always installed with it)

from rpm_lib.method_choices import AUGMENT_RECIPES  # noqa: E402

__all__ = [
    "AppliedTransform",
    "RECIPES",
    "RELEASE_ROLL_MAX",
    "RELEASE_ROLL_VH_MAX_DX",
    "ROTATION_LIMIT_DEG",
    "Recipe",
    "RandomRoll",
    "RpmAugment",
    "SINGLE_TRANSFORM_NAMES",
    "single_transform",
]

#: Rotation angles are drawn uniformly from [-ROTATION_LIMIT_DEG, +ROTATION_LIMIT_DEG] (albumentations'
#: default limit, which the official code used).
ROTATION_LIMIT_DEG: float = 90.0
#: Fill value for pixels a rotation uncovers: RPM panels are black drawings on white.
WHITE: int = 255
#: Largest roll offset (px, inclusive) of the release: 80 for every axis of every roll (its panels are 80 px, so
#: 80 and 0 are the same shift) ...
RELEASE_ROLL_MAX: int = 80
#: ... except the horizontal offset of its both-axes roll (``Roll(max_horizontal_shift=10, max_vertical_shift=80)``).
RELEASE_ROLL_VH_MAX_DX: int = 10


# --------------------------------------------------------------------------------------------------
# Roll: albumentations has no cyclic shift, so we add one.
# --------------------------------------------------------------------------------------------------
class RandomRoll(A.DualTransform):
    """Cyclic shift (``np.roll``) by one random offset, the same for every channel (= panel).

    Args:
        axis: ``"v"`` rolls rows (vertical shift ``dy``), ``"h"`` rolls columns (horizontal shift ``dx``),
            ``"vh"`` both at once. By default offsets are uniform integers in ``[0, H)`` / ``[0, W)`` pixels.
        max_dy, max_dx: when given, the offset is drawn uniformly from ``[0, max]`` *inclusive*, as the
            release's ``random.randint(0, max)`` (it used 80 on 80 px panels, where 80 and 0 are the same
            shift, and 10 for the horizontal offset of its both-axes roll).
        p: probability of applying the transform.

    Randomness comes from ``self.py_random``, the generator albumentations hands to every transform, so a
    seeded ``RpmAugment`` (and ``ReplayCompose``) reproduce it.
    """

    class InitSchema(BaseTransformInitSchema):
        axis: Literal["v", "h", "vh"]
        # strict: albumentations' schema would otherwise turn 2.5 / True / "10" into ints silently.
        max_dy: Annotated[int, Field(ge=0, strict=True)] | None
        max_dx: Annotated[int, Field(ge=0, strict=True)] | None

    def __init__(self, axis: Literal["v", "h", "vh"] = "vh", max_dy: int | None = None, max_dx: int | None = None,
                 p: float = 0.5):
        super().__init__(p=p)
        self.axis = axis
        self.max_dy = max_dy
        self.max_dx = max_dx

    def _offset(self, size: int, limit: int | None) -> int:
        return self.py_random.randrange(size) if limit is None else self.py_random.randint(0, limit)

    def get_params_dependent_on_data(self, params: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        height, width = params["shape"][:2]
        dy = self._offset(height, self.max_dy) if "v" in self.axis else 0
        dx = self._offset(width, self.max_dx) if "h" in self.axis else 0
        # "axis" travels with the params so `applied_transforms` can tell the three rolls apart.
        return {"dy": dy, "dx": dx, "axis": self.axis}

    def apply(self, img: np.ndarray, dy: int = 0, dx: int = 0, **params: Any) -> np.ndarray:
        """img: (H, W) or (H, W, C) -> same shape, rolled by (dy, dx) pixels."""
        return np.roll(img, (dy, dx), axis=(0, 1))

    def apply_to_mask(self, mask: np.ndarray, dy: int = 0, dx: int = 0, **params: Any) -> np.ndarray:
        return np.roll(mask, (dy, dx), axis=(0, 1))

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("axis", "max_dy", "max_dx")


# --------------------------------------------------------------------------------------------------
# The individual transforms, by short name.
# --------------------------------------------------------------------------------------------------
def _make_transform(name: str, p: float, release: bool = False) -> A.BasicTransform:
    """A fresh albumentations transform for the short ``name`` (see ``SINGLE_TRANSFORM_NAMES``).

    ``release=True`` gives the MLCL release's variant where it differs: reflect-101 rotation padding and
    roll offsets drawn as the release drew them (``RELEASE_ROLL_MAX``, ``RELEASE_ROLL_VH_MAX_DX``).
    """
    if name == "vflip":
        return A.VerticalFlip(p=p)
    if name == "hflip":
        return A.HorizontalFlip(p=p)
    if name == "rot90":
        return A.RandomRotate90(p=p)
    if name == "rotate":
        if release:
            return A.Rotate(limit=(-ROTATION_LIMIT_DEG, ROTATION_LIMIT_DEG), interpolation=cv2.INTER_LINEAR,
                            border_mode=cv2.BORDER_REFLECT_101, p=p)
        return A.Rotate(
            limit=(-ROTATION_LIMIT_DEG, ROTATION_LIMIT_DEG),
            interpolation=cv2.INTER_LINEAR,
            border_mode=cv2.BORDER_CONSTANT,
            fill=WHITE,  # 2.x name; the 1.x `value=` would be ignored (-> black corners) without strict=True
            p=p,
        )
    if name == "transpose":
        return A.Transpose(p=p)
    if name == "grid2":
        return A.RandomGridShuffle(grid=(2, 2), p=p)
    if name == "grid3":
        # 80 px is not divisible by 3: albumentations cuts 27/27/26 px strips (random order) and only
        # swaps tiles of equal shape, so the pixel content is still a permutation.
        return A.RandomGridShuffle(grid=(3, 3), p=p)
    limit = RELEASE_ROLL_MAX if release else None
    if name == "roll_v":
        return RandomRoll(axis="v", max_dy=limit, p=p)
    if name == "roll_h":
        return RandomRoll(axis="h", max_dx=limit, p=p)
    if name == "roll_vh":
        return RandomRoll(axis="vh", max_dy=limit, max_dx=RELEASE_ROLL_VH_MAX_DX if release else None, p=p)
    raise ValueError(f"unknown transform {name!r}; known: {', '.join(SINGLE_TRANSFORM_NAMES)}")


#: Names accepted by ``single_transform`` (and reported in ``RpmAugment.last_applied``).
SINGLE_TRANSFORM_NAMES: tuple[str, ...] = (
    "vflip", "hflip", "rot90", "rotate", "transpose", "grid2", "grid3", "roll_v", "roll_h", "roll_vh",
)
#: Transforms that move content between positions of the panel (they break Position rules).
POSITION_MOVING_NAMES: frozenset[str] = frozenset({"grid2", "grid3", "roll_v", "roll_h", "roll_vh"})


def _official_transforms(release: bool = False) -> list[Any]:
    """Children of the official pipeline (docs/augmentation.md, "The official recipe"); the pipeline itself
    runs with p=0.5. ``release=True``: the release's rotation padding and roll ranges."""
    return [
        *_position_preserving_transforms(release),
        A.OneOf([_make_transform("grid2", 0.5), _make_transform("grid3", 0.5)], p=0.25),
        # Inside OneOf the children's p are selection weights (normalised), not probabilities.
        A.OneOf(
            [_make_transform("roll_vh", 0.4, release), _make_transform("roll_h", 0.3, release),
             _make_transform("roll_v", 0.3, release)],
            p=0.5,
        ),
    ]


def _position_preserving_transforms(release: bool = False) -> list[Any]:
    """Flips, rot90, rotation and transposition, each p=0.25 (the official ones minus grid / roll)."""
    return [_make_transform(name, 0.25, release) for name in ("vflip", "hflip", "rot90", "rotate", "transpose")]


def _no_transforms() -> list[Any]:
    return []


class _SingleTransform:
    """Picklable builder for a one-transform pipeline (a lambda would not survive DataLoader spawn)."""

    def __init__(self, name: str):
        _make_transform(name, 1.0)  # validates the name early
        self.name = name

    def __call__(self) -> list[Any]:
        return [_make_transform(self.name, 1.0)]


@dataclass(frozen=True)
class Recipe:
    """A named augmentation pipeline.

    Attributes:
        name: registry key / label.
        build: returns fresh albumentations transforms (the children of the top-level ``Compose``).
        p: probability that the pipeline runs at all for one RPM (the official code: 0.5).
        position_fallback: name (in ``RECIPES``) of the recipe used instead when ``preserve_position=True``;
            ``None`` when this recipe already keeps positions (then it is used for both flags).
    """

    name: str
    build: Callable[[], list[Any]]
    p: float
    position_fallback: str | None


RECIPES: dict[str, Recipe] = {
    "official": Recipe("official", _official_transforms, 0.5, "position_preserving"),
    "position_preserving": Recipe("position_preserving", _position_preserving_transforms, 0.5, None),
    "none": Recipe("none", _no_transforms, 1.0, None),
    # functools.partial (not a lambda): recipes travel to spawned DataLoader workers.
    "release": Recipe("release", functools.partial(_official_transforms, release=True), 0.5,
                      "release_position_preserving"),
    "release_position_preserving": Recipe("release_position_preserving",
                                          functools.partial(_position_preserving_transforms, release=True), 0.5,
                                          None),
}
assert tuple(RECIPES) == AUGMENT_RECIPES, "rpm_lib.method_choices names every recipe, in this order"


class AppliedTransform(NamedTuple):
    """One transform applied in the last call: short ``name`` and its parameters.

    ``params`` by name: ``rot90`` ``{"factor": k}`` (k quarter turns, counter-clockwise as ``np.rot90``);
    ``rotate`` ``{"angle": degrees (counter-clockwise, OpenCV convention), "matrix": (3, 3) float}``;
    ``grid2``/``grid3`` ``{"tiles": (n, 4) int (y0, x0, y1, x1), "mapping": list[int]}`` (output tile
    ``i`` holds input tile ``mapping[i]``); ``roll_*`` ``{"dy": px, "dx": px}``; flips / transpose ``{}``.
    """

    name: str
    params: dict[str, Any]


# Bookkeeping keys albumentations adds to every params dict; not interesting in a figure caption.
_BOOKKEEPING_KEYS = frozenset(
    {"shape", "interpolation", "fill", "fill_mask", "bbox_matrix", "x_min", "x_max", "y_min", "y_max", "axis"}
)
_CLASS_TO_NAME = {
    "VerticalFlip": "vflip",
    "HorizontalFlip": "hflip",
    "RandomRotate90": "rot90",
    "Rotate": "rotate",
    "Transpose": "transpose",
}


def _describe(class_name: str, params: dict[str, Any]) -> AppliedTransform:
    """albumentations' ``(class name, params)`` record -> ``AppliedTransform`` with our short name."""
    if class_name == "RandomGridShuffle":
        name = f"grid{math.isqrt(len(params['tiles']))}"
    elif class_name == "RandomRoll":
        name = f"roll_{params['axis']}"
    elif class_name in _CLASS_TO_NAME:
        name = _CLASS_TO_NAME[class_name]
    else:
        name = class_name
    clean = {k: v for k, v in params.items() if k not in _BOOKKEEPING_KEYS}
    if name == "rotate":
        matrix = params["matrix"]
        # OpenCV's getRotationMatrix2D(angle) has m[0, 1] = sin(angle), m[0, 0] = cos(angle).
        clean = {"angle": math.degrees(math.atan2(matrix[0, 1], matrix[0, 0])), "matrix": matrix}
    return AppliedTransform(name, clean)


def _walk(transforms: list[Any]) -> Iterator[A.BasicTransform]:
    for t in transforms:
        if isinstance(t, A.BaseCompose):
            yield from _walk(list(t.transforms))
        else:
            yield t


def _moves_positions(transforms: list[Any]) -> bool:
    return any(isinstance(t, (A.RandomGridShuffle, RandomRoll)) for t in _walk(transforms))


# --------------------------------------------------------------------------------------------------
# The augmenter.
# --------------------------------------------------------------------------------------------------
class RpmAugment:
    """Random geometric augmentation of one RPM, identical for all its panels.

    Args:
        recipe: a name in ``RECIPES`` (``"official"``, ``"position_preserving"``, ``"none"``) or a ``Recipe``.
        seed: seed of the augmenter's random stream. ``None`` takes ``torch.initial_seed()`` at
            construction, so ``torch.manual_seed(s)`` before building the dataset makes a
            ``num_workers=0`` run reproducible (torch's default initial seed is a constant, so it is
            reproducible even without that). Datasets of ``rpm_lib.data`` reseed it for every sample.
        p: overrides the recipe's pipeline probability (official: 0.5); ``p=1`` always runs the pipeline
            (each transform inside still has its own probability).
        save_applied_params: record what each call applied in ``last_applied`` (costs ~1 us per transform).

    Call: ``aug(panels, preserve_position=False)``; ``panels`` is ``np.ndarray`` uint8 ``(N, S, S)``
    (N = 16 for an RPM: 8 context panels then 8 choices), returns a new uint8 ``(N, S, S)`` array.
    ``preserve_position=True`` uses the recipe's ``position_fallback`` recipe (for ``"official"``:
    ``"position_preserving"``).
    """

    def __init__(
        self,
        recipe: str | Recipe = "official",
        seed: int | None = None,
        p: float | None = None,
        save_applied_params: bool = True,
    ):
        main = _resolve_recipe(recipe)
        if p is not None and not (isinstance(p, (int, float)) and 0.0 <= float(p) <= 1.0):
            raise ValueError(f"RpmAugment: p must be a probability in [0, 1] or None, got {p!r}")
        self.recipe: Recipe = main
        self.p: float = main.p if p is None else float(p)
        self.save_applied_params = save_applied_params
        self.last_applied: list[AppliedTransform] = []

        self._pipeline = self._compose(main.build())
        if main.position_fallback is None:
            if self._pipeline is not None and _moves_positions(list(self._pipeline.transforms)):
                raise ValueError(
                    f"recipe {main.name!r} contains grid shuffle / roll but has no position_fallback; "
                    "name a position-preserving recipe to use when preserve_position=True"
                )
            self.position_recipe: Recipe = main
            self._position_pipeline = self._pipeline
        else:
            fallback = _resolve_recipe(main.position_fallback)
            self.position_recipe = fallback
            self._position_pipeline = self._compose(fallback.build())
            if self._position_pipeline is not None and _moves_positions(list(self._position_pipeline.transforms)):
                raise ValueError(
                    f"position_fallback {fallback.name!r} of recipe {main.name!r} contains grid shuffle / roll"
                )
        self.seed: int = 0
        self.reseed(torch.initial_seed() if seed is None else seed)

    def _compose(self, transforms: list[Any]) -> A.Compose | None:
        if not transforms:
            return None
        # strict=True: a misspelt / 1.x-only argument (e.g. `value=` instead of `fill=`) raises instead of
        # being silently ignored. No `seed=` here: see `reseed` for why.
        return A.Compose(transforms, p=self.p, strict=True, save_applied_params=self.save_applied_params)

    def reseed(self, seed: int) -> None:
        """Restart the random stream from ``seed`` (any int >= 0).

        albumentations pitfalls this avoids:
        * ``A.Compose(..., seed=s)`` gives EVERY child transform its own generator seeded with the same
          ``s``; transforms with equal ``p`` then make identical decisions (measured: VerticalFlip(0.5) and
          HorizontalFlip(0.5) always fire together). We instead hand one shared ``random.Random`` and one
          ``np.random.Generator`` to the whole tree (``set_random_state``), so draws are sequential and
          independent.
        * Generator state set once in the main process is copied into every DataLoader worker, so with
          ``Compose(seed=...)`` or ``seed=None`` alike, all workers produce the same augmentation
          stream, and every epoch repeats the previous one (workers are re-forked from the unchanged
          parent). ``rpm_lib.data`` datasets therefore call ``reseed`` for every sample, from
          ``(seed, epoch, index)``.
        """
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"RpmAugment.reseed: seed must be an int >= 0, got {seed!r}")
        self.seed = int(seed)
        py_random = random.Random(self.seed)
        np_random = np.random.default_rng(self.seed)
        for pipeline in (self._pipeline, self._position_pipeline):
            if pipeline is not None:
                pipeline.set_random_state(np_random, py_random)

    def __call__(self, panels: np.ndarray, preserve_position: bool = False) -> np.ndarray:
        """panels: uint8 (N, S, S) -> a new uint8 (N, S, S), one random transform for all N panels."""
        _check_panels(panels)
        pipeline = self._position_pipeline if preserve_position else self._pipeline
        if pipeline is None:
            self.last_applied = []
            return panels.copy()
        # (N, S, S) -> (S, S, N): albumentations treats the panels as channels of one image.
        stack = np.ascontiguousarray(np.moveaxis(panels, 0, -1))
        result = pipeline(image=stack)
        self.last_applied = [_describe(n, prm) for n, prm in result.get("applied_transforms", [])]
        out = result["image"].reshape(stack.shape)  # (S, S, 1) may come back squeezed for N = 1
        if out.dtype != np.uint8:
            raise RuntimeError(f"augmentation changed dtype to {out.dtype} (recipe {self.recipe.name!r})")
        return np.ascontiguousarray(np.moveaxis(out, -1, 0))

    def __repr__(self) -> str:
        return (
            f"RpmAugment(recipe={self.recipe.name!r}, position_recipe={self.position_recipe.name!r}, "
            f"p={self.p}, seed={self.seed})"
        )


def _resolve_recipe(recipe: str | Recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str) and recipe in RECIPES:
        return RECIPES[recipe]
    raise ValueError(f"unknown augmentation recipe {recipe!r}; known: {', '.join(sorted(RECIPES))}")


def _check_panels(panels: Any) -> None:
    if not isinstance(panels, np.ndarray):
        raise ValueError(
            f"RpmAugment expects panels as np.ndarray uint8 (16, S, S), got {type(panels).__name__}"
        )
    if panels.dtype != np.uint8:
        raise ValueError(f"RpmAugment expects uint8 panels (16, S, S), got dtype {panels.dtype}")
    if panels.ndim != 3 or panels.shape[1] != panels.shape[2] or panels.shape[0] < 1 or panels.shape[1] < 3:
        raise ValueError(
            f"RpmAugment expects panels of shape (16, S, S) (N panels first, square, S >= 3), "
            f"got {panels.shape}; channels-last (S, S, 16) input must be moved to (16, S, S) first"
        )


def single_transform(name: str, seed: int | None = None) -> RpmAugment:
    """An augmenter that applies exactly the transform ``name`` (p=1) on every call, for figures.

    ``name`` is one of ``SINGLE_TRANSFORM_NAMES``. Called with ``preserve_position=True``, a grid-shuffle
    or roll augmenter returns the panels unchanged (``last_applied == []``), because that transform
    would break the RPM; the other transforms are applied either way.
    """
    if name not in SINGLE_TRANSFORM_NAMES:
        raise ValueError(f"unknown transform {name!r}; known: {', '.join(SINGLE_TRANSFORM_NAMES)}")
    fallback = "none" if name in POSITION_MOVING_NAMES else None
    return RpmAugment(Recipe(name, _SingleTransform(name), 1.0, fallback), seed=seed)
