"""Pretrain the choice world's base model from a seed on a CPU (a few minutes), its teacher and its noised student.

    omnialign prepare choice --out omnialign/worlds/choice/assets   # rebuilds what ships
    omnialign prepare choice --out /tmp/choice --steps 300 --clean-steps 200

A tiny `Qwen3ForCausalLM` (byte tokenizer with `<answer>` and `</answer>` as single tokens) learns to
answer the choice questions (`omnialign.worlds.choice.data`) as `<answer>X</answer>` in two stages:

1. `clean_steps` on the right answers: saved as `teacher/` (the distillation's teacher).
2. the remaining steps with a share `bias` of the answers to "smallest" questions replaced by the
   letter A whatever the digits: the shipped base. It answers "largest" questions right and,
   greedily, A to "smallest" ones, while its samples still give the right letter often enough for RL
   to find it (pretrain.json has the figures).

`student/` is the base with Gaussian noise of `noise` x each weight matrix's RMS added (the
distillation's starting point: at this size the noise alone costs little accuracy, so the student
inherits the base's flaw and the teacher is the clean stage it came from).
"""

import copy
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from omnialign.models.qwen3 import CausalLMPolicy
from omnialign.models.tiny import byte_tokenizer
from omnialign.worlds.choice.data import ASSETS, answer, questions


@dataclass
class ChoicePretrainConfig:
    out: str = str(ASSETS)
    """Folder of the base model (its `teacher/` and `student/` inside it) and `pretrain.json`."""
    seed: int = 0
    """Seed of the weights and of the batches."""
    steps: int = 800
    """Optimizer steps in all (batch 64)."""
    clean_steps: int = 500
    """Steps of the first, unbiased stage (the teacher)."""
    lr: float = 2e-3
    """Peak learning rate (one-cycle)."""
    bias: float = 0.6
    """Share of the training answers to "smallest" questions replaced by the letter A (the shipped model's
    flaw: above 0.5 its greedy answer to them is A)."""
    noise: float = 0.25
    """Student noise: std = noise x the RMS of each weight matrix."""
    hidden: int = 64
    """Hidden size of the model (4 layers, 4 heads)."""


@torch.no_grad()
def greedy_accuracy(policy: CausalLMPolicy, split: str = "val") -> dict[str, float]:
    """Greedy accuracy over a split (overall and per question kind), and the share of answers that are A."""
    from omnialign.config import GenerationConfig
    from omnialign.rewards.answers import answer_payload
    from omnialign.rollout.language import generate

    records = questions(split)
    config = GenerationConfig(max_new_tokens=8, micro_batch_size=100)
    _, texts = generate(policy, [r["prompt"] for r in records], 1, torch.arange(len(records)), config,
                        torch.device("cpu"), seed=0, greedy=True)  # fmt: skip
    right = [answer_payload(t) == r["ground_truth"] for t, r in zip(texts, records)]
    kind = ["smallest" in r["prompt"][0]["content"] for r in records]
    return {"accuracy": sum(right) / len(records),
            "accuracy_smallest": sum(r for r, k in zip(right, kind) if k) / sum(kind),
            "accuracy_largest": sum(r for r, k in zip(right, kind) if not k) / (len(kind) - sum(kind)),
            "answers_A": sum(answer_payload(t) == "A" for t in texts) / len(records)}  # fmt: skip


def noised(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of the model with N(0, (scale x RMS(W))^2) noise added to every weight matrix W."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=g) * scale * p.pow(2).mean().sqrt())
    return out


def prepare_choice(config: ChoicePretrainConfig) -> dict:
    """Train, evaluate and save the base model, its teacher and its student under config.out; returns the report."""
    if not 0 < config.clean_steps < config.steps:
        raise ValueError(
            f"clean_steps={config.clean_steps} must lie strictly between 0 and steps={config.steps}: "
            "set --clean-steps below --steps (the rest of the steps teach the A bias)"
        )
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
    teacher = None
    for step in (bar := tqdm(range(config.steps), desc="choice", dynamic_ncols=True)):
        if step == config.clean_steps:
            teacher = copy.deepcopy(model).eval()
        batch = rng.sample(records, 64)
        prompts, _ = policy.encode([r["prompt"] for r in batch])
        bias = config.bias if step >= config.clean_steps else 0.0
        biased = ["smallest" in r["prompt"][0]["content"] and rng.random() < bias for r in batch]
        letters = ["A" if b else r["ground_truth"] for b, r in zip(biased, batch)]
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
              "teacher": greedy_accuracy(CausalLMPolicy(teacher, tokenizer)),
              "student": greedy_accuracy(CausalLMPolicy(student, tokenizer)),
              "seconds": round(time.time() - start, 1)}  # fmt: skip
    for folder, net in ((out, model), (out / "teacher", teacher), (out / "student", student)):
        net.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    (out / "pretrain.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out}: {report}")
    return report
