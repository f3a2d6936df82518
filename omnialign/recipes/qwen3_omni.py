"""Recipes of the Qwen3-Omni thinker: RL on audio-visual multiple choice (AVQA) and offline multimodal DPO.

Point `model.path` at a local Qwen3-Omni checkpoint and `data.prompts` / `data.val_prompts` at files
written by `omnialign prepare avqa` (or `mmk12`) and `omnialign prepare omni-preference`. LoRA r32/a64 on
the language model's attention projections; the vision and audio towers stay frozen.
"""

from omnialign.config import Config


def qwen3_omni_grpo() -> Config:
    """GRPO on AVQA with the Qwen3-Omni thinker (LoRA r32/a64, bf16, clip 0.2, k3 KL 0.01)."""
    c = Config(name="qwen3_omni_grpo", recipe="qwen3_omni_grpo")
    c.model.arch, c.model.path, c.model.dtype = "qwen3_omni", "models/Qwen3-Omni-30B-A3B-Instruct", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 32, 64
    c.data.prompts = c.data.val_prompts = "data/avqa.parquet"
    c.data.prompts_per_step = 16
    c.data.val_limit = 256
    c.rollout.n = 8
    c.generation.max_new_tokens = 512
    c.generation.temperature = 1.0
    c.generation.micro_batch_size = 32
    # omnialign's decoder, compiled: GSPO on the 30B-A3B thinker (16 image prompts x 8, 64 generated together) ran
    # 2.3x as many samples per second as with `generate`, 1.89 against 0.81 on one H100 (BENCHMARKS.md). It holds
    # the whole text stack (56 GiB) for the generation; over one rank the frozen weights are the modules' own, but
    # over 2-4 ranks of 80 GB cards the gathered stack beside each shard may not fit: generation.decoder=transformers
    # (`generate`, one layer at a time) is the fallback the out-of-memory error names
    c.generation.decoder = "compiled"
    c.reward.weights = {"choice": 1.0}
    c.algorithm.name = "grpo"
    c.algorithm.clip_range = 0.2
    c.algorithm.kl_coef = 0.01
    c.algorithm.kl_estimator = "k3"
    c.actor.lr = 1e-5
    c.actor.micro_batch_size = 4
    c.actor.mini_batch_size = 64
    c.engine.activation_checkpointing = True
    c.trainer.total_steps = 200
    c.trainer.val_every = 20
    c.trainer.save_every = 50
    return c


def qwen3_omni_dapo() -> Config:
    """DAPO phase 1 on AVQA: clip 0.2/0.28, token-mean, no KL."""
    c = qwen3_omni_grpo()
    c.name = c.recipe = "qwen3_omni_dapo"
    c.algorithm.name, c.algorithm.clip_high, c.algorithm.kl_coef = "dapo", 0.28, 0.0
    return c


def qwen3_omni_gspo() -> Config:
    """GSPO on AVQA: sequence-level ratio, clip 3e-4/4e-4, seq-mean-token-mean, no KL."""
    c = qwen3_omni_grpo()
    c.name = c.recipe = "qwen3_omni_gspo"
    c.algorithm.name, c.algorithm.kl_coef = "gspo", 0.0
    c.algorithm.clip_range, c.algorithm.clip_high = 3e-4, 4e-4
    c.algorithm.aggregation = "seq-mean-token-mean"
    return c


def qwen3_omni_dpo() -> Config:
    """Offline multimodal DPO (sigmoid, beta 0.1) on `prepare omni-preference` pairs, one modality per batch."""
    c = qwen3_omni_grpo()
    c.name = c.recipe = "qwen3_omni_dpo"
    c.data.prompts = c.data.val_prompts = "data/omni_preference.parquet"
    c.data.prompts_per_step = 16
    c.data.val_limit = 512
    c.algorithm.name = "dpo"
    c.algorithm.dpo_beta, c.algorithm.dpo_loss = 0.1, "sigmoid"
    c.model.lora.exclude = ["visual", "audio_tower"]
    c.actor.lr = 5e-6
    c.actor.micro_batch_size = 4
    c.actor.mini_batch_size = None
    c.trainer.total_steps = 500
    c.trainer.val_every = 50
    c.trainer.save_every = 100
    return c
