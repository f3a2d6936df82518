"""The online RL loop of language models (GRPO, DAPO, GSPO, OPD): each step a flat list of named, timed phases.

rollout (n samples per prompt) -> reward -> advantage -> [old_log_probs] -> [reference] -> [teacher] -> update.
Validation decodes greedily every prompt of the validation split (capped by `data.val_limit`, split evenly
across modalities) before training, every `trainer.val_every` steps and at the end; with a 0/1 reward such
as `choice`, `val/reward/mean` is the accuracy. `fit` builds the objective (and the offline loop for dpo).
"""

import copy
import dataclasses
import json
from contextlib import nullcontext
from pathlib import Path

import torch

from omnialign import rewards
from omnialign.algorithms.advantages import group_relative
from omnialign.config import Config, recomputes_old_log_probs, training_batch
from omnialign.data.language import cap_by_modality, load_records
from omnialign.data.prompts import prompts_for_step
from omnialign.engine import dist, fsdp, optim
from omnialign.engine.dist import World
from omnialign.metrics import MetricsLog, Timer
from omnialign.models import LOADERS, lora
from omnialign.models.base import LanguagePolicy
from omnialign.models.reference import Context, swapped_network
from omnialign.rollout.language import generate
from omnialign.trainer import actor, offline
from omnialign.trainer.language_objectives import dpo_objective, logprob_objective, policy_objective
from omnialign.trainer.loop import run_loop

VAL_SEED = 2**40


def prompt_text(messages: list[dict]) -> str:
    """The text of the last user message (what rewards see as the prompt)."""
    content = [m for m in messages if m["role"] == "user"][-1]["content"]
    return content if isinstance(content, str) else " ".join(c["text"] for c in content if c["type"] == "text")


def metadata(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("prompt", "media")}


class LanguageTrainer:
    def __init__(
        self,
        config: Config,
        policy: LanguagePolicy,
        params: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        objective: actor.Objective,
        world: World,
        run_dir: Path,
        reference: Context | None = None,
        teacher: Context | None = None,
    ):
        self.config, self.policy, self.params, self.objective = config, policy, params, objective
        self.optimizer, self.scheduler, self.reference, self.teacher = optimizer, scheduler, reference, teacher
        self.actor_config = actor.local_config(config.actor, *training_batch(config)[:2], world.size)
        self.world, self.run_dir = world, Path(run_dir)
        self.records = load_records(config.data.prompts, "train")
        self.val_records = cap_by_modality(load_records(config.data.val_prompts, "val"), config.data.val_limit)
        self.timer = Timer(dist.synchronizer(world.device))
        self.log = MetricsLog(self.run_dir, config) if world.is_main else None
        self.progress = config.trainer.progress and world.is_main

    def infer(self, context: Context, batch) -> torch.Tensor:
        """Response log-probs (B, R) of a batch under a context (old policy, reference, teacher)."""
        with context():
            out = actor.infer(logprob_objective(self.policy, self.config.generation.temperature), batch,
                              self.config.actor.micro_batch_size, self.world.device)  # fmt: skip
        return out["log_prob"][:, 0].cpu()  # language batches live on the host

    def train_step(self, step: int) -> dict[str, torch.Tensor]:
        c, device, phase, rank = self.config, self.world.device, self.timer.phase, self.world.rank
        with phase("rollout"):
            per_rank = c.data.prompts_per_step // self.world.size
            index = prompts_for_step(self.records, c.data.prompts_per_step, c.seed, step)
            mine = index[rank * per_rank : (rank + 1) * per_rank]
            records = [self.records[i] for i in mine]
            group = torch.arange(rank * per_rank, (rank + 1) * per_rank)
            seed = (c.seed * 1_000_003 + step) * 1000 + rank
            batch, texts = generate(self.policy, [r["prompt"] for r in records], c.rollout.n, group, c.generation,
                                    device, seed=seed, progress=self.progress)  # fmt: skip
        with phase("reward"):
            records = [r for r in records for _ in range(c.rollout.n)]
            scored = rewards.score(texts, [prompt_text(r["prompt"]) for r in records], [metadata(r) for r in records],
                                   c.reward)  # fmt: skip
            reward = scored.total.float()
        with phase("advantage"):
            all_rewards = dist.all_gather(reward.to(device))
            advantages, adv_metrics = group_relative(all_rewards, dist.all_gather(batch.group.to(device)),
                                                     c.algorithm.global_std, c.algorithm.norm_by_std)  # fmt: skip
            batch.rewards, batch.advantages = reward, advantages[rank * len(reward) : (rank + 1) * len(reward)].cpu()
        metrics: dict[str, torch.Tensor] = {}
        if recomputes_old_log_probs(c):
            with phase("old_log_probs"):
                batch.old_log_probs = self.infer(nullcontext, batch)
                mask = batch.response_mask
                diff = (batch.old_log_probs - batch.log_probs) * mask
                metrics["actor/rollout_logprob_gap"] = diff.abs().sum() / mask.sum()  # per token
                metrics["actor/rollout_seq_gap"] = (diff.sum(-1) / mask.sum(-1).clamp_min(1)).abs().mean()  # GSPO's
        if c.algorithm.kl_coef > 0:
            with phase("reference"):
                batch.ref_log_probs = self.infer(self.reference, batch)
        if self.teacher is not None:
            with phase("teacher"):
                batch.teacher_log_probs = self.infer(self.teacher, batch)
        with phase("update"):
            update = actor.update(self.objective, batch, self.params, self.optimizer, self.scheduler, self.actor_config,
                                  seed=c.seed * 1_000_003 + step, device=device, progress=self.progress)  # fmt: skip
        metrics.update({f"actor/{k}": v for k, v in update.metrics.items()})
        metrics.update({f"reward/{k}": v.mean() for k, v in scored.parts.items() if len(scored.parts) > 1})
        metrics.update(
            {f"reward/{k}/failed_chunks": torch.tensor(float(k in scored.failed)) for k in c.reward.optional}
        )
        metrics.update({
            "reward/mean": all_rewards.mean(), "reward/std": all_rewards.std(),
            "reward/zero_std_ratio": adv_metrics["zero_std_ratio"], "reward/group_std": adv_metrics["group_std"],
            "rollout/response_length": batch.response_mask.sum(-1).mean(),
            "actor/lr": torch.tensor(self.scheduler.get_last_lr()[0]),
        })  # fmt: skip
        return metrics

    @torch.no_grad()
    def validate(self, step: int) -> dict[str, torch.Tensor]:
        """Greedy answers to the validation prompts, shared out over the ranks; writes samples/step_N.jsonl."""
        c, world = self.config, self.world
        share = -(-len(self.val_records) // world.size)
        padded = self.val_records + self.val_records[-1:] * (share * world.size - len(self.val_records))
        mine = padded[world.rank * share : (world.rank + 1) * share]
        _, texts = generate(self.policy, [r["prompt"] for r in mine], 1, torch.arange(len(mine)), c.generation,
                            world.device, seed=VAL_SEED, greedy=True)  # fmt: skip
        scored = rewards.score(texts, [prompt_text(r["prompt"]) for r in mine], [metadata(r) for r in mine], c.reward)
        reward = dist.all_gather(scored.total.float().to(world.device))[: len(self.val_records)]
        if world.is_main:
            path = self.run_dir / "samples" / f"step_{step:06d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = [json.dumps({"prompt": prompt_text(r["prompt"]), "response": t, "reward": s})
                     for r, t, s in zip(mine, texts, scored.total.tolist())]  # fmt: skip
            path.write_text("\n".join(lines) + "\n")
        modalities = sorted({r["modality"] for r in self.val_records})
        out = {"val/reward/mean": reward.mean()}
        out.update(
            {f"val/reward/{k}/failed_chunks": torch.tensor(float(k in scored.failed)) for k in c.reward.optional}
        )
        if len(modalities) > 1:
            for m in modalities:
                rows = torch.tensor([r["modality"] == m for r in self.val_records], device=reward.device)
                out[f"val/reward/{m}"] = reward[rows].mean()
        return out

    def fit(self, resume: Path | None = None) -> dict[str, float]:
        return run_loop(self, self.policy.transformer, resume, "val/reward/mean")


def build(
    config: Config, world: World, policy: LanguagePolicy | None = None
) -> tuple[LanguagePolicy, Context | None, Context | None]:
    """The sharded policy on its device, the reference context (adapters off, or a frozen copy under full
    fine-tuning; None when unused) and the teacher context (None without algorithm.teacher_path). `policy`
    defaults to loading `config.model` (a benchmark passes one built in memory)."""
    m, a, e = config.model, config.algorithm, config.engine
    policy = LOADERS[m.arch](m) if policy is None else policy
    net, blocks, reference = policy.transformer, policy.blocks(), None
    mesh, dtype = fsdp.mesh(world), getattr(torch, m.dtype)
    if m.lora.rank > 0:
        lora.apply_lora(net, m.lora.rank, m.lora.alpha or m.lora.rank, m.lora.targets or policy.lora_targets,
                        exclude=m.lora.exclude)  # fmt: skip
        reference = lambda: lora.adapters_disabled(net)  # noqa: E731
    else:
        net.requires_grad_(True).float()  # fp32 master weights; compute in model.dtype (FSDP mixed precision)
        if a.kl_coef > 0 or a.name == "dpo":
            frozen = copy.deepcopy(net).requires_grad_(False).eval()
            names = {id(module): name for name, module in net.named_modules()}
            fsdp.shard(frozen, [frozen.get_submodule(names[id(b)]) for b in blocks], mesh, dtype, False, e.cpu_offload)
            reference = swapped_network(policy, frozen)
    for module in policy.frozen:
        module.requires_grad_(False)
    teacher = None
    if a.teacher_path:
        teacher_net = LOADERS[m.arch](dataclasses.replace(m, path=a.teacher_path)).transformer
        teacher_net.requires_grad_(False).eval()
        fsdp.shard(teacher_net, list(teacher_net.get_submodule(_layers_name(net, blocks))), mesh, dtype, False,
                   e.cpu_offload)  # fmt: skip
        teacher = swapped_network(policy, teacher_net)
    fsdp.shard(net, blocks, mesh, dtype, e.activation_checkpointing, e.cpu_offload, e.reshard_after_forward,
               checkpoint_every=e.checkpoint_every)  # fmt: skip
    with torch.no_grad():  # FSDP initialises at the root's first forward; generation may call a tower first
        net(input_ids=torch.full((1, 1), policy.pad_token_id, device=world.device), use_cache=False)
    return policy.to(world.device), reference, teacher


def _layers_name(net: torch.nn.Module, blocks: list[torch.nn.Module]) -> str:
    """The dotted name of the module list holding `blocks` (the same in a teacher of the same architecture)."""
    name = next(n for n, module in net.named_modules() if module is blocks[0])
    return name.rsplit(".", 1)[0]


def main(config: Config, world: World, run_dir: Path, resume: Path | None) -> dict[str, float]:
    """Build the policy, optimizer, objective and loop of a language algorithm (grpo, dapo, gspo, opd, dpo)
    and train; returns the validation summary."""
    policy, reference, teacher = build(config, world)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    if config.algorithm.name == "dpo":
        objective = dpo_objective(policy, config.algorithm)
        trainer = offline.language_dpo(config, policy, params, optimizer, scheduler, objective, reference, world,
                                       run_dir)  # fmt: skip
        return trainer.fit(resume)
    objective = policy_objective(policy, config.algorithm, config.generation.temperature,
                                 recomputes_old_log_probs(config))  # fmt: skip
    trainer = LanguageTrainer(
        config, policy, params, optimizer, scheduler, objective, world, run_dir, reference, teacher
    )
    return trainer.fit(resume)
