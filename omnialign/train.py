"""Build a run from a config and train it: `main(config)`. The command line is `omnialign train`."""

import json
import shutil
from pathlib import Path

from omnialign.config import Config, ConfigError, to_dict
from omnialign.engine import checkpoint, dist, optim
from omnialign.models import LOADERS
from omnialign.models.reference import frozen_reference
from omnialign.trainer.actor import flowgrpo_objective
from omnialign.trainer.online import OnlineTrainer


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """'auto' -> the newest checkpoint of the run (None if there is none); a path -> that checkpoint."""
    if resume is None:
        if checkpoint.latest(run_dir) is not None:
            raise SystemExit(
                f"{run_dir} already holds checkpoints: pass --resume auto to continue it, "
                f"or name=NEW_NAME for a new run (or delete the folder)"
            )
        return None
    if resume == "auto":
        found = checkpoint.latest(run_dir)
        print(f"--resume auto: {'continuing from ' + str(found) if found else 'no checkpoint yet, starting fresh'}")
        return found
    return Path(resume)


def main(config: Config, resume: str | None = None) -> dict:
    """Train `config` (validated) and return the validation summary (before/after)."""
    if config.model.arch not in LOADERS:
        raise ConfigError(f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}")
    world = dist.init()
    dist.seed_everything(config.seed)
    run_dir = Path(config.trainer.output_dir) / config.name
    resume_path = resolve_resume(run_dir, resume)
    if world.is_main:
        if resume_path is None:
            for stale in ("metrics.jsonl", "samples", "tensorboard", "reward_curve.png", "summary.json"):
                path = run_dir / stale
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    policy = LOADERS[config.model.arch](config.model).to(world.device)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    reference = frozen_reference(policy) if config.algorithm.kl_coef > 0 else None
    objective = flowgrpo_objective(policy, config.rollout, config.algorithm, reference)
    trainer = OnlineTrainer(config, policy, params, optimizer, scheduler, objective, world, run_dir,
                            sync=dist.synchronizer(world.device))  # fmt: skip
    return trainer.fit(resume_path)
