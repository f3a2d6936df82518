"""The online RL loop (FlowGRPO): each step is a flat list of named, timed phases."""

import dataclasses
import json
from pathlib import Path

import torch
from tqdm import tqdm

from omnialign import rewards
from omnialign.algorithms.advantages import group_relative
from omnialign.batch import Trajectory
from omnialign.config import Config
from omnialign.data.prompts import load_prompt_set, prompts_for_step
from omnialign.engine import checkpoint, dist
from omnialign.engine.dist import World
from omnialign.metrics import MetricsLog, Timer, diversity, plot_curves, read_metrics, save_grid, to_host
from omnialign.models.base import DiffusionPolicy
from omnialign.rollout.diffusion import generate, generate_ode, sample_seeds
from omnialign.trainer import actor
from omnialign.trainer.objectives import Algorithm, log_prob_objective

VAL_SEED = 2**40  # validation seeds are fixed across runs and recipes


class OnlineTrainer:
    def __init__(
        self,
        config: Config,
        policy: DiffusionPolicy,
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        algorithm: Algorithm,
        world: World,
        run_dir: Path,
        reward_worker: rewards.RewardWorker,
        sync=lambda: None,
    ):
        self.config, self.policy, self.params = config, policy, params
        # the optimizer steps on a global mini-batch: each rank contributes its share of it
        local_mini = config.actor.mini_batch_size and config.actor.mini_batch_size // world.size
        self.actor_config = dataclasses.replace(config.actor, mini_batch_size=local_mini)
        self.optimizer, self.scheduler, self.algorithm = optimizer, scheduler, algorithm
        self.world, self.run_dir = world, Path(run_dir)
        self.prompts, self.metadata = load_prompt_set(config.data.prompts)
        self.val_prompts, self.val_metadata = load_prompt_set(config.data.val_prompts)
        self.rewards = reward_worker
        self.timer = Timer(sync)
        self.log = MetricsLog(self.run_dir, config.trainer.total_steps) if world.is_main else None
        self.progress = config.trainer.progress and world.is_main

    def train_step(self, step: int) -> dict[str, torch.Tensor]:
        c, device, phase = self.config, self.world.device, self.timer.phase
        with phase("rollout"):  # each chunk's rewards are computed while the next chunk is generated
            prompts, meta, group, seeds = self.share_of_step(step)
            futures = []
            submit = lambda images, rows: futures.append(self.rewards.submit(images, prompts[rows], meta[rows]))  # noqa: E731
            traj, images = generate(self.policy, prompts, group, seeds, c.rollout, device, self.progress, step,
                                    c.seed, on_chunk=submit)  # fmt: skip
        with phase("reward_wait"):
            reward, parts, reward_metrics = self.collect(futures)
        with phase("advantage"):
            all_rewards = dist.all_gather(reward.to(device))
            advantages, adv_metrics = group_relative(
                all_rewards, dist.all_gather(group.to(device)), c.algorithm.global_std, c.algorithm.norm_by_std
            )
            mine = slice(self.world.rank * len(reward), (self.world.rank + 1) * len(reward))
            traj.rewards, traj.advantages = reward.to(device), advantages[mine]
            batch = self.algorithm.batch(traj, step)
        if c.actor.timestep_staging:
            batch = batch.cpu()
        metrics = reward_metrics
        if self.algorithm.replays_window and c.algorithm.old_log_probs == "recompute":
            with phase("old_log_probs"):
                metrics.update(self.recompute_old(batch))
        with phase("update"):
            update = actor.update(self.algorithm.objective, batch, self.params, self.optimizer, self.scheduler,
                                  self.actor_config, seed=c.seed * 1_000_003 + step, device=device,
                                  progress=self.progress)  # fmt: skip
            self.algorithm.after_update(step)
        metrics.update({f"actor/{k}": v for k, v in update.metrics.items()})
        metrics.update({f"reward/{k}": v.mean() for k, v in parts.items() if len(parts) > 1})
        metrics.update({
            "reward/mean": all_rewards.mean(), "reward/std": all_rewards.std(),
            "reward/zero_std_ratio": adv_metrics["zero_std_ratio"], "reward/group_std": adv_metrics["group_std"],
            "rollout/diversity": diversity(images, group.to(images.device)),
            "actor/lr": torch.tensor(self.scheduler.get_last_lr()[0]),
        })  # fmt: skip
        return metrics

    def share_of_step(self, step: int) -> tuple[list[str], list[dict], torch.Tensor, torch.Tensor]:
        """This rank's prompts (whole groups of rollout.n), their metadata, group ids and per-sample seeds."""
        c, n = self.config, self.config.rollout.n
        per_rank = c.data.prompts_per_step // self.world.size
        first = self.world.rank * per_rank
        index = prompts_for_step(self.prompts, c.data.prompts_per_step, c.seed, step)[first : first + per_rank]
        seeds = sample_seeds(c.seed, step, c.data.prompts_per_step * n)[first * n : (first + per_rank) * n]
        group = torch.arange(first, first + per_rank).repeat_interleave(n)
        prompts = [self.prompts[i] for i in index for _ in range(n)]
        return prompts, [self.metadata[i] for i in index for _ in range(n)], group, seeds

    def recompute_old(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """Old-policy log-probs and means by a forward-only replay; returns the gap to the rollout's."""
        c = self.config
        old = actor.infer(log_prob_objective(self.policy, c.rollout), traj, c.actor.micro_batch_size,
                          self.world.device, c.actor.timestep_staging, c.actor.prefetch)  # fmt: skip
        traj.old_log_probs, traj.old_means = old["log_prob"].to(traj.device), old["mean"].to(traj.device)
        return {"actor/rollout_logprob_gap": (traj.old_log_probs - traj.log_probs).abs().mean()}

    def collect(self, futures: list) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Wait for the rewards of every chunk (in order): total (B,), each reward (B,), and metrics."""
        results = [f.result() for f in tqdm(futures, desc="reward", leave=False, disable=not self.progress)]
        parts = {k: torch.cat([r.parts[k] for r in results]) for k in results[0].parts}
        failed = {name: sum(name in r.failed for r in results) for name in parts}
        metrics = {f"reward/{k}/failed_chunks": torch.tensor(float(v)) for k, v in failed.items() if v}
        return torch.cat([r.total for r in results]), parts, metrics

    def score(self, images: torch.Tensor, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        """Rewards of a batch in chunks of the rollout micro-batch (validation)."""
        chunk = self.config.rollout.micro_batch_size
        futures = [self.rewards.submit(images[lo : lo + chunk], prompts[lo : lo + chunk], meta[lo : lo + chunk])
                   for lo in range(0, len(prompts), chunk)]  # fmt: skip
        return self.collect(futures)[0]

    @torch.no_grad()
    def validate(self, step: int) -> dict[str, torch.Tensor]:
        """ODE samples of every validation prompt x `data.val_seeds` fixed seeds, shared out over
        the ranks and gathered; writes the grid."""
        c, world = self.config, self.world
        n = c.data.val_seeds
        prompts = [p for p in self.val_prompts for _ in range(n)]
        share = -(-len(prompts) // world.size)  # padded so that every rank has the same count
        padded = prompts + prompts[-1:] * (share * world.size - len(prompts))
        mine = slice(world.rank * share, (world.rank + 1) * share)
        seeds = torch.arange(len(padded)) + VAL_SEED
        images = generate_ode(self.policy, padded[mine], seeds[mine], c.rollout, world.device)
        meta = [self.val_metadata[min(i, len(prompts) - 1) // n] for i in range(len(padded))]
        reward = self.score(images, padded[mine], meta[mine])
        images = dist.all_gather(images)[: len(prompts)]
        reward = dist.all_gather(reward.to(world.device))[: len(prompts)]
        group = torch.arange(len(self.val_prompts)).repeat_interleave(n)
        if world.is_main:
            captions = [f"{p} {r:.2f}" for p, r in zip(prompts, reward.tolist())]
            save_grid(images, captions, n, self.run_dir / "samples" / f"step_{step:06d}.png")
        return {"val/reward/mean": reward.mean(), "val/reward/std": reward.std(),
                "val/diversity": diversity(images, group.to(images.device))}  # fmt: skip

    def save(self, step: int) -> None:
        checkpoint.save(self.run_dir, step, self.policy.transformer, self.optimizer, self.scheduler,
                        {"step": step}, self.config.trainer.keep_last, self.world)  # fmt: skip

    def fit(self, resume: Path | None = None) -> dict[str, float]:
        """Train to trainer.total_steps (from a checkpoint if given); returns val reward before/after."""
        c = self.config.trainer
        start = 0
        if resume is not None:
            start = checkpoint.load(resume, self.policy.transformer, self.optimizer, self.scheduler, self.world)["step"]
            if self.log:
                self.log.truncate_after(start)
                print(f"resumed from {resume} at step {start}")
        if start == 0:
            with self.timer.phase("validate"):
                metrics = self.validate(0)
            self.record(0, metrics)
        for step in range(start + 1, c.total_steps + 1):
            metrics = self.train_step(step)
            if step % c.val_every == 0 or step == c.total_steps:
                with self.timer.phase("validate"):
                    metrics.update(self.validate(step))
            self.record(step, metrics)
            if step % c.save_every == 0 or step == c.total_steps:
                with self.timer.phase("save"):
                    self.save(step)
        return self.finish()

    def record(self, step: int, metrics: dict[str, torch.Tensor]) -> None:
        values = to_host({**metrics, **self.timer.pop()}, reduce=dist.mean_across, device=self.world.device)
        if self.log:
            self.log.log(step, values, echo=tqdm.write)
            if "val/reward/mean" in values:
                plot_curves(read_metrics(self.log.path), self.run_dir / "reward_curve.png")

    def finish(self) -> dict[str, float]:
        if not self.log:
            return {}
        self.log.close()
        val = [r for r in read_metrics(self.log.path) if "val/reward/mean" in r]
        summary = {"val_reward_before": val[0]["val/reward/mean"], "val_reward_after": val[-1]["val/reward/mean"],
                   "val_diversity_before": val[0]["val/diversity"], "val_diversity_after": val[-1]["val/diversity"],
                   "steps": val[-1]["step"]}  # fmt: skip
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print(
            f"validation reward: {summary['val_reward_before']:.3f} before -> {summary['val_reward_after']:.3f} "
            f"after {summary['steps']} steps (diversity {summary['val_diversity_before']:.3f} -> "
            f"{summary['val_diversity_after']:.3f}); outputs in {self.run_dir}"
        )
        return summary
