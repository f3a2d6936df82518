"""Porting checks: the same tensors through our functions and through the reference implementations' formulas,
re-derived here in the references' own terms (their variable names, shapes and order of operations; not their
code): flow_grpo (SDE and CPS steps, reference KL, Diffusion-DPO), DanceGRPO (its SDE step), GRPO-Guard and
Flow-DPPO (per sample, as Flow-Factory and the papers state them), DiffusionNFT (train_nft_sd3), DGPO
(train_sd3_dgpo), GARDO (train_sd3_grpo_gardo, its stat tracker; flow_grpo's train_sd3_gardo is the same), verl
(DAPO's clipped loss with dual clip, GSPO) and on-policy distillation (per-token reverse-KL reward,
importance-sampled).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diffusers import FlowMatchEulerDiscreteScheduler

from omnialign.algorithms import dgpo, distill, gardo, nft, preference
from omnialign.algorithms.advantages import group_relative
from omnialign.algorithms.awm import matching_log_prob
from omnialign.algorithms.policy_gradient import (
    aggregate,
    dppo,
    dual_clip,
    gaussian_mean_kl,
    grpo_guard,
    gspo,
    ppo_clip,
)
from omnialign.diffusion import sde

SIGMAS = sde.sigma_schedule(10, shift=3.0)  # a shifted schedule: steps of unequal length


def flow_inputs(seed: int = 0, b: int = 4, shape=(2, 4, 4)):
    """x, v (B, *shape) and a per-sample step k of the 10-step schedule, first step included."""
    g = torch.Generator().manual_seed(seed)
    k = torch.tensor([0, 3, 6, 8])[:b]
    return torch.randn(b, *shape, generator=g), torch.randn(b, *shape, generator=g), k, g


def per_sample(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1, 1, 1, 1)


def flow_grpo_sde_step(v, x, k, eta, prev_sample=None, noise=None):
    """flow_grpo's sde_step_with_logprob: (prev_sample, log_prob, prev_sample_mean, std_dev_t)."""
    sigma, sigma_prev = per_sample(SIGMAS[k]), per_sample(SIGMAS[k + 1])
    sigma_max = SIGMAS[1].item()  # the denominator's stand-in at sigma = 1
    dt = sigma_prev - sigma
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * eta
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    if prev_sample is None:
        prev_sample = mean + std_dev_t * torch.sqrt(-dt) * noise
    log_prob = (
        -((prev_sample - mean) ** 2) / (2 * (std_dev_t * torch.sqrt(-dt)) ** 2)
        - torch.log(std_dev_t * torch.sqrt(-dt))
        - torch.log(torch.sqrt(torch.as_tensor(2 * math.pi)))
    )
    return prev_sample, log_prob.mean(dim=(1, 2, 3)), mean, std_dev_t


def test_sde_step_matches_flow_grpo():
    x, v, k, g = flow_inputs()
    noise = torch.randn(x.shape, generator=g)
    prev, log_prob, mean, std_dev_t = flow_grpo_sde_step(v, x, k, 0.7, noise=noise)
    ours = sde.transition("sde", v, x, SIGMAS[k], SIGMAS[k + 1], 0.7, noise=noise)
    torch.testing.assert_close(ours.sample, prev)
    torch.testing.assert_close(ours.mean, mean)
    torch.testing.assert_close(ours.log_prob, log_prob)
    sqrt_neg_dt = (SIGMAS[k] - SIGMAS[k + 1]).sqrt()
    torch.testing.assert_close(ours.std, std_dev_t.flatten() * sqrt_neg_dt)
    # replaying a stored sample
    replay = sde.transition("sde", v + 0.1, x, SIGMAS[k], SIGMAS[k + 1], 0.7, sample=prev)
    torch.testing.assert_close(replay.log_prob, flow_grpo_sde_step(v + 0.1, x, k, 0.7, prev_sample=prev)[1])


def test_cps_step_matches_flow_grpo():
    x, v, k, g = flow_inputs(1)
    noise, eta = torch.randn(x.shape, generator=g), 0.8
    sigma, sigma_prev = per_sample(SIGMAS[k]), per_sample(SIGMAS[k + 1])
    std_dev_t = sigma_prev * math.sin(eta * math.pi / 2)
    pred_original_sample = x - sigma * v
    noise_estimate = x + v * (1 - sigma)
    mean = pred_original_sample * (1 - sigma_prev) + noise_estimate * torch.sqrt(sigma_prev**2 - std_dev_t**2)
    prev = mean + std_dev_t * noise
    log_prob = (-((prev - mean) ** 2)).mean(dim=(1, 2, 3))
    ours = sde.transition("cps", v, x, SIGMAS[k], SIGMAS[k + 1], eta, noise=noise)
    torch.testing.assert_close(ours.sample, prev)
    torch.testing.assert_close(ours.mean, mean)
    torch.testing.assert_close(ours.log_prob, log_prob)


def test_dance_step_matches_dancegrpo():
    """DanceGRPO's flux_step with its SDE solver (grpo=True): score-corrected mean, std eta*sqrt(sigma - sigma')."""
    x, v, k, g = flow_inputs(2)
    noise, eta = torch.randn(x.shape, generator=g), 0.3
    rows = []
    for i in range(len(k)):  # flux_step takes one scalar index for the batch
        sigma, sigma_next = SIGMAS[k[i]].item(), SIGMAS[k[i] + 1].item()
        latents, model_output = x[i : i + 1], v[i : i + 1]
        dsigma = sigma_next - sigma
        prev_sample_mean = latents + dsigma * model_output
        pred_original_sample = latents - sigma * model_output
        std_dev_t = eta * math.sqrt(sigma - sigma_next)
        score_estimate = -(latents - pred_original_sample * (1 - sigma)) / sigma**2
        prev_sample_mean = prev_sample_mean + (-0.5 * eta**2 * score_estimate) * dsigma
        prev_sample = prev_sample_mean + noise[i : i + 1] * std_dev_t
        log_prob = (
            -((prev_sample - prev_sample_mean) ** 2) / (2 * std_dev_t**2)
            - math.log(std_dev_t)
            - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
        )
        rows.append((prev_sample, prev_sample_mean, log_prob.mean(dim=(1, 2, 3))))
    ours = sde.transition("dance", v, x, SIGMAS[k], SIGMAS[k + 1], eta, noise=noise)
    torch.testing.assert_close(ours.sample, torch.cat([r[0] for r in rows]))
    torch.testing.assert_close(ours.mean, torch.cat([r[1] for r in rows]))
    torch.testing.assert_close(ours.log_prob, torch.cat([r[2] for r in rows]))


def test_reference_kl_is_flow_grpos_divided_by_the_step():
    """flow_grpo's kl_loss divides by 2*std_dev_t^2 (no dt); ours by 2*std^2 = 2*std_dev_t^2*|dt|: ours = theirs/|dt|,
    so a flow_grpo kl_coef ports as kl_coef * |dt| (docs/algorithms.md)."""
    x, v, k, g = flow_inputs(3)
    v_ref = v + 0.2 * torch.randn(v.shape, generator=g)
    _, _, mean, std_dev_t = flow_grpo_sde_step(v, x, k, 1.0, noise=torch.zeros_like(x))
    _, _, mean_ref, _ = flow_grpo_sde_step(v_ref, x, k, 1.0, noise=torch.zeros_like(x))
    theirs = ((mean - mean_ref) ** 2).mean(dim=(1, 2, 3), keepdim=True) / (2 * std_dev_t**2)
    ours_tr = sde.transition("sde", v, x, SIGMAS[k], SIGMAS[k + 1], 1.0)
    ours_ref = sde.transition("sde", v_ref, x, SIGMAS[k], SIGMAS[k + 1], 1.0)
    abs_dt = SIGMAS[k] - SIGMAS[k + 1]
    kl = gaussian_mean_kl(ours_tr.mean, ours_ref.mean, ours_tr.std)
    torch.testing.assert_close(kl * abs_dt, theirs.flatten())


def test_grpo_guard_matches_its_per_sample_formula():
    """GRPO-Guard as Flow-Factory writes it per sample, scale = sqrt(-dt) * std_dev_t:
    log rho = (logp - logp_old) * scale + mse(mu, mu_old) / (2 * scale); the paper's step reweighting then
    divides each clipped loss by sqrt(-dt)^2."""
    x, v_old, k, g = flow_inputs(4)
    v = v_old + 0.3 * torch.randn(v_old.shape, generator=g)
    prev, old_log_prob, old_mean, _ = flow_grpo_sde_step(v_old, x, k, 1.0, noise=torch.randn(x.shape, generator=g))
    _, log_prob, mean, std_dev_t = flow_grpo_sde_step(v, x, k, 1.0, prev_sample=prev)
    sqrt_dt = (SIGMAS[k] - SIGMAS[k + 1]).sqrt()
    scale = sqrt_dt * std_dev_t.flatten()
    mse = ((mean - old_mean) ** 2).mean(dim=(1, 2, 3))
    ratio = torch.exp((log_prob - old_log_prob) * scale + mse / (2 * scale))
    adv, clip = torch.tensor([1.0, -2.0, 0.5, -0.5]), 2e-3
    theirs = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)) / sqrt_dt**2
    new = sde.transition("sde", v, x, SIGMAS[k], SIGMAS[k + 1], 1.0, sample=prev)
    old = sde.transition("sde", v_old, x, SIGMAS[k], SIGMAS[k + 1], 1.0, sample=prev)
    loss, m = grpo_guard(new.log_prob, old.log_prob, adv, new.mean, old.mean, new.std, sqrt_dt, clip, clip)
    torch.testing.assert_close(m["ratio"], ratio)
    torch.testing.assert_close(loss, theirs)
    assert ((ratio - 1).abs() > clip).any() and ((ratio - 1).abs() < clip).any()  # both branches exercised


def test_dppo_matches_its_trust_region_mask():
    """Flow-DPPO: x-space KL(current || old) with sigma_t = std_dev_t * sqrt(-dt); a term is dropped when its KL
    exceeds the threshold and it widens the gap (ratio > 1 with A > 0, ratio < 1 with A < 0); no ratio clip."""
    x, v_old, k, g = flow_inputs(5)
    v = v_old + torch.tensor([0.02, 2.0, 2.0, 0.02]).view(-1, 1, 1, 1) * torch.randn(v_old.shape, generator=g)
    prev, old_log_prob, old_mean, _ = flow_grpo_sde_step(v_old, x, k, 1.0, noise=torch.randn(x.shape, generator=g))
    _, log_prob, mean, std_dev_t = flow_grpo_sde_step(v, x, k, 1.0, prev_sample=prev)
    sigma_t = std_dev_t.flatten() * (SIGMAS[k] - SIGMAS[k + 1]).sqrt()
    kl = ((mean - old_mean) ** 2).mean(dim=(1, 2, 3)) / (2 * sigma_t**2)
    ratio = torch.exp(log_prob - old_log_prob)
    adv, tau = torch.where(ratio > 1, 1.0, -1.0) * torch.tensor([1.0, 1.0, -1.0, 1.0]), 1e-3
    widening = ((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0))
    keep = ~((kl > tau) & widening)
    theirs = -adv * ratio * keep
    new = sde.transition("sde", v, x, SIGMAS[k], SIGMAS[k + 1], 1.0, sample=prev)
    old = sde.transition("sde", v_old, x, SIGMAS[k], SIGMAS[k + 1], 1.0, sample=prev)
    loss, m = dppo(new.log_prob, old.log_prob, adv, new.mean, old.mean, new.std, tau)
    torch.testing.assert_close(m["divergence"], kl)
    torch.testing.assert_close(loss, theirs)
    assert keep.tolist() == [True, False, True, True]  # far and widening: dropped; far but narrowing: kept


def test_nft_matches_diffusionnft():
    """train_nft_sd3's loss per sample: r from clipped advantages, v+ / v- around the old adapter's prediction,
    float64 adaptive weights, both terms / beta, times adv_clip_max; plus the KL weight times mean((v - v_ref)^2)."""
    g = torch.Generator().manual_seed(6)
    x0, noise = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    t = torch.tensor([0.9, 0.5, 0.2])
    forward_prediction = torch.randn(3, 2, 4, 4, generator=g)
    old_prediction = forward_prediction + 0.1 * torch.randn(3, 2, 4, 4, generator=g)
    ref_forward_prediction = forward_prediction + 0.2 * torch.randn(3, 2, 4, 4, generator=g)
    advantages, adv_clip_max, beta, kl_beta = torch.tensor([7.0, -1.0, 0.3]), 5.0, 0.1, 1e-4
    t_expanded = t.view(-1, 1, 1, 1)
    xt = (1 - t_expanded) * x0 + t_expanded * noise
    r = torch.clamp(torch.clamp(advantages, -adv_clip_max, adv_clip_max) / adv_clip_max / 2.0 + 0.5, 0, 1)
    positive_prediction = beta * forward_prediction + (1 - beta) * old_prediction
    implicit_negative_prediction = (1.0 + beta) * old_prediction - beta * forward_prediction
    x0_prediction = xt - t_expanded * positive_prediction
    weight_factor = (x0_prediction.double() - x0.double()).abs().mean(dim=(1, 2, 3), keepdim=True).clip(min=1e-5)
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=(1, 2, 3))
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction
    negative_weight_factor = (
        (negative_x0_prediction.double() - x0.double()).abs().mean(dim=(1, 2, 3), keepdim=True).clip(min=1e-5)
    )
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(dim=(1, 2, 3))
    policy_loss = (r * positive_loss / beta + (1.0 - r) * negative_loss / beta) * adv_clip_max
    theirs = policy_loss + kl_beta * ((forward_prediction - ref_forward_prediction) ** 2).mean(dim=(1, 2, 3))
    ours, _ = nft.nft_loss(x0, sde.add_noise(x0, noise, t), t, forward_prediction, old_prediction,
                           nft.optimality(advantages, adv_clip_max), beta, adv_clip_max, ref_forward_prediction,
                           kl_beta)  # fmt: skip
    torch.testing.assert_close(ours, theirs.float())


def test_nft_old_adapter_decay_matches_diffusionnft():
    """return_decay(step, decay_type=2): flat 75, uprate 0.0075, uphold 0.999, in optimizer steps."""
    for step in (0, 74, 75, 76, 100, 207, 208, 10_000):
        theirs = 0.0 if step < 75 else min((step - 75) * 0.0075, 0.999)
        assert nft.old_decay(step, "delayed_linear") == pytest.approx(theirs)
        assert nft.old_decay(step, "copy") == 0.0  # decay_type 0


def test_diffusion_dpo_matches_flow_grpo():
    """flow_grpo's train_sd3_dpo: u from a logit-normal (mean 0, std 1) indexes the scheduler's training timesteps
    at int(u * 1000); one noise per pair; MSE to noise - x0 for learner and reference on winner and loser;
    loss = -logsigmoid(-beta/2 * ((w - ref_w) - (l - ref_l)))."""
    pairs, beta = 6, 100.0
    noise_scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)  # as loaded from an SD3 pipeline
    g = torch.Generator().manual_seed(7)
    u = torch.sigmoid(torch.randn(pairs, generator=g) * 1.0 + 0.0)
    indices = (u * noise_scheduler.config.num_train_timesteps).long()
    sigmas = noise_scheduler.sigmas[indices]
    ours_sigmas = sde.logit_normal_sigmas(pairs, torch.Generator().manual_seed(7), sde.train_sigmas(3.0))
    torch.testing.assert_close(ours_sigmas, sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(noise_scheduler.timesteps[indices], sigmas * 1000)  # what the transformer receives

    x0 = torch.randn(2 * pairs, 2, 4, 4, generator=g)  # winners then losers, as flow_grpo concatenates them
    noise = torch.randn(pairs, 2, 4, 4, generator=g).repeat(2, 1, 1, 1)
    s = sigmas.repeat(2).view(-1, 1, 1, 1)
    noisy = (1.0 - s) * x0 + s * noise
    target = noise - x0
    model_pred, model_pred_ref = target + 0.3 * torch.randn_like(x0), target + 0.3 * torch.randn_like(x0)
    theta_mse = ((model_pred - target) ** 2).reshape(2 * pairs, -1).mean(dim=1)
    ref_mse = ((model_pred_ref - target) ** 2).reshape(2 * pairs, -1).mean(dim=1)
    w_diff = theta_mse[:pairs] - ref_mse[:pairs]
    l_diff = theta_mse[pairs:] - ref_mse[pairs:]
    inside_term = -0.5 * beta * (w_diff - l_diff)
    theirs = -F.logsigmoid(inside_term)

    torch.testing.assert_close(sde.add_noise(x0, noise, sigmas.repeat(2)), noisy)
    torch.testing.assert_close(sde.velocity_target(x0, noise), target)
    e = ((model_pred - sde.velocity_target(x0, noise)) ** 2).mean(dim=(1, 2, 3))
    e_ref = ((model_pred_ref - sde.velocity_target(x0, noise)) ** 2).mean(dim=(1, 2, 3))
    loss, m = preference.dpo_loss(-e[:pairs] / 2, -e[pairs:] / 2, -e_ref[:pairs] / 2, -e_ref[pairs:] / 2, beta)
    torch.testing.assert_close(loss, theirs)
    torch.testing.assert_close(m["dpo/accuracy"], (inside_term > 0).float())


def token_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    old_log_prob = -torch.rand(3, 6, generator=g) * 3
    log_prob = old_log_prob + 0.4 * torch.randn(3, 6, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    return old_log_prob, log_prob, mask


def test_dgpo_matches_dgpo_train_sd3():
    """Luo-Yihong/DGPO train_sd3_dgpo.py, one training timestep of a micro-batch of whole groups, in its terms
    (flow-matching errors): the clip mask from exp(-dsm + old_dsm) per advantage sign, dsm's gradient stopped where
    clipped; per sample A * beta_dpo * (dsm - ref_dsm) / group_size (dsm detached), summed over the group; the
    weight sigmoid(sum); loss mean(w * A * dsm). Ours gives the same loss and gradient (groups of 3 with ids out of
    order, weights far from 1/2, some samples clipped)."""
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(6, 2, 4, 4, generator=g), torch.randn(6, 2, 4, 4, generator=g)
    sigma, target_v = torch.full((6,), 0.7), noise - x0
    ref_v = target_v + torch.randn(6, 2, 4, 4, generator=g)
    old_v = ref_v + 0.3 * torch.randn(6, 2, 4, 4, generator=g)
    model_v = old_v + 0.05 * torch.randn(6, 2, 4, 4, generator=g)
    advantages, prompt_ids = torch.tensor([1.2, -0.4, -0.8, 0.9, 0.1, -1.0]), torch.tensor([5, 5, 5, 2, 2, 2])
    beta_dpo, clip_range, group_size = 50.0, 0.02, 3

    def reference(model_v):
        dsm_loss = (target_v - model_v).square().reshape(6, -1).mean(dim=1)
        old_dsm_loss = (target_v - old_v).square().reshape(6, -1).mean(dim=1)
        ratio = torch.exp(-dsm_loss + old_dsm_loss)
        should_clip = torch.where(advantages > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)
        dsm_loss = torch.where(should_clip, dsm_loss.detach(), dsm_loss)
        ref_dsm_loss = (target_v - ref_v).square().reshape(6, -1).mean(dim=1)
        per_sample_term = advantages * beta_dpo * (dsm_loss.detach() - ref_dsm_loss) / group_size
        _, inverse_indices = torch.unique(prompt_ids, return_inverse=True)
        group_sums = torch.zeros(2).scatter_add_(0, inverse_indices, per_sample_term)
        local_weights = torch.sigmoid(group_sums)[inverse_indices]
        return (local_weights.detach() * advantages * dsm_loss).mean(), should_clip

    v1, v2 = (model_v.clone().requires_grad_(True) for _ in range(2))
    expected, should_clip = reference(v1)
    lp = matching_log_prob(v2, x0, noise, sigma, "uniform")
    ref_lp, old_lp = (matching_log_prob(v, x0, noise, sigma, "uniform") for v in (ref_v, old_v))
    weight = dgpo.group_weights(lp.detach()[:, None], ref_lp[:, None], advantages, prompt_ids, beta_dpo)[0][:, 0]
    loss, metrics = dgpo.dgpo_loss(lp, old_lp, advantages, weight, clip_range, clip_range)
    assert 0 < should_clip.sum() < 6 and (weight - 0.5).abs().min() > 0.1
    torch.testing.assert_close(metrics["clip_frac"], should_clip.float())
    torch.testing.assert_close(loss.mean(), expected)
    expected.backward()
    loss.mean().backward()
    torch.testing.assert_close(v2.grad, v1.grad)


class RiskCompensator:
    """GARDO's controller of the share of samples whose KL counts, in its terms."""

    def __init__(self, base=0.1, beta=0.1):
        self.risk_buffer, self.base, self.alpha, self.beta, self.beta_min, self.beta_max = (
            [],
            base,
            0.1,
            beta,
            0.02,
            0.2,
        )

    def update(self, pad_scores):
        if len(self.risk_buffer) == 0:
            self.beta = self.base
        elif np.mean(pad_scores) > max(self.risk_buffer):
            self.beta = self.beta * (1 + self.alpha)
        elif np.mean(pad_scores) < min(self.risk_buffer):
            self.beta = self.beta * (1 - self.alpha)
        self.beta = np.clip(self.beta, self.beta_min, self.beta_max)
        self.risk_buffer.append(np.mean(pad_scores))
        if len(self.risk_buffer) > 20:
            self.risk_buffer = self.risk_buffer[-20:]


def gardo_reference_epoch(prompts, rewards, feature_embs, dynamic_controller, num_train_timesteps=3):
    """One epoch of train_sd3_grpo_gardo.py before training: the stat tracker's 'gardo' advantages (diversity from
    the nearest other sample of the prompt's group, no std) and the rank-based uncertainty mask ('reward_std')."""
    avg = np.repeat(rewards["ocr"][:, None], num_train_timesteps, axis=1)
    dists = feature_embs / np.linalg.norm(feature_embs, ord=2, axis=1, keepdims=True)
    advantages = np.empty_like(avg) * 0.0
    for prompt in np.unique(prompts):
        prompt_rewards = avg[prompts == prompt]
        mean = np.mean(prompt_rewards, axis=0, keepdims=True)
        prompt_dists = dists[prompts == prompt]
        similarity_matrix = np.dot(prompt_dists, prompt_dists.T).clip(-1, 1)
        distance_matrix = 1 - similarity_matrix
        avg_distances = np.zeros(len(distance_matrix))
        for i in range(len(distance_matrix)):
            mask = np.ones(len(distance_matrix), dtype=bool)
            mask[i] = False
            avg_distances[i] = np.min(distance_matrix[i, mask])
        prompt_dists = np.repeat(avg_distances[:, np.newaxis], prompt_rewards.shape[-1], axis=1)
        prompt_dists = np.where(
            (prompt_rewards - mean) < 0, np.ones_like(prompt_dists), prompt_dists / np.mean(prompt_dists)
        )
        advantages[prompts == prompt] = (prompt_rewards - mean) * prompt_dists
    reward_std = []
    for item in ["aesthetic", "imagereward", "ocr"]:
        _, indices = torch.sort(torch.tensor(rewards[item]), descending=True)
        ranks = torch.empty_like(torch.tensor(rewards[item])).long()
        ranks[indices] = torch.arange(1, len(rewards[item]) + 1)
        reward_std.append(ranks.float())
    reward_std = reward_std[-1] - (reward_std[0] + reward_std[1]) / 2
    dynamic_controller.update(np.array([p for p in reward_std.cpu().numpy() if p >= 0]))
    threshold = np.percentile(
        np.array([p for p in reward_std.cpu().numpy() if p >= 0]), 100 - dynamic_controller.beta * 100
    )
    return advantages, reward_std > threshold


def test_gardo_advantages_and_gate_match_train_sd3_grpo_gardo():
    """30 epochs of 4 prompts x 6 samples: the diversity-aware advantages ((r - mean) times the nearest-neighbour
    distance over the group's mean for r >= mean, no std), the uncertainty mask (OCR's rank minus the mean rank of
    aesthetic and imagereward, above the (1 - beta) percentile of the values >= 0) and the controller's beta, epoch
    by epoch (the controller's window of 20 fills and slides)."""
    g = torch.Generator().manual_seed(0)
    controller, share = RiskCompensator(), torch.tensor(0.1, dtype=torch.float64)
    history = torch.full((gardo.WINDOW,), torch.nan, dtype=torch.float64)
    group = torch.arange(4).repeat_interleave(6)[torch.randperm(24, generator=g)]  # groups interleaved
    prompts = np.array([f"prompt {i}" for i in group.tolist()])
    betas, gated = set(), 0
    for epoch in range(30):
        scale = 1 + epoch % 7  # the aesthetic reward's spread varies, and with it the uncertainty level
        rewards = {"ocr": torch.rand(24, generator=g), "aesthetic": scale * torch.randn(24, generator=g),
                   "imagereward": torch.randn(24, generator=g)}  # fmt: skip
        if epoch % 3 == 0:  # correlated rewards: low uncertainty
            rewards["aesthetic"] = rewards["ocr"] + 0.05 * torch.randn(24, generator=g)
        features = torch.randn(24, 16, generator=g)
        expected, mask = gardo_reference_epoch(prompts, {k: v.numpy() for k, v in rewards.items()}, features.numpy(),
                                               controller)  # fmt: skip
        advantages = group_relative(rewards["ocr"], group, norm_by_std=False)[0]
        weights = gardo.diversity_weights(gardo.nearest_distance(features, group), advantages, group)
        torch.testing.assert_close(advantages * weights, torch.from_numpy(expected[:, 0]).float())
        u = gardo.uncertainty(rewards["ocr"], torch.stack([rewards["aesthetic"], rewards["imagereward"]]))
        share, history = gardo.adapt_share(share, history, gardo.nonnegative_mean(u), 0.02, 0.2)
        assert share.item() == pytest.approx(controller.beta, rel=1e-12)
        assert torch.equal(gardo.gate(u, share), mask), epoch
        betas.add(round(float(controller.beta), 6))
        gated += int(mask.sum())
    assert len(betas) >= 4 and gated > 0


def test_gardo_gated_kl_is_train_sd3_grpo_gardos_divided_by_the_step():
    """Its kl_loss: the mean over the gated samples of (mean - mean_ref)^2 / (2 * std_dev_t^2) (flow_grpo's units);
    ours: the batch mean of kl_weights * our KL, which is theirs / |dt| (as FlowGRPO's KL, so kl_coef and
    gardo_kl_threshold port by |dt|)."""
    x, v, k, g = flow_inputs(5)
    k = torch.full((4,), 3)  # one timestep for the micro-batch, as the reference trains
    v_ref = v + 0.3 * torch.randn(v.shape, generator=g)
    _, _, prev_sample_mean, std_dev_t = flow_grpo_sde_step(v, x, k, 1.0, noise=torch.zeros_like(x))
    _, _, prev_sample_mean_ref, _ = flow_grpo_sde_step(v_ref, x, k, 1.0, noise=torch.zeros_like(x))
    idx = torch.tensor([False, True, False, True])
    kl_loss = torch.mean((torch.square(prev_sample_mean[idx] - prev_sample_mean_ref[idx])) / (2 * std_dev_t[idx] ** 2))
    ours_tr = sde.transition("sde", v, x, SIGMAS[k], SIGMAS[k + 1], 1.0)
    ours_ref = sde.transition("sde", v_ref, x, SIGMAS[k], SIGMAS[k + 1], 1.0)
    kl = gaussian_mean_kl(ours_tr.mean, ours_ref.mean, ours_tr.std) * gardo.kl_weights(idx)
    torch.testing.assert_close(kl.mean() * (SIGMAS[3] - SIGMAS[4]), kl_loss)


def test_gardo_reference_refresh_matches_train_sd3_grpo_gardo(monkeypatch):
    """The reference's epoch loop: after an optimizer step whose kl_loss exceeded kl_thres the next epoch starts
    from a refreshed reference, as does any epoch more than reset_freq after the last refresh. Ours refreshes after
    our step s (its epoch s - 1) exactly where it refreshes at the start of epoch s."""
    from omnialign.config import apply_overrides
    from omnialign.engine import dist
    from omnialign.recipes import RECIPES
    from omnialign.trainer import objectives

    g = torch.Generator().manual_seed(0)
    kls = (torch.rand(60, generator=g) ** 4 * 2).tolist()  # mostly below kl_thres = 1, some above
    reset_freq, thres = 5, 1.0
    expected, reset, prev_epoch = [], False, 0
    for epoch in range(len(kls)):
        if (epoch != 0 and reset is True) or (epoch - prev_epoch) > reset_freq:
            expected.append(epoch)
            reset, prev_epoch = False, epoch
        if kls[epoch] > thres:  # its one optimizer step's info["kl_loss"]
            reset = True

    class Reference:
        state, count = {}, []

        def refresh(self):
            self.count.append(1)

    monkeypatch.setattr(dist, "mean_across", lambda t: t)
    config = apply_overrides(RECIPES["glyphs_gardo"](), [f"algorithm.ref_update_every={reset_freq + 1}",
                                                         f"algorithm.gardo_kl_threshold={thres}"])  # fmt: skip
    reference = Reference()
    algorithm = objectives.gardo(None, config, reference, None, None)
    ours = [s for s in range(1, len(kls) + 1) if algorithm.after_update(s, {"kl": torch.tensor(kls[s - 1])})
            ["gardo/refreshed"]]  # fmt: skip
    assert ours == expected and len(reference.count) == len(ours)
    assert 0 < sum(k > thres for k in kls) and any(b - a == reset_freq + 1 for a, b in zip(expected, expected[1:]))


def test_dapo_token_mean_with_dual_clip_matches_verl():
    """verl's vanilla policy loss: clip-higher (0.2 / 0.28), dual clip c = 3 for A < 0, token-mean."""
    old_log_prob, log_prob, mask = token_batch(8)
    log_prob[1, 0] = old_log_prob[1, 0] + 1.5  # rho = 4.5 > c on a token with A < 0: the dual clip acts
    log_prob.requires_grad_(True)
    advantages = torch.tensor([1.5, -2.0, -0.7]).unsqueeze(-1).expand(3, 6)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -20.0, 20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * 3.0, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    theirs = (pg_losses * mask).sum() / mask.sum()
    (grad_theirs,) = torch.autograd.grad(theirs, log_prob)

    loss, _ = ppo_clip(log_prob, old_log_prob, advantages, 0.2, 0.28, adv_clip=5.0)
    ours = aggregate(dual_clip(loss, advantages, 3.0), mask, "token-mean")
    (grad_ours,) = torch.autograd.grad(ours, log_prob)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
    assert (clip_pg_losses2 != clip_pg_losses1)[advantages < 0].any()  # the dual clip acted


def test_gspo_matches_verl():
    """verl's GSPO: per-token log ratio sg(mean_t log rho) + logp - sg(logp), clipped (3e-4 / 4e-4), then
    seq-mean-token-mean; the values and the gradients agree."""
    old_log_prob, _, mask = token_batch(9)
    log_prob = old_log_prob + 1e-3 * torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    log_prob.requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, -0.5])
    negative_approx_kl = log_prob - old_log_prob
    seq_kl = (negative_approx_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_seq_ratio = torch.clamp(log_prob - log_prob.detach() + seq_kl.detach().unsqueeze(-1), max=10.0)
    seq_ratio = torch.exp(log_seq_ratio)
    advantages = adv.unsqueeze(-1).expand(3, 6)
    pg_losses = torch.maximum(-advantages * seq_ratio, -advantages * torch.clamp(seq_ratio, 1 - 3e-4, 1 + 4e-4))
    theirs = ((pg_losses * mask).sum(-1) / (mask.sum(-1) + 1e-8)).mean()
    (grad_theirs,) = torch.autograd.grad(theirs, log_prob)

    loss, m = gspo(log_prob, old_log_prob, adv, mask, 3e-4, 4e-4)
    ours = aggregate(loss, mask, "seq-mean-token-mean")
    (grad_ours,) = torch.autograd.grad(ours, log_prob)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
    clipped = (pg_losses[:, 0] > -advantages[:, 0] * seq_ratio[:, 0]).tolist()
    assert clipped == [False, False, True]  # the third sequence's ratio is below 1 - 3e-4 with A < 0


def test_opd_matches_the_importance_sampled_reverse_kl_reward():
    """On-policy distillation: per-token advantage -(log pi_sampler - log pi_teacher), importance-sampled with
    rho = pi / pi_sampler (loss -rho * A, no advantage clip). Inside the clip range ours is exactly that."""
    old_log_prob, _, mask = token_batch(10)
    log_prob = old_log_prob + 0.05 * torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    assert ((log_prob - old_log_prob).exp() - 1).abs().max() < 0.2  # inside the clip range
    log_prob.requires_grad_(True)
    teacher_log_prob = old_log_prob - torch.rand(3, 6, generator=torch.Generator().manual_seed(3)) * 8
    advantages = -(old_log_prob - teacher_log_prob)
    theirs = (-torch.exp(log_prob - old_log_prob) * advantages * mask).sum() / mask.sum()
    (grad_theirs,) = torch.autograd.grad(theirs, log_prob)

    reward = -distill.sampled_reverse_kl(old_log_prob, teacher_log_prob)
    assert reward.abs().max() > 5  # larger than adv_clip: the term is not clipped
    loss, _ = ppo_clip(log_prob, old_log_prob, reward, 0.2, 0.2, adv_clip=None)
    ours = aggregate(loss, mask, "token-mean")
    (grad_ours,) = torch.autograd.grad(ours, log_prob)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
