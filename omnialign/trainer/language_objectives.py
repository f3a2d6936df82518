"""The language algorithm family as actor objectives over a `TokenBatch` (one step per micro-batch).

| name | loss per response token (then `algorithm.aggregation`) |
|---|---|
| grpo, dapo | PPO clip on the token ratio with clip_range / clip_high, optional dual clip |
| gspo | the sequence ratio exp(mean_t log rho), clipped with its small ranges |
| opd | importance-sampled policy gradient with the per-token reward -(logp_old - logp_teacher) |
| any of the above | + distill_coef x the opd term when a teacher is given; + kl_coef x k1/k3 KL to the reference |
| dpo | DPO on adjacent chosen/rejected rows (summed or averaged response log-probs) |

Token-level losses are aggregated over the micro-batch (as verl does); with one micro-batch per
mini-batch that is the mini-batch aggregate. The math lives in `algorithms/`.
"""

from collections.abc import Callable

import torch

from omnialign.algorithms.distill import sampled_reverse_kl
from omnialign.algorithms.policy_gradient import aggregate, dual_clip, gspo, kl_estimate, ppo_clip
from omnialign.algorithms.preference import dpo_loss, split_pairs
from omnialign.config import AlgorithmConfig
from omnialign.models.base import LanguagePolicy
from omnialign.models.reference import Context
from omnialign.trainer.actor import Inputs, Objective

SEQUENCE = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "media")


def response_logprobs(policy: LanguagePolicy, inputs: Inputs, temperature: float = 1.0) -> torch.Tensor:
    """The policy's log-probs of the response tokens, (b, R) float32."""
    ids = torch.cat([inputs["prompt_ids"], inputs["response_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["response_mask"].long()], dim=1)
    return policy.token_logprobs(ids, mask, inputs["media"], inputs["prompt_ids"].shape[1], temperature)


def masked_mean(value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (value * mask).sum() / mask.sum().clamp_min(1)


def logprob_objective(policy: LanguagePolicy, temperature: float = 1.0) -> Objective:
    """Forward-only: response log-probs (old, reference or teacher policy, by the context it runs in)."""

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict, dict[str, torch.Tensor]]:
        logp = response_logprobs(policy, inputs, temperature)
        return logp.new_zeros(len(logp)), {}, {"log_prob": logp}

    return Objective(fn, resident=SEQUENCE)


def policy_objective(
    policy: LanguagePolicy, algorithm: AlgorithmConfig, temperature: float, recompute: bool
) -> Objective:
    """GRPO / DAPO / GSPO / OPD (and their sums) over sampled responses; see the module table. `recompute`: the old
    log-probs are the replayed ones (`config.recomputes_old_log_probs`), else the rollout's."""
    a = algorithm
    clip_high = a.clip_range if a.clip_high is None else a.clip_high
    distill = a.teacher_path is not None
    distill_coef = 1.0 if a.name == "opd" else a.distill_coef

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        logp = response_logprobs(policy, inputs, temperature)
        mask, old, adv = inputs["response_mask"], inputs["old_log_prob"], inputs["advantages"]
        metrics: dict[str, torch.Tensor] = {}
        loss = torch.zeros_like(logp)
        if a.name == "gspo":
            loss, m = gspo(logp, old, adv.clamp(-a.adv_clip, a.adv_clip), mask, a.clip_range, clip_high)
            metrics.update({k: v.mean() for k, v in m.items()})
        elif a.name != "opd":
            token_adv = adv.unsqueeze(-1).expand_as(logp)
            loss, m = ppo_clip(logp, old, token_adv, a.clip_range, clip_high, a.adv_clip)
            if a.dual_clip is not None:
                loss = dual_clip(loss, token_adv.clamp(-a.adv_clip, a.adv_clip), a.dual_clip)
            metrics.update({k: masked_mean(v, mask) for k, v in m.items()})
        if a.name in ("gspo", "opd"):
            metrics["approx_kl"] = masked_mean(old - logp.detach(), mask)
        if "clip_frac_low" in metrics:
            metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        if distill:
            reverse_kl = sampled_reverse_kl(old, inputs["teacher_log_prob"])
            term, _ = ppo_clip(logp, old, -reverse_kl, a.clip_range, clip_high, adv_clip=None)
            loss = loss + distill_coef * term
            metrics["distill/reverse_kl"] = masked_mean(reverse_kl, mask)
        if a.kl_coef > 0:
            kl = kl_estimate(logp, inputs["ref_log_prob"], a.kl_estimator)
            loss = loss + a.kl_coef * kl
            metrics["kl"] = masked_mean(kl.detach(), mask)
        total = aggregate(loss, mask, a.aggregation)
        return total.expand(len(logp)), metrics, {"log_prob": logp.detach()}

    old = "old_log_probs" if recompute else "log_probs"
    resident = SEQUENCE + ("advantages",)
    fields = {"old_log_prob": old}
    if distill:
        fields["teacher_log_prob"] = "teacher_log_probs"
    if a.kl_coef > 0:
        fields["ref_log_prob"] = "ref_log_probs"
    return Objective(_renamed(fn, fields), resident=resident + tuple(fields.values()))


def _renamed(fn: Callable, fields: dict[str, str]) -> Callable:
    """Call fn with batch fields also available under the objective's input names."""
    return lambda inputs: fn({**inputs, **{name: inputs[f] for name, f in fields.items()}})


def pair_scores(logp: torch.Tensor, mask: torch.Tensor, average: bool) -> torch.Tensor:
    """Summed (or averaged) response-token log-probs per row, (b,)."""
    total = (logp * mask).sum(-1)
    return total / mask.sum(-1).clamp_min(1) if average else total


def dpo_objective(policy: LanguagePolicy, algorithm: AlgorithmConfig, reference: Context | None = None) -> Objective:
    """DPO on adjacent chosen/rejected rows; the reference log-probs come from the batch (`ref_log_probs`),
    or, when `reference` is given (validation), from a forward under it."""
    a = algorithm

    def fn(inputs: Inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        mask = inputs["response_mask"]
        score = pair_scores(response_logprobs(policy, inputs), mask, a.average_log_prob)
        if reference is None:
            ref_logp = inputs["ref_log_probs"]
        else:
            with torch.no_grad(), reference():
                ref_logp = response_logprobs(policy, inputs)
        ref = pair_scores(ref_logp, mask, a.average_log_prob)
        loss, metrics = dpo_loss(*split_pairs(score), *split_pairs(ref), a.dpo_beta, a.dpo_loss, a.label_smoothing,
                                 a.dpo_positive)  # fmt: skip
        outputs = {"accuracy": metrics["dpo/accuracy"], "margin": metrics["dpo/margin"]}
        return loss.repeat_interleave(2), {k: v.mean() for k, v in metrics.items()}, outputs

    resident = SEQUENCE + (("ref_log_probs",) if reference is None else ())
    return Objective(fn, resident=resident)
