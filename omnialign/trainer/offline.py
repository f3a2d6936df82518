"""The offline preference loop: batches of stored pairs, each step a flat list of named, timed phases.

data (one batch of pairs) -> the `prepare` phases (e.g. reference scores) -> update. The loop knows no
model family: it takes a function from step to batch (adjacent chosen/rejected rows), named phases that
fill batch fields, an actor objective and a validation function, so a Diffusion-DPO objective over
`PreferencePairs` runs in it as language DPO over `TokenBatch` does (`language_dpo` builds that one).
"""

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from omnialign.config import Config, training_batch
from omnialign.data.language import cap_by_modality, load_records, pair_batches
from omnialign.engine import dist
from omnialign.engine.dist import World
from omnialign.metrics import MetricsLog, Timer
from omnialign.models.base import LanguagePolicy
from omnialign.models.reference import Context
from omnialign.rollout.language import pack
from omnialign.trainer import actor
from omnialign.trainer.language_objectives import dpo_objective, logprob_objective
from omnialign.trainer.loop import run_loop


class OfflineTrainer:
    def __init__(
        self,
        config: Config,
        model: torch.nn.Module,
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        objective: actor.Objective,
        world: World,
        run_dir: Path,
        batch_of_step: Callable[[int], Any],
        prepare: dict[str, Callable[[Any], Any]],
        validate: Callable[[int], dict[str, torch.Tensor]],
        key: str,
    ):
        """batch_of_step(step) -> this rank's batch on the host; prepare: phase name -> fn(batch) -> batch,
        run in order before the update; validate(step) -> metrics; key: the validation metric summarised."""
        self.config, self.model, self.params, self.objective = config, model, params, objective
        self.optimizer, self.scheduler, self.world, self.run_dir = optimizer, scheduler, world, Path(run_dir)
        self.batch_of_step, self.prepare, self.validate, self.key = batch_of_step, prepare, validate, key
        self.actor_config = actor.local_config(config.actor, *training_batch(config)[:2], world.size)
        self.timer = Timer(dist.synchronizer(world.device))
        self.log = MetricsLog(self.run_dir, config) if world.is_main else None
        self.progress = config.trainer.progress and world.is_main

    def train_step(self, step: int) -> dict[str, torch.Tensor]:
        c, phase = self.config, self.timer.phase
        with phase("data"):
            batch = self.batch_of_step(step)
        for name, fn in self.prepare.items():
            with phase(name):
                batch = fn(batch)
        with phase("update"):
            update = actor.update(self.objective, batch, self.params, self.optimizer, self.scheduler, self.actor_config,
                                  seed=c.seed * 1_000_003 + step, device=self.world.device,
                                  progress=self.progress)  # fmt: skip
        return {**{f"actor/{k}": v for k, v in update.metrics.items()},
                "actor/lr": torch.tensor(self.scheduler.get_last_lr()[0])}  # fmt: skip

    def fit(self, resume: Path | None = None) -> dict[str, float]:
        return run_loop(self, self.model, resume, self.key)


def pair_batch(policy: LanguagePolicy, records: list[dict], first_pair: int = 0):
    """Preference records to a `TokenBatch` of adjacent chosen/rejected rows (responses end with the end-of-turn
    token); the group of a pair is its index from `first_pair`."""
    ids, media = policy.encode([r["prompt"] for r in records])
    end = [policy.tokenizer.eos_token_id]
    tok = policy.tokenizer
    responses = [tok(r[k], add_special_tokens=False).input_ids + end for r in records for k in ("chosen", "rejected")]
    group = torch.arange(first_pair, first_pair + len(records)).repeat_interleave(2)
    return pack(
        policy, [i for i in ids for _ in range(2)], [m or {} for m in media for _ in range(2)], responses, group
    )


def language_dpo(
    config: Config,
    policy: LanguagePolicy,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    objective: actor.Objective,
    reference: Context,
    world: World,
    run_dir: Path,
) -> OfflineTrainer:
    """Offline multimodal DPO: one modality per batch, reference scores as a phase, held-out reward accuracy
    and margin (validation pairs capped by data.val_limit, split evenly across modalities)."""
    c = config
    records = load_records(c.data.prompts, "train")
    val_records = cap_by_modality(load_records(c.data.val_prompts, "val"), c.data.val_limit)
    per_rank = c.data.prompts_per_step // world.size
    micro = c.actor.micro_batch_size

    def batch_of_step(step: int):
        index = pair_batches(records, c.data.prompts_per_step, c.seed, step)
        return pair_batch(policy, [records[i] for i in index[world.rank * per_rank : (world.rank + 1) * per_rank]])

    def with_reference(batch):
        with reference():
            out = actor.infer(logprob_objective(policy), batch, micro, world.device)
        batch.ref_log_probs = out["log_prob"][:, 0].cpu()  # language batches live on the host
        return batch

    val_objective = dpo_objective(policy, c.algorithm, reference)

    @torch.no_grad()
    def validate(step: int) -> dict[str, torch.Tensor]:
        share = -(-len(val_records) // world.size)
        padded = val_records + val_records[-1:] * (share * world.size - len(val_records))
        mine = padded[world.rank * share : (world.rank + 1) * share]
        out = actor.infer(val_objective, pair_batch(policy, mine), micro, world.device)
        accuracy = dist.all_gather(out["accuracy"][:, 0].float())[: len(val_records)]
        margin = dist.all_gather(out["margin"][:, 0].float())[: len(val_records)]
        return {"val/dpo/accuracy": accuracy.mean(), "val/dpo/margin": margin.mean()}

    return OfflineTrainer(config, policy.transformer, params, optimizer, scheduler, objective, world, run_dir,
                          batch_of_step, {"reference": with_reference}, validate, "val/dpo/accuracy")  # fmt: skip


def diffusion_dpo(config: Config, world: World, run_dir: Path) -> OfflineTrainer:
    """Offline Diffusion-DPO on the pairs of `omnialign prepare offline-dpo` (`data.pairs`): stored latents
    and prompt embeddings, so the policy loads without VAE and text encoders; one noise and one
    logit-normal sigma per pair and step; held-out implicit reward accuracy on `data.val_pairs`."""
    from omnialign.data.offline_dpo import PairLoader
    from omnialign.data.prompts import prompts_for_step
    from omnialign.engine import optim
    from omnialign.trainer.build import build_policy
    from omnialign.trainer.objectives import dpo_accuracy, dpo_objective, pair_batch

    c = config  # train.check_inputs has refused a run without data.pairs
    loader = PairLoader(c.data.pairs)
    val_loader = PairLoader(c.data.val_pairs) if c.data.val_pairs else None
    policy, contexts = build_policy(dataclasses.replace(c, model=dataclasses.replace(c.model, transformer_only=True)),
                                    world)  # fmt: skip
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, c.actor)
    objective = dpo_objective(policy, c, contexts["reference"])
    per_rank = c.data.prompts_per_step // world.size
    every_pair = list(range(len(loader)))

    def batch_of_step(step: int):
        index = prompts_for_step(every_pair, c.data.prompts_per_step, c.seed, step)
        pairs = loader.read(index[world.rank * per_rank : (world.rank + 1) * per_rank]).to(world.device)
        g = torch.Generator().manual_seed(c.seed * 1_000_003 + step)
        return pair_batch(pairs.latents, pairs.cond, pairs.scores, g, c, policy.train_sigmas())

    @torch.no_grad()
    def validate(step: int) -> dict[str, torch.Tensor]:
        if val_loader is None:
            return {}
        pairs = val_loader.read(list(range(len(val_loader)))).to(world.device)
        batch = pair_batch(pairs.latents, pairs.cond, pairs.scores, torch.Generator().manual_seed(2**40), c,
                           policy.train_sigmas())  # fmt: skip
        out = actor.infer(objective, batch, c.actor.micro_batch_size, world.device)
        metrics = dpo_accuracy(out["errors"][:, 0], out["ref_errors"][:, 0], c.algorithm.dpo_beta)
        return {f"val/{k}": v for k, v in metrics.items()}

    key = "val/dpo/accuracy" if val_loader is not None else "actor/dpo/accuracy"
    return OfflineTrainer(config, policy.transformer, params, optimizer, scheduler, objective, world, run_dir,
                          batch_of_step, {}, validate, key)  # fmt: skip
