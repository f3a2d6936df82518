"""The DPO family (ALGORITHMS.md section 6); one loss serves Diffusion-DPO and MLLM DPO.

Scores are log-likelihood-like: summed (or averaged) response-token log-probs for language
models; for diffusion, -1/2 * the flow-matching MSE (so that beta * z reproduces Diffusion-DPO's
-1/2 * beta * ((e_w - e_ref,w) - (e_l - e_ref,l))).
"""

import torch
import torch.nn.functional as F


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    kind: str = "sigmoid",
    label_smoothing: float = 0.0,
    positive: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair loss (P,) and metrics; every input is (P,).

    z = (chosen - rejected) - (ref_chosen - ref_rejected) - positive * max(0, ref_chosen - chosen);
    sigmoid: -(1-ls)*log sigmoid(beta*z) - ls*log sigmoid(-beta*z); ipo: (z - 1/(2 beta))^2; hinge: max(0, 1 - beta*z).
    `positive` is DPO-Positive's lambda (DPOP, Pal et al. 2024): the margin pays for every unit by which the policy
    scores the chosen sample below the reference, so the loss cannot be lowered by making both samples less likely.
    """
    z = (chosen - rejected) - (ref_chosen - ref_rejected) - positive * torch.relu(ref_chosen - chosen)
    if kind == "sigmoid":
        loss = -(1 - label_smoothing) * F.logsigmoid(beta * z) - label_smoothing * F.logsigmoid(-beta * z)
    elif kind == "ipo":
        loss = (z - 1 / (2 * beta)) ** 2
    elif kind == "hinge":
        loss = torch.relu(1 - beta * z)
    else:
        raise ValueError(f"DPO loss {kind!r}: choose sigmoid, ipo or hinge")
    chosen_reward = (beta * (chosen - ref_chosen)).detach()
    rejected_reward = (beta * (rejected - ref_rejected)).detach()
    metrics = {"dpo/accuracy": (z > 0).float(), "dpo/chosen_reward": chosen_reward,
               "dpo/rejected_reward": rejected_reward, "dpo/margin": chosen_reward - rejected_reward}  # fmt: skip
    return loss, metrics


def best_and_worst(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Row indices (2P,) of the best then the worst sample of every group with at least 2 samples,
    so that pairs sit on adjacent rows (winner first) and share a group id."""
    pairs = []
    for g in torch.unique(group):
        rows = torch.nonzero(group == g).flatten()
        if len(rows) >= 2:
            r = rewards[rows]
            pairs += [rows[r.argmax()], rows[r.argmin()]]
    if not pairs:
        raise ValueError("online DPO needs a prompt with at least two samples to pair: raise rollout.n to 2 or more")
    return torch.stack(pairs)


def split_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adjacent winner/loser rows (2P, ...) to (winners (P, ...), losers (P, ...)); odd batches are rejected."""
    if x.shape[0] % 2:
        raise ValueError(
            f"a preference batch holds adjacent winner/loser rows, so its size must be even; got {x.shape[0]}"
        )
    return x[0::2], x[1::2]
