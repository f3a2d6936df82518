"""Recipes of the choice world: a tiny Qwen3 model answers multiple-choice questions as <answer>X</answer>.

The shipped base model (`omnialign/assets/choice/`, made by `omnialign prepare choice`: 250 steps, a
third of its training answers replaced by A) has learned the answer format and the letter prior but not
yet the comparison: greedy decoding answers A everywhere (validation accuracy 0.24, chance), while its
sampled answers spread over the letters, which is what the RL recipes start from.
"""

from omnialign.config import Config
from omnialign.data.choice import ASSETS


def choice_dapo() -> Config:
    """DAPO phase 1 on the choice world: token-level PPO clip 0.2/0.28, token-mean, no KL (CPU, minutes)."""
    c = Config(name="choice_dapo", recipe="choice_dapo", seed=0)
    c.model.arch, c.model.path = "qwen3", str(ASSETS)
    c.data.prompts = c.data.val_prompts = "choice"
    c.data.prompts_per_step = 8
    c.rollout.n = 8
    c.generation.max_new_tokens = 8
    c.generation.micro_batch_size = 64
    c.reward.weights = {"choice": 1.0}
    c.algorithm.name = "dapo"
    c.algorithm.clip_range, c.algorithm.clip_high = 0.2, 0.28
    c.algorithm.aggregation = "token-mean"
    c.algorithm.kl_coef = 0.0
    c.actor.lr = 1e-4
    c.actor.micro_batch_size = 32
    c.actor.mini_batch_size = 32
    c.trainer.total_steps = 60
    c.trainer.val_every = 20
    c.trainer.save_every = 60
    return c


def choice_grpo() -> Config:
    """GRPO on the choice world: symmetric clip 0.2 with a k3 KL to the base model (adapters off / frozen copy)."""
    c = choice_dapo()
    c.name = c.recipe = "choice_grpo"
    c.algorithm.name = "grpo"
    c.algorithm.clip_high = None
    c.algorithm.kl_coef = 0.01
    return c


def choice_gspo() -> Config:
    """GSPO on the choice world: sequence-level ratio, clip 3e-4/4e-4, seq-mean-token-mean."""
    c = choice_dapo()
    c.name = c.recipe = "choice_gspo"
    c.algorithm.name = "gspo"
    c.algorithm.clip_range, c.algorithm.clip_high = 3e-4, 4e-4
    c.algorithm.aggregation = "seq-mean-token-mean"
    return c


def choice_distill() -> Config:
    """On-policy distillation: the student is the shipped model plus Gaussian noise (0.25 x each weight matrix's
    RMS, made by `omnialign prepare choice`); the frozen shipped model is the teacher."""
    c = choice_gspo()
    c.name = c.recipe = "choice_distill"
    c.model.path = str(ASSETS / "student")
    c.algorithm.name = "opd"
    c.algorithm.teacher_path = str(ASSETS)
    c.algorithm.clip_range, c.algorithm.clip_high = 0.2, 0.28
    c.algorithm.aggregation = "token-mean"
    return c


def choice_gspo_noised() -> Config:
    """Plain GSPO from the same noised start as choice_distill: the baseline distillation is compared with."""
    c = choice_gspo()
    c.name = c.recipe = "choice_gspo_noised"
    c.model.path = str(ASSETS / "student")
    return c


def choice_dpo() -> Config:
    """Offline DPO on synthetic preference pairs (right letter chosen over a wrong one); held-out reward accuracy."""
    c = choice_dapo()
    c.name = c.recipe = "choice_dpo"
    c.data.prompts = c.data.val_prompts = "choice_pairs"
    c.data.prompts_per_step = 16
    c.algorithm.name = "dpo"
    c.algorithm.dpo_beta = 0.1
    c.actor.lr = 1e-4
    c.actor.micro_batch_size = 32
    c.actor.mini_batch_size = None
    return c
