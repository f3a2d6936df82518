"""Build a run from a config and train it: `main(config)`. The command line is `omnialign train`.

Checks what can fail early, prepares the run folder, then hands over to the trainer of the
algorithm: online diffusion (`trainer/online.py`), offline Diffusion-DPO (`trainer/offline.py`)
or the language loops (`trainer/language.py`).
"""

import json
import shutil
from pathlib import Path

from omnialign import rewards, trackers
from omnialign.config import LANGUAGE_ALGORITHMS, Config, ConfigError, check_world_size, flat_values, to_dict
from omnialign.data.prompts import PROMPT_FILE_TYPES, load_prompt_set
from omnialign.engine import checkpoint, dist, optim
from omnialign.export import find_checkpoint
from omnialign.metrics import write_atomic
from omnialign.models import IMAGE_SIZES, LOADERS, check_image_size
from omnialign.rewards.client import RewardServerError, Unreachable
from omnialign.rewards.vlm import served_model
from omnialign.trainer import language, offline
from omnialign.trainer.build import build_policy
from omnialign.trainer.objectives import ALGORITHMS
from omnialign.trainer.online import OnlineTrainer


def resolve_resume(run_dir: Path, resume: str | None, total_steps: int) -> Path | None:
    """'auto' -> the newest checkpoint of the run (None if there is none); a checkpoint folder -> it; a run folder ->
    its newest checkpoint."""
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
        if found is not None and int(found.name.removeprefix("step_")) >= total_steps:
            print(f"{found.name} has reached trainer.total_steps={total_steps}: nothing left to train (raise "
                  f"trainer.total_steps to go on, e.g. trainer.total_steps={2 * total_steps})")  # fmt: skip
        return found
    try:
        return find_checkpoint(resume)
    except FileNotFoundError:
        missing = "not a complete checkpoint" if Path(resume).is_dir() else "does not exist"
        raise ConfigError(f"--resume {resume}: {missing}; give auto (this run's newest), a run folder, or a checkpoint "
                          "folder runs/NAME/checkpoints/step_XXXXXX") from None  # fmt: skip


RESUMABLE = (
    "recipe",
    "trainer.",
    "engine.",
    "reward.remote",
    "actor.timestep_staging",
    "actor.prefetch",
    "rollout.micro_batch_size",
    "generation.micro_batch_size",
)
"""Config keys a resumed run may change: how long it trains and how often it validates and saves, how the same
math is computed (engine options, staging, chunk sizes), where remote rewards are served. Any other change would
make it a different training run: start a new one (name=NEW) instead."""
NOT_RESUMABLE = ("trainer.ema_",)
"""Keys under RESUMABLE that may not change all the same: the moving average is part of the run's state."""


def check_resume_config(saved: dict, config: Config) -> None:
    """ConfigError listing every key that differs from the run's saved config.json and may not change on resume."""
    old, new = flat_values(saved), flat_values(json.loads(json.dumps(to_dict(config))))
    fixed = [k for k in old if not k.startswith(RESUMABLE) or k.startswith(NOT_RESUMABLE)]
    changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in fixed if old.get(k) != new.get(k)]
    if changed:
        raise ConfigError(
            "--resume continues the same training run, but these settings differ from its config.json: "
            f"{'; '.join(changed)}. Keys that may change on resume start with {', '.join(RESUMABLE)}; "
            "start a new run (name=NEW_NAME) to change the others"
        )


def prepare_run_dir(run_dir: Path, config: Config, fresh: bool) -> None:
    if fresh:
        for stale in ("metrics.jsonl", "samples", "reward_curve.png", "summary.json", *trackers.FILES):
            path = run_dir / stale
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.json", json.dumps(to_dict(config), indent=2))


def check_inputs(config: Config) -> None:
    """ConfigError for a model, teacher, prompt file or pair folder the config names that does not exist (nothing is
    downloaded: each is a local path), a prompt file of the online trainer that does not parse, a reward or gold judge
    that cannot be resolved (for the trainers that score), or a required reward's server or OpenAI-compatible endpoint
    that does not answer (after the retries), before the run folder is made."""
    d = config.data
    if config.algorithm.name == "diffusion_dpo" and not d.pairs:
        raise ConfigError("algorithm.name=diffusion_dpo trains on stored pairs: set data.pairs=DIR (written by "
                          "`omnialign prepare offline-dpo`)")  # fmt: skip
    named = {"data.pairs": d.pairs, "data.val_pairs": d.val_pairs, "data.prompts": d.prompts,
             "data.val_prompts": d.val_prompts, "model.path": config.model.path,
             "algorithm.teacher_path": config.algorithm.teacher_path}  # fmt: skip
    for key, value in named.items():
        if key.endswith("prompts") and not value.endswith(PROMPT_FILE_TYPES):
            continue  # a prompt set's name
        if value is not None and not Path(value).exists():
            raise ConfigError(f"{key}={value!r} does not exist (from {Path.cwd()}): give the local path "
                              "(nothing is downloaded)")  # fmt: skip
    if config.algorithm.name in ALGORITHMS:  # the online diffusion trainer's prompt files: a bad row fails here
        for prompts in (d.prompts, d.val_prompts):
            try:
                load_prompt_set(prompts)
            except ValueError as e:
                raise ConfigError(str(e)) from None
    r = config.reward
    if config.algorithm.name not in ("dpo", "diffusion_dpo"):  # the trainers that score samples
        try:
            rewards.resolve(r)
            if r.gold:
                rewards.framed(r.gold, r)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for name, url in r.remote.items():  # a required reward's server answers before the model loads
            if name in r.optional:
                continue
            try:
                rewards.lookup(name, r.options.get(name), r.remote).health(wait=True)
            except Unreachable as e:
                raise ConfigError(f"reward.remote[{name!r}]={url!r}: {e}. Start the server (omnialign serve-reward "
                                  "NAME --port PORT), correct the URL, or list the reward in reward.optional to "
                                  "score 0 while it is down") from None  # fmt: skip
            except RewardServerError:
                pass  # it answers: a 4xx or 5xx from a server of one's own without /health
        chat = sorted(
            n for n in {*r.weights, r.gold} if n in rewards.CHAT_REWARDS and n not in (*r.optional, *r.remote)
        )
        for name in chat:  # a required VLM reward's endpoint answers (GET {url}/models) before the model loads
            options = r.options.get(name, {})
            try:
                served_model(options["url"], options.get("api_key"), timeout=10.0)
            except Unreachable as e:
                raise ConfigError(f"reward.options[{name!r}]['url']: {e}; or list {name} in reward.optional to "
                                  "score 0 while it is down") from None  # fmt: skip
            except RewardServerError:
                pass  # it answers, if not with a list of models


def main(config: Config, resume: str | None = None) -> dict:
    """Train `config` (validated) and return the validation summary (before/after)."""
    check_inputs(config)
    if config.model.arch not in LOADERS:
        raise ConfigError(f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}")
    if config.algorithm.name not in (*ALGORITHMS, *LANGUAGE_ALGORITHMS, "diffusion_dpo"):
        raise ConfigError(
            f"algorithm.name={config.algorithm.name!r} has no trainer yet; choose one of {list(ALGORITHMS)}"
        )
    if config.model.arch in IMAGE_SIZES and config.algorithm.name != "diffusion_dpo":
        check_image_size(config.model.arch, config.rollout.height, config.rollout.width)
    world = dist.init()
    check_world_size(config, world.size)
    dist.seed_everything(config.seed)
    run_dir = Path(config.trainer.output_dir) / config.name
    resume_path = resolve_resume(run_dir, resume, config.trainer.total_steps)
    if resume_path is not None:
        check_resume_config(json.loads((resume_path.parent.parent / "config.json").read_text()), config)
    if world.is_main:
        if resume_path is not None and resume_path.resolve().parent.parent == run_dir.resolve():
            for moved in checkpoint.set_aside_after(resume_path):
                print(f"{moved.name} is newer than {resume_path.name}: moved to {moved.parent / 'abandoned'}")
        prepare_run_dir(run_dir, config, fresh=resume_path is None)
        steps = config.trainer.total_steps
        print(f"{config.recipe}: {config.algorithm.name} on {config.model.arch}, {steps} step{'s' * (steps != 1)} on "
              f"{world.size} process{'es' * (world.size > 1)}; run folder {run_dir} (building the model)")  # fmt: skip
    with dist.deterministic(config.trainer.deterministic):
        summary = fit(config, world, run_dir, resume_path)
    if world.is_main:
        print(f"next: omnialign export {run_dir} --to DIR (its newest checkpoint), or raise trainer.total_steps and "
              "pass --resume auto to train on")  # fmt: skip
    return summary


def fit(config: Config, world: dist.World, run_dir: Path, resume_path: Path | None) -> dict:
    """Build the trainer of config.algorithm.name and train; returns the validation summary."""
    if config.algorithm.name in LANGUAGE_ALGORITHMS:
        return language.main(config, world, run_dir, resume_path)
    if config.algorithm.name == "diffusion_dpo":
        return offline.diffusion_dpo(config, world, run_dir).fit(resume_path)
    reward_worker = rewards.RewardWorker(config.reward)  # resolves every reward before the model loads
    policy, contexts = build_policy(config, world)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    algorithm = ALGORITHMS[config.algorithm.name](
        policy, config, contexts.get("reference"), contexts.get("teacher"), contexts.get("old")
    )
    trainer = OnlineTrainer(config, policy, params, optimizer, scheduler, algorithm, world, run_dir, reward_worker,
                            sync=dist.synchronizer(world.device))  # fmt: skip
    with reward_worker:
        return trainer.fit(resume_path)
