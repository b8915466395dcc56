"""How much shape content does the MLCL release's rotation padding copy into the corners a rotation uncovers?

The release rotates with albumentations 1.1's default padding, ``BORDER_REFLECT_101``; rpm_lib's ``official``
recipe fills with white (the panel background). This bench rotates every training RPM of a dataset once, at an
angle from the recipes' range, with the ``release`` recipe's Rotate, and counts dark pixels (< 128) landing in
the uncovered corners; with white fill there are none by construction.

    python experiments/release-comparison/bench_rotation_fill.py --data data/i-raven            # any data_root, raw or cache

Prints the share of rotated RPMs that get shape pixels in their corners and the dark share of those corner
pixels next to the ink share of the panels themselves. Seeded; about 10 s for 210 RPMs on one core.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="data_root: an I-RAVEN folder or cache")
    parser.add_argument("--image-size", type=int, default=80, help="panel side in px (default 80, the release's)")
    parser.add_argument("--split", default="train", choices=("train", "val", "test"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import albumentations as A
    import cv2
    import numpy as np

    from rpm_lib.augment import _make_transform
    from rpm_lib.training.config import TrainConfig
    from rpm_lib.training.samples import make_dataset

    dataset = make_dataset(TrainConfig(data_root=args.data, image_size=args.image_size), args.split)
    rotate = A.Compose([_make_transform("rotate", 1.0, release=True)], strict=True, save_applied_params=True,
                       seed=args.seed)
    size = args.image_size
    rotated = with_shapes = 0
    dark_shares, ink_shares = [], []
    for index in range(len(dataset)):
        panels = np.asarray(dataset[index]["panels"])  # uint8 (16, S, S)
        result = rotate(image=np.ascontiguousarray(np.moveaxis(panels, 0, -1)))
        out = result["image"].reshape(size, size, -1)
        matrix = np.asarray(result["applied_transforms"][0][1]["matrix"])[:2]
        covered = cv2.warpAffine(np.full((size, size), 255, np.uint8), matrix, (size, size), flags=cv2.INTER_NEAREST,
                                 borderMode=cv2.BORDER_CONSTANT, borderValue=0) > 0
        if covered.all():
            continue
        dark = out[~covered] < 128  # (uncovered pixels, 16)
        rotated += 1
        with_shapes += bool(dark.any())
        dark_shares.append(float(dark.mean()))
        ink_shares.append(float((panels < 128).mean()))
    if not rotated:
        print("error: no rotation uncovered a pixel", file=sys.stderr)
        return 1
    print(f"{args.split} RPMs: {len(dataset)} at {size} px; rotations that uncover corners: {rotated}")
    print(f"reflect-101 (release): RPMs with shape pixels (< 128) copied into the uncovered corners: {with_shapes} / "
          f"{rotated} = {100 * with_shapes / rotated:.1f} %")
    print(f"reflect-101 (release): dark share of the uncovered corner pixels: {100 * np.mean(dark_shares):.2f} % "
          f"(dark share of the panels themselves: {100 * np.mean(ink_shares):.2f} %)")
    print("white fill (rpm_lib): 0 dark pixels in the uncovered corners, by construction")
    return 0


if __name__ == "__main__":
    sys.exit(main())
