"""Wan text-to-video text rendering: FlowGRPO (SDE and CPS), Flow-DPPO, DiffusionNFT and online Diffusion-DPO.

Point `model.path` at a local diffusers `WanPipeline` folder (the default is the Hub id's name under models/, e.g.
models/Wan2.1-T2V-1.3B-Diffusers) and `data.prompts` / `data.val_prompts` at the parquet files of `omnialign
prepare ocr`. The reward is OCR of the quoted text on every frame, averaged over the video (`reward.per_frame`),
so a recipe runs with no downloads; `reward.weights` / `reward.per_frame` swap in other rewards (docs/rewards.md).

Sizes: Wan 2.1 T2V 1.3B and 14B and Wan 2.2 T2V-A14B at 480p (832x480, 81 frames: 21 latent frames of 30x52
tokens, 32760 per video), Wan 2.2 TI2V-5B at its 704x1280, 121 frames (31 latent frames of 22x40). Sampling
follows the released configs: the pipeline's negative prompt (Wan's `sample_neg_prompt`), UMT5's 512 text tokens,
shift 3 and CFG 5 for Wan 2.1 at 480p, shift 12 and CFG 4 on the high-noise expert's steps and 3 on the low-noise
expert's (`rollout.guidance_2`, the pipeline's guidance_scale_2) for A14B, shift 5 and CFG 5 for TI2V-5B. The RL
settings follow Flow-GRPO's Wan 2.1 OCR run (20 rollout steps, lr 1e-4, clip 1e-3; that run used 416x240 at 33
frames, 4 videos per prompt and trained every step); here 8 videos per prompt, an SDE window of 2 steps in the
first half of the trajectory and 50 validation steps (the pipeline's default).

Wan 2.2 A14B trains only its high-noise expert (`transformer`, where sigma >= boundary_ratio 0.875); the recipes
put the SDE window's end at the last rollout step above that boundary for their shift (13 of 20 at shift 12).
DiffusionNFT and online DPO draw training timesteps from the whole schedule, below the boundary too, so A14B has
no NFT or online DPO recipe. Full fine-tuning of the 14B models needs its fp32 master weights and optimizer state
sharded over several GPUs (FSDP2 under torchrun). Sizes are the global batch; each GPU takes its share.
"""

from omnialign.config import Config
from omnialign.diffusion.sde import scheduler_sigma_min, sigma_schedule

NEGATIVE_PROMPT = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，"
    "残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，"
    "三条腿，背景人很多，倒着走"
)
"""Wan's `sample_neg_prompt` (its shared config), the negative prompt of the released sampling scripts."""

A14B_BOUNDARY = 0.875
"""Wan 2.2 T2V-A14B's `boundary_ratio`: its high-noise expert (the trained one) runs where sigma >= this."""


def high_noise_steps(steps: int, shift: float, boundary: float) -> int:
    """Rollout steps of the Wan schedule (`WanPolicy.schedule`) whose sigma is at or above `boundary`: the first
    ones, where Wan 2.2's high-noise expert runs (the adapter's test, on timesteps sigma * 1000)."""
    sigmas = sigma_schedule(steps, shift=shift, sigma_min=scheduler_sigma_min(shift))[:-1]
    return int((sigmas * 1000 >= boundary * 1000).sum())


def _wan(name: str, path: str, shift: float, guidance: float) -> Config:
    """FlowGRPO LoRA on Wan OCR at 832x480, 81 frames: r64/a128, 16 prompts x 8 videos, eta 0.7, window 2 in [0, 10)
    of 20 steps, OCR per frame."""
    c = Config(name=name, recipe=name)
    c.model.arch, c.model.path, c.model.dtype = "wan", path, "bfloat16"
    c.model.shift, c.model.frames, c.model.text_tokens = shift, 81, 512  # 512: UMT5's length in every Wan pipeline
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 16
    c.data.val_seeds = 1
    c.rollout.n = 8
    c.rollout.steps, c.rollout.val_steps = 20, 50
    c.rollout.height, c.rollout.width = 480, 832
    c.rollout.guidance, c.rollout.negative_prompt = guidance, NEGATIVE_PROMPT
    c.rollout.kind, c.rollout.eta = "sde", 0.7
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 2, 0, 10
    c.rollout.micro_batch_size = 4
    c.reward.weights = {"ocr": 1.0}
    c.reward.per_frame = {"ocr": "mean"}
    c.algorithm.clip_range = 1e-3
    c.actor.lr = 1e-4
    c.actor.micro_batch_size = 4
    c.engine.activation_checkpointing = True
    c.engine.compile = True  # regional compile: 1.3B's warm step at MFU 0.316 -> 0.511 on one H100 (BENCHMARKS.md)
    c.rollout.grad_graph = True  # the compiled update's own graph in rollout: the replay stays exact
    c.trainer.total_steps = 1000
    c.trainer.val_every = 50
    c.trainer.save_every = 50
    return c


def _large(c: Config) -> Config:
    """The larger runs (14B, A14B, TI2V-5B at 704x1280x121): 8 prompts x 8 videos a step, 2 videos per rollout
    forward and 1 per training forward: 2 (4 rows with CFG) ran the 14B out of an H200's 140 GB in the backward."""
    c.data.prompts_per_step = 8
    c.rollout.micro_batch_size, c.actor.micro_batch_size = 2, 1
    return c


def _variant(c: Config, name: str) -> Config:
    c.name = c.recipe = name
    return c


def _cps(c: Config, name: str) -> Config:
    """FlowGRPO with coefficients-preserving transitions (noise level 0.8, as Flow-GRPO's CPS runs)."""
    c = _variant(c, name)
    c.rollout.kind, c.rollout.eta = "cps", 0.8
    return c


def _dppo(c: Config, name: str) -> Config:
    """Flow-DPPO: the KL trust region replaces ratio clipping."""
    c = _variant(c, name)
    c.algorithm.name, c.algorithm.dppo_tau = "dppo", 1e-5
    return c


def _nft(c: Config, name: str) -> Config:
    """DiffusionNFT: CFG-free ODE rollout, 4 training timesteps of the schedule."""
    c = _variant(c, name)
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_kappa = "nft", 0.1, 1e-4
    c.rollout.guidance, c.rollout.window_size = 1.0, 0
    return c


def _online_dpo(c: Config, name: str) -> Config:
    """Online Diffusion-DPO: the best and the worst video of each prompt."""
    c = _variant(c, name)
    c.algorithm.name, c.algorithm.dpo_beta = "online_dpo", 100.0
    c.rollout.window_size = 0
    c.actor.micro_batch_size = max(1, c.actor.micro_batch_size // 2)  # pairs
    return c


def _full(c: Config, name: str) -> Config:
    """Full fine-tuning: lr 1e-5, fp32 master weights and optimizer state."""
    c = _variant(c, name)
    c.model.lora.rank = c.model.lora.alpha = 0
    c.actor.lr = 1e-5
    return c


# --------------------------------------------------------------------------- Wan 2.1 T2V 1.3B


def wan21_t2v_1_3b_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Wan 2.1 T2V 1.3B OCR per frame: LoRA r64/a128, 16 prompts x 8 videos of 832x480x81, CFG 5,
    shift 3, eta 0.7, window 2 in [0, 10) of 20 steps."""
    return _wan("wan21_t2v_1_3b_ocr_flowgrpo_lora", "models/Wan2.1-T2V-1.3B-Diffusers", shift=3.0, guidance=5.0)


def wan21_t2v_1_3b_ocr_flowgrpo_cps_lora() -> Config:
    """FlowGRPO-CPS on Wan 2.1 T2V 1.3B OCR (LoRA): coefficients-preserving transitions, eta 0.8."""
    return _cps(wan21_t2v_1_3b_ocr_flowgrpo_lora(), "wan21_t2v_1_3b_ocr_flowgrpo_cps_lora")


def wan21_t2v_1_3b_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Wan 2.1 T2V 1.3B OCR (LoRA): the KL trust region replaces ratio clipping."""
    return _dppo(wan21_t2v_1_3b_ocr_flowgrpo_lora(), "wan21_t2v_1_3b_ocr_dppo_lora")


def wan21_t2v_1_3b_ocr_nft_lora() -> Config:
    """DiffusionNFT on Wan 2.1 T2V 1.3B OCR (LoRA): CFG-free ODE rollout."""
    return _nft(wan21_t2v_1_3b_ocr_flowgrpo_lora(), "wan21_t2v_1_3b_ocr_nft_lora")


def wan21_t2v_1_3b_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Wan 2.1 T2V 1.3B OCR (LoRA): the best video of each prompt against the worst."""
    return _online_dpo(wan21_t2v_1_3b_ocr_flowgrpo_lora(), "wan21_t2v_1_3b_ocr_online_dpo_lora")


def wan21_t2v_1_3b_ocr_flowgrpo_full() -> Config:
    """FlowGRPO on Wan 2.1 T2V 1.3B OCR, full fine-tuning: lr 1e-5, fp32 master weights and optimizer state."""
    return _full(wan21_t2v_1_3b_ocr_flowgrpo_lora(), "wan21_t2v_1_3b_ocr_flowgrpo_full")


# --------------------------------------------------------------------------- Wan 2.1 T2V 14B


def wan21_t2v_14b_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Wan 2.1 T2V 14B OCR per frame: LoRA r64/a128, 8 prompts x 8 videos of 832x480x81, CFG 5, shift 3,
    eta 0.7, window 2 in [0, 10) of 20 steps."""
    c = _wan("wan21_t2v_14b_ocr_flowgrpo_lora", "models/Wan2.1-T2V-14B-Diffusers", shift=3.0, guidance=5.0)
    return _large(c)


def wan21_t2v_14b_ocr_flowgrpo_cps_lora() -> Config:
    """FlowGRPO-CPS on Wan 2.1 T2V 14B OCR (LoRA): coefficients-preserving transitions, eta 0.8."""
    return _cps(wan21_t2v_14b_ocr_flowgrpo_lora(), "wan21_t2v_14b_ocr_flowgrpo_cps_lora")


def wan21_t2v_14b_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Wan 2.1 T2V 14B OCR (LoRA): the KL trust region replaces ratio clipping."""
    return _dppo(wan21_t2v_14b_ocr_flowgrpo_lora(), "wan21_t2v_14b_ocr_dppo_lora")


def wan21_t2v_14b_ocr_nft_lora() -> Config:
    """DiffusionNFT on Wan 2.1 T2V 14B OCR (LoRA): CFG-free ODE rollout."""
    return _nft(wan21_t2v_14b_ocr_flowgrpo_lora(), "wan21_t2v_14b_ocr_nft_lora")


def wan21_t2v_14b_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Wan 2.1 T2V 14B OCR (LoRA): the best video of each prompt against the worst."""
    return _online_dpo(wan21_t2v_14b_ocr_flowgrpo_lora(), "wan21_t2v_14b_ocr_online_dpo_lora")


def wan21_t2v_14b_ocr_flowgrpo_full() -> Config:
    """FlowGRPO on Wan 2.1 T2V 14B OCR, full fine-tuning (lr 1e-5; shard it over several GPUs)."""
    return _full(wan21_t2v_14b_ocr_flowgrpo_lora(), "wan21_t2v_14b_ocr_flowgrpo_full")


# --------------------------------------------------------------------------- Wan 2.2 T2V-A14B (two experts)


def wan22_t2v_a14b_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Wan 2.2 T2V-A14B OCR per frame, training the high-noise expert: LoRA r64/a128, 8 prompts x 8
    videos of 832x480x81, CFG 4 on the high-noise expert's steps and 3 on the low-noise expert's (the released
    sample_guide_scale (3.0, 4.0)), shift 12, eta 0.7, window 2 in the 13 high-noise steps of 20."""
    c = _wan("wan22_t2v_a14b_ocr_flowgrpo_lora", "models/Wan2.2-T2V-A14B-Diffusers", shift=12.0, guidance=4.0)
    c.rollout.guidance_2 = 3.0
    c.rollout.window_end = high_noise_steps(c.rollout.steps, c.model.shift, A14B_BOUNDARY)
    return _large(c)


def wan22_t2v_a14b_ocr_flowgrpo_cps_lora() -> Config:
    """FlowGRPO-CPS on Wan 2.2 T2V-A14B OCR (LoRA, high-noise expert): coefficients-preserving transitions."""
    return _cps(wan22_t2v_a14b_ocr_flowgrpo_lora(), "wan22_t2v_a14b_ocr_flowgrpo_cps_lora")


def wan22_t2v_a14b_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Wan 2.2 T2V-A14B OCR (LoRA, high-noise expert): the KL trust region replaces ratio clipping."""
    return _dppo(wan22_t2v_a14b_ocr_flowgrpo_lora(), "wan22_t2v_a14b_ocr_dppo_lora")


def wan22_t2v_a14b_ocr_flowgrpo_full() -> Config:
    """FlowGRPO on Wan 2.2 T2V-A14B OCR, full fine-tuning of the high-noise expert (lr 1e-5; several GPUs)."""
    return _full(wan22_t2v_a14b_ocr_flowgrpo_lora(), "wan22_t2v_a14b_ocr_flowgrpo_full")


# --------------------------------------------------------------------------- Wan 2.2 TI2V-5B (text to video)


def wan22_ti2v_5b_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Wan 2.2 TI2V-5B text-to-video OCR per frame: LoRA r64/a128, 8 prompts x 8 videos of
    1280x704x121, CFG 5, shift 5, eta 0.7, window 2 in [0, 10) of 20 steps."""
    c = _wan("wan22_ti2v_5b_ocr_flowgrpo_lora", "models/Wan2.2-TI2V-5B-Diffusers", shift=5.0, guidance=5.0)
    c.model.frames = 121
    c.rollout.height, c.rollout.width = 704, 1280
    return _large(c)


def wan22_ti2v_5b_ocr_flowgrpo_cps_lora() -> Config:
    """FlowGRPO-CPS on Wan 2.2 TI2V-5B OCR (LoRA): coefficients-preserving transitions, eta 0.8."""
    return _cps(wan22_ti2v_5b_ocr_flowgrpo_lora(), "wan22_ti2v_5b_ocr_flowgrpo_cps_lora")


def wan22_ti2v_5b_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Wan 2.2 TI2V-5B OCR (LoRA): the KL trust region replaces ratio clipping."""
    return _dppo(wan22_ti2v_5b_ocr_flowgrpo_lora(), "wan22_ti2v_5b_ocr_dppo_lora")


def wan22_ti2v_5b_ocr_nft_lora() -> Config:
    """DiffusionNFT on Wan 2.2 TI2V-5B OCR (LoRA): CFG-free ODE rollout."""
    return _nft(wan22_ti2v_5b_ocr_flowgrpo_lora(), "wan22_ti2v_5b_ocr_nft_lora")


def wan22_ti2v_5b_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Wan 2.2 TI2V-5B OCR (LoRA): the best video of each prompt against the worst."""
    return _online_dpo(wan22_ti2v_5b_ocr_flowgrpo_lora(), "wan22_ti2v_5b_ocr_online_dpo_lora")


def wan22_ti2v_5b_ocr_flowgrpo_full() -> Config:
    """FlowGRPO on Wan 2.2 TI2V-5B OCR, full fine-tuning: lr 1e-5, fp32 master weights and optimizer state."""
    return _full(wan22_ti2v_5b_ocr_flowgrpo_lora(), "wan22_ti2v_5b_ocr_flowgrpo_full")


RECIPES = {f.__name__: f for f in (
    wan21_t2v_1_3b_ocr_flowgrpo_lora, wan21_t2v_1_3b_ocr_flowgrpo_cps_lora, wan21_t2v_1_3b_ocr_dppo_lora,
    wan21_t2v_1_3b_ocr_nft_lora, wan21_t2v_1_3b_ocr_online_dpo_lora, wan21_t2v_1_3b_ocr_flowgrpo_full,
    wan21_t2v_14b_ocr_flowgrpo_lora, wan21_t2v_14b_ocr_flowgrpo_cps_lora, wan21_t2v_14b_ocr_dppo_lora,
    wan21_t2v_14b_ocr_nft_lora, wan21_t2v_14b_ocr_online_dpo_lora, wan21_t2v_14b_ocr_flowgrpo_full,
    wan22_t2v_a14b_ocr_flowgrpo_lora, wan22_t2v_a14b_ocr_flowgrpo_cps_lora, wan22_t2v_a14b_ocr_dppo_lora,
    wan22_t2v_a14b_ocr_flowgrpo_full,
    wan22_ti2v_5b_ocr_flowgrpo_lora, wan22_ti2v_5b_ocr_flowgrpo_cps_lora, wan22_ti2v_5b_ocr_dppo_lora,
    wan22_ti2v_5b_ocr_nft_lora, wan22_ti2v_5b_ocr_online_dpo_lora, wan22_ti2v_5b_ocr_flowgrpo_full,
)}  # fmt: skip
