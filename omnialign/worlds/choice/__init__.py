"""The choice world: a tiny Qwen3 language model answers multiple-choice questions as <answer>X</answer>.

`data` generates the questions, `pretrain` makes the shipped base model, teacher and student
(`omnialign prepare choice`), `recipes` holds the RL, distillation and DPO recipes. The reward is
the generic `choice` answer check (`omnialign.rewards.answers`).
"""

from omnialign.worlds.choice.data import pairs, questions
from omnialign.worlds.choice.recipes import RECIPES

__all__ = ["RECIPES", "pairs", "questions"]
