"""Colocated language rollout: the training module samples responses under no_grad into a `TokenBatch`.

Each prompt is encoded once and sampled n times; `generation.micro_batch_size` sequences are sampled together,
each chunk under its own seed (so a step's samples depend only on the seed and the step), through `decode.generate`
(static KV cache, CUDA graph; the omni thinker's prompts first through its own forward, `policy.prefill`), or
`policy.generate` (transformers' `generate`) with generation.decoder=transformers. A response ends at its first stop
token or the end of its first stop string, whichever comes first; `response_mask` covers it through that point.
Greedy decoding validates.
"""

import torch
from tqdm import tqdm

from omnialign.batch import TokenBatch
from omnialign.config import GenerationConfig
from omnialign.models.base import LanguagePolicy
from omnialign.rollout import decode


def left_pad(rows: list[list[int]] | list[torch.Tensor], pad: int, width: int | None = None) -> tuple:
    """Sequences to (ids (B, width), mask (B, width) int64), aligned to the right."""
    width = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            ids[i, width - len(row) :] = torch.as_tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def response_lengths(policy: LanguagePolicy, response: torch.Tensor, stop: list[str]) -> torch.Tensor:
    """(B,) length of each response: through its first stop token or the end of its first stop string."""
    length = response.shape[1]
    is_stop = torch.isin(response, torch.tensor(policy.stop_token_ids, device=response.device))
    ends = torch.where(
        is_stop.any(1), is_stop.float().argmax(1) + 1, torch.full_like(is_stop[:, 0], length, dtype=torch.long)
    )
    if stop:
        decode = policy.tokenizer.decode
        for i, row in enumerate(response.tolist()):
            lo, hi = 0, int(ends[i])
            if not any(s in decode(row[:hi]) for s in stop):
                continue
            while lo < hi:  # the shortest prefix that holds a stop string
                mid = (lo + hi) // 2
                lo, hi = (mid + 1, hi) if not any(s in decode(row[:mid]) for s in stop) else (lo, mid)
            ends[i] = hi
    return ends


def pack(
    policy: LanguagePolicy,
    prompts: list[list[int]],
    media: list,
    responses: list[torch.Tensor] | list[list[int]],
    group: torch.Tensor,
    log_probs: list[torch.Tensor] | None = None,
) -> TokenBatch:
    """Prompt and response token lists (and per-token log-probs) into one padded `TokenBatch` on the host."""
    prompt_ids, prompt_mask = left_pad(prompts, policy.pad_token_id)
    width = max(max(len(r) for r in responses), 1)
    response_ids = torch.full((len(responses), width), policy.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(responses), width))
    lp = torch.zeros((len(responses), width)) if log_probs is not None else None
    for i, r in enumerate(responses):
        response_ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        response_mask[i, : len(r)] = 1
        if lp is not None:
            lp[i, : len(r)] = log_probs[i][: len(r)]
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, group=group.long().cpu(), media=list(media), log_probs=lp,
                      batch_size=[len(responses)])  # fmt: skip


def options(config: GenerationConfig, greedy: bool) -> dict:
    """transformers generation kwargs of a rollout (sampling) or of validation (greedy)."""
    out = {"max_new_tokens": config.max_new_tokens, "do_sample": not greedy}
    if not greedy:
        out.update(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
    if config.stop:
        out["stop_strings"] = list(config.stop)
    return out


@torch.no_grad()
def generate(
    policy: LanguagePolicy,
    prompts: list[list[dict]],
    n: int,
    group: torch.Tensor,
    config: GenerationConfig,
    device: torch.device,
    seed: int,
    greedy: bool = False,
    progress: bool = False,
) -> tuple[TokenBatch, list[str]]:
    """Sample n responses to each chat prompt (group (len(prompts),) ids repeat with them).

    Returns the batch on the host (B = n * len(prompts), prompt-major) with the rollout log-probs, and
    the response texts (special tokens removed) for the rewards."""
    ids, media = policy.encode(prompts)
    ids = [row for row in ids for _ in range(n)]
    media = [m or {} for m in media for _ in range(n)]
    responses, log_probs = [], []
    chunk = config.micro_batch_size
    for k, lo in enumerate(tqdm(range(0, len(ids), chunk), desc="generate", leave=False, disable=not progress)):
        prompt_ids, prompt_mask = (t.to(device) for t in left_pad(ids[lo : lo + chunk], policy.pad_token_id))
        prompt_media = media[lo : lo + chunk]
        devices = [] if device.index is None else [device.index]
        with torch.random.fork_rng(devices=devices, device_type=device.type):
            torch.manual_seed(seed * 1_000_003 + k)
            if config.decoder in ("static", "compiled"):
                sampling = (1.0 if greedy else config.temperature, config.top_k, config.top_p, greedy)
                with policy.generating():
                    prefill = policy.prefill(prompt_ids, prompt_mask, prompt_media)
                    out, lp = decode.generate(policy.transformer, prompt_ids, prompt_mask, policy.stop_token_ids,
                                              policy.pad_token_id, config.max_new_tokens, *sampling,
                                              compiled=config.decoder == "compiled", merge_lora=config.merge_lora,
                                              banned=policy.banned_token_ids, prefill=prefill)  # fmt: skip
            else:
                out, lp = policy.generate(prompt_ids, prompt_mask, prompt_media, options(config, greedy))
        lengths = response_lengths(policy, out, config.stop).tolist()
        responses += [row[:n_] for row, n_ in zip(out.cpu(), lengths)]
        log_probs += list(lp.float().cpu())
    batch = pack(policy, ids, media, responses, group.repeat_interleave(n), log_probs)
    texts = policy.tokenizer.batch_decode([r.tolist() for r in responses], skip_special_tokens=True)
    return batch, texts
