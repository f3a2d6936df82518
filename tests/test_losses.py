"""Advantages and the clipped policy-gradient loss against hand-computed values (ALGORITHMS.md 3-4)."""

import math

import pytest
import torch

from omnialign.algorithms.advantages import group_relative
from omnialign.algorithms.policy_gradient import gaussian_mean_kl, ppo_clip


def test_group_relative_global_std():
    rewards, group = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 1, 1])
    adv, m = group_relative(rewards, group)
    std = torch.tensor([1.0, 2.0, 3.0, 4.0]).std().item()  # 1.2910
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5]) / (std + 1e-4))
    assert m["zero_std_ratio"].item() == 0.0


def test_group_relative_group_std_and_unnormalised():
    rewards, group = torch.tensor([1.0, 3.0, 5.0, 5.0]), torch.tensor([7, 7, 3, 3])
    adv, m = group_relative(rewards, group, global_std=False)
    torch.testing.assert_close(
        adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]) / torch.tensor([math.sqrt(2) + 1e-4] * 2 + [1e-4] * 2)
    )
    assert m["zero_std_ratio"].item() == 0.5
    adv, _ = group_relative(rewards, group, norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


def test_all_equal_rewards_give_zero_advantages():
    adv, m = group_relative(torch.full((6,), 0.3), torch.tensor([0, 0, 0, 1, 1, 1]))
    assert torch.equal(adv, torch.zeros(6))
    assert m["zero_std_ratio"].item() == 1.0


def test_ppo_clip_hand_values():
    log_ratio = torch.tensor([math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5), 0.0])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 10.0])
    loss, m = ppo_clip(log_ratio, torch.zeros(5), adv, 0.2, 0.2, adv_clip=5.0)
    # A>0, rho=1.5: max(-1.5, -1.2) = -1.2 (clipped); A<0, rho=1.5: max(1.5, 1.2) = 1.5;
    # A>0, rho=.5: max(-.5, -.8) = -.5; A<0, rho=.5: max(.5, .8) = .8 (clipped); A=10 -> 5: -5
    torch.testing.assert_close(loss, torch.tensor([-1.2, 1.5, -0.5, 0.8, -5.0]))
    torch.testing.assert_close(m["clip_frac_high"], torch.tensor([1.0, 0, 0, 0, 0]))
    torch.testing.assert_close(m["clip_frac_low"], torch.tensor([0.0, 0, 0, 1, 0]))
    torch.testing.assert_close(m["approx_kl"], -log_ratio)


def test_ppo_clip_asymmetric_ranges_and_gradient():
    logp = torch.tensor([math.log(1.25)], requires_grad=True)
    loss, _ = ppo_clip(logp, torch.zeros(1), torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.25)  # inside 1 + 0.28: not clipped
    loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-1.25)  # d(-A*rho)/dlogp = -A*rho
    logp = torch.tensor([math.log(1.5)], requires_grad=True)
    loss, _ = ppo_clip(logp, torch.zeros(1), torch.tensor([1.0]), 0.2, 0.28)
    loss.sum().backward()
    assert loss.item() == pytest.approx(-1.28) and logp.grad.item() == 0.0  # clipped: no gradient


def test_gaussian_mean_kl():
    mean, ref = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])
    # mean((1, 4)) / (2 * .5^2) = 2.5 / .5 = 5
    torch.testing.assert_close(gaussian_mean_kl(mean, ref, torch.tensor([0.5])), torch.tensor([5.0]))
