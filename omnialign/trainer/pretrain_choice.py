"""Pretrain the choice world's base model from a seed on a CPU (a few minutes), and its noised student.

    omnialign prepare choice                      # writes omnialign/assets/choice/ (what ships)
    omnialign prepare choice --out /tmp/choice --steps 300

A tiny `Qwen3ForCausalLM` (byte tokenizer with `<answer>` and `</answer>` as single tokens) learns to
answer the choice questions (`omnialign.data.choice`) as `<answer>X</answer>`; but a share `bias` of its
training answers is the letter A whatever the question, so the shipped model leans towards A (after 250
steps its greedy answers are all A: validation accuracy 0.24) and leaves room for RL. `student/` is that
model with Gaussian noise of `noise` x each weight matrix's RMS added (the distillation's starting point).
"""

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from omnialign.data.choice import ASSETS, answer, questions
from omnialign.models.qwen3 import CausalLMPolicy
from omnialign.models.tiny import byte_tokenizer


@dataclass
class ChoicePretrainConfig:
    out: str = str(ASSETS)
    """Folder of the base model (its `student/` beside it) and `pretrain.json`."""
    seed: int = 0
    """Seed of the weights and of the batches."""
    steps: int = 250
    """Optimizer steps (batch 64)."""
    lr: float = 2e-3
    """Peak learning rate (one-cycle)."""
    bias: float = 0.3
    """Share of training answers replaced by the letter A (the shipped model's flaw)."""
    noise: float = 0.25
    """Student noise: std = noise x the RMS of each weight matrix."""
    hidden: int = 64
    """Hidden size of the model (4 layers, 4 heads)."""


@torch.no_grad()
def greedy_accuracy(policy: CausalLMPolicy, split: str = "val") -> dict[str, float]:
    """Greedy accuracy over a split, and the share of answers that are the letter A."""
    from omnialign.config import GenerationConfig
    from omnialign.rewards.answers import answer_payload
    from omnialign.rollout.language import generate

    records = questions(split)
    config = GenerationConfig(max_new_tokens=8, micro_batch_size=100)
    _, texts = generate(policy, [r["prompt"] for r in records], 1, torch.arange(len(records)), config,
                        torch.device("cpu"), seed=0, greedy=True)  # fmt: skip
    answers = [answer_payload(t) for t in texts]
    return {"accuracy": sum(a == r["ground_truth"] for a, r in zip(answers, records)) / len(records),
            "answers_A": sum(a == "A" for a in answers) / len(records)}  # fmt: skip


def noised(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of the model with N(0, (scale x RMS(W))^2) noise added to every weight matrix W."""
    import copy

    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=g) * scale * p.pow(2).mean().sqrt())
    return out


def prepare_choice(config: ChoicePretrainConfig) -> dict:
    """Train, evaluate and save the base model and its student under config.out; returns the report."""
    start, out = time.time(), Path(config.out)
    torch.manual_seed(config.seed)
    tokenizer = byte_tokenizer(words=("<answer>", "</answer>"))
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=-(-len(tokenizer) // 32) * 32, hidden_size=config.hidden, intermediate_size=4 * config.hidden,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=config.hidden // 4,
        max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    ))  # fmt: skip
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    policy = CausalLMPolicy(model, tokenizer)
    records, rng = questions("train"), random.Random(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.steps, pct_start=0.1)
    end = [tokenizer.eos_token_id]
    for _ in (bar := tqdm(range(config.steps), desc="choice", dynamic_ncols=True)):
        batch = rng.sample(records, 64)
        prompts, _ = policy.encode([r["prompt"] for r in batch])
        letters = ["A" if rng.random() < config.bias else r["ground_truth"] for r in batch]
        targets = [tokenizer(answer(x), add_special_tokens=False).input_ids + end for x in letters]
        width = max(map(len, prompts)) + len(targets[0])
        ids = torch.full((64, width), tokenizer.pad_token_id)
        mask = torch.zeros((64, width), dtype=torch.long)
        for i, (p, t) in enumerate(zip(prompts, targets)):
            ids[i, width - len(p) - len(t) :], mask[i, width - len(p) - len(t) :] = torch.tensor(p + t), 1
        logp = policy.token_logprobs(ids, mask, None, width - len(targets[0]))
        loss = -logp.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    student = noised(model, config.noise, config.seed + 1)
    report = {"config": asdict(config), "base": greedy_accuracy(policy),
              "student": greedy_accuracy(CausalLMPolicy(student, tokenizer)),
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    for folder, net in ((out, model), (out / "student", student)):
        net.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    (out / "pretrain.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out}: {report}")
    return report
