"""Branched rollouts (TempFlow-GRPO, BranchGRPO): many images per sample, sharing the sample's path up to where
they branch.

Every state being denoised sits at the same noise level at each step (a branch drawn at step k continues from
k + 1, as its trunk does; a tree's nodes all advance together), so one batched forward per step serves the trunks
and all their branches, or every node of the trees.
"""

from collections.abc import Callable

import torch
from tensordict import TensorDict
from tqdm import tqdm

from omnialign.batch import Branched, Trajectory
from omnialign.config import RolloutConfig, branch_steps, leaves_per_sample, tree_leaves, tree_widths
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import guided_velocity, per_sample_noise
from omnialign.engine.stage import to_device
from omnialign.models.base import DiffusionPolicy
from omnialign.rollout.diffusion import _conditions, _generators, rollout_velocity, step_guidance


def _velocity(
    policy: DiffusionPolicy,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: TensorDict,
    uncond: TensorDict | None,
    owner: torch.Tensor,
    config: RolloutConfig,
) -> torch.Tensor:
    """The guided velocity of states x (S, *latent) at sigma (S,), state i under its trunk owner[i]'s conditions, in
    forwards of rollout.micro_batch_size states."""
    parts, velocity = [], rollout_velocity(policy, config)
    for lo in range(0, len(x), config.micro_batch_size):
        sl = slice(lo, lo + config.micro_batch_size)
        index = owner[sl].to(cond.device)
        negative = None if uncond is None else uncond[index]
        parts.append(guided_velocity(velocity, x[sl], sigma[sl], cond[index], negative,
                                     step_guidance(policy, sigma[sl], config), config.cfg_rescale))  # fmt: skip
    return torch.cat(parts).float()


def _decode(policy: DiffusionPolicy, latents: torch.Tensor, config: RolloutConfig) -> torch.Tensor:
    """Images of the leaves' latents (L, *latent), decoded rollout.micro_batch_size at a time."""
    step = config.micro_batch_size
    return torch.cat([policy.decode(latents[i : i + step]) for i in range(0, len(latents), step)])


def _rows(
    stacked: dict[str, torch.Tensor],
    sigmas: torch.Tensor,
    final: torch.Tensor,
    owner: torch.Tensor,
    cond: TensorDict,
    uncond: TensorDict | None,
    group: torch.Tensor,
    seeds: torch.Tensor,
) -> Trajectory:
    """The trained transitions as one-step rows (R,): `stacked` x, x_next, mean (R, *latent) and log_prob (R,), their
    sigma pairs (R, 2), the final latent each leads to (R, *latent), and each row's sample (trunk or tree) `owner`
    (R,), an index into the chunk's cond, uncond, group and seeds."""
    return Trajectory(
        final=final,
        latents=torch.stack([stacked["x"], stacked["x_next"]], 1),
        log_probs=stacked["log_prob"][:, None],
        means=stacked["mean"][:, None],
        sigmas=sigmas,
        cond=cond[owner.to(cond.device)],
        uncond=None if uncond is None else uncond[owner.to(uncond.device)],
        group=group[owner],
        seeds=seeds[owner],
        batch_size=[len(owner)],
    )


@torch.no_grad()
def generate_tempflow(
    policy: DiffusionPolicy,
    prompts: list[str],
    group: torch.Tensor,
    seeds: torch.Tensor,
    config: RolloutConfig,
    device: torch.device,
    progress: bool = False,
    step: int = 0,
    seed: int = 0,
    on_chunk: Callable[[torch.Tensor, slice], None] = lambda images, rows: None,
    sources: list[list[torch.Tensor]] | None = None,
) -> tuple[Branched, torch.Tensor]:
    """TempFlow-GRPO's rollout: each sample is a trunk denoised by the ODE; at each branch step k, `rollout.branches`
    transitions of `rollout.kind` leave the trunk's state x_k (with the trunk's velocity), and each branch is
    finished by the ODE. Returns the Branched rollout and the leaves' images (B * leaves_per_sample, C, H, W), a
    trunk's leaves together, by branch step then branch; row r is leaf r's branch transition, its row group
    (trunk, step). Noise: the trunk's own generator (its seed), the trunk's noise first, then at each branch step
    one noise per branch. `on_chunk(images, leaves)` runs as each chunk of rollout.micro_batch_size trunks is
    decoded; arguments otherwise as `rollout.diffusion.generate`."""
    sigmas = policy.schedule(config.steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    steps, per = branch_steps(config), leaves_per_sample(config)
    on_device = to_device(sigmas, device)
    step_sigmas = to_device(torch.stack([sigmas[steps], sigmas[[k + 1 for k in steps]]], 1), device)  # (S, 2)
    parts, images = [], []
    chunks = range(0, len(prompts), config.micro_batch_size)
    for lo in tqdm(chunks, desc="rollout", leave=False, disable=not progress, dynamic_ncols=True):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = _conditions(policy, prompts[sl], sources and sources[sl], config)
        generators = _generators(seeds[sl])
        m = len(generators)
        trunk = per_sample_noise(generators, shape, device)
        tails, owner = trunk[:0], torch.zeros(0, dtype=torch.long, device=device)  # branches, each one's trunk
        rows: dict[str, list[torch.Tensor]] = {"x": [], "x_next": [], "mean": [], "log_prob": [], "std": []}
        trunk_ids = torch.arange(m, device=device)
        for k in range(len(sigmas) - 1):
            keep_trunk = k <= max(steps)
            x = torch.cat([trunk, tails]) if keep_trunk else tails
            who = torch.cat([trunk_ids, owner]) if keep_trunk else owner
            sigma, sigma_next = on_device[k].expand(len(x)), on_device[k + 1].expand(len(x))
            v = _velocity(policy, x, sigma, cond, uncond, who, config)
            x = sde.transition("ode", v, x, sigma, sigma_next, 0.0).sample
            if not keep_trunk:
                tails = x
                continue
            if k in steps:
                v_trunk, at, to = v[:m], sigma[:m], sigma_next[:m]
                for _ in range(config.branches):
                    noise = per_sample_noise(generators, shape, device)
                    tr = sde.transition(config.kind, v_trunk, trunk, at, to, config.eta, noise=noise)
                    for key, value in zip(rows, (trunk, tr.sample, tr.mean, tr.log_prob, tr.std)):
                        rows[key].append(value)
                    x = torch.cat([x, tr.sample])
                    who = torch.cat([who, trunk_ids])
            trunk, tails, owner = x[:m], x[m:], who[m:]
        # branches were appended by (step, branch, trunk); a trunk's leaves and rows go together, by step and branch
        order = torch.arange(m * per, device=device).reshape(per, m).T.flatten()
        final = tails[order]
        decoded = _decode(policy, final, config)
        images.append(decoded)
        on_chunk(decoded, slice(lo * per, lo * per + len(decoded)))
        stacked = {key: torch.stack(value).flatten(0, 1)[order] for key, value in rows.items()}
        trunk_of = torch.arange(m, device=device).repeat_interleave(per)
        step_of = torch.arange(len(steps), device=device).repeat_interleave(config.branches).repeat(m)
        parts.append(
            (
                _rows(
                    stacked,
                    step_sigmas[step_of],
                    final,
                    trunk_of,
                    cond,
                    uncond,
                    to_device(group[sl], device),
                    to_device(seeds[sl], device),
                ),  # fmt: skip
                (lo + trunk_of) * len(steps) + step_of,
                stacked["std"],
            )
        )
    rows = torch.cat([p[0] for p in parts])
    first = torch.arange(len(rows), device=device)
    tree = Branched(rows=rows, leaf_range=torch.stack([first, first + 1], 1),
                    row_group=torch.cat([p[1] for p in parts]), row_std=torch.cat([p[2] for p in parts]))  # fmt: skip
    return tree, torch.cat(images)


@torch.no_grad()
def generate_tree(
    policy: DiffusionPolicy,
    prompts: list[str],
    group: torch.Tensor,
    seeds: torch.Tensor,
    config: RolloutConfig,
    device: torch.device,
    progress: bool = False,
    step: int = 0,
    seed: int = 0,
    on_chunk: Callable[[torch.Tensor, slice], None] = lambda images, rows: None,
    sources: list[list[torch.Tensor]] | None = None,
) -> tuple[Branched, torch.Tensor]:
    """BranchGRPO's rollout: each sample is the root of a tree; at every step each node takes a transition of
    `rollout.kind`, and at each of rollout.split_steps it has rollout.split_factor children instead of one (their
    noise rollout.split_noise_scale times wider, their log-prob scored with the transition's std), so a tree has
    `tree_leaves` leaves, decoded from the last latents. Every edge is a row. Returns the Branched rollout and the
    leaves' images (B * tree_leaves, C, H, W): a tree's leaves together in depth-first order, so that the leaves
    below a node are a contiguous range (`leaf_range`); a tree's rows together, by step then node; row group
    (tree, step), that is (tree, depth). Noise: the tree's own generator (its seed), the root's first, then at each
    step one for each new node, in order. All the nodes of a step go through one batched forward. `on_chunk` and the
    arguments as `generate_tempflow`, with trees for trunks."""
    sigmas = policy.schedule(config.steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    per, splits, widths = tree_leaves(config), set(config.split_steps), tree_widths(config)
    step_sigmas = to_device(torch.stack([sigmas[:-1], sigmas[1:]], 1), device)  # (S, 2)
    width_of = to_device(torch.tensor(widths), device)  # (S,): the nodes at each step
    step_of = torch.arange(config.steps, device=device).repeat_interleave(width_of)  # (E,)
    below = per // width_of[step_of]  # (E,): the leaves below each row's child
    first = torch.cat([torch.arange(w, device=device) for w in widths]) * below  # (E,): the first of them
    parts, images = [], []
    chunks = range(0, len(prompts), config.micro_batch_size)
    for lo in tqdm(chunks, desc="rollout", leave=False, disable=not progress, dynamic_ncols=True):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = _conditions(policy, prompts[sl], sources and sources[sl], config)
        generators = _generators(seeds[sl])
        m, width = len(generators), 1
        x = per_sample_noise(generators, shape, device)  # (m * width, *latent): the nodes, by tree, depth-first
        rows: dict[str, list[torch.Tensor]] = {"x": [], "x_next": [], "mean": [], "log_prob": [], "std": []}
        for k in range(config.steps):
            owner = torch.arange(m, device=device).repeat_interleave(width)
            v = _velocity(policy, x, step_sigmas[k, 0].expand(len(x)), cond, uncond, owner, config)
            f = config.split_factor if k in splits else 1
            x, v, width = x.repeat_interleave(f, 0), v.repeat_interleave(f, 0), width * f
            noise = torch.stack([per_sample_noise(generators, shape, device) for _ in range(width)], 1).flatten(0, 1)
            at, to = (step_sigmas[k, i].expand(len(x)) for i in (0, 1))
            tr = sde.transition(config.kind, v, x, at, to, config.eta,
                                noise=noise * (config.split_noise_scale if f > 1 else 1.0))  # fmt: skip
            for key, value in zip(rows, (x, tr.sample, tr.mean, tr.log_prob, tr.std)):
                rows[key].append(value.unflatten(0, (m, width)))
            x = tr.sample
        decoded = _decode(policy, x, config)
        images.append(decoded)
        on_chunk(decoded, slice(lo * per, lo * per + len(decoded)))
        stacked = {key: torch.cat(value, 1).flatten(0, 1) for key, value in rows.items()}  # (m * E, ...) by tree
        tree_of = torch.arange(m, device=device).repeat_interleave(len(step_of))
        leaf = tree_of * per + first.repeat(m)  # the first leaf below each row, in the chunk
        parts.append(
            (
                _rows(
                    stacked,
                    step_sigmas[step_of.repeat(m)],
                    x[leaf],
                    tree_of,
                    cond,
                    uncond,
                    to_device(group[sl], device),
                    to_device(seeds[sl], device),
                ),  # fmt: skip
                torch.stack([leaf, leaf + below.repeat(m)], 1) + lo * per,
                stacked["std"],
            )
        )
    rows = torch.cat([p[0] for p in parts])
    step_of = step_of.repeat(len(prompts))
    tree_of = torch.arange(len(prompts), device=device).repeat_interleave(len(below))
    tree = Branched(rows=rows, leaf_range=torch.cat([p[1] for p in parts]),
                    row_group=tree_of * config.steps + step_of, row_std=torch.cat([p[2] for p in parts]),
                    row_step=step_of)  # fmt: skip
    return tree, torch.cat(images)
