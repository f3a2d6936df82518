"""Stable Diffusion 3.5 recipes: offline Diffusion-DPO on pairs written by `omnialign prepare offline-dpo`.

    omnialign prepare offline-dpo prompts.jsonl data/sd3_pairs model.arch=sd3 model.path=models/sd3.5 \\
        rollout.n=8 rollout.height=512 rollout.width=512 rollout.guidance=4.5 'reward.weights={"ocr": 1}'
    omnialign train sd3_offline_dpo model.path=models/sd3.5 data.pairs=data/sd3_pairs

Training reads stored VAE latents and prompt embeddings, so it loads the transformer alone.
"""

from omnialign.config import Config


def sd3_offline_dpo() -> Config:
    """Offline Diffusion-DPO on SD3.5 (LoRA r64/a128, beta 100, logit-normal sigma) from stored best/worst pairs."""
    c = Config(name="sd3_offline_dpo", recipe="sd3_offline_dpo")
    c.model.arch, c.model.path, c.model.dtype = "sd3", "models/stable-diffusion-3.5-medium", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.data.pairs, c.data.val_pairs = "data/sd3_pairs/train", "data/sd3_pairs/val"
    c.data.prompts_per_step = 32  # pairs per step
    c.algorithm.name, c.algorithm.dpo_beta = "diffusion_dpo", 100.0
    c.actor.lr = 5e-5
    c.actor.micro_batch_size = 8  # pairs
    c.engine.activation_checkpointing = True
    c.trainer.total_steps = 2000
    c.trainer.val_every = 100
    c.trainer.save_every = 250
    return c
