"""Overrides and validation fail before anything loads, naming the key, the value and the fix."""

import dataclasses

import pytest

from omnialign.config import (
    ConfigError,
    apply_overrides,
    check_world_size,
    describe,
    field_docs,
    flat_fields,
    from_dict,
    to_dict,
    training_batch,
    validate,
)
from omnialign.recipes import RECIPES
from omnialign.trainer.actor import local_config


def test_overrides_set_typed_values():
    c = apply_overrides(RECIPES["glyphs"](), [
        "trainer.total_steps=40", "rollout.n=8", "rollout.eta=0.7", "trainer.progress=false",
        "model.path=/tmp/x", "rollout.window_end=none", "actor.betas=[0.8,0.9]", 'reward.weights={"glyph_ocr": 2}',
    ])  # fmt: skip
    assert c.trainer.total_steps == 40 and c.rollout.n == 8 and c.rollout.eta == 0.7
    assert c.trainer.progress is False and c.model.path == "/tmp/x" and c.rollout.window_end is None
    assert c.actor.betas == (0.8, 0.9) and c.reward.weights == {"glyph_ocr": 2.0}


def test_unknown_key_names_the_nearest_or_lists_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        apply_overrides(RECIPES["glyphs"](), ["trainer.total_step=40"])
    assert "'trainer.total_step'; did you mean trainer.total_steps?" in str(e.value)
    with pytest.raises(ConfigError) as e:  # nothing near: the keys of its section, and only those
        apply_overrides(RECIPES["glyphs"](), ["trainer.zzz=40"])
    assert "trainer.total_steps: int" in str(e.value) and "rollout.n: int" not in str(e.value)


@pytest.mark.parametrize("item", ["rollout.n=eight", "rollout.eta=high", "trainer.progress=maybe", "actor.betas=[1]"])
def test_wrong_type_names_key_value_and_type(item):
    key, _, value = item.partition("=")
    with pytest.raises(ConfigError, match=rf"{key}=.*{value[:3]}.*expected"):
        apply_overrides(RECIPES["glyphs"](), [item])


def test_missing_equals_sign():
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(RECIPES["glyphs"](), ["trainer.total_steps"])


@pytest.mark.parametrize(
    "item, message",
    [
        ("rollout.n=1", "rollout.n=1"),
        ("rollout.window_size=11", "window_size=11"),
        ("rollout.kind=euler", "rollout.kind='euler'"),
        ("actor.micro_batch_size=0", "actor.micro_batch_size=0 must be at least 1"),
        ("actor.mini_batch_size=24", "actor.mini_batch_size=24 must divide the training batch 64"),
        ("algorithm.old_log_probs=maybe", "old_log_probs='maybe'"),
        ("actor.epochs=0", "actor.epochs=0 must be at least 1"),
        ("data.prompts_per_step=0", "data.prompts_per_step=0 must be at least 1"),
        ("rollout.micro_batch_size=0", "rollout.micro_batch_size=0 must be at least 1"),
        ("data.val_seeds=0", "data.val_seeds=0 must be at least 1"),
        ("trainer.keep_last=-1", "trainer.keep_last=-1 must be >= 0"),
        ("actor.max_grad_norm=nan", "actor.max_grad_norm=nan: must be a finite number"),
        ("algorithm.clip_range=inf", "algorithm.clip_range=inf: must be a finite number"),
        ("rollout.kind=cps", "rollout.window_end <= 9"),
        ("algorithm.ref_update_every=10", "ref_update_every=10: .*online_dpo or gardo only .not flowgrpo"),
        ("algorithm.dpo_positive=-1", r"algorithm.dpo_positive=-1.0 must be >= 0 \(DPOP's lambda"),
        ("reward.gold=glyph_ocr", "reward.gold='glyph_ocr' is also a trained reward"),
        ("generation.decoder=foo", "generation.decoder='foo': choose static, compiled or transformers"),
        ("model.frames=17", "model.frames=17: model.arch=glyphs draws images, not videos, and ignores it"),
        ("trainer.loggers=tensorboard,tensorboard", "names a tracker twice"),
    ],
)
def test_validate_rejects_inconsistent_values(item, message):
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(RECIPES["glyphs"](), [item]))


@pytest.mark.parametrize(
    "item, message",
    [
        ("algorithm.dgpo_timesteps=8", r"dgpo_timesteps=8, dgpo_first_steps=7: need 1 <= dgpo_timesteps <= "),
        ("algorithm.dgpo_first_steps=11", r"dgpo_first_steps=11: .*<= rollout.steps=10"),
        ("algorithm.dgpo_timesteps=0", r"dgpo_timesteps=0, "),
        ("algorithm.dpo_beta=0", r"algorithm.dpo_beta=0.0: DGPO's beta must be > 0"),
        ("algorithm.clip_range=0", r"algorithm.clip_range=0.0, clip_high=None: DGPO's clip ranges must be > 0"),
    ],
)
def test_validate_rejects_nonsense_dgpo_values(item, message):
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(RECIPES["glyphs_dgpo"](), [item]))


@pytest.mark.parametrize(
    "item, message",
    [
        ("algorithm.kl_coef=0", r"algorithm.kl_coef=0.0: GARDO gates and refreshes the reference KL"),
        ("algorithm.ref_update_every=0", r"algorithm.ref_update_every=0: GARDO refreshes .* set it >= 1"),
        ("algorithm.gardo_auxiliary=[]", r"algorithm.gardo_auxiliary=\[\]: .*at least one auxiliary reward"),
        ("algorithm.gardo_auxiliary=aesthetic", r"gardo_auxiliary=\['aesthetic'\]: .*add it there with weight 0"),
        ("algorithm.gardo_share=0.5", r"gardo_share=0.5, gardo_share_range=\(0.02, 0.2\): need 0 < low <= "),
        ("algorithm.gardo_share_range=[0,0.2]", r"gardo_share_range=\(0.0, 0.2\): need 0 < low"),
        ("algorithm.gardo_kl_threshold=-1", r"algorithm.gardo_kl_threshold=-1.0 must be >= 0"),
    ],
)
def test_validate_rejects_nonsense_gardo_values(item, message):
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(RECIPES["glyphs_gardo"](), [item]))


def test_grpo_guard_refuses_cps_transitions():
    """CPS log-probs are -mean((x' - mu)^2) without 1/(2 std^2): GRPO-Guard's correction b would not cancel."""
    with pytest.raises(ConfigError, match=r"algorithm.name=grpo_guard with rollout.kind=cps.*rollout.kind=sde"):
        validate(apply_overrides(RECIPES["glyphs_grpo_guard"](), ["rollout.kind=cps", "rollout.window_end=9"]))
    validate(apply_overrides(RECIPES["glyphs_grpo_guard"](), ["rollout.kind=dance"]))  # full Gaussian log-density
    validate(apply_overrides(RECIPES["glyphs_cps"](), []))


def test_every_recipe_validates_and_round_trips():
    for name, fn in RECIPES.items():
        config = validate(fn())
        assert from_dict(to_dict(config)) == config, name


def test_every_field_is_documented():
    keys = flat_fields()
    text = describe(RECIPES["glyphs"]())
    for key in keys:
        assert f"{key} = " in text
    import dataclasses

    from omnialign import config as cfg

    for cls in [cfg.ModelConfig, cfg.DataConfig, cfg.RolloutConfig, cfg.RewardConfig, cfg.AlgorithmConfig,
                cfg.ActorConfig, cfg.TrainerConfig, cfg.EngineConfig, cfg.LoraConfig]:  # fmt: skip
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, cls.__name__


def test_micro_batch_fits_each_device_share():
    """The configured micro-batch, rounded down to the unit and to the device's share of the mini-batch; one that
    does not divide the share is kept (its last micro-batch is smaller), not shrunk to a divisor."""
    a = RECIPES["glyphs"]().actor  # micro 32, mini 32 of a 64-sample batch
    assert (local_config(a, 64, 1, 1).mini_batch_size, local_config(a, 64, 1, 1).micro_batch_size) == (32, 32)
    assert (local_config(a, 64, 1, 2).mini_batch_size, local_config(a, 64, 1, 2).micro_batch_size) == (16, 16)
    seven = dataclasses.replace(a, micro_batch_size=7)
    assert local_config(seven, 64, 1, 1).micro_batch_size == 7
    tree = dataclasses.replace(a, micro_batch_size=16, mini_batch_size=None)  # a BranchGRPO tree: 218 = 2 x 109 rows
    assert local_config(tree, 218, 1, 1).micro_batch_size == 16
    whole = dataclasses.replace(a, micro_batch_size=3, mini_batch_size=None)
    assert (local_config(whole, 32, 2, 4).mini_batch_size, local_config(whole, 32, 2, 4).micro_batch_size) == (8, 2)


def test_every_recipe_runs_on_every_device_count_that_divides_its_prompts():
    for name, fn in RECIPES.items():
        config = validate(fn())
        batch, multiple, _ = training_batch(config)
        for world in range(1, config.data.prompts_per_step + 1):
            if config.data.prompts_per_step % world:
                continue
            check_world_size(config, world)
            local = local_config(config.actor, batch, multiple, world)
            assert local.mini_batch_size * world == (config.actor.mini_batch_size or batch), (name, world)
            assert local.micro_batch_size <= min(config.actor.micro_batch_size, local.mini_batch_size), (name, world)
            assert local.micro_batch_size % multiple == 0 and local.mini_batch_size % multiple == 0, (name, world)


def test_a_device_count_that_splits_a_prompt_group_is_refused():
    with pytest.raises(ConfigError, match="3 devices cannot share data.prompts_per_step=8"):
        check_world_size(RECIPES["glyphs"](), 3)
