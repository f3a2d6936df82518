"""`language`: training steps of a language recipe through its own trainer at one GPU's share of the step (`--prompts`
prompts, or pairs for DPO; default the recipe's `data.prompts_per_step`), on a model with random weights built on
the device in bf16 (`language_policy`): for `model.arch=qwen3_omni` the Qwen3-Omni-30B-A3B thinker with its full-
size text stack (48 MoE layers, 128 experts, 8 active; 30.5 B parameters) and its released vision (0.54 B) and audio
(0.65 B) towers (`--towers shrunk` for tiny ones; the row says which), fed by `--media image|audio|video` rows (a
random 448 x 448 image, 10 s of audio or 8 frames of 224 x 224 first in every prompt, their tokens part of the
prompt's length); for `model.arch=qwen3` a Qwen3 causal LM of a released size (`--model-size`, `QWEN3_SIZES`). The
recipe's config is kept (LoRA, FSDP2 at world size 1, the objective, micro- and mini-batches) except: bf16,
activation checkpointing on, the data (synthetic text of random letters under a byte-level tokenizer, one token per
character), the reward (`choice`, a CPU string match) and, for RL, `generation.max_new_tokens` (`--max-new-tokens`);
a mini-batch that does not divide the per-GPU batch becomes the whole batch.
- Offline DPO (`algorithm.name=dpo`, e.g. `qwen3_omni_dpo`): the offline trainer's step on pairs of
  `--seq-len` tokens each (half prompt, half response): data (tokenize, pack), reference (log-probs
  with the adapters off, forward only) and update (policy forward + backward of every micro-batch of
  `actor.micro_batch_size` sequences, one optimizer step per mini-batch). Per step: sequences
  (`samples_per_gpu_s`) and pairs per GPU per second, seconds per phase, peak allocated memory.
- RL (grpo, dapo, gspo, e.g. `choice_gspo`, full fine-tuning unless `--set model.lora.rank=32
  model.lora.alpha=64`): the language trainer's step on prompts of `--prompt-len` tokens: rollout
  (`rollout.n` samples per prompt; random weights rarely stop early, so responses run to
  `--max-new-tokens`), reward, advantage, [reference] and update. Per step: samples per GPU per
  second, generated tokens per second of rollout and per GPU per second of the whole step (`step_tokens_per_gpu_s`),
  the share of the step spent generating (`gen_share`), seconds per phase, peak allocated memory.
Every step is reported, the first with its warm-up. `--tiny` runs the same code on tiny configs on the CPU.
"""

import json
from pathlib import Path

import torch

from omnialign.bench.models import language_policy, progress
from omnialign.engine import dist
from omnialign.models.base import LanguagePolicy


def synthetic_media(kind: str, path: Path, seed: int) -> Path:
    """A random media file for `bench language --media`: a 448 x 448 PNG (196 vision tokens), 10 s of 16 kHz audio
    as .npy (130 audio tokens) or 8 frames of 224 x 224 as .npy, read at 2 fps (4 temporal patches, 196 tokens)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    if kind == "image":
        path = path.with_suffix(".png")
        Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(path)
    elif kind == "audio":
        path = path.with_suffix(".npy")
        np.save(path, (0.1 * rng.standard_normal(160000)).astype(np.float32))
    else:
        path = path.with_suffix(".npy")
        np.save(path, rng.integers(0, 256, (8, 224, 224, 3), dtype=np.uint8))
    return path


def synthetic_records(
    policy: LanguagePolicy, dpo: bool, count: int, prompt_tokens: int, response_tokens: int, media: str = "text",
    folder: Path | None = None,
) -> list[dict]:  # fmt: skip
    """`count` train records and 2 val records of random letters (one token per character under the byte
    tokenizer) whose chat-formatted prompts are `prompt_tokens` long, a random image, audio clip or video
    (`synthetic_media`, written under `folder`) first in each prompt unless `media` is "text" (its tokens count
    in the prompt's length); DPO pairs hold two responses of `response_tokens` tokens with their end-of-turn token,
    RL prompts a ground truth for the `choice` reward."""
    import random

    def prompt(i: int, letters: str, absolute: bool = False) -> list[dict]:
        if media == "text":
            return [{"role": "user", "content": letters}]
        path = synthetic_media(media, folder / f"{media}_{i}", i)
        item = str(path if absolute else path.relative_to(folder))  # records name media relative to their file
        return [{"role": "user", "content": [{"type": media, media: item}, {"type": "text", "text": letters}]}]

    overhead = len(policy.encode([prompt(0, "", absolute=True)])[0][0])
    if prompt_tokens <= overhead or (dpo and response_tokens < 2):
        raise ValueError(f"--media {media}: prompts need more than {overhead} tokens (the chat template and the "
                         f"media's) and responses at least 2: raise --seq-len (DPO) or --prompt-len (RL)")  # fmt: skip
    rng = random.Random(0)

    def text(n: int) -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))

    out = []
    for i in range(count + 2):
        record = {"id": f"bench-{i}", "prompt": prompt(i, text(prompt_tokens - overhead)),
                  "modality": media, "split": "train" if i < count else "val"}  # fmt: skip
        if dpo:
            record.update(chosen=text(response_tokens - 1), rejected=text(response_tokens - 1))
        else:
            record["ground_truth"] = "A"
        out.append(record)
    return out


def language_trainer(
    recipe: str,
    prompts: int | None,
    tiny: bool,
    work: Path,
    extra: list[str] = (),
    model_size: str = "4b",
    seq_len: int = 1024,
    prompt_len: int = 256,
    max_new_tokens: int = 512,
    media: str = "text",
    towers: str = "full",
) -> tuple:
    """The trainer of a language recipe (offline DPO or RL) on a random full-size model, its policy, and the row
    head that describes it; see the module docstring."""
    import dataclasses

    from omnialign.config import apply_overrides, recomputes_old_log_probs, validate
    from omnialign.data.language import write_records
    from omnialign.engine import optim
    from omnialign.recipes import RECIPES
    from omnialign.trainer import language, offline
    from omnialign.trainer.language_objectives import dpo_objective, policy_objective

    world = dist.init()
    base = RECIPES[recipe]()
    arch, algorithm = base.model.arch, base.algorithm.name
    if arch not in ("qwen3", "qwen3_omni") or algorithm not in ("dpo", "grpo", "dapo", "gspo"):
        raise SystemExit(f"bench language: recipe {recipe} ({arch}, {algorithm}) is not a qwen3/qwen3_omni recipe of "
                         "dpo, grpo, dapo or gspo")  # fmt: skip
    dpo = algorithm == "dpo"
    per_gpu = prompts or (2 if tiny else base.data.prompts_per_step // world.size)
    data = work / "language.parquet"
    overrides = [f"data.prompts={data}", f"data.val_prompts={data}", f"data.prompts_per_step={per_gpu * world.size}",
                 'reward.weights={"choice": 1.0}', f"model.dtype={'float32' if tiny else 'bfloat16'}",
                 "engine.activation_checkpointing=true", "trainer.progress=false",
                 f"trainer.output_dir={work}"]  # fmt: skip
    if not dpo:
        overrides.append(f"generation.max_new_tokens={max_new_tokens}")
    if tiny:
        overrides += ["rollout.n=4", "actor.micro_batch_size=4", "generation.micro_batch_size=8"]
    config = apply_overrides(base, overrides + list(extra))
    local = per_gpu * (2 if dpo else config.rollout.n)  # sequences per GPU and step
    local_mini = (config.actor.mini_batch_size or 0) // world.size
    if config.actor.mini_batch_size and (not local_mini or local % local_mini):
        config.actor = dataclasses.replace(config.actor, mini_batch_size=None)
    config = validate(config)
    progress(f"building {recipe}'s {'tiny' if tiny else 'full-size'} {arch} model on {world.device}", world.is_main)
    policy = language_policy(arch, "tiny" if tiny else model_size, world.device, getattr(torch, config.model.dtype),
                             towers)  # fmt: skip
    response = seq_len // 2 if dpo else max_new_tokens
    if world.is_main:
        work.mkdir(parents=True, exist_ok=True)
        length = seq_len - response if dpo else prompt_len
        write_records(synthetic_records(policy, dpo, per_gpu * world.size, length, response, media, work), data)
    torch.distributed.barrier()
    params_b = sum(p.numel() for p in policy.transformer.parameters()) / 1e9
    policy, reference, _ = language.build(config, world, policy)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    run_dir = work / "run"
    if dpo:
        objective = dpo_objective(policy, config.algorithm)
        trainer = offline.language_dpo(config, policy, params, optimizer, scheduler, objective, reference, world,
                                       run_dir)  # fmt: skip
    else:
        objective = policy_objective(policy, config.algorithm, config.generation.temperature,
                                     recomputes_old_log_probs(config))  # fmt: skip
        trainer = language.LanguageTrainer(config, policy, params, optimizer, scheduler, objective, world, run_dir,
                                           reference)  # fmt: skip
    model = "qwen3-omni-30b-a3b-thinker" if arch == "qwen3_omni" else f"qwen3-{model_size}"
    head = {"recipe": recipe, "model": f"tiny-{arch}" if tiny else model,
            "params_b": round(params_b, 3), "trainable_m": round(sum(p.numel() for p in params) / 1e6, 3),
            "gpus": world.size, "media": media}  # fmt: skip
    if arch == "qwen3_omni":
        head["towers"] = "shrunk" if tiny else towers
    return trainer, policy, head


def bench_language(
    recipe: str,
    prompts: int | None,
    steps: int,
    tiny: bool,
    work: Path,
    extra: list[str] = (),
    model_size: str = "4b",
    seq_len: int = 1024,
    prompt_len: int = 256,
    max_new_tokens: int = 512,
    media: str = "text",
    towers: str = "full",
) -> list[dict]:
    """Training steps of a language recipe (offline DPO or RL) on a random full-size model; see the module docstring."""
    trainer, _, head = language_trainer(recipe, prompts, tiny, work, extra, model_size, seq_len, prompt_len,
                                        max_new_tokens, media, towers)  # fmt: skip
    config, world = trainer.config, trainer.world
    dpo = config.algorithm.name == "dpo"
    per_gpu = config.data.prompts_per_step // world.size
    local = per_gpu * (2 if dpo else config.rollout.n)  # sequences per GPU and step
    cuda = world.device.type == "cuda"
    rows = []
    for step in range(1, steps + 1):
        progress(f"step {step} of {steps}", world.is_main)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step(step)
        phases = {k.removeprefix("timing/"): v for k, v in trainer.timer.pop().items()}
        seconds = sum(phases.values())
        row = {**head, "step": step}
        if dpo:
            row.update(pairs=per_gpu, seq_len=seq_len, step_s=round(seconds, 2),
                       samples_per_gpu_s=round(2 * per_gpu / seconds, 3),
                       pairs_per_gpu_s=round(per_gpu / seconds, 3))  # fmt: skip
        else:
            tokens = float(metrics["rollout/response_length"]) * local
            row.update(samples=local, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                       response_len=round(tokens / local, 1), step_s=round(seconds, 2),
                       samples_per_gpu_s=round(local / seconds, 3),
                       gen_tokens_per_s=round(tokens / phases["rollout"], 1),
                       step_tokens_per_gpu_s=round(tokens / seconds, 1),
                       gen_share=round(phases["rollout"] / seconds, 3))  # fmt: skip
        row.update({f"{k}_s": round(v, 2) for k, v in phases.items()})
        if "actor/rollout_logprob_gap" in metrics:  # with the replay: rollout against training log-probs, per token
            row["rollout_logprob_gap"] = round(float(metrics["actor/rollout_logprob_gap"]), 6)
        row["peak_alloc_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows
