"""GARDO (gated and adaptive regularization with diversity-aware optimization, docs/algorithms.md): three guards
against reward hacking on top of FlowGRPO.

- Gated KL: a sample's uncertainty is how far the proxy reward's rank in the batch is from the mean rank the
  auxiliary rewards give it (`uncertainty`); the KL to the reference is applied to the most uncertain share of
  the samples of uncertainty >= 0 only (`gate`), averaged over them (`kl_weights`). The share adapts to the batch's
  uncertainty level (`adapt_share`).
- Adaptive reference: the reference becomes the current policy when the gated KL exceeds a threshold, or after a
  number of steps (the trainer's part: `trainer.objectives.gardo`).
- Diversity-aware advantages: a sample above its group's mean reward has its advantage scaled by its distance to
  its nearest neighbour in the group over the group's mean such distance (`nearest_distance`, `diversity_weights`).

Pure tensor math without host syncs; callers gather over ranks first (ranks and the gate span the whole batch, the
distances a prompt group).
"""

import torch
import torch.nn.functional as F

WINDOW = 20
"""The share controller remembers this many past uncertainty levels (the reference's RiskCompensator buffer)."""
RATE = 0.1
"""The share controller's multiplicative step (grow by 1 + RATE, shrink by 1 - RATE)."""


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Rank of each of the values (B,) in the batch, 1 for the highest, tied values sharing their mean rank; float64."""
    v = values.double()
    above = (v[None, :] > v[:, None]).sum(1)
    tied = (v[None, :] == v[:, None]).sum(1) - 1
    return 1 + above + tied.double() / 2


def uncertainty(proxy: torch.Tensor, auxiliary: torch.Tensor) -> torch.Tensor:
    """u = rank of the proxy reward minus the mean over the auxiliary rewards of their ranks, per sample: proxy (B,),
    auxiliary (K, B); (B,) float64. Ranks count from the highest reward (1), as the reference's, so u > 0 where the
    proxy ranks a sample lower than the auxiliary rewards do on average."""
    return ranks(proxy) - torch.stack([ranks(a) for a in auxiliary]).mean(0)


def nonnegative_mean(u: torch.Tensor) -> torch.Tensor:
    """Mean of the uncertainties u (B,) that are >= 0 (0-d float64): the level the share controller follows. Ranks
    centre u on 0, so at least one is >= 0."""
    kept = u >= 0
    return (u * kept).sum() / kept.sum()


def adapt_share(
    share: torch.Tensor, history: torch.Tensor, level: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's RiskCompensator, one step: `share` (0-d) grows by RATE when `level` (0-d) is above every
    remembered level, shrinks by RATE when below every one, stays otherwise (and at the first step, with nothing
    remembered), then is clipped to [low, high]; `level` joins `history` (WINDOW,), whose NaN entries are empty
    slots, the oldest leaving. Returns (share, history), float64."""
    history, level, one = history.double(), level.double(), torch.ones((), dtype=torch.float64)
    seen = ~history.isnan()
    top = torch.where(seen, history, -torch.inf).max()
    bottom = torch.where(seen, history, torch.inf).min()
    factor = torch.where(level > top, one * (1 + RATE), torch.where(level < bottom, one * (1 - RATE), one))
    share = (share.double() * torch.where(seen.any(), factor, one)).clamp(low, high)
    return share, torch.cat([history[1:], level.reshape(1)])


def gate(u: torch.Tensor, share: torch.Tensor) -> torch.Tensor:
    """The samples whose KL counts (B,) bool: u above the (1 - share) quantile (linear, as numpy's percentile) of
    the uncertainties u (B,) that are >= 0; `share` 0-d. Samples with u < 0 never count."""
    threshold = torch.nanquantile(torch.where(u >= 0, u, torch.nan).double(), 1 - share.double())
    return u > threshold


def kl_weights(mask: torch.Tensor) -> torch.Tensor:
    """Per-sample weight of the KL (B,) float32: B / (gated count) on the gated samples of `mask` (B,), 0 elsewhere,
    so that the batch mean of weight * KL is the gated samples' mean KL (0 when none is gated)."""
    return mask.float() * len(mask) / mask.sum().clamp_min(1)


def nearest_distance(features: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Each sample's cosine distance 1 - cos to its nearest other sample of its group: features (B, D), group (B,)
    ids (every group of at least two); (B,) float32. A zero feature vector is at distance 1 from everything."""
    f = F.normalize(features.float(), dim=1)
    distance = 1 - (f @ f.T).clamp(-1, 1)
    others = (group[:, None] == group[None, :]) & ~torch.eye(len(group), dtype=torch.bool, device=group.device)
    return torch.where(others, distance, torch.inf).min(1).values


def diversity_weights(distance: torch.Tensor, advantages: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """The factor of each advantage (B,): distance / (its group's mean distance) where the advantage is >= 0, 1
    where it is < 0 (distance, advantages (B,), group (B,) ids). A group of duplicates (mean distance 0) gets 0,
    not 0/0."""
    _, index, counts = torch.unique(group, return_inverse=True, return_counts=True)
    mean = torch.zeros(len(counts), device=distance.device).index_add_(0, index, distance.float()) / counts
    return torch.where(advantages < 0, 1.0, distance / mean[index].clamp_min(torch.finfo(torch.float32).tiny))
