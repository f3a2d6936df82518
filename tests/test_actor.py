"""The actor's output retention and timestep staging: same numbers, fewer tensors kept and moved."""

import copy
import dataclasses
import gc
import weakref

import pytest
import torch

from omnialign.config import ConfigError, apply_overrides, validate
from omnialign.engine import stage
from omnialign.recipes import RECIPES
from omnialign.rollout.diffusion import generate
from omnialign.trainer import actor, objectives
from omnialign.worlds.glyphs import model as glyphs


@pytest.fixture(scope="module")
def world():
    """A fresh rollout of the shipped glyphs model with advantages, and the recipe."""
    config = validate(
        apply_overrides(
            RECIPES["debug"](), ["rollout.window_size=3", "actor.micro_batch_size=4", "algorithm.kl_coef=0"]
        )
    )
    policy = glyphs.load()
    prompts = ["1"] * 4 + ["7"] * 4
    traj, _ = generate(policy, prompts, torch.arange(2).repeat_interleave(4), torch.arange(8) + 5,
                       config.rollout, torch.device("cpu"))  # fmt: skip
    traj.advantages = torch.linspace(-1, 1, 8)
    return config, policy, traj


def train_once(world, optimizer=torch.optim.AdamW, lr=1e-3, **overrides):
    """One update from the same start; returns (result, trained parameters)."""
    config, policy, traj = world
    policy = copy.copy(policy)
    policy.transformer = copy.deepcopy(policy.transformer)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    actor_cfg = dataclasses.replace(config.actor, **{k: v for k, v in overrides.items() if k != "return_model_output"})
    opt = optimizer(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    objective = objectives.policy_gradient(policy, config, None, None, None).objective
    result = actor.update(objective, traj, params, opt, sched, actor_cfg, seed=0, device=torch.device("cpu"),
                          return_model_output=overrides.get("return_model_output", False))  # fmt: skip
    return result, [p.detach() for p in params]


def assert_same_update(a, b):
    (ra, pa), (rb, pb) = a, b
    assert ra.metrics.keys() == rb.metrics.keys()
    for k in ra.metrics:
        assert torch.equal(ra.metrics[k], rb.metrics[k]), k
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))


def test_outputs_are_discarded_by_default_and_retention_changes_nothing(world):
    plain = train_once(world)
    kept = train_once(world, return_model_output=True)
    assert plain[0].model_output == {}
    assert_same_update(plain, kept)
    out = kept[0].model_output
    assert out["log_prob"].shape == (8, 3) and out["mean"].shape == (8, 3, 1, 32, 32)
    assert sorted(out["index"].tolist()) == list(range(8))


def test_a_smaller_last_micro_batch_gives_the_same_update(world):
    """8 rows in passes of 3, 3 and 2: the same loss, metrics and trained weights as passes of 4 (each pass's loss
    scaled by its rows, metrics averaged over rows, not over passes)."""
    config, policy, traj = world
    traj = traj.clone()
    traj.advantages = torch.linspace(0.1, 1.5, 8) ** 2  # uneven, so that a mean over passes differs from one over rows
    skewed = config, policy, traj
    # SGD at lr 1, whose step is the gradient itself: Adam's first step is g / (|g| + eps), which turns a
    # gradient's summation-order rounding near zero into a difference of a good part of the learning rate.
    even, p_even = train_once(skewed, torch.optim.SGD, lr=1.0, micro_batch_size=4)
    ragged, p_ragged = train_once(skewed, torch.optim.SGD, lr=1.0, micro_batch_size=3)
    assert ragged.metrics.keys() == even.metrics.keys()
    for k in even.metrics:
        torch.testing.assert_close(ragged.metrics[k], even.metrics[k], rtol=1e-5, atol=1e-7, msg=k)
    start = [p.detach() for p in world[1].transformer.parameters() if p.requires_grad]
    assert max((p - y).abs().max() for p, y in zip(start, p_even)) > 1e-3  # the step is far above the tolerance
    for x, y in zip(p_ragged, p_even):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_forward_only_calls_return_complete_outputs(world):
    config, policy, traj = world
    out = actor.infer(objectives.log_prob_objective(policy, config.rollout), traj, micro_batch_size=3)
    assert out["log_prob"].shape == (8, 3) and out["mean"].shape == (8, 3, 1, 32, 32)
    torch.testing.assert_close(out["log_prob"], traj.log_probs, rtol=0, atol=1e-5)


def test_staging_gives_exactly_the_unstaged_update(world):
    assert_same_update(train_once(world), train_once(world, timestep_staging=True))


def test_staging_copies_prompts_once_per_micro_batch_and_never_unused_fields(world, monkeypatch):
    copies = []
    real = stage.Stager.copy

    def counting(self, name, value):
        copies.append(name)
        return real(self, name, value)

    monkeypatch.setattr(stage.Stager, "copy", counting)
    train_once(world, timestep_staging=True)  # 8 samples, micro-batch 4, window 3
    assert copies.count("cond") == 2 and copies.count("uncond") == 2 and copies.count("advantages") == 2
    assert copies.count("x") == 2 * 3 and copies.count("x_next") == 2 * 3 and copies.count("old_log_prob") == 2 * 3
    assert not {"means", "rewards", "seeds", "group", "latents"} & set(copies)


def test_no_staged_tensor_of_step_k_is_alive_at_step_k_plus_1(world):
    config, policy, traj = world
    alive = []
    previous = []

    def fn(inputs):
        gc.collect()
        alive.extend(ref() is not None for ref in previous)
        previous[:] = [weakref.ref(inputs["x"]), weakref.ref(inputs["x_next"])]
        loss = inputs["x"].flatten(1).mean(1) * torch.zeros((), requires_grad=True)
        return loss, {}, {}

    objective = actor.Objective(fn, resident=("cond",), per_step=dict(objectives.FLOW_STEP))
    actor.infer(objective, traj, micro_batch_size=4, stage=True)
    assert len(alive) == 2 * (2 * 3 - 1) and not any(alive)


def test_staging_rejects_bad_inputs_before_any_forward(world):
    config, policy, traj = world
    calls = []

    def fn(inputs):
        calls.append(1)
        return inputs["x"].sum(), {}, {}

    objective = actor.Objective(fn, resident=("cond",), per_step=dict(objectives.FLOW_STEP))
    with pytest.raises(ValueError, match="on the host"):
        actor.infer(objective, traj.to("meta"), 4, stage=True)
    grad = traj.clone()
    grad.latents.requires_grad_(True)
    with pytest.raises(ValueError, match="requires grad"):
        actor.infer(objective, grad, 4, stage=True)
    short = traj.clone()
    short.latents = short.latents[:, :-1]
    with pytest.raises(ValueError, match="steps \\+ 1"):
        actor.infer(objective, short, 4, stage=True)
    empty = traj.clone()
    empty.latents, empty.sigmas = empty.latents[:, :1], empty.sigmas[:, :1]
    with pytest.raises(ValueError, match="window is empty"):
        actor.infer(objective, empty, 4, stage=True)
    assert calls == []


def test_configs_staging_cannot_serve_are_rejected():
    with pytest.raises(ConfigError, match="cpu_offload"):
        validate(apply_overrides(RECIPES["debug"](), ["actor.timestep_staging=true", "engine.cpu_offload=true"]))


def test_the_rollout_encodes_each_groups_prompt_once():
    """A group's samples share their prompt: `generate` encodes it once (here 2 prompts for 8 samples, in chunks of
    3 that split the groups): every sample of a group has the same conditions, its prompt's (as encoded alone, up to
    the float rounding that a batch of another size gives)."""
    config = validate(apply_overrides(RECIPES["debug"](), ["rollout.window_size=2", "rollout.micro_batch_size=3"]))
    policy, prompts = glyphs.load(), ["1"] * 4 + ["7"] * 4
    encoded, encode = [], policy.encode_prompts

    def counted(batch, sources=None):
        encoded.extend(batch)
        return encode(batch, sources)

    policy.encode_prompts = counted
    traj, _ = generate(policy, prompts, torch.arange(2).repeat_interleave(4), torch.arange(8) + 5, config.rollout,
                       torch.device("cpu"))  # fmt: skip
    assert encoded == ["1", "7"]
    for key, value in traj.cond.items():
        assert all(torch.equal(value[i], value[4 * (i // 4)]) for i in range(8)), key
        torch.testing.assert_close(value, torch.cat([encode([p])[key] for p in prompts]), rtol=0, atol=1e-5)


def test_shared_init_noise_starts_each_group_from_one_noise():
    """rollout.shared_init_noise (DanceGRPO's init_same_noise): the samples of a group start from the same noise,
    other groups from another, and their SDE steps still make them differ; off, every sample starts from its own."""
    config = validate(apply_overrides(RECIPES["debug"](), ["rollout.window_size=4", "rollout.kind=dance"]))
    # a window over all 4 steps: the trajectory's first latents are the initial noise
    policy, group, seeds = glyphs.load(), torch.arange(2).repeat_interleave(4), torch.arange(8) + 5
    shared = dataclasses.replace(config.rollout, shared_init_noise=True, micro_batch_size=3)  # groups split by chunks
    traj, images = generate(policy, ["1"] * 4 + ["7"] * 4, group, seeds, shared, torch.device("cpu"))
    start = traj.latents[:, 0]
    assert torch.equal(start[0], start[3]) and torch.equal(start[4], start[7]) and not torch.equal(start[0], start[4])
    assert (images[0] - images[1]).abs().max() > 0.05  # the group's samples still differ
    own, _ = generate(policy, ["1"] * 4 + ["7"] * 4, group, seeds, config.rollout, torch.device("cpu"))
    assert not torch.equal(own.latents[0, 0], own.latents[1, 0])
    assert not torch.equal(own.latents[0, 0], start[0])  # not any sample's own first draw either


def test_shared_init_noise_needs_an_sde_window():
    with pytest.raises(ConfigError, match="shared_init_noise"):
        validate(apply_overrides(RECIPES["glyphs_nft"](), ["rollout.shared_init_noise=true"]))
