"""LTX-2 text-to-video text rendering (`model.arch=ltx2`): FlowGRPO LoRA and DiffusionNFT LoRA.

Point `model.path` at a local diffusers `LTX2Pipeline` folder (the default is the Hub id's name under models/,
models/LTX-2) and `data.prompts` / `data.val_prompts` at the parquet files of `omnialign prepare ocr`. The reward is
OCR of the quoted text on every frame, averaged over the video (`reward.per_frame`), as the Wan recipes. LTX-2 makes
the video's audio too; it rides along in the latents and is dropped before the reward (models/ltx2.py says how).

The FlowGRPO recipe takes X-GenGroup/Flow-Factory's LTX-2 GRPO LoRA configs (examples/grpo/lora/ltx2/t2av.yaml and
t2av_pickscore.yaml; CLAP/ImageBind and PickScore rewards there, OCR here): 512x768 (height x width), 121 frames at
24 fps, LoRA r64/a128 (on the video stream's projections here, where it targets all 28 of a block), 48 prompts x 16
videos, 24 rollout steps without CFG (its training guidance_scale 1; STG, modality guidance and rescale off),
coefficients-preserving transitions (its CPS) at noise level 0.8 on 3 steps among the first 10 (it draws the 3 from
steps 0-9 at random, here a window of 3 consecutive ones), clip 1e-4, advantages clipped to 5 and normalised over the
batch (global_std), no KL, lr 3e-4, weight decay 1e-4, two optimizer steps a step, activation checkpointing, 50
validation steps. Its EMA of the weights (`trainer.ema_decay`) is left off, and its evaluation CFG of 4 is not
taken: validation samples as the rollout does (rollout.guidance). Flow-Factory has no LTX-2 DiffusionNFT config: the
NFT recipe takes our Wan recipes' NFT settings (beta 0.1, kappa 1e-4, 4 training timesteps a step, one optimizer
step a step).
Sizes are the global batch; under torchrun each GPU takes its share. The text is the pipeline's 1024 tokens (a
multiple of its connectors' 128 registers, which fill the padding and are attended to: the length is not free).
"""

from omnialign.config import Config

NEGATIVE_PROMPT = "worst quality, inconsistent motion, blurry, jittery, distorted"
"""The negative prompt of `LTX2Pipeline`'s example (used only where rollout.guidance turns CFG on)."""


def ltx2_t2v_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on LTX-2 OCR per frame (Flow-Factory's LTX-2 GRPO LoRA config): LoRA r64/a128, 48 prompts x 16 videos
    of 768x512x121 without CFG, CPS at 0.8 on a window of 3 of the first 10 of 24 steps, clip 1e-4, lr 3e-4, two
    optimizer steps a step."""
    c = Config(name="ltx2_t2v_ocr_flowgrpo_lora", recipe="ltx2_t2v_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "ltx2", "models/LTX-2", "bfloat16"
    c.model.frames, c.model.text_tokens = 121, 1024
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 48
    c.data.val_seeds = 1
    c.rollout.n = 16
    c.rollout.steps, c.rollout.val_steps = 24, 50
    c.rollout.height, c.rollout.width = 512, 768
    c.rollout.guidance, c.rollout.negative_prompt = 1.0, NEGATIVE_PROMPT
    c.rollout.kind, c.rollout.eta = "cps", 0.8
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 3, 0, 10
    c.rollout.micro_batch_size = 4
    c.reward.weights = {"ocr": 1.0}
    c.reward.per_frame = {"ocr": "mean"}
    c.algorithm.clip_range = 1e-4
    c.algorithm.adv_clip = 5.0
    c.algorithm.global_std = True
    c.actor.lr, c.actor.weight_decay = 3e-4, 1e-4
    c.actor.micro_batch_size = 2
    c.actor.mini_batch_size = 384  # half the step's 768 videos: two optimizer steps, as the reference
    c.engine.activation_checkpointing = True
    c.trainer.total_steps = 1000
    c.trainer.val_every = 60
    c.trainer.save_every = 60
    return c


def ltx2_t2v_ocr_nft_lora() -> Config:
    """DiffusionNFT on LTX-2 OCR per frame (LoRA; the Wan recipes' NFT settings): 24-step ODE rollouts without CFG,
    beta 0.1, kappa 1e-4, 4 training timesteps a step, one optimizer step a step."""
    c = ltx2_t2v_ocr_flowgrpo_lora()
    c.name = c.recipe = "ltx2_t2v_ocr_nft_lora"
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_kappa = "nft", 0.1, 1e-4
    c.rollout.window_size = 0
    c.actor.mini_batch_size = None
    return c


RECIPES = {f.__name__: f for f in (ltx2_t2v_ocr_flowgrpo_lora, ltx2_t2v_ocr_nft_lora)}
