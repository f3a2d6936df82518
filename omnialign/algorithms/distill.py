"""On-policy distillation (ALGORITHMS.md section 7)."""

import torch
import torch.nn.functional as F

from omnialign.algorithms.policy_gradient import gaussian_mean_kl


def diffusion_distill(student_mean: torch.Tensor, teacher_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Gaussian KL between the student's and the frozen teacher's transition means at a stored state, (B,)."""
    return gaussian_mean_kl(student_mean, teacher_mean.detach(), std)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Per-token reverse KL sum_v pi_s(v) (log pi_s(v) - log pi_t(v)); logits (B, T, V) -> (B, T)."""
    log_s = F.log_softmax(student_logits.float(), -1)
    log_t = F.log_softmax(teacher_logits.float().detach(), -1)
    return (log_s.exp() * (log_s - log_t)).sum(-1)


def sampled_reverse_kl(log_prob: torch.Tensor, teacher_log_prob: torch.Tensor) -> torch.Tensor:
    """The sampled-token estimate logp_s - logp_t, (B, T); used as a negative per-token reward."""
    return log_prob - teacher_log_prob.detach()
