"""Schedules and transitions against hand-computed values (ALGORITHMS.md sections 1-2)."""

import math

import pytest
import torch

from omnialign.diffusion import sde

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def one(value: float) -> torch.Tensor:
    return torch.tensor([[value]])  # (B=1, dims=1)


def test_static_shift_schedule():
    # linspace(1, 1/4, 4) = 1, .75, .5, .25; 3s/(1+2s) -> 1, .9, .75, .5; then 0
    torch.testing.assert_close(sde.sigma_schedule(4, shift=3.0), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    torch.testing.assert_close(sde.sigma_schedule(2), torch.tensor([1.0, 0.5, 0.0]))


def test_schedule_to_a_given_sigma_min():
    # SD3 without explicit sigmas: linspace(1, shifted(1/1000), N), shifted again; shifted(1/1000) = .003/1.002
    assert sde.scheduler_sigma_min(3.0) == pytest.approx(0.003 / 1.002)
    assert sde.scheduler_sigma_min(1.0, num_train_timesteps=100) == pytest.approx(0.01)
    # linspace(1, .5, 2) = 1, .5; 3s/(1+2s) -> 1, .75; then 0
    torch.testing.assert_close(sde.sigma_schedule(2, shift=3.0, sigma_min=0.5), torch.tensor([1.0, 0.75, 0.0]))


def test_train_sigmas_and_their_logit_normal_draw():
    # shifted((4, 3, 2, 1) / 4) with shift 3: 3s / (1 + 2s) -> 1, .9, .75, .5
    table = sde.train_sigmas(shift=3.0, num_train_timesteps=4)
    torch.testing.assert_close(table, torch.tensor([1.0, 0.9, 0.75, 0.5]))
    torch.testing.assert_close(sde.train_sigmas(num_train_timesteps=4), torch.tensor([1.0, 0.75, 0.5, 0.25]))
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    # u = sigmoid(N(m, 1)) indexes the table at floor(4u): u near 1 is the lowest noise, near 0 the highest
    torch.testing.assert_close(sde.logit_normal_sigmas(3, g(), table, mean=20.0), torch.full((3,), 0.5))
    torch.testing.assert_close(sde.logit_normal_sigmas(3, g(), table, mean=-20.0), torch.ones(3))
    u = torch.sigmoid(torch.randn(1000, generator=g()))
    torch.testing.assert_close(sde.logit_normal_sigmas(1000, g(), table), table[(u * 4).long()])


def test_dynamic_shift_schedule():
    # e^mu / (e^mu + 1/s - 1) with mu = ln 2: s=.5 -> 2/3
    sigmas = sde.sigma_schedule(2, mu=math.log(2.0))
    torch.testing.assert_close(sigmas, torch.tensor([1.0, 2 / 3, 0.0]))
    assert sde.dynamic_shift_mu(256) == pytest.approx(0.5)
    assert sde.dynamic_shift_mu(4096) == pytest.approx(1.15)


def test_sde_transition_hand_values():
    # x=1, v=2, sigma=.5 -> .25, eta=1: s=1, dt=-.25, mu = .75 + 2*1.5*(-.25) = 0, std = .5
    tr = sde.transition("sde", one(2.0), one(1.0), torch.tensor([0.5]), torch.tensor([0.25]), 1.0, sample=one(0.5))
    assert tr.mean.item() == pytest.approx(0.0, abs=1e-7)
    assert tr.std.item() == pytest.approx(0.5)
    assert tr.log_prob.item() == pytest.approx(-0.5 + math.log(2) - LOG_SQRT_2PI, abs=1e-6)


def test_sde_first_step_uses_next_sigma_in_denominator():
    # sigma=1: s = eta*sqrt(1/(1-sigma_next)) = .5*sqrt(5); std = s*sqrt(.2) = .5
    tr = sde.transition("sde", one(0.0), one(0.0), torch.tensor([1.0]), torch.tensor([0.8]), 0.5)
    assert tr.std.item() == pytest.approx(0.5 * math.sqrt(5) * math.sqrt(0.2), rel=1e-6)
    assert torch.isfinite(tr.mean).all()


def test_cps_transition_hand_values():
    # std = .25 sin(pi/4); x0 = 0, x1 = 2; mu = .75*0 + sqrt(.0625 - std^2)*2; log p = -(x'-mu)^2
    tr = sde.transition("cps", one(2.0), one(1.0), torch.tensor([0.5]), torch.tensor([0.25]), 0.5, sample=one(0.5))
    std = 0.25 * math.sin(math.pi / 4)
    mu = math.sqrt(0.0625 - std**2) * 2
    assert tr.std.item() == pytest.approx(std)
    assert tr.mean.item() == pytest.approx(mu, rel=1e-6)
    assert tr.log_prob.item() == pytest.approx(-((0.5 - mu) ** 2), rel=1e-5)


def test_dance_transition_hand_values():
    # x0 = 0, score = -4, mu = 1 - .5 - .5*.25*(-4)*(-.25) = .375, std = .5*sqrt(.25)
    tr = sde.transition("dance", one(2.0), one(1.0), torch.tensor([0.5]), torch.tensor([0.25]), 0.5)
    assert tr.mean.item() == pytest.approx(0.375)
    assert tr.std.item() == pytest.approx(0.25)


@pytest.mark.parametrize("kind", ["sde", "cps", "dance"])
def test_eta_zero_is_the_euler_step(kind):
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    sigma, sigma_next = torch.tensor([0.9, 0.5, 0.3]), torch.tensor([0.8, 0.2, 0.0])
    tr = sde.transition(kind, v, x, sigma, sigma_next, 0.0, noise=torch.randn(x.shape, generator=g))
    euler = x + v * (sigma_next - sigma).view(-1, 1, 1, 1)
    torch.testing.assert_close(tr.sample, euler)
    torch.testing.assert_close(sde.transition("ode", v, x, sigma, sigma_next, 0.0).sample, euler)


@pytest.mark.parametrize("kind", ["sde", "dance"])
def test_log_prob_is_the_gaussian_density_of_the_sample(kind):
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, 5, generator=g)
    sigma, sigma_next = torch.tensor([1.0, 0.7, 0.5, 0.2]), torch.tensor([0.9, 0.6, 0.3, 0.1])
    eta = torch.tensor([0.7, 1.0, 1.2, 0.9])
    tr = sde.transition(kind, v, x, sigma, sigma_next, eta, noise=torch.randn(x.shape, generator=g))
    normal = torch.distributions.Normal(tr.mean, tr.std.view(-1, 1, 1))
    torch.testing.assert_close(tr.log_prob, normal.log_prob(tr.sample).mean(dim=(1, 2)))
    # replaying the drawn sample scores it identically
    replay = sde.transition(kind, v, x, sigma, sigma_next, eta, sample=tr.sample)
    torch.testing.assert_close(replay.log_prob, tr.log_prob, rtol=0, atol=0)


def test_samples_follow_mean_and_std():
    x, v = torch.zeros(1, 20000), torch.ones(1, 20000)
    tr = sde.transition("sde", v, x, torch.tensor([0.5]), torch.tensor([0.4]), 1.0,
                        noise=torch.randn(1, 20000, generator=torch.Generator().manual_seed(2)))  # fmt: skip
    assert (tr.sample - tr.mean).mean().item() == pytest.approx(0.0, abs=0.02)
    assert (tr.sample - tr.mean).std().item() == pytest.approx(tr.std.item(), rel=0.02)


def test_transition_math_is_float32_for_bf16_inputs():
    x, v = torch.randn(2, 8).bfloat16(), torch.randn(2, 8).bfloat16()
    tr = sde.transition("sde", v, x, torch.tensor([0.5, 0.5]), torch.tensor([0.4, 0.4]), 1.0, noise=torch.randn(2, 8))
    assert tr.mean.dtype == tr.log_prob.dtype == tr.sample.dtype == torch.float32


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="sde"):
        sde.transition("euler", one(0.0), one(0.0), torch.tensor([0.5]), torch.tensor([0.4]), 1.0)


def test_windows_are_reproducible_per_seed_and_in_range():
    seeds = torch.arange(200) * 7919
    starts = sde.window_starts(seeds, size=3, lo=1, hi=8)
    assert starts.min() >= 1 and starts.max() <= 5 and len(set(starts.tolist())) == 5
    torch.testing.assert_close(sde.window_starts(seeds, 3, 1, 8), starts)
    # a sample's window does not depend on its neighbours
    torch.testing.assert_close(sde.window_starts(seeds[10:20], 3, 1, 8), starts[10:20])
    with pytest.raises(ValueError, match="window size"):
        sde.window_starts(seeds, size=8, lo=1, hi=8)


def test_forward_noising_and_target():
    x0, noise = torch.full((2, 3), 2.0), torch.full((2, 3), -1.0)
    xt = sde.add_noise(x0, noise, torch.tensor([0.0, 0.25]))
    torch.testing.assert_close(xt, torch.tensor([[2.0] * 3, [1.25] * 3]))
    torch.testing.assert_close(sde.velocity_target(x0, noise), torch.full((2, 3), -3.0))


@pytest.mark.parametrize("terminal", [0.02, 0.1])
def test_stretch_to_terminal_is_the_schedulers(terminal):
    """diffusers' FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal on the nonzero sigmas; the final 0 stays."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    sigmas = sde.sigma_schedule(10, mu=0.9)
    ours = sde.stretch_to_terminal(sigmas, terminal)
    scheduler = FlowMatchEulerDiscreteScheduler(shift_terminal=terminal)
    torch.testing.assert_close(ours[:-1], scheduler.stretch_shift_to_terminal(sigmas[:-1]), rtol=0, atol=1e-6)
    assert ours[0] == 1 and ours[-2].item() == pytest.approx(terminal) and ours[-1] == 0


@pytest.mark.parametrize(
    "config, shift",
    [(dict(use_dynamic_shifting=True, shift_terminal=0.02), None), (dict(use_dynamic_shifting=True), None),
     (dict(use_dynamic_shifting=False, shift=3.0), None), (dict(use_dynamic_shifting=True, shift_terminal=0.1), 2.5)],
    ids=["dynamic-terminal", "dynamic", "static", "fixed-shift"],
)  # fmt: skip
def test_pipeline_schedule_is_the_schedulers(config, shift):
    """What FlowMatchEulerDiscreteScheduler.set_timesteps gives a pipeline that passes linspace(1, 1/N, N) and mu
    (dynamic shifting), or its own shift; model.shift (fixed-shift) replaces the scheduler's shift as a static one."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    n, tokens = 10, 1024
    ours = sde.pipeline_schedule(n, FlowMatchEulerDiscreteScheduler(**config).config, tokens, shift)
    if shift is not None:
        config = {**config, "use_dynamic_shifting": False, "shift": shift}
    scheduler = FlowMatchEulerDiscreteScheduler(**config)
    mu = sde.dynamic_shift_mu(tokens, 256, 4096, 0.5, 1.15) if config["use_dynamic_shifting"] else None
    scheduler.set_timesteps(sigmas=list(torch.linspace(1, 1 / n, n).tolist()), mu=mu)
    torch.testing.assert_close(ours, scheduler.sigmas.float(), rtol=0, atol=1e-6)
