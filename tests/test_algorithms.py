"""The algorithm family's pure losses against hand-computed values (ALGORITHMS.md sections 4-7)."""

import math

import pytest
import torch

from omnialign.algorithms import distill, nft, preference
from omnialign.algorithms.policy_gradient import aggregate, dppo, dual_clip, grpo_guard, gspo, kl_estimate, ppo_clip
from omnialign.diffusion import sde


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_dual_clip_caps_negative_advantages_only():
    loss, _ = ppo_clip(t(math.log(5.0), math.log(5.0)), t(0, 0), t(-1, 1), 0.2, 0.2)
    torch.testing.assert_close(loss, t(5.0, -1.2))
    torch.testing.assert_close(dual_clip(loss, t(-1, 1), 3.0), t(3.0, -1.2))


def test_grpo_guard_hand_values():
    mean = torch.stack([torch.full((4,), 0.1), torch.zeros(4)])
    loss, _ = grpo_guard(t(0.02, -0.04), t(0, 0), t(1, -1), mean, torch.zeros(2, 4), std=t(0.25, 0.5),
                         sqrt_neg_dt=t(0.5, 0.25), clip_low=0.05, clip_high=0.05)  # fmt: skip
    # per sample s = std: b = (.01 / (2 * .25^2), 0) = (.08, 0); rho = exp((.02 + .08) * .25, -.04 * .5);
    # each loss divided by its own sqrt(-dt)^2 = (.25, .0625)
    rho = t(math.exp(0.1 * 0.25), math.exp(-0.04 * 0.5))
    torch.testing.assert_close(loss, t(-1.0, 1.0) * rho / t(0.25, 0.0625))


def test_grpo_guard_ratio_has_zero_mean_at_the_old_policy_for_every_sample_of_mixed_sigmas():
    """Per-sample SDE windows put the samples of one micro-batch at different sigmas. With x' drawn from the
    old policy's transition and the current policy's mean moved off the old one, E[(log r + b) * s] = 0
    must hold for each sample, not only on the batch average (ALGORITHMS.md section 4)."""
    g = torch.Generator().manual_seed(0)
    sigma = t(1.0, 0.8, 0.5, 0.2)  # four window steps of a 10-step schedule, one micro-batch
    sigma_next = sigma - 0.1
    x, v_old = torch.randn(4, 64, generator=g), torch.randn(4, 64, generator=g)
    v = v_old + torch.randn(4, 64, generator=g)
    draws = 20000
    rows = torch.arange(4).repeat(draws)  # every sample, draws times
    old = sde.transition("sde", v_old[rows], x[rows], sigma[rows], sigma_next[rows], 1.0,
                         noise=torch.randn(len(rows), 64, generator=g))  # fmt: skip
    new = sde.transition("sde", v[rows], x[rows], sigma[rows], sigma_next[rows], 1.0, sample=old.sample)
    _, m = grpo_guard(new.log_prob, old.log_prob, torch.ones(len(rows)), new.mean, old.mean, new.std,
                      (sigma - sigma_next)[rows].sqrt(), 2e-4, 2e-4)  # fmt: skip
    normalised = -m["approx_kl"].view(draws, 4)  # (log r + b) * s per draw and sample
    bias = (((new.mean - old.mean) ** 2).mean(-1) / (2 * new.std)).view(draws, 4)[0]  # b * s per sample
    error = 4 * normalised.std(0) / math.sqrt(draws)
    assert (bias > 10 * error).all()  # the bias the correction removes is far above the noise of the check
    assert (normalised.mean(0).abs() < error).all(), (normalised.mean(0), error)


def test_dppo_masks_only_moves_away_outside_the_trust_region():
    far = torch.ones(4, 2)  # D = mean(1)/2 = .5 >= tau
    near = torch.zeros(4, 2)  # D = 0
    log_ratio = t(0.1, -0.1, -0.1, 0.1)
    adv = t(1.0, 1.0, -1.0, 1.0)
    mean = torch.cat([far[:3], near[3:]])
    loss, m = dppo(log_ratio, torch.zeros(4), adv, mean, torch.zeros(4, 2), std=torch.ones(4), tau=0.01)
    rho = log_ratio.exp()
    # A>0, rho>1, far: masked; A>0, rho<1 (corrective): kept; A<0, rho<1, far: masked; near: kept
    torch.testing.assert_close(loss, t(0.0, -rho[1].item(), 0.0, -rho[3].item()))
    torch.testing.assert_close(m["masked"], t(1, 0, 1, 0))
    adv_big = t(10.0, 10.0, -10.0, 10.0)  # advantages are not clipped
    loss, _ = dppo(log_ratio, torch.zeros(4), adv_big, mean, torch.zeros(4, 2), std=torch.ones(4), tau=0.01)
    assert loss[1].item() == pytest.approx(-10 * rho[1].item())


def test_gspo_sequence_ratio_and_gradient():
    logp = t(0.1, 0.3).reshape(1, 2).requires_grad_(True)
    loss, m = gspo(logp, torch.zeros(1, 2), t(1.0), torch.ones(1, 2), 0.3, 0.3)
    s = math.exp(0.2)
    torch.testing.assert_close(loss, torch.full((1, 2), -s))
    aggregate(loss, torch.ones(1, 2), "seq-mean-token-mean").backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), -s / 2))
    # masked tokens do not enter the sequence ratio
    _, m = gspo(t(0.1, 5.0).reshape(1, 2), torch.zeros(1, 2), t(1.0), t(1, 0).reshape(1, 2), 0.3, 0.3)
    assert m["ratio"].item() == pytest.approx(math.exp(0.1))


def test_aggregation_modes():
    loss, mask = t(1, 2, 3, 4, 0, 0).reshape(2, 3), t(1, 1, 1, 1, 0, 0).reshape(2, 3)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(2.5)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)
    assert aggregate(loss, mask, "seq-mean-token-sum", length_norm=4).item() == pytest.approx(1.25)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "mean")


def test_kl_estimators():
    assert kl_estimate(t(-1.0), t(-2.0), "k1").item() == pytest.approx(1.0)
    assert kl_estimate(t(-1.0), t(-2.0), "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert kl_estimate(t(-1.0), t(-1.0), "k3").item() == 0.0


def test_nft_optimality_probability():
    torch.testing.assert_close(nft.optimality(t(-10.0, 0.0, 2.5)), t(0.0, 0.5, 0.75))


def one(v):
    return torch.full((1, 1), v)


def test_nft_loss_hand_values():
    # v+ = 1.5, v- = .5; x0+ = .25, x0- = .75; w = .25, .75; pos = .25, neg = .75
    loss, _ = nft.nft_loss(one(0.0), one(1.0), t(0.5), one(2.0), one(1.0), t(0.75), beta=0.5)
    assert loss.item() == pytest.approx(5 * (0.75 * 0.25 + 0.25 * 0.75) / 0.5)
    # beta = 1: v+ = v (x0+ = 0 exactly, w+ clamped at 1e-5 -> 0), v- = 2 v_old - v (x0- = 1)
    loss, _ = nft.nft_loss(one(0.0), one(1.0), t(0.5), one(2.0), one(1.0), t(0.75), beta=1.0)
    assert loss.item() == pytest.approx(5 * 0.25 * 1.0)
    # reference KL
    loss_kl, m = nft.nft_loss(one(0.0), one(1.0), t(0.5), one(2.0), one(1.0), t(0.75), beta=1.0,
                              v_ref=one(1.0), kappa=0.1)  # fmt: skip
    assert loss_kl.item() == pytest.approx(1.25 + 0.1 * 1.0) and m["kl"].item() == 1.0


def test_nft_small_beta_stays_finite():
    v = torch.randn(3, 8, requires_grad=True)
    loss, _ = nft.nft_loss(torch.randn(3, 8), torch.randn(3, 8), t(0.2, 0.5, 0.9), v, v.detach() + 0.01,
                           t(0.1, 0.5, 0.9), beta=1e-4)  # fmt: skip
    loss.mean().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(v.grad).all()


def test_nft_old_adapter_schedules():
    assert [nft.old_decay(s, "delayed_linear") for s in (0, 75, 100, 500)] == [0.0, 0.0, 0.0075 * 25, 0.999]
    assert nft.old_decay(300, "copy") == 0.0
    with pytest.raises(ValueError, match="old_schedule"):
        nft.old_decay(1, "ema")


def test_dpo_losses_hand_values():
    args = t(-1.0), t(-2.0), t(-1.5), t(-1.5)  # z = 1
    loss, m = preference.dpo_loss(*args, beta=0.1)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.1))))
    smooth, _ = preference.dpo_loss(*args, beta=0.1, label_smoothing=0.1)
    assert smooth.item() == pytest.approx(0.9 * loss.item() + 0.1 * -math.log(1 / (1 + math.exp(0.1))))
    assert preference.dpo_loss(*args, beta=0.1, kind="ipo")[0].item() == pytest.approx(16.0)
    assert preference.dpo_loss(*args, beta=0.1, kind="hinge")[0].item() == pytest.approx(0.9)
    assert m["dpo/accuracy"].item() == 1.0 and m["dpo/margin"].item() == pytest.approx(0.1)
    assert m["dpo/chosen_reward"].item() == pytest.approx(0.05)


def test_dpo_positive_hand_values():
    """DPOP (Pal et al. 2024, eq. 3): -log sigmoid(beta * (lr_w - lr_l - lambda * max(0, -lr_w))), lr the log-ratios."""
    below = t(-1.0), t(-2.0), t(-0.5), t(-1.5)  # log-ratio_w = -0.5, log-ratio_l = -0.5: plain z = 0
    loss, m = preference.dpo_loss(*below, beta=0.1, positive=2.0)  # z = 0 - 2 * 0.5 = -1
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(0.1))))
    assert m["dpo/accuracy"].item() == 0.0 and m["dpo/margin"].item() == pytest.approx(0.0)  # rewards stay DPO's
    above = t(-1.0), t(-2.0), t(-1.5), t(-1.5)  # the chosen above the reference: no penalty
    assert preference.dpo_loss(*above, beta=0.1, positive=2.0)[0].item() == pytest.approx(
        preference.dpo_loss(*above, beta=0.1)[0].item()
    )


def test_dpo_reproduces_diffusion_dpo_with_half_negative_errors():
    e_w, e_ref_w, e_l, e_ref_l, beta = 0.2, 0.3, 0.5, 0.4, 100.0
    expected = -math.log(1 / (1 + math.exp(-(-0.5 * beta * ((e_w - e_ref_w) - (e_l - e_ref_l))))))
    loss, _ = preference.dpo_loss(t(-e_w / 2), t(-e_l / 2), t(-e_ref_w / 2), t(-e_ref_l / 2), beta=beta)
    assert loss.item() == pytest.approx(expected, rel=1e-4)


def test_online_dpo_pairs_and_errors():
    rows = preference.best_and_worst(t(0.1, 0.9, 0.5, 0.3, 0.3), torch.tensor([0, 0, 0, 1, 2]))
    assert rows.tolist() == [1, 0]
    with pytest.raises(ValueError, match="raise rollout.n"):
        preference.best_and_worst(t(0.1, 0.2), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="even"):
        preference.split_pairs(torch.zeros(3, 2))
    w, lo = preference.split_pairs(torch.arange(4))
    assert w.tolist() == [0, 2] and lo.tolist() == [1, 3]


def test_distillation_kls():
    student, teacher = torch.zeros(1, 1, 2), torch.tensor([[[math.log(3.0), 0.0]]])
    expected = 0.5 * (math.log(0.5) - math.log(0.75)) + 0.5 * (math.log(0.5) - math.log(0.25))
    assert distill.reverse_kl(student, teacher).item() == pytest.approx(expected, rel=1e-5)
    assert distill.reverse_kl(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)
    torch.testing.assert_close(distill.sampled_reverse_kl(t(-1.0), t(-3.0)), t(2.0))
    torch.testing.assert_close(distill.diffusion_distill(torch.ones(1, 2), torch.zeros(1, 2), t(1.0)), t(0.5))


def test_dpo_min_gap_gives_tied_pairs_no_loss():
    """algorithm.dpo_min_gap: a pair whose reward gap is under it gets loss 0; the others keep DPO's log 2
    (at the first step the policy is its reference)."""
    from omnialign.config import apply_overrides, validate
    from omnialign.engine import dist
    from omnialign.recipes import RECIPES
    from omnialign.trainer.build import build_policy
    from omnialign.trainer.objectives import dpo_objective, pair_batch

    config = validate(apply_overrides(RECIPES["glyphs_online_dpo"](), ["algorithm.dpo_min_gap=0.1"]))
    world = dist.init()
    policy, contexts = build_policy(config, world)
    g = torch.Generator().manual_seed(0)
    cond = policy.encode_prompts(["1", "1", "2", "2", "3", "3"]).to(world.device)
    scores = torch.tensor([1.0, 0.0, 0.95, 0.9, 0.6, 0.4], device=world.device)  # gaps 1.0, 0.05 (a tie) and 0.2
    x0 = torch.randn(6, 1, 32, 32, generator=g).to(world.device)
    batch = pair_batch(x0, cond, scores, g, config, policy.train_sigmas())
    inputs = {k: getattr(batch, k) for k in ("x0", "noise", "sigma", "cond", "weight")}
    loss, metrics, _ = dpo_objective(policy, config, contexts["reference"]).fn(inputs)
    torch.testing.assert_close(loss.cpu(), torch.tensor([1.5 * math.log(2), 0.0, 1.5 * math.log(2)]), atol=1e-3, rtol=0)
    assert metrics["dpo/kept"].tolist() == [1.0, 0.0, 1.0]


def test_awm_matching_log_prob_by_hand_and_its_first_update_is_advantage_weighted_matching():
    """AWM (scxue/advantage_weighted_matching): the log-likelihood surrogate is minus the flow-matching error e =
    mean((v - (noise - x0))^2), times sigma (t) or generalised-Huber'd (ghuber: ((e + c)^p - c^p) * sigma / p). At the
    first update the ratio is 1 and the PPO gradient is the advantage-weighted flow-matching loss's, sign included."""
    from omnialign.algorithms.awm import matching_log_prob
    from omnialign.algorithms.policy_gradient import ppo_clip

    x0, noise = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    v, sigma = torch.tensor([[-1.0, 3.0], [1.0, -1.0]]), torch.tensor([0.5, 0.25])
    # targets noise - x0 = [[-1, 1], [1, -1]]; errors mean([0, 4]) = 2 and mean([0, 0]) = 0
    torch.testing.assert_close(matching_log_prob(v, x0, noise, sigma, "uniform"), torch.tensor([-2.0, 0.0]))
    torch.testing.assert_close(matching_log_prob(v, x0, noise, sigma, "t"), torch.tensor([-1.0, 0.0]))
    expected = -((2 + 1e-10) ** 0.5 - 1e-5) * 0.5 / 0.5  # p = 0.5: c^p = 1e-5
    torch.testing.assert_close(matching_log_prob(v, x0, noise, sigma, "ghuber", 0.5), torch.tensor([expected, 0.0]))

    advantages = torch.tensor([1.5, -0.5])
    v1, v2 = (v.clone().requires_grad_(True) for _ in range(2))
    lp = matching_log_prob(v1, x0, noise, sigma, "uniform")
    ppo_clip(lp, lp.detach(), advantages, 1.0, 1.0, None)[0].mean().backward()
    error = -matching_log_prob(v2, x0, noise, sigma, "uniform")
    (advantages * error).mean().backward()
    torch.testing.assert_close(v1.grad, v2.grad)
    assert v1.grad[0].abs().sum() > 0  # the positive sample is pulled toward its target


def test_dgpo_group_weights_and_loss_by_hand():
    """DGPO (Luo-Yihong/DGPO): per group and noise level, the margin z = beta * mean over the group of
    A * (l - l_ref) and the weight w = sigmoid(-z); the loss -w * A * l, its gradient stopped where the ratio
    exp(l - l_old) left the clip range in the advantage's direction."""
    from omnialign.algorithms.dgpo import dgpo_loss, group_weights

    lp = torch.tensor([[-1.0, 0.0], [-2.0, 0.0], [0.5, 0.0], [-0.5, 0.0]])
    ref = torch.tensor([[-0.5, 0.0], [-2.25, 0.0], [0.4, 0.0], [-0.3, 0.0]])
    adv, group = t(1.0, -1.0, 2.0, -2.0), torch.tensor([7, 7, 3, 3])
    w, z = group_weights(lp, ref, adv, group, beta=2.0)
    # group 7: A * (l - l_ref) = (1 * -0.5, -1 * 0.25), mean -0.375, z = -0.75; group 3: (2 * 0.1, -2 * -0.2), z = 0.6
    torch.testing.assert_close(z[:, 0], t(-0.75, -0.75, 0.6, 0.6))
    torch.testing.assert_close(w[:, 0], torch.sigmoid(t(0.75, 0.75, -0.6, -0.6)))
    torch.testing.assert_close(w[:, 1], t(0.5, 0.5, 0.5, 0.5))  # each noise level on its own: no change, no margin

    weight = t(0.25, 0.5, 0.75, 1.0)
    log_prob = t(-1.0, -2.0, 0.5, -0.5).requires_grad_(True)
    # ratios exp(0.2) (A > 0: above 1 + 0.1, clipped), exp(-0.2) (A < 0: below 1 - 0.1, clipped), exp(0.05), exp(-0.05)
    loss, metrics = dgpo_loss(log_prob, t(-1.2, -1.8, 0.45, -0.45), adv, weight, 0.1, 0.1)
    torch.testing.assert_close(loss, t(0.25, -1.0, -0.75, -1.0))  # -w * A * l
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, t(0.0, 0.0, -1.5, 2.0))  # -w * A where not clipped
    torch.testing.assert_close(metrics["clip_frac"], t(1.0, 1.0, 0.0, 0.0))


def test_dgpo_first_update_is_half_advantage_weighted_matching():
    """With the policy as its reference and old policy, every group weight is 1/2 and nothing is clipped: the
    gradient is half AWM's first-update one, the advantage-weighted flow-matching loss's (sign included)."""
    from omnialign.algorithms.awm import matching_log_prob
    from omnialign.algorithms.dgpo import dgpo_loss, group_weights

    g = torch.Generator().manual_seed(0)
    x0, noise, v = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    sigma, adv, group = torch.full((4,), 0.6), t(1.5, -1.5, 0.5, -0.5), torch.tensor([0, 0, 1, 1])
    v1, v2 = (v.clone().requires_grad_(True) for _ in range(2))
    lp = matching_log_prob(v1, x0, noise, sigma, "uniform")
    w = group_weights(lp.detach()[:, None], lp.detach()[:, None], adv, group, 100.0)[0][:, 0]
    loss, metrics = dgpo_loss(lp, lp.detach(), adv, w, 1e-2, 1e-2)
    assert metrics["clip_frac"].sum() == 0 and (w == 0.5).all()
    loss.mean().backward()
    (0.5 * adv * -matching_log_prob(v2, x0, noise, sigma, "uniform")).mean().backward()
    torch.testing.assert_close(v1.grad, v2.grad)
    assert v1.grad[0].abs().sum() > 0


def test_dgpo_batch_shares_noise_per_group_and_starts_at_weight_one_half():
    """objectives.dgpo's batch: noise levels drawn without replacement from the schedule's noisiest
    `dgpo_first_steps`, the same for every sample; one noise per prompt group and level. At the first step the
    policy is its reference (LoRA B = 0): every weight is 1/2, nothing is clipped and the loss is A * e / 2."""
    from omnialign.batch import Trajectory
    from omnialign.config import apply_overrides, validate
    from omnialign.engine import dist
    from omnialign.recipes import RECIPES
    from omnialign.trainer.build import build_policy
    from omnialign.trainer.objectives import dgpo

    config = validate(apply_overrides(RECIPES["glyphs_dgpo"](), ["algorithm.dgpo_timesteps=3"]))
    world = dist.init()
    policy, contexts = build_policy(config, world)
    g = torch.Generator().manual_seed(0)
    x0, d = torch.randn(6, 1, 32, 32, generator=g).to(world.device), world.device
    traj = Trajectory(final=x0, latents=x0[:, None], log_probs=torch.zeros(6, 0), means=x0[:, :0],
                      sigmas=torch.zeros(6, 1), cond=policy.encode_prompts(["1", "1", "1", "4", "4", "4"]).to(d),
                      uncond=None, group=torch.tensor([3, 3, 3, 1, 1, 1]).to(d), seeds=torch.arange(6),
                      advantages=t(1.0, -0.5, 9.0, 0.0, 2.0, -2.0).to(d), batch_size=[6])  # fmt: skip
    algorithm = dgpo(policy, config, contexts["reference"], None, None)
    batch = algorithm.batch(traj, step=1)
    schedule = policy.schedule(config.rollout.steps, config.rollout.height, config.rollout.width)
    sigmas = batch.sigmas.cpu()
    assert (sigmas == sigmas[0]).all() and len(set(sigmas[0].tolist())) == 3
    assert all(s in schedule[: config.algorithm.dgpo_first_steps].tolist() for s in sigmas[0].tolist())
    noise = batch.noise.cpu()
    assert (noise[:3] == noise[0]).all() and (noise[3:] == noise[3]).all() and not torch.equal(noise[0], noise[3])
    assert not torch.equal(noise[0, 0], noise[0, 1])
    torch.testing.assert_close(batch.advantages.cpu(), t(1.0, -0.5, 5.0, 0.0, 2.0, -2.0))  # clipped to adv_clip
    assert (batch.weights == 0.5).all()
    step = {"x0": batch.x0, "cond": batch.cond, "advantages": batch.advantages, "sigma": batch.sigmas[:, 0],
            "noise": batch.noise[:, 0], "old_log_prob": batch.old_log_probs[:, 0], "weight": batch.weights[:, 0],
            "ref_velocity": batch.ref_velocities[:, 0]}  # fmt: skip
    loss, metrics, _ = algorithm.objective.fn(step)
    assert metrics["clip_frac"].sum() == 0
    torch.testing.assert_close(loss, -0.5 * batch.advantages * batch.old_log_probs[:, 0], atol=1e-6, rtol=1e-5)


def test_gardo_uncertainty_gate_and_kl_weights_by_hand():
    """GARDO (tinnerhrhe/GARDO): u = rank under the proxy - mean rank under the auxiliary rewards (1 = highest, ties
    share their mean rank); the KL counts on the u above the (1 - share) quantile of the u >= 0, averaged over them."""
    from omnialign.algorithms.gardo import gate, kl_weights, nonnegative_mean, ranks, uncertainty

    proxy = t(0.9, 0.1, 0.5, 0.7, 0.3)
    auxiliary = torch.stack([t(0.1, 0.9, 0.5, 0.3, 0.7), t(0.2, 0.8, 0.6, 0.4, 0.4)])
    torch.testing.assert_close(ranks(auxiliary[1]), torch.tensor([5, 1, 2, 3.5, 3.5], dtype=torch.float64))
    u = uncertainty(proxy, auxiliary)  # proxy ranks (1, 5, 3, 2, 4), auxiliary mean ranks (5, 1, 2.5, 3.75, 2.75)
    torch.testing.assert_close(u, torch.tensor([-4, 4, 0.5, -1.75, 1.25], dtype=torch.float64))
    assert nonnegative_mean(u).item() == pytest.approx(5.75 / 3)
    # the u >= 0 sorted: 0.5, 1.25, 4; share 0.5: the median 1.25; 0.25: 1.25 + 0.5 * 2.75; 0.9: 0.5 + 0.2 * 0.75
    assert gate(u, torch.tensor(0.5)).tolist() == [False, True, False, False, False]
    assert gate(u, torch.tensor(0.25)).tolist() == [False, True, False, False, False]
    mask = gate(u, torch.tensor(0.9))
    assert mask.tolist() == [False, True, False, False, True]
    torch.testing.assert_close(kl_weights(mask), t(0, 2.5, 0, 0, 2.5))  # B / gated count
    torch.testing.assert_close(kl_weights(torch.zeros(5, dtype=torch.bool)), torch.zeros(5))


def test_gardo_share_follows_the_uncertainty_level_within_its_window_and_bounds():
    """The reference's RiskCompensator: x1.1 above every remembered level, x0.9 below every one, clipped; it
    remembers the last 20 levels."""
    from omnialign.algorithms.gardo import WINDOW, adapt_share

    share, history = torch.tensor(0.1, dtype=torch.float64), torch.full((WINDOW,), torch.nan, dtype=torch.float64)
    shares = []
    for level in (2.0, 3.0, 2.5, 1.0, 10.0, 11.0, *[5.0] * WINDOW, 4.0, 0.5):
        share, history = adapt_share(share, history, torch.tensor(level), 0.095, 0.115)
        shares.append(share.item())
    # first: kept; 3 > 2: x1.1; 2.5 inside: kept; 1 below: x0.9; 10, 11 above: x1.1, the second clipped to 0.115;
    # 5 (inside) x20: kept; 4, below the remembered 5s only (the earlier levels have left the window): x0.9; 0.5
    # below: x0.9 = 0.09315, clipped to 0.095
    assert shares[:6] == pytest.approx([0.1, 0.11, 0.11, 0.099, 0.1089, 0.115])
    assert shares[6:-2] == pytest.approx([0.115] * WINDOW) and shares[-2:] == pytest.approx([0.1035, 0.095])
    assert history.tolist() == [5.0] * (WINDOW - 2) + [4.0, 0.5]


def test_gardo_diversity_weights_by_hand():
    """A positive advantage is scaled by the sample's cosine distance to its group's nearest other sample over the
    group's mean such distance; a negative one is kept; a group of duplicates gets 0, not 0/0."""
    from omnialign.algorithms.advantages import group_relative
    from omnialign.algorithms.gardo import diversity_weights, nearest_distance

    features = torch.tensor([[1.0, 0], [1, 1], [-1, 0], [1, 0], [2, 0], [0, 0], [0, 1]])
    group = torch.tensor([4, 4, 4, 9, 9, 2, 2])
    near = 1 - 1 / math.sqrt(2)  # (1, 0) and (1, 1); (-1, 0) is 1 + 1/sqrt(2) from (1, 1), 2 from (1, 0)
    distance = nearest_distance(features, group)
    torch.testing.assert_close(distance, t(near, near, 1 + 1 / math.sqrt(2), 0, 0, 1, 1))  # zero vector: 1
    rewards = t(0.9, 0.2, 0.4, 0.7, 0.1, 0.6, 0.6)
    advantages = group_relative(rewards, group, norm_by_std=False)[0]  # r - mean: 0.4, -0.3, -0.1, 0.3, -0.3, 0, 0
    weights = diversity_weights(distance, advantages, group)
    mean = (2 * near + 1 + 1 / math.sqrt(2)) / 3
    torch.testing.assert_close(weights, t(near / mean, 1, 1, 0, 1, 1, 1))
    torch.testing.assert_close(advantages * weights, t(0.4 * near / mean, -0.3, -0.1, 0, -0.3, 0, 0))


def test_gardo_kl_counts_on_the_gated_samples_only():
    """objectives.gardo is FlowGRPO's objective with each sample's reference KL times its `kl_weights`: the loss
    differs from FlowGRPO's by kl_coef * (w - 1) * KL, the logged KL is the gated samples' mean and an ungated
    sample's KL sends no gradient."""
    from contextlib import contextmanager

    from omnialign.config import apply_overrides, validate
    from omnialign.models.reference import Reference
    from omnialign.recipes import RECIPES
    from omnialign.trainer.objectives import gardo, policy_gradient

    class Policy:  # a velocity that the reference halves
        scale = 1.0

        def velocity(self, x, sigma, cond):
            return x * self.scale * (1 + sigma.view(-1, 1))

    policy = Policy()

    @contextmanager
    def halved():
        policy.scale = 0.5
        yield
        policy.scale = 1.0

    config = validate(RECIPES["glyphs_gardo"]())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g)
    weights = t(0, 2, 0, 2)
    inputs = {"x": x, "x_next": x + 0.1 * torch.randn(4, 8, generator=g), "sigma": t(0.9, 0.7, 0.5, 0.3),
              "sigma_next": t(0.8, 0.6, 0.4, 0.2), "cond": None, "uncond": None, "advantages": t(1, -1, 0.5, 0),
              "old_log_prob": torch.zeros(4), "kl_weights": weights}  # fmt: skip
    ours = gardo(policy, config, Reference(halved, {}), None, None).objective.fn
    flowgrpo = policy_gradient(policy, apply_overrides(RECIPES["glyphs_gardo"](), ["algorithm.name=flowgrpo"]), halved,
                               None, None)  # fmt: skip
    loss, metrics, _ = ours(inputs)
    base_loss, base_metrics, _ = flowgrpo.objective.fn(inputs)
    kl = base_metrics["kl"]
    assert (kl > 0).all()
    torch.testing.assert_close(metrics["gardo/kl_all"], kl)
    torch.testing.assert_close(metrics["kl"], kl * weights)
    assert metrics["kl"].mean().item() == pytest.approx((kl[1] + kl[3]).item() / 2)  # the gated samples' mean KL
    torch.testing.assert_close(loss - base_loss, config.algorithm.kl_coef * (weights - 1) * kl)
    x_grad = x.clone().requires_grad_(True)
    ours({**inputs, "x": x_grad, "advantages": torch.zeros(4)})[0].sum().backward()
    assert (x_grad.grad[[0, 2]] == 0).all() and (x_grad.grad[[1, 3]] != 0).all()
