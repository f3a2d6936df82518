"""Validation through both samplers: the recipe's ODE and the training rollout's own transitions (the SDE or CPS
window, per-sample, seeded by the validation seeds); the second's metrics logged as val_train_sampler/*.
    python benchmarks/glyphs_video/cpu_1206_sampler_gap/sampler_gap.py train RECIPE OVERRIDES...
(the omnialign CLI otherwise; the grids it writes are the second sampler's)"""

import sys

import torch

import omnialign.trainer.online as online
from omnialign.rollout.diffusion import generate

ode = online.generate_ode


def train_sampler(policy, prompts, seeds, config, device, sources=None):
    return generate(policy, prompts, torch.arange(len(prompts)), seeds, config, device, sources=sources)[1]


validate = online.OnlineTrainer.validate


def both(self, step):
    metrics = validate(self, step)
    online.generate_ode = train_sampler
    try:
        other = validate(self, step)
    finally:
        online.generate_ode = ode
    metrics.update({k.replace("val/", "val_train_sampler/"): v for k, v in other.items()})
    return metrics


online.OnlineTrainer.validate = both
from omnialign.cli import main  # noqa: E402

main(sys.argv[1:])
