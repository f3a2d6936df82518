"""Batch containers passed between rollout, rewards and the actor. Shapes on every field.

B = samples, W = SDE window steps. Indexing a container by samples (`traj[idx]`) slices every
field at once; `.to(device)` moves them all.
"""

import torch
from tensordict import TensorDict, tensorclass


@tensorclass
class Trajectory:
    """One diffusion rollout: the SDE-window part of each sample's denoising path."""

    latents: torch.Tensor  # (B, W+1, *latent) float32: x_k .. x_{k+W}
    log_probs: torch.Tensor  # (B, W) float32: rollout log-prob of each window transition
    means: torch.Tensor  # (B, W, *latent) float32: rollout transition means (Flow-DPPO's mu_old)
    sigmas: torch.Tensor  # (B, W+1) float32: sigma of each stored latent
    cond: TensorDict  # (B, ...): prompt conditions from `policy.encode_prompts`
    uncond: TensorDict | None  # (B, ...): negative conditions for CFG, None without CFG
    group: torch.Tensor  # (B,) int64: prompt group id; the samples of one prompt share it
    seeds: torch.Tensor  # (B,) int64: per-sample seed of noise and window
    rewards: torch.Tensor | None = None  # (B,) float32
    advantages: torch.Tensor | None = None  # (B,) float32
    old_log_probs: torch.Tensor | None = None  # (B, W) float32: recomputed before the update

    @property
    def window(self) -> int:
        return self.log_probs.shape[1]


@tensorclass
class PreferencePairs:
    """Preference pairs on adjacent rows: row 2i is pair i's winner, row 2i+1 its loser (same prompt).

    P = pairs. Written by `omnialign prepare offline-dpo`, read by `data.offline_dpo.PairLoader`;
    `algorithms.preference.split_pairs` splits any field into (winners, losers).
    """

    latents: torch.Tensor  # (2P, *latent) float32: the clean latent x_0 of each image, in the policy's layout
    cond: TensorDict  # (2P, ...): prompt conditions as `policy.encode_prompts` gives them (floats as float32)
    uncond: TensorDict | None  # (2P, ...): the negative prompt's conditions (CFG), None where not stored
    group: torch.Tensor  # (2P,) int64: prompt id (index in the prompt file); both rows of a pair share it
    scores: torch.Tensor  # (2P,) float32: reward of each image; a winner scores >= its loser
    seeds: torch.Tensor  # (2P,) int64: the seed each image was sampled from
