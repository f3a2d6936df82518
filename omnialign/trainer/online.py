"""The online RL loop (FlowGRPO): each step is a flat list of named, timed phases."""

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from omnialign import rewards
from omnialign.algorithms.advantages import group_relative
from omnialign.algorithms.gardo import nearest_distance
from omnialign.batch import Trajectory
from omnialign.config import Config, recomputes_old_log_probs, training_batch
from omnialign.data.prompts import check_sources, load_prompt_set, prompts_for_step, source_images
from omnialign.engine import dist
from omnialign.engine.dist import World
from omnialign.metrics import MetricsLog, Timer, diversity, grid_path, save_grid
from omnialign.models.base import DiffusionPolicy
from omnialign.rewards.pairwise import group_spans
from omnialign.rollout.diffusion import generate_ode, sample_seeds
from omnialign.trainer import actor
from omnialign.trainer.loop import run_loop
from omnialign.trainer.objectives import Algorithm, log_prob_objective

VAL_SEED = 2**40  # validation seeds are fixed across runs and recipes


def with_sources(
    images: torch.Tensor, captions: list[str], sources: list[torch.Tensor], n: int
) -> tuple[torch.Tensor, list[str], int]:
    """A validation grid's images (P * n, C, H, W) and captions with each prompt's source image (C', H', W') put
    in front of its n results, resized and given the results' channels: (P * (n + 1), C, H, W), captions, n + 1."""
    channels, size = images.shape[1], images.shape[-2:]
    shown = [F.interpolate(s[None].float().to(images.device), size=size, mode="bilinear", antialias=True)[0]
             for s in sources]  # fmt: skip
    shown = [s.mean(0, keepdim=True) if channels == 1 else s.expand(channels, *size) for s in shown]
    rows = [torch.cat([s[None], images[i * n : (i + 1) * n]]) for i, s in enumerate(shown)]
    titles = [c for i in range(len(sources)) for c in ["source", *captions[i * n : (i + 1) * n]]]
    return torch.cat(rows), titles, n + 1


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
        # data parallelism runs over groups of engine.sequence_parallel consecutive ranks, which hold the same samples
        self.group = config.engine.sequence_parallel
        self.dp_rank, self.dp_size = world.rank // self.group, world.size // self.group
        # the optimizer steps on a global mini-batch: each data-parallel rank contributes its share of it
        self.actor_config = actor.local_config(config.actor, *training_batch(config)[:2], self.dp_size)
        self.optimizer, self.scheduler, self.algorithm = optimizer, scheduler, algorithm
        # the update's graph (rollout.grad_graph) serves the replay of the rollout's log-probs: an algorithm without
        # one samples in the cheaper no-grad graph whatever the setting
        self.rollout_config = config.rollout if algorithm.replays_window else replace(config.rollout, grad_graph=False)
        self.world, self.run_dir = world, Path(run_dir)
        self.prompts, self.metadata = load_prompt_set(config.data.prompts)
        self.val_prompts, self.val_metadata = load_prompt_set(config.data.val_prompts)
        for field, name, metadata in (("data.prompts", config.data.prompts, self.metadata),
                                      ("data.val_prompts", config.data.val_prompts, self.val_metadata)):  # fmt: skip
            with_sources = sum("sources" in m for m in metadata)
            if with_sources != (len(metadata) if policy.edits else 0):
                kind = "an editing model: every prompt needs" if policy.edits else "text-to-image: no prompt takes"
                raise ValueError(f"{field}={name!r}: {with_sources} of {len(metadata)} "
                                 f'prompts have source images, but model.arch={config.model.arch} is {kind} "sources"'
                                 " (prompt files with sources come from `omnialign prepare edit`)")  # fmt: skip
            check_sources(metadata, field)
        self.rewards, self.gold = reward_worker, reward_worker.gold
        self.timer = Timer(sync)
        self.log = MetricsLog(self.run_dir, config) if world.is_main else None
        self.progress = config.trainer.progress and world.is_main

    def train_step(self, step: int) -> dict[str, torch.Tensor]:
        c, device, phase = self.config, self.world.device, self.timer.phase
        with phase("rollout"):  # each chunk's rewards are computed while the next chunk is generated
            prompts, meta, group, seeds = self.share_of_step(step)
            futures, n = [], self.algorithm.leaves  # the images of a sample: 1, or a branched rollout's leaves
            leaf_prompts, leaf_meta = [p for p in prompts for _ in range(n)], [m for m in meta for _ in range(n)]
            traj, images = self.algorithm.rollout(
                self.policy, prompts, group, seeds, self.rollout_config, device, self.progress, step, c.seed,
                on_chunk=self.submitter(leaf_prompts, leaf_meta, group.repeat_interleave(n), futures),
                sources=self.sources(meta),
            )  # fmt: skip
            group = group.repeat_interleave(n)
        with phase("reward_wait"):
            reward, parts, reward_metrics = self.collect(futures)
        with phase("advantage"):
            # every sample once, scored as the first rank of its sequence-parallel group scored it (the group's
            # ranks hold the same samples, which a remote reward may score differently)
            scores = dist.all_gather(torch.stack([reward, *parts.values()], 1).to(device), self.group)
            all_rewards, all_parts = scores[:, 0], dict(zip(parts, scores[:, 1:].unbind(1)))
            all_groups = dist.all_gather(group.to(device), self.group)
            advantages, adv_metrics = group_relative(
                all_rewards, all_groups, c.algorithm.global_std, c.algorithm.norm_by_std
            )
            mine = slice(self.dp_rank * len(reward), (self.dp_rank + 1) * len(reward))
            shaped = {}
            if self.algorithm.reshape is not None:  # GARDO: diversity-aware advantages, the KL's gate (pixels)
                distance = nearest_distance(images.flatten(1), group.to(images.device)).to(device)
                advantages, kl_weights, shaped = self.algorithm.reshape(
                    advantages, all_rewards, all_parts, all_groups, dist.all_gather(distance, self.group)
                )
                traj.kl_weights = kl_weights[mine]
            traj.rewards, traj.advantages = all_rewards[mine], advantages[mine]
            batch = self.algorithm.batch(traj, step)
        if c.actor.timestep_staging:
            batch = batch.cpu()
        metrics = reward_metrics
        if self.algorithm.replays_window and recomputes_old_log_probs(c):
            with phase("old_log_probs"):
                metrics.update(self.recompute_old(batch))
        with phase("update"):
            update = actor.update(self.algorithm.objective, batch, self.params, self.optimizer, self.scheduler,
                                  self.actor_config, seed=c.seed * 1_000_003 + step, device=device,
                                  progress=self.progress, grad_scale=self.group)  # fmt: skip
            metrics.update(self.algorithm.after_update(step, update.metrics))
        metrics.update(shaped)
        metrics.update({f"actor/{k}": v for k, v in update.metrics.items()})
        metrics.update({f"reward/{k}": v.mean() for k, v in all_parts.items() if len(parts) > 1})
        metrics.update({
            "reward/mean": all_rewards.mean(), "reward/std": all_rewards.std(),
            "reward/zero_std_ratio": adv_metrics["zero_std_ratio"], "reward/group_std": adv_metrics["group_std"],
            "rollout/diversity": diversity(images, group.to(images.device)),
            "actor/lr": torch.tensor(self.scheduler.get_last_lr()[0]),
        })  # fmt: skip
        return metrics

    def submitter(
        self, prompts: list[str], meta: list[dict], group: torch.Tensor, futures: list
    ) -> Callable[[torch.Tensor, slice], None]:
        """The rollout's `on_chunk`: each decoded chunk's rewards are submitted at once (appended to `futures`),
        but a chunk that ends inside a prompt group waits for the rest of it, since a group-wise reward
        (docs/rewards.md) scores whole groups."""
        held = []

        def submit(images: torch.Tensor, rows: slice) -> None:
            held.append(images)
            stop = rows.start + len(images)
            if stop < len(prompts) and group[stop] == group[stop - 1]:
                return
            span = slice(stop - sum(map(len, held)), stop)
            futures.append(self.rewards.submit(torch.cat(held), prompts[span], meta[span]))
            held.clear()

        return submit

    def share_of_step(self, step: int) -> tuple[list[str], list[dict], torch.Tensor, torch.Tensor]:
        """This data-parallel rank's prompts (whole groups of rollout.n), their metadata, group ids and per-sample
        seeds."""
        c, n = self.config, self.config.rollout.n
        per_rank = c.data.prompts_per_step // self.dp_size
        first = self.dp_rank * per_rank
        index = prompts_for_step(self.prompts, c.data.prompts_per_step, c.seed, step)[first : first + per_rank]
        seeds = sample_seeds(c.seed, step, c.data.prompts_per_step * n)[first * n : (first + per_rank) * n]
        group = torch.arange(first, first + per_rank).repeat_interleave(n)
        prompts = [self.prompts[i] for i in index for _ in range(n)]
        meta = [{**self.decoded(self.metadata[i], f"data.prompts item {i}"), "group": first + k}  # group-wise rewards
                for k, i in enumerate(index)]  # fmt: skip
        return prompts, [m for m in meta for _ in range(n)], group, seeds

    def decoded(self, meta: dict, where: str) -> dict:
        """A prompt's metadata with its source images decoded to tensors (editing models); else as it is."""
        return {**meta, "sources": source_images(meta, where)} if self.policy.edits else meta

    def sources(self, meta: list[dict]) -> list[list[torch.Tensor]] | None:
        """Each sample's source images for an editing model, None for text-to-image."""
        return [m["sources"] for m in meta] if self.policy.edits else None

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
        # every optional reward reports (0 when it did not fail): each rank reduces the same metrics
        metrics = {f"reward/{name}/failed_chunks": torch.tensor(float(sum(name in r.failed for r in results)))
                   for name in self.config.reward.optional}  # fmt: skip
        return torch.cat([r.total for r in results]), parts, metrics

    def score(self, images: torch.Tensor, prompts: list[str], meta: list[dict]) -> tuple[torch.Tensor, dict]:
        """Rewards of a batch in chunks of the rollout micro-batch (validation), and the failure metrics."""
        spans = group_spans([m["group"] for m in meta], self.config.rollout.micro_batch_size)  # whole groups
        futures = [self.rewards.submit(images[span], prompts[span], meta[span]) for span in spans]
        total, _, metrics = self.collect(futures)
        return total, metrics

    @torch.no_grad()
    def validate(self, step: int) -> dict[str, torch.Tensor]:
        """ODE samples of every validation prompt x `data.val_seeds` fixed seeds, shared out over
        the data-parallel ranks and gathered; writes the grid."""
        c, world = self.config, self.world
        n = c.data.val_seeds
        prompts = [p for p in self.val_prompts for _ in range(n)]
        share = -(-len(prompts) // self.dp_size)  # padded so that every rank has the same count
        padded = prompts + prompts[-1:] * (share * self.dp_size - len(prompts))
        mine = slice(self.dp_rank * share, (self.dp_rank + 1) * share)
        seeds = torch.arange(len(padded)) + VAL_SEED
        val_meta = [self.decoded(m, f"data.val_prompts item {i}") for i, m in enumerate(self.val_metadata)]
        meta = [{**val_meta[min(i, len(prompts) - 1) // n], "group": min(i, len(prompts) - 1) // n}
                for i in range(len(padded))]  # fmt: skip
        images_mine = generate_ode(self.policy, padded[mine], seeds[mine], c.rollout, world.device,
                                   self.sources(meta[mine]))  # fmt: skip
        reward, failures = self.score(images_mine, padded[mine], meta[mine])
        images = dist.all_gather(images_mine, self.group)[: len(prompts)]
        reward = dist.all_gather(reward.to(world.device), self.group)[: len(prompts)]
        group = torch.arange(len(self.val_prompts)).repeat_interleave(n)
        gold, reads = self.judge(images_mine, padded[mine], meta[mine], len(prompts))
        if world.is_main:
            captions = [f"{p} {r:.2f}" + (f" g{g}" if g else "") for p, r, g in zip(prompts, reward.tolist(), reads)]
            grid, columns = images, n
            if self.policy.edits:  # each row opens with its prompt's (first) source image
                grid, captions, columns = with_sources(images, captions, [m["sources"][0] for m in val_meta], n)
            save_grid(grid, captions, columns, grid_path(self.run_dir, step))
            if c.trainer.save_val_images:
                torch.save({"images": images.mul(255).round().to(torch.uint8).cpu(), "prompts": prompts,
                            "reward": reward.cpu(), **{f"gold/{k}": v.cpu() for k, v in gold.items()}},
                           self.run_dir / "samples" / f"step_{step:06d}.pt")  # fmt: skip
        return {"val/reward/mean": reward.mean(), "val/reward/std": reward.std(),
                "val/diversity": diversity(images, group.to(images.device)),
                **{f"val/gold/{k}": v.mean() for k, v in gold.items()},
                **{f"val/{k}": v for k, v in failures.items()}}  # fmt: skip

    def judge(self, images: torch.Tensor, prompts: list[str], meta: list[dict], count: int
              ) -> tuple[dict[str, torch.Tensor], list[str]]:  # fmt: skip
        """The gold judge's verdicts on this rank's validation images, gathered over the data-parallel ranks (first
        `count`): {"accuracy": its scores, KEY: each number of its info} as (count,) tensors, and what it reads."""
        if self.gold is None:
            return {}, [""] * count
        scores = self.gold(images, prompts, meta)
        info = scores.info if isinstance(scores, rewards.Scores) else [{} for _ in scores]  # a plain list of floats
        numbers = [k for k, v in info[0].items() if isinstance(v, (int, float))]
        values = {"accuracy": list(scores), **{k: [i[k] for i in info] for k in numbers}}
        device = self.world.device
        gathered = {k: dist.all_gather(torch.tensor(v, device=device), self.group)[:count] for k, v in values.items()}
        return gathered, dist.all_gather_list([str(i.get("reads", "")) for i in info], self.group)[:count]

    def fit(self, resume: Path | None = None) -> dict:
        """Train to trainer.total_steps (from a checkpoint if given); returns the validation summary."""
        return run_loop(self, self.policy.transformer, resume, "val/reward/mean", self.algorithm.state)
