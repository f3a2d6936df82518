"""The diffusion algorithm family: each turns a scored rollout into a training batch and an objective.

| name | trains on | objective |
|---|---|---|
| flowgrpo | SDE-window transitions | PPO clip on transition log-probs (+ reference KL, + teacher KL) |
| grpo_guard | SDE-window transitions | GRPO-Guard: normalised ratio, step reweighting |
| dppo | SDE-window transitions | Flow-DPPO: KL trust-region mask instead of clipping |
| distill | SDE-window transitions | Gaussian KL to a frozen teacher at every stored state |
| nft | clean samples, fresh timesteps | DiffusionNFT with the `old` adapter |
| awm | clean samples, stratified timesteps | AWM: PPO clip on the flow-matching log-likelihood surrogate |
| dgpo | clean samples, noisiest timesteps | DGPO: group preference (advantage-weighted DPO) against the reference |
| gardo | SDE-window transitions | FlowGRPO, KL on uncertain samples only, refreshed reference, diversity advantages |
| tempflow | branch transitions of ODE trunks | FlowGRPO per branch step, noise-aware step weights |
| branchgrpo | the edges of SDE trees (less pruned ones) | FlowGRPO per edge, advantages per tree depth |
| online_dpo | best and worst sample of each prompt | Diffusion-DPO against the reference |

The math lives in `algorithms/`; this module only calls the policy and hands tensors over.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from omnialign.algorithms import awm as awm_loss
from omnialign.algorithms import branching, nft, preference
from omnialign.algorithms import dgpo as dgpo_loss
from omnialign.algorithms import gardo as gardo_math
from omnialign.algorithms.advantages import group_relative
from omnialign.algorithms.distill import diffusion_distill
from omnialign.algorithms.policy_gradient import dppo, dual_clip, gaussian_mean_kl, grpo_guard, ppo_clip
from omnialign.batch import Branched, CleanBatch, PairBatch, Trajectory
from omnialign.config import Config, RolloutConfig, leaves_per_sample, recomputes_old_log_probs, tree_leaves
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import guided_velocity
from omnialign.engine import dist
from omnialign.models.base import DiffusionPolicy
from omnialign.models.reference import Context
from omnialign.rollout.branching import generate_tempflow, generate_tree
from omnialign.rollout.diffusion import generate, rollout_velocity, step_guidance
from omnialign.trainer.actor import Inputs, Objective, infer

FLOW_STEP = {"x": ("latents", 0), "x_next": ("latents", 1), "sigma": ("sigmas", 0), "sigma_next": ("sigmas", 1)}


def replay(policy: DiffusionPolicy, inputs: Inputs, rollout: RolloutConfig) -> sde.Transition:
    """Score a stored transition x -> x_next under the current policy."""
    x, sigma = inputs["x"], inputs["sigma"]
    v = guided_velocity(rollout_velocity(policy, rollout), x, sigma, inputs["cond"], inputs["uncond"],
                        step_guidance(policy, sigma, rollout), rollout.cfg_rescale)  # fmt: skip
    return sde.transition(rollout.kind, v, x, sigma, inputs["sigma_next"], rollout.eta, sample=inputs["x_next"])


def log_prob_objective(policy: DiffusionPolicy, rollout: RolloutConfig) -> Objective:
    """Forward-only: the log-prob and mean of each stored transition (old policy, teacher)."""

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict, dict[str, torch.Tensor]]:
        tr = replay(policy, inputs, rollout)
        return tr.log_prob, {}, {"log_prob": tr.log_prob, "mean": tr.mean}

    return Objective(fn, resident=("cond", "uncond"), per_step=dict(FLOW_STEP))


@dataclass
class Algorithm:
    objective: Objective
    batch: Callable[[Trajectory, int], Any]
    """The training batch from a scored rollout (advantages set) at a step."""
    after_update: Callable[[int, dict[str, torch.Tensor]], dict[str, torch.Tensor]] = lambda step, metrics: {}
    """Runs after the optimizer steps of a training step with its update's metrics (e.g. refreshing the `old`
    adapter); returns metrics of its own."""
    replays_window: bool = True
    """Trains on SDE-window transitions (needs rollout.window_size > 0; old log-probs may be recomputed)."""
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """Tensors besides the trained parameters that a checkpoint keeps, by name (NFT: the frozen `old` adapter)."""
    rollout: Callable[..., tuple[Any, torch.Tensor]] = generate
    """The rollout: (what `batch` takes, the images the rewards score); a branched one (TempFlow) has `leaves`
    images per sample."""
    leaves: int = 1
    """Images per sample of the rollout."""
    reshape: Callable[..., tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] | None = None
    """GARDO: (advantages, rewards, {reward name: rewards}, groups, nearest-neighbour distances) of every sample of
    the step, all (B,) -> (advantages, per-sample KL weights, metrics)."""


def policy_gradient(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """flowgrpo, grpo_guard, dppo and distill: per window step, a loss on the replayed transition."""
    a, rollout = config.algorithm, config.rollout
    clip_high = a.clip_high if a.clip_high is not None else a.clip_range

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        tr = replay(policy, inputs, rollout)
        old_lp, adv = inputs["old_log_prob"], inputs["advantages"]
        if a.name in ("flowgrpo", "gardo", "tempflow", "branchgrpo"):
            loss, metrics = ppo_clip(tr.log_prob, old_lp, adv, a.clip_range, clip_high, a.adv_clip)
            if a.name == "tempflow":  # noise-aware step weights, on the policy term only (the reference's)
                loss = loss * inputs["loss_weights"]
            if a.dual_clip:
                loss = dual_clip(loss, adv.clamp(-a.adv_clip, a.adv_clip), a.dual_clip)
        elif a.name == "grpo_guard":
            sqrt_neg_dt = (inputs["sigma"] - inputs["sigma_next"]).sqrt()
            loss, metrics = grpo_guard(tr.log_prob, old_lp, adv, tr.mean, inputs["old_mean"], tr.std, sqrt_neg_dt,
                                       a.clip_range, clip_high, a.adv_clip)  # fmt: skip
        elif a.name == "dppo":
            loss, metrics = dppo(tr.log_prob, old_lp, adv, tr.mean, inputs["old_mean"], tr.std, a.dppo_tau)
        else:  # distill: the teacher term alone
            loss, metrics = torch.zeros_like(tr.log_prob), {}
        if "clip_frac_low" in metrics:
            metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        if a.kl_coef > 0:
            with torch.no_grad(), reference():
                ref = replay(policy, inputs, rollout)
            kl = gaussian_mean_kl(tr.mean, ref.mean, tr.std)
            if a.name == "gardo":  # on the gated samples only, their mean over the batch (algorithms.gardo)
                metrics["gardo/kl_all"] = kl.detach()
                kl = kl * inputs["kl_weights"]
            loss = loss + a.kl_coef * kl
            metrics["kl"] = kl.detach()
        if teacher is not None:
            with torch.no_grad(), teacher():
                taught = replay(policy, inputs, rollout)
            distance = diffusion_distill(tr.mean, taught.mean, tr.std)
            loss = loss + a.distill_coef * distance
            metrics["distill_kl"] = distance.detach()
        return loss, metrics, {"log_prob": tr.log_prob, "mean": tr.mean}

    recompute = recomputes_old_log_probs(config)
    per_step = {**FLOW_STEP, "old_log_prob": ("old_log_probs" if recompute else "log_probs", 0)}
    if a.name in ("grpo_guard", "dppo"):
        per_step["old_mean"] = ("old_means" if recompute else "means", 0)
    resident = (
        "cond",
        "uncond",
        "advantages",
        *{"gardo": ("kl_weights",), "tempflow": ("loss_weights",)}.get(a.name, ()),
    )
    return Algorithm(Objective(fn, resident=resident, per_step=per_step), batch=lambda traj, step: traj)


def tempflow(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """TempFlow-GRPO: FlowGRPO's objective on the branch transitions of ODE trunks (`rollout.branching`), each row's
    advantage its branch's reward against the other branches of the same trunk state, its policy loss weighted by
    its transition's noise."""
    a = config.algorithm

    def batch(tree: Branched, step: int) -> Trajectory:
        rows = tree.rows
        rows.advantages = group_relative(branching.row_rewards(tree.rewards, tree.leaf_range), tree.row_group,
                                         global_std=False, norm_by_std=a.norm_by_std)[0]  # fmt: skip
        rows.loss_weights = branching.noise_weights(tree.row_std)
        return rows

    objective = policy_gradient(policy, config, reference, teacher, old).objective
    return Algorithm(objective, batch, rollout=generate_tempflow, leaves=leaves_per_sample(config.rollout))


def branchgrpo(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """BranchGRPO: FlowGRPO's objective on the edges of SDE trees (`rollout.branching.generate_tree`), each edge's
    advantage its child's reward (the mean of the leaves below it) against the other nodes of its depth in its
    tree; the edges of algorithm.branch_depth_pruning's depths and algorithm.branch_width_pruning's share of those
    after the last split are not trained."""
    a, r = config.algorithm, config.rollout

    def batch(tree: Branched, step: int) -> Trajectory:
        rows = tree.rows
        rows.advantages = group_relative(branching.row_rewards(tree.rewards, tree.leaf_range), tree.row_group,
                                         global_std=False, norm_by_std=a.norm_by_std)[0]  # fmt: skip
        trees = len(tree.rewards) // tree_leaves(r)
        keep = branching.prune(rows.advantages.view(trees, -1), tree.row_step.view(trees, -1), a.branch_depth_pruning,
                               max(r.split_steps), a.branch_width_pruning)  # fmt: skip
        return rows[keep.flatten()]

    objective = policy_gradient(policy, config, reference, teacher, old).objective
    return Algorithm(objective, batch, rollout=generate_tree, leaves=tree_leaves(r))


def _generator(config: Config, step: int, salt: int) -> torch.Generator:
    """A generator seeded by (seed, step, salt): the same on every rank, fresh every step."""
    return torch.Generator().manual_seed((config.seed * 1_000_003 + step) * 7 + salt)


def diffusion_nft(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """DiffusionNFT: clean rollout samples, re-noised at a fresh subset of the rollout's timesteps."""
    a = config.algorithm

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        x0, noise, sigma, cond = inputs["x0"], inputs["noise"], inputs["sigma"], inputs["cond"]
        xt = sde.add_noise(x0, noise, sigma)
        v = policy.velocity(xt, sigma, cond)
        with torch.no_grad(), old():
            v_old = policy.velocity(xt, sigma, cond)
        v_ref = None
        if a.nft_kappa > 0:
            with torch.no_grad(), reference():
                v_ref = policy.velocity(xt, sigma, cond)
        r = nft.optimality(inputs["advantages"], a.adv_clip)
        loss, metrics = nft.nft_loss(x0, xt, sigma, v, v_old, r, a.nft_beta, a.adv_clip, v_ref, a.nft_kappa)
        return loss, metrics, {"velocity": v.detach()}

    def batch(traj: Trajectory, step: int) -> CleanBatch:
        schedule = policy.schedule(config.rollout.steps, config.rollout.height, config.rollout.width)[:-1]
        pick = torch.randperm(len(schedule), generator=_generator(config, step, 1))[: a.nft_timesteps]
        g = _generator(config, step, 2)
        noise = torch.randn(traj.final.shape, generator=g).to(traj.final.device)
        sigmas = schedule[pick].sort(descending=True).values.expand(len(traj), -1).contiguous()
        return CleanBatch(x0=traj.final, noise=noise, sigmas=sigmas.to(traj.final.device), cond=traj.cond,
                          advantages=traj.advantages, batch_size=[len(traj)])  # fmt: skip

    batch_size = config.data.prompts_per_step * config.rollout.n
    updates = config.actor.epochs * (batch_size // (config.actor.mini_batch_size or batch_size))

    def refresh(step: int, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """After training step `step`, `step * updates` optimizer steps have run: the decay counts those, as
        DiffusionNFT's global_step does."""
        from omnialign.models.lora import blend_adapter

        blend_adapter(policy.transformer, "old", nft.old_decay(step * updates, a.old_schedule))
        return {}

    objective = Objective(fn, resident=("x0", "noise", "cond", "advantages"), per_step={"sigma": ("sigmas", 0)})
    old_adapter = {name: p for name, p in policy.transformer.named_parameters() if ".old." in name}
    return Algorithm(objective, batch, after_update=refresh, replays_window=False, state=old_adapter)


def awm(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """AWM: clean rollout samples at `awm_timesteps` noise levels, one per stratum of the schedule, fresh noise each;
    the matching log-probs before the update are the old ones (one forward pass), then PPO clip on them."""
    a = config.algorithm

    def log_prob(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(matching log-probs, velocity, the noised input it was predicted at)."""
        x0, noise, sigma = inputs["x0"], inputs["noise"], inputs["sigma"]
        xt = sde.add_noise(x0, noise, sigma)
        v = policy.velocity(xt, sigma, inputs["cond"])
        return awm_loss.matching_log_prob(v, x0, noise, sigma, a.awm_weighting, a.awm_power), v, xt

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        lp, v, xt = log_prob(inputs)
        loss, metrics = ppo_clip(lp, inputs["old_log_prob"], inputs["advantages"], a.clip_range,
                                 a.clip_high if a.clip_high is not None else a.clip_range, a.adv_clip)  # fmt: skip
        metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        if a.kl_coef > 0:  # the reference's uniform-weight KL: the mean squared velocity difference
            with torch.no_grad(), reference():
                v_ref = policy.velocity(xt, inputs["sigma"], inputs["cond"])
            kl = ((v.float() - v_ref.float()) ** 2).mean(dim=tuple(range(1, v.dim())))
            loss, metrics["kl"] = loss + a.kl_coef * kl, kl.detach()
        return loss, metrics, {"log_prob": lp.detach()}

    noised = {"sigma": ("sigmas", 0), "noise": ("noise", 0)}
    before = Objective(lambda inputs: (None, {}, {"log_prob": log_prob(inputs)[0]}), ("x0", "cond"), noised)

    def batch(traj: Trajectory, step: int) -> CleanBatch:
        schedule = policy.schedule(config.rollout.steps, config.rollout.height, config.rollout.width)[:-1]
        bounds = torch.linspace(1, len(schedule), a.awm_timesteps + 1).long()
        g = _generator(config, step, 4)
        pick = bounds[:-1] + (torch.rand(a.awm_timesteps, generator=g) * (bounds[1:] - bounds[:-1])).long()
        noise = torch.randn((len(traj), a.awm_timesteps, *traj.final.shape[1:]), generator=g).to(traj.final.device)
        sigmas = schedule[pick].expand(len(traj), -1).contiguous().to(traj.final.device)
        clean = CleanBatch(x0=traj.final, noise=noise, sigmas=sigmas, cond=traj.cond, advantages=traj.advantages,
                           batch_size=[len(traj)])  # fmt: skip
        clean.old_log_probs = infer(before, clean, config.actor.micro_batch_size)["log_prob"]
        return clean

    objective = Objective(fn, ("x0", "cond", "advantages"), {**noised, "old_log_prob": ("old_log_probs", 0)})
    return Algorithm(objective, batch, replays_window=False)


def dgpo(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """DGPO: clean rollout samples at `dgpo_timesteps` noise levels drawn from the schedule's first
    `dgpo_first_steps` (one set for the batch), one noise per prompt group and level. Before the update, one pass gives
    the policy's and the reference's errors: the group weights, the old log-probs of the clip and (with a KL) the
    reference's velocity."""
    a = config.algorithm
    kl = {"ref_velocity": ("ref_velocities", 0)} if a.kl_coef > 0 else {}

    def forward(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the policy's velocity, minus the flow-matching error, the noised input)."""
        x0, noise, sigma = inputs["x0"], inputs["noise"], inputs["sigma"]
        xt = sde.add_noise(x0, noise, sigma)
        v = policy.velocity(xt, sigma, inputs["cond"])
        return v, awm_loss.matching_log_prob(v, x0, noise, sigma, "uniform"), xt

    def before(inputs: Inputs) -> tuple[None, dict, dict[str, torch.Tensor]]:
        _, lp, xt = forward(inputs)
        with reference():
            v_ref = policy.velocity(xt, inputs["sigma"], inputs["cond"])
        ref_lp = awm_loss.matching_log_prob(v_ref, inputs["x0"], inputs["noise"], inputs["sigma"], "uniform")
        return None, {}, {"log_prob": lp, "ref_log_prob": ref_lp, **({"ref_velocity": v_ref.float()} if kl else {})}

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        v, lp, _ = forward(inputs)
        clip_high = a.clip_high if a.clip_high is not None else a.clip_range
        loss, metrics = dgpo_loss.dgpo_loss(lp, inputs["old_log_prob"], inputs["advantages"], inputs["weight"],
                                            a.clip_range, clip_high)  # fmt: skip
        metrics["dgpo/error"] = -lp.detach()
        if kl:  # the reference's uniform-weight KL: the mean squared velocity difference
            distance = ((v.float() - inputs["ref_velocity"]) ** 2).mean(dim=tuple(range(1, v.dim())))
            loss, metrics["kl"] = loss + a.kl_coef * distance, distance.detach()
        return loss, metrics, {"log_prob": lp.detach()}

    noised = {"sigma": ("sigmas", 0), "noise": ("noise", 0)}

    def batch(traj: Trajectory, step: int) -> CleanBatch:
        schedule = policy.schedule(config.rollout.steps, config.rollout.height, config.rollout.width)
        g = _generator(config, step, 5)
        pick = torch.randperm(a.dgpo_first_steps, generator=g)[: a.dgpo_timesteps]
        groups, index = torch.unique(traj.group.cpu(), return_inverse=True)
        noise = torch.randn((len(groups), a.dgpo_timesteps, *traj.final.shape[1:]), generator=g)[index]
        advantages = traj.advantages.clamp(-a.adv_clip, a.adv_clip)
        clean = CleanBatch(x0=traj.final, noise=noise.to(traj.final.device), cond=traj.cond, advantages=advantages,
                           sigmas=schedule[pick].expand(len(traj), -1).contiguous().to(traj.final.device),
                           batch_size=[len(traj)])  # fmt: skip
        out = infer(Objective(before, ("x0", "cond"), noised), clean, config.actor.micro_batch_size)
        clean.weights = dgpo_loss.group_weights(out["log_prob"], out["ref_log_prob"], advantages, traj.group,
                                                a.dpo_beta)[0]  # fmt: skip
        clean.old_log_probs, clean.ref_velocities = out["log_prob"], out.get("ref_velocity")
        return clean

    per_step = {**noised, "old_log_prob": ("old_log_probs", 0), "weight": ("weights", 0), **kl}
    return Algorithm(Objective(fn, ("x0", "cond", "advantages"), per_step), batch, replays_window=False)


def gardo(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """GARDO on FlowGRPO: its objective with the reference KL weighted per sample (`kl_weights`, set by `reshape`:
    the gated samples only, averaged over them); `reshape` also scales the advantages for diversity; after each
    update the reference (`algorithm.ref_update_every`, a `Reference`) becomes the policy when the gated KL
    exceeded `gardo_kl_threshold` or `ref_update_every` steps passed since the last refresh. The share controller's
    state and the refresh counts are checkpointed with the reference."""
    a = config.algorithm
    share = torch.tensor(a.gardo_share, dtype=torch.float64)
    history = torch.full((gardo_math.WINDOW,), torch.nan, dtype=torch.float64)
    since, refreshes = torch.zeros(()), torch.zeros(())  # steps since the last refresh, refreshes so far

    def reshape(
        advantages: torch.Tensor,
        rewards: torch.Tensor,
        parts: dict[str, torch.Tensor],
        group: torch.Tensor,
        distance: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        weights = gardo_math.diversity_weights(distance, advantages, group)
        u = gardo_math.uncertainty(rewards, torch.stack([parts[name] for name in a.gardo_auxiliary])).cpu()
        level = gardo_math.nonnegative_mean(u)
        new_share, new_history = gardo_math.adapt_share(share, history, level, *a.gardo_share_range)
        share.copy_(new_share)
        history.copy_(new_history)
        gated = gardo_math.gate(u, share)
        above = (advantages >= 0).float()
        metrics = {"gardo/gated": gated.float().mean(), "gardo/share": share.float(),
                   "gardo/uncertainty": level.float(),
                   "gardo/diversity_weight": (weights * above).sum() / above.sum().clamp_min(1)}  # fmt: skip
        return advantages * weights, gardo_math.kl_weights(gated).to(advantages.device), metrics

    def refresh(step: int, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        since.add_(1)
        refreshed = float(dist.mean_across(metrics["kl"])) > a.gardo_kl_threshold or int(since) >= a.ref_update_every
        if refreshed:
            reference.refresh()
            since.zero_()
            refreshes.add_(1)
        return {"gardo/refreshed": torch.tensor(float(refreshed)), "gardo/refreshes": refreshes.clone()}

    state = {**reference.state, "gardo/share": share, "gardo/history": history, "gardo/since": since,
             "gardo/refreshes": refreshes}  # fmt: skip
    objective = policy_gradient(policy, config, reference, teacher, old).objective
    return Algorithm(objective, lambda traj, step: traj, refresh, state=state, reshape=reshape)


def dpo_objective(policy: DiffusionPolicy, config: Config, reference: Context) -> Objective:
    """Diffusion-DPO on pairs: flow-matching errors of policy and reference at a shared noise and sigma."""
    a = config.algorithm

    def errors(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor, cond: Any) -> torch.Tensor:
        v = policy.velocity(sde.add_noise(x0, noise, sigma), sigma, cond)
        return ((v.float() - sde.velocity_target(x0, noise)) ** 2).mean(dim=tuple(range(1, x0.dim())))

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        x0 = inputs["x0"].flatten(0, 1)  # (2P, ...): winner, loser, winner, ...
        noise = inputs["noise"].unsqueeze(1).expand(inputs["x0"].shape).flatten(0, 1)
        sigma = inputs["sigma"].repeat_interleave(2)
        cond = inputs["cond"].flatten(0, 1)
        e = errors(x0, noise, sigma, cond).view(-1, 2)
        with torch.no_grad(), reference():
            e_ref = errors(x0, noise, sigma, cond).view(-1, 2)
        loss, metrics = preference.dpo_loss(-e[:, 0] / 2, -e[:, 1] / 2, -e_ref[:, 0] / 2, -e_ref[:, 1] / 2,
                                            a.dpo_beta, a.dpo_loss, a.label_smoothing, a.dpo_positive)  # fmt: skip
        w = inputs["weight"]  # means over the kept pairs
        metrics = {name: value * w for name, value in metrics.items()}
        if a.dpo_min_gap > 0:
            metrics["dpo/kept"] = (w > 0).float()
        return loss * w, metrics, {"errors": e.detach(), "ref_errors": e_ref}

    return Objective(fn, resident=("x0", "noise", "sigma", "cond", "weight"))


def pair_batch(
    x0: torch.Tensor,
    cond: Any,
    scores: torch.Tensor,
    generator: torch.Generator,
    config: Config,
    train_sigmas: torch.Tensor,
) -> PairBatch:
    """Adjacent winner/loser rows (2P, ...) to a `PairBatch` with one noise and one sigma per pair, the sigma
    drawn from the model's training sigmas `train_sigmas` (T,) at a logit-normal position. A pair whose reward gap
    is below `algorithm.dpo_min_gap` gets weight 0, the kept ones P / kept, so that the loss is their mean (and 0,
    with no optimizer step, where none is kept)."""
    a, pairs = config.algorithm, len(x0) // 2
    noise = torch.randn((pairs, *x0.shape[1:]), generator=generator).to(x0.device)
    sigma = sde.logit_normal_sigmas(pairs, generator, train_sigmas, a.timestep_mean, a.timestep_std)
    scores = scores.view(pairs, 2)
    keep = (scores[:, 0] - scores[:, 1] >= a.dpo_min_gap).float() if a.dpo_min_gap > 0 else scores.new_ones(pairs)
    return PairBatch(x0=x0.unflatten(0, (pairs, 2)), noise=noise, sigma=sigma.to(x0.device),
                     cond=cond.reshape(pairs, 2), scores=scores, weight=keep * pairs / keep.sum().clamp(min=1),
                     batch_size=[pairs])  # fmt: skip


def dpo_accuracy(errors: torch.Tensor, ref_errors: torch.Tensor, beta: float) -> dict[str, torch.Tensor]:
    """Implicit reward accuracy and margin of pairs from (P, 2) flow-matching errors (winner first)."""
    z = (ref_errors[:, 0] - errors[:, 0] - ref_errors[:, 1] + errors[:, 1]) / 2
    return {"dpo/accuracy": (z > 0).float().mean(), "dpo/margin": (beta * z).mean()}


def online_dpo(
    policy: DiffusionPolicy, config: Config, reference: Context | None, teacher: Context | None, old: Context | None
) -> Algorithm:
    """Online Diffusion-DPO: per prompt, the best and the worst of its n samples form a pair; with
    `algorithm.ref_update_every`, the reference becomes the current policy every that many steps."""
    every = config.algorithm.ref_update_every

    def batch(traj: Trajectory, step: int) -> PairBatch:
        rows = preference.best_and_worst(traj.rewards.cpu(), traj.group.cpu()).to(traj.final.device)
        return pair_batch(traj.final[rows], traj.cond[rows], traj.rewards[rows], _generator(config, step, 3), config,
                          policy.train_sigmas())  # fmt: skip

    def refresh(step: int, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if step % every == 0:
            reference.refresh()
        return {}

    if not every:
        return Algorithm(dpo_objective(policy, config, reference), batch, replays_window=False)
    return Algorithm(dpo_objective(policy, config, reference), batch, refresh, replays_window=False,
                     state=reference.state)  # fmt: skip


ALGORITHMS: dict[str, Callable[..., Algorithm]] = {
    "flowgrpo": policy_gradient,
    "grpo_guard": policy_gradient,
    "dppo": policy_gradient,
    "distill": policy_gradient,
    "nft": diffusion_nft,
    "awm": awm,
    "dgpo": dgpo,
    "gardo": gardo,
    "tempflow": tempflow,
    "branchgrpo": branchgrpo,
    "online_dpo": online_dpo,
}
