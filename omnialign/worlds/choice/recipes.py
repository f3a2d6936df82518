"""Recipes of the choice world: a tiny Qwen3 model answers multiple-choice questions as <answer>X</answer>.

Questions compare four digits ("Which is smallest? A) 7 B) 2 C) 9 D) 4"). The shipped base model
(`omnialign/worlds/choice/assets/`, made by `omnialign prepare choice` in about 3 CPU minutes) answers
"largest" questions right, but was fine-tuned with 60% of its answers to "smallest" questions replaced
by A, so greedily it answers A to those (validation accuracy 0.67) while its samples still give the
right letter 40% of the time: what the RL recipes start from. `teacher/` is the clean stage before that
fine-tuning (accuracy 1.0), `student/` the base plus weight noise (the distillation's start).
"""

from omnialign.config import Config
from omnialign.worlds.choice.data import ASSETS


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
    """On-policy distillation: the student is the shipped base plus Gaussian noise (0.25 x each weight matrix's
    RMS, made by `omnialign prepare choice`); the teacher is the frozen clean stage the base was fine-tuned from."""
    c = choice_gspo()
    c.name = c.recipe = "choice_distill"
    c.model.path = str(ASSETS / "student")
    c.algorithm.name = "opd"
    c.algorithm.teacher_path = str(ASSETS / "teacher")
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


RECIPES = {
    f.__name__: f for f in (choice_dapo, choice_grpo, choice_gspo, choice_distill, choice_gspo_noised, choice_dpo)
}
