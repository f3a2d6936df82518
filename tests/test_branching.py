"""TempFlow-GRPO (docs/algorithms.md): its branched rollout on the glyphs model, row rewards and advantages, the
noise-aware step weights against the reference's constant, and its config refusals."""

import math

import pytest
import torch

from omnialign.algorithms import branching
from omnialign.config import ConfigError, apply_overrides, training_batch, validate
from omnialign.diffusion import sde
from omnialign.recipes import RECIPES


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_row_rewards_are_the_mean_of_their_leaves():
    leaf_rewards = t(1.0, 0.0, 0.5, 0.25)
    ranges = torch.tensor([[0, 1], [0, 2], [1, 4], [3, 4], [0, 4]])
    torch.testing.assert_close(branching.row_rewards(leaf_rewards, ranges), t(1.0, 0.5, 0.25, 0.25, 0.4375))


def test_noise_weights_reproduce_the_reference_constant_on_sd3():
    """TempFlow's SD3 code multiplies the PPO term by 2.25 * std_k, std_k = eta sqrt(sigma / (1 - sigma~)) sqrt(-dt)
    (sigma~ = sigmas[1] where sigma = 1) at eta 0.7 over the first 9 of 10 steps of SD3's schedule: 2.25 is 1 / the
    mean std, so our weights std / mean std equal the reference's to the constant's rounding."""
    sigmas = sde.sigma_schedule(10, shift=3.0, sigma_min=sde.scheduler_sigma_min(3.0)).double()
    s, s_next = sigmas[:9], sigmas[1:10]
    s_tilde = torch.where(s == 1, sigmas[1], s)
    reference = 2.25 * 0.7 * torch.sqrt(s / (1 - s_tilde)) * torch.sqrt(s - s_next)
    ours = sde.transition("sde", torch.zeros(9, 4), torch.zeros(9, 4), s.float(), s_next.float(), 0.7).std
    torch.testing.assert_close(branching.noise_weights(ours), reference.float(), rtol=2e-3, atol=0)
    assert ours[0] < ours[1] > ours[2] > ours[8]  # weights fall with the noise after the first step
    assert branching.noise_weights(ours).mean().item() == pytest.approx(1.0)


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the run's, as dist.init picks it


def _policy(overrides: list[str]):
    from omnialign.engine import dist
    from omnialign.trainer.build import build_policy

    config = validate(apply_overrides(RECIPES["glyphs_tempflow"](), ["actor.mini_batch_size=null", *overrides]))
    policy, contexts = build_policy(config, dist.init())
    return config, policy, contexts


def test_tempflow_rollout_branches_each_trunk_state_and_finishes_by_the_ode():
    """Two trunks, 3 branches at steps 1 and 4 of 6: 6 leaves per trunk, in (trunk, step, branch) order. The
    branches of one state share it and differ in their draw; a row's log-prob is its transition's replayed under
    the policy; a leaf is the ODE from its branch's sample; the trunk state at step 4 is the ODE from step 1's; the
    same seeds give the same leaves."""
    from omnialign.rollout.branching import generate_tempflow
    from omnialign.trainer.objectives import replay

    config, policy, _ = _policy(["rollout.steps=6", "rollout.branches=3", "rollout.branch_steps=[1,4]"])
    r, device = config.rollout, DEVICE
    args = (policy, ["3", "7"], torch.tensor([0, 1]), torch.tensor([11, 12]), r, device)
    tree, images = generate_tempflow(*args)
    rows = tree.rows
    assert images.shape[0] == len(rows) == 12 and rows.latents.shape[1] == 2
    assert tree.row_group.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    sigmas = policy.schedule(6, r.height, r.width).to(DEVICE)
    torch.testing.assert_close(
        rows.sigmas[:6], torch.stack([sigmas[[1, 1, 1, 4, 4, 4]], sigmas[[2, 2, 2, 5, 5, 5]]], 1)
    )
    x, x_next = rows.latents[:, 0], rows.latents[:, 1]
    torch.testing.assert_close(x[0], x[2]) and torch.testing.assert_close(x[3], x[5])
    assert not torch.equal(x_next[0], x_next[1]) and not torch.equal(x[0], x[6])
    inputs = {"x": x, "x_next": x_next, "sigma": rows.sigmas[:, 0], "sigma_next": rows.sigmas[:, 1],
              "cond": rows.cond, "uncond": None}  # fmt: skip
    tr = replay(policy, inputs, r)
    torch.testing.assert_close(tr.log_prob, rows.log_probs[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(tr.std, tree.row_std)

    def ode(x, cond, ks):
        for k in ks:
            s = sigmas[k].expand(len(x))
            x = sde.transition("ode", policy.velocity(x, s, cond), x, s, sigmas[k + 1].expand(len(x)), 0.0).sample
        return x

    torch.testing.assert_close(ode(x_next[:3], rows.cond[:3], range(2, 6)), rows.final[:3], rtol=0, atol=1e-5)
    torch.testing.assert_close(ode(x[:1], rows.cond[:1], range(1, 4)), x[3:4], rtol=0, atol=1e-5)
    torch.testing.assert_close(policy.decode(rows.final), images)
    again, _ = generate_tempflow(*args)
    torch.testing.assert_close(again.rows.final, rows.final, rtol=0, atol=0)


def test_tempflow_batch_normalises_each_trunk_state_and_weights_by_noise():
    from omnialign.batch import Branched
    from omnialign.rollout.branching import generate_tempflow
    from omnialign.trainer.objectives import tempflow

    config, policy, contexts = _policy(["rollout.steps=4", "rollout.branches=2", "rollout.branch_steps=[0,2]"])
    tree, _ = generate_tempflow(policy, ["5"], torch.tensor([0]), torch.tensor([3]), config.rollout, DEVICE)
    assert isinstance(tree, Branched)
    tree.rewards = t(1.0, 0.0, 0.5, 0.5).to(DEVICE)
    rows = tempflow(policy, config, contexts["reference"], None, None).batch(tree, 1)
    # (1 - 0.5) / (unbiased std 0.7071 + 1e-4) and its negative; a tied state gets 0
    torch.testing.assert_close(rows.advantages.cpu(), t(0.7070, -0.7070, 0.0, 0.0), rtol=0, atol=1e-4)
    std = tree.row_std
    assert std[0] == std[1] and std[2] == std[3] and std[0] > std[2]
    torch.testing.assert_close(rows.loss_weights, std / std.mean())


def test_tempflow_counts_and_refusals():
    config = validate(apply_overrides(RECIPES["glyphs_tempflow"](), []))
    assert training_batch(config)[0] == 8 * 1 * 4 * 9  # prompts x trunks x branches x every step but the last
    for overrides, match in [(["rollout.branches=1"], "rollout.branches=1"),
                             (["rollout.branch_steps=[3,10]"], "rollout.branch_steps"),
                             (["rollout.branch_steps=[]"], "rollout.branch_steps"),
                             (["rollout.kind=cps", "rollout.branch_steps=[8,9]"], "leave step 9 out"),
                             (["actor.mini_batch_size=100"], "must divide the training batch 288")]:  # fmt: skip
        with pytest.raises(ConfigError, match=re_escape(match)):
            validate(apply_overrides(RECIPES["glyphs_tempflow"](), overrides))
    assert math.isclose(validate(apply_overrides(RECIPES["glyphs_tempflow"](), ["rollout.n=1"])).rollout.n, 1)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
