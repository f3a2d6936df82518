"""Where a training step of the glyphs video teacher spends its time (issue 33: the teacher needs far more steps than
one device call gives at 27 steps a second): STEPS steps of stage video_teacher at each batch size, after a warm-up,
under the torch profiler (`omnialign.bench.profile`), printing steps per second, the share of the time the device
was busy (the rest is the host launching kernels) and the device time by kernel kind.

    python benchmarks/glyphs_video_profile.py OUT [--steps 30] [--batches 256 1024] [--device cuda]

writes OUT/batch_B/{trace.json.gz,kernels.json} and OUT/summary.json. One evaluation (10 clips) ends each run.
"""

import argparse
import json
import time
from functools import partial
from pathlib import Path

from omnialign.bench.profile import profiled
from omnialign.worlds.glyphs.data import ASSETS
from omnialign.worlds.glyphs.pretrain import PretrainConfig, pick_device, train_video_teacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    assets = args.out / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for part in ("gold", "recognizer"):  # the judges the evaluation reads
        if not (assets / part).exists():
            (assets / part).symlink_to(ASSETS / part)
    device, rows = pick_device(args.device), []
    for batch in args.batches:
        config = PretrainConfig(out=str(assets), device=device.type, video_batch=batch, eval_every=10**9,
                                video_eval_seeds=1)  # fmt: skip
        config.video_steps = 5
        train_video_teacher(config, assets, device)  # warm-up: kernels chosen, caches filled
        config.video_steps = args.steps
        start = time.perf_counter()
        _, summary = profiled(partial(train_video_teacher, config, assets, device), args.out / f"batch_{batch}")
        seconds = time.perf_counter() - start
        rows.append({"batch": batch, "steps": args.steps, "steps_per_s": round(args.steps / seconds, 2),
                     "clips_per_s": round(args.steps * batch / seconds, 1), "busy_share": summary["busy_share"],
                     "kinds": {k: v["share"] for k, v in summary["kinds"].items()}})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "summary.json").write_text(json.dumps({"device": str(device), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
