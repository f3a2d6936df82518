"""Recipes of the glyphs world: a tiny text-to-image model learns to draw the digits it is asked for."""

from omnialign.config import Config


def glyphs() -> Config:
    """FlowGRPO teaches the tiny glyphs generator to draw digits (OCR reward, CPU, ~10 min)."""
    c = Config(name="glyphs", recipe="glyphs")
    c.data.prompts_per_step = 8
    c.rollout.n = 8
    c.rollout.steps = 10
    c.rollout.eta = 1.0
    c.rollout.window_size = 4
    c.algorithm.clip_range = 1e-4
    c.algorithm.kl_coef = 0.0
    c.actor.lr = 1e-4
    c.actor.micro_batch_size = 32
    c.actor.mini_batch_size = 32
    c.trainer.total_steps = 200
    c.trainer.val_every = 10
    c.trainer.save_every = 50
    return c


def glyphs_flowgrpo() -> Config:
    """The glyphs recipe under its algorithm's name (FlowGRPO, SDE transitions)."""
    c = glyphs()
    c.name = c.recipe = "glyphs_flowgrpo"
    return c


def debug() -> Config:
    """Tiny and fast, for tests: 2 prompts x 4 samples, 4 denoising steps, window 2."""
    c = glyphs()
    c.name = c.recipe = "debug"
    c.data.prompts_per_step = 2
    c.data.val_prompts = "digits"
    c.data.val_seeds = 1
    c.rollout.n = 4
    c.rollout.steps = 4
    c.rollout.val_steps = 4
    c.rollout.window_size = 2
    c.actor.micro_batch_size = 4
    c.actor.mini_batch_size = None
    c.trainer.total_steps = 2
    c.trainer.val_every = 2
    c.trainer.save_every = 2
    c.trainer.progress = False
    return c
