"""Linear evaluation with and without cached embeddings, side by side in one process: the stage's wall time and how
far its numbers move (``linear_eval_feature_cache``, rpm_lib.training.feature_cache).

Both runs share everything but that switch: one MLCL pre-training (the same seed, so the same encoder), then a
linear evaluation of ``--linear-epochs`` epochs. Prints the linear stage's seconds for each, their ratio, and the
largest difference between their per-epoch training and validation losses and accuracies (history.csv).

    python bench/bench_linear_eval_cache.py                       # CPU: SCL, 80 px, 100 problems per configuration
    python bench/bench_linear_eval_cache.py --per-config 1000 accelerator=gpu precision=bf16-mixed
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def _linear_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "history.csv").open() as handle:
        return [row for row in csv.DictReader(handle) if row["stage"] == "linear"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-config", type=int, default=100, help="generated problems per configuration")
    parser.add_argument("--linear-epochs", type=int, default=5, help="epochs of linear evaluation")
    parser.add_argument("--out", type=Path, default=None, help="folder for the data and runs (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="TrainConfig fields as key=value (e.g. accelerator=gpu)")
    args = parser.parse_args(argv)
    from rpm_lib.training.config import ConfigError, TrainConfig, parse_overrides
    from rpm_lib.training.run import train

    folder = args.out or Path(tempfile.mkdtemp(prefix="bench-linear-cache-"))
    base = dict(data_root=str(folder / "data"), generate=True, generate_num_per_config=args.per_config,
                generate_seed=3, setup="mlcl", encoder="scl", image_size=80, batch_size=32, max_epochs=1,
                linear_eval_epochs=args.linear_epochs, patience=args.linear_epochs, progress_bar=False,
                save_predictions=False, overwrite=True)
    try:
        base.update(parse_overrides(args.overrides))
        configs = {cache: TrainConfig(run_dir=str(folder / f"cache_{cache}".lower()), linear_eval_feature_cache=cache,
                                      **base) for cache in (False, True)}
    except ConfigError as error:
        parser.error(str(error))
    seconds = {}
    for cache, config in configs.items():
        metrics = train(config)
        seconds[cache] = next(s["wall_time_s"] for s in metrics["stages"] if s["name"] == "linear")
        print(f"linear evaluation, cache {'on ' if cache else 'off'}: {seconds[cache]:.1f} s "
              f"(test accuracy {100 * metrics['test_accuracy']:.2f} %)", flush=True)
    plain, cached = (_linear_rows(Path(configs[c].run_dir)) for c in (False, True))
    largest = max((abs(float(a[k]) - float(b[k])) for a, b in zip(plain, cached)
                   for k in a if k not in ("stage", "epoch", "step", "lr") and a[k] and b[k]), default=0.0)
    print(f"cached / plain wall time: {seconds[True] / seconds[False]:.2f} ({seconds[False] / seconds[True]:.1f}x "
          f"faster); largest per-epoch difference in history.csv: {largest:.2e} over {len(plain)} epochs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
