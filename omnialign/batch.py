"""Batch containers passed between rollout, rewards and the actor. Shapes on every field.

B = samples, W = SDE window steps. Indexing a container by samples (`traj[idx]`) slices every
field at once; `.to(device)` moves them all.
"""

from dataclasses import dataclass

import torch
from tensordict import TensorDict, tensorclass


@tensorclass
class Trajectory:
    """One diffusion rollout: the SDE-window part of each sample's denoising path."""

    final: torch.Tensor  # (B, *latent) float32: the clean sample x_0 at the end of the path
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
    old_means: torch.Tensor | None = None  # (B, W, *latent) float32: recomputed with old_log_probs
    kl_weights: torch.Tensor | None = None  # (B,) float32, GARDO: each sample's weight of the reference KL
    loss_weights: torch.Tensor | None = None  # (B,) float32, TempFlow-GRPO: each row's weight of the policy loss

    @property
    def window(self) -> int:
        return self.log_probs.shape[1]


@dataclass
class Branched:
    """A branched rollout (TempFlow-GRPO, BranchGRPO): the transitions it trains (rows, R) and the images they lead
    to (leaves, L), which the rewards score. Rows and leaves of one trunk or tree are contiguous, in the same
    order."""

    rows: Trajectory  # (R,) one transition each: latents (R, 2, *latent), log_probs (R, 1), means, sigmas (R, 2)
    leaf_range: torch.Tensor  # (R, 2) int64: the leaves [first, last) a row leads to, local indices
    row_group: torch.Tensor  # (R,) int64: rows whose advantages are normalised together (TempFlow: trunk and step)
    row_std: torch.Tensor  # (R,) float32: the std of each row's transition
    row_step: torch.Tensor | None = None  # (R,) int64, BranchGRPO: each row's step k (its child's depth is k + 1)
    rewards: torch.Tensor | None = None  # (L,) float32: the leaves' rewards
    advantages: torch.Tensor | None = None  # (L,) float32: the leaves' group-relative advantages (not trained on)


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


@tensorclass
class CleanBatch:
    """Clean samples to train at chosen noise levels (DiffusionNFT, AWM, DGPO). T = training timesteps per sample."""

    x0: torch.Tensor  # (B, *latent) float32: clean latents
    noise: torch.Tensor  # NFT (B, *latent): shared by a sample's timesteps; AWM, DGPO (B, T, *latent): one per timestep
    sigmas: torch.Tensor  # (B, T) float32: training noise levels
    cond: TensorDict  # (B, ...): prompt conditions
    advantages: torch.Tensor  # (B,) float32
    old_log_probs: torch.Tensor | None = None  # (B, T) float32, AWM, DGPO: the matching log-probs before the update
    weights: torch.Tensor | None = None  # (B, T) float32, DGPO: the group weight of each sample's group
    ref_velocities: torch.Tensor | None = None  # (B, T, *latent) float32, DGPO with a KL: the reference's velocity


@tensorclass
class PairBatch:
    """Winner/loser pairs to train Diffusion-DPO on (online, or offline from `PreferencePairs`): the
    pair dim keeps a pair together through shuffling and micro-batching; index 0 is the winner."""

    x0: torch.Tensor  # (P, 2, *latent) float32: clean latents of winner and loser
    noise: torch.Tensor  # (P, *latent) float32: noise shared within a pair
    sigma: torch.Tensor  # (P,) float32: noise level shared within a pair (logit-normal)
    cond: TensorDict  # (P, 2, ...): prompt conditions of winner and loser
    scores: torch.Tensor  # (P, 2) float32: rewards of winner and loser
    weight: torch.Tensor  # (P,) float32: the pair's loss weight, 0 for a dropped pair, mean 1 over the batch


@tensorclass
class TokenBatch:
    """Prompts and responses of a language model. P = prompt positions (left-padded, so every prompt
    ends at P), R = response positions (right-padded). Log-prob fields score response token r given
    everything before it. Preference pairs (DPO) are adjacent rows, chosen then rejected, sharing a group.
    """

    prompt_ids: torch.Tensor  # (B, P) int64: chat-formatted prompt tokens, media placeholders expanded
    prompt_mask: torch.Tensor  # (B, P) int64: 1 on prompt tokens, 0 on left padding
    response_ids: torch.Tensor  # (B, R) int64: response tokens, right-padded
    response_mask: torch.Tensor  # (B, R) float32: 1 on response tokens (through the stop token), 0 after
    group: torch.Tensor  # (B,) int64: prompt group (RL: the n samples of one prompt) or pair id (DPO)
    media: list  # (B,) dicts of the adapter's encoded media tensors (pixel_values, ...); {} for a text prompt
    log_probs: torch.Tensor | None = None  # (B, R) float32: rollout log-probs of the response tokens
    rewards: torch.Tensor | None = None  # (B,) float32
    advantages: torch.Tensor | None = None  # (B,) float32
    old_log_probs: torch.Tensor | None = None  # (B, R) float32: recomputed before the update
    ref_log_probs: torch.Tensor | None = None  # (B, R) float32: the reference policy's (KL, DPO)
    teacher_log_probs: torch.Tensor | None = None  # (B, R) float32: a frozen teacher's (distillation)
