"""FLUX.2 text rendering recipes: FlowGRPO LoRA and its variants on FLUX.2-dev (`flux2_ocr_*`) and FLUX.2-klein
(`flux2_klein_ocr_*`).

Point `model.path` at a local pipeline folder and `data.prompts` / `data.val_prompts` at the parquet files of
`omnialign prepare ocr`; the reward is OCR of the quoted text. The base settings are Flow-Factory's FLUX.2 LoRA
examples (X-GenGroup/Flow-Factory examples/grpo/lora/flux2/t2i.yaml and flux2_klein/default.yaml): LoRA r64/a128 on
its FLUX.2 targets, 48 prompts x 16 images, one SDE step a sample in a window of the first steps, clip 1e-4,
advantages clipped to +-5 and normalised per group, no KL, lr 3e-4, two optimizer steps a step, validation and
checkpoints every 20 steps, the pipelines' 512 text tokens. Its EMA of the adapter (`trainer.ema_decay`) is left
off and its reward (CLIP and PickScore) is not ported: the reward is OCR, as in the FLUX.1 recipes. Validation draws
at the rollout size, not its 1024x1024.
Where Flow-Factory has no FLUX.2 example (GRPO-Guard, online DPO; DPPO and NFT on FLUX.2-dev), a variant makes the
edit our FLUX.1 variant makes (`recipes/flux.py`).

FLUX.2-dev (`flux2_ocr_*`, models/FLUX.2-dev): 512x512, 8 rollout steps (28 to validate), the embedded guidance 4.0
and no true CFG (the model is guidance-distilled, as FLUX.1-dev; Flow-Factory's guidance_scale 4 is the embedded
one), eta 1.0 on one of steps 1-3.

FLUX.2-klein (`flux2_klein_ocr_*`, models/FLUX.2-klein-4B, the distilled 4B): 384x384, 4 rollout steps (10 to
validate), no CFG (the distilled kleins' pipeline ignores guidance_scale), eta 0.5 on one of steps 1-2. Flow-Factory
runs the same settings on FLUX.2-klein-9B: `model.path=models/FLUX.2-klein-9B` (the adapter reads its sizes from the
folder). The base kleins (models/FLUX.2-klein-base-4B or -9B) take true CFG: Flow-Factory's flux2_klein_base example
adds `rollout.guidance=4 rollout.steps=8 rollout.val_steps=28 rollout.eta=0.7 rollout.window_end=4`.

Sizes are the global batch; under torchrun each GPU takes its share of the prompts.
"""

from omnialign.config import Config


def flux2_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on FLUX.2-dev OCR (Flow-Factory's grpo/lora/flux2/t2i.yaml): LoRA r64/a128, 48 prompts x 16 images
    at 512x512, 8 steps, embedded guidance 4.0, eta 1.0 on one SDE step in [1, 4), two optimizer steps."""
    c = Config(name="flux2_ocr_flowgrpo_lora", recipe="flux2_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "flux2", "models/FLUX.2-dev", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.model.text_tokens = 512  # the pipelines' max_sequence_length (their padding is attended to)
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 48
    c.data.val_seeds = 1
    c.rollout.n = 16
    c.rollout.steps, c.rollout.val_steps = 8, 28
    c.rollout.height = c.rollout.width = 512
    c.rollout.guidance = 1.0  # no true CFG: model.embedded_guidance (None: 4.0) steers instead
    c.rollout.kind, c.rollout.eta = "sde", 1.0
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 1, 1, 4  # its sde_steps [1, 2, 3]
    c.rollout.micro_batch_size = 16
    c.reward.weights = {"ocr": 1.0}
    c.algorithm.clip_range, c.algorithm.adv_clip, c.algorithm.kl_coef = 1e-4, 5.0, 0.0
    c.algorithm.global_std = False
    c.actor.lr = 3e-4
    c.actor.micro_batch_size = 8  # a 32 B transformer: half FLUX.1's 16 (6144 wide, 1536 tokens a sample)
    c.actor.mini_batch_size = 384  # half the step's 768 images: its two gradient steps
    c.engine.activation_checkpointing = True
    c.engine.compile = True
    c.engine.cudnn_attention = False  # attention and MLP concatenate inside the attention module (config docstring)
    c.trainer.total_steps = 1000
    c.trainer.val_every = 20
    c.trainer.save_every = 20
    return c


def _variant(base: Config, name: str) -> Config:
    base.name = base.recipe = name
    return base


def flux2_ocr_grpo_guard_lora() -> Config:
    """GRPO-Guard on FLUX.2-dev OCR (LoRA): FlowGRPO with ratio normalisation and step reweighting, clip 2e-5 as our
    FLUX.1 variant (Flow-Factory has no FLUX.2 GRPO-Guard example)."""
    c = _variant(flux2_ocr_flowgrpo_lora(), "flux2_ocr_grpo_guard_lora")
    c.algorithm.name, c.algorithm.clip_range = "grpo_guard", 2e-5
    return c


def flux2_ocr_dppo_lora() -> Config:
    """Flow-DPPO on FLUX.2-dev OCR (LoRA): the KL trust region (tau 1e-5, our FLUX.1 variant's) replaces ratio
    clipping."""
    c = _variant(flux2_ocr_flowgrpo_lora(), "flux2_ocr_dppo_lora")
    c.algorithm.name, c.algorithm.dppo_tau = "dppo", 1e-5
    return c


def flux2_ocr_nft_lora() -> Config:
    """DiffusionNFT on FLUX.2-dev OCR (LoRA), our FLUX.1 variant's settings: 24 prompts x 12 images, ODE rollout,
    beta 0.1, reference KL 1e-4, one optimizer step."""
    c = _variant(flux2_ocr_flowgrpo_lora(), "flux2_ocr_nft_lora")
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_kappa = "nft", 0.1, 1e-4
    c.data.prompts_per_step, c.rollout.n = 24, 12
    c.rollout.window_size = 0
    c.actor.mini_batch_size = None
    return c


def flux2_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on FLUX.2-dev OCR (LoRA), our FLUX.1 variant's settings: 16 samples per prompt, the best
    against the worst, beta 100, pairs in micro-batches of 8, one optimizer step."""
    c = _variant(flux2_ocr_flowgrpo_lora(), "flux2_ocr_online_dpo_lora")
    c.algorithm.name, c.algorithm.dpo_beta = "online_dpo", 100.0
    c.rollout.window_size = 0
    c.actor.micro_batch_size, c.actor.mini_batch_size = 8, None  # pairs
    return c


def _klein(base: Config, name: str) -> Config:
    """A FLUX.2-dev recipe moved to FLUX.2-klein-4B with Flow-Factory's grpo/lora/flux2_klein/default.yaml sampling:
    384x384, 4 steps (10 to validate), no CFG, eta 0.5 on one SDE step in [1, 3); a window the base recipe's
    algorithm has keeps its size. Twice the dev's micro-batches (a 4 B transformer)."""
    c = _variant(base, name)
    c.model.arch, c.model.path = "flux2_klein", "models/FLUX.2-klein-4B"
    c.rollout.height = c.rollout.width = 384
    c.rollout.steps, c.rollout.val_steps = 4, 10
    c.rollout.eta = 0.5
    if c.rollout.window_size:
        c.rollout.window_start, c.rollout.window_end = 1, 3  # its sde_steps [1, 2]
    c.actor.micro_batch_size *= 2
    return c


def flux2_klein_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on FLUX.2-klein-4B OCR (Flow-Factory's grpo/lora/flux2_klein/default.yaml): LoRA r64/a128, 48 prompts
    x 16 images at 384x384, 4 steps, no CFG, eta 0.5 on one SDE step in [1, 3), two optimizer steps. For the 9B:
    model.path=models/FLUX.2-klein-9B."""
    return _klein(flux2_ocr_flowgrpo_lora(), "flux2_klein_ocr_flowgrpo_lora")


def flux2_klein_ocr_grpo_guard_lora() -> Config:
    """GRPO-Guard on FLUX.2-klein-4B OCR (LoRA), clip 2e-5 (our FLUX.1 variant's)."""
    return _klein(flux2_ocr_grpo_guard_lora(), "flux2_klein_ocr_grpo_guard_lora")


def flux2_klein_ocr_dppo_lora() -> Config:
    """Flow-DPPO on FLUX.2-klein-4B OCR (LoRA), tau 1e-5 (our FLUX.1 variant's). Flow-Factory's DPPO example is for
    klein-base-9B on GenEval2 (14 CFG-free steps, a window of 3 in the first 6, threshold 1e-6 in its KL units):
    not ported to the 4-step distilled model."""
    return _klein(flux2_ocr_dppo_lora(), "flux2_klein_ocr_dppo_lora")


def flux2_klein_ocr_nft_lora() -> Config:
    """DiffusionNFT on FLUX.2-klein-4B OCR (LoRA), Flow-Factory's nft/lora/flux2_klein_base/default.yaml: 48 prompts
    x 16 images, ODE rollout without CFG, beta 0.1, 2 training timesteps, no KL, lr 1e-4, one optimizer step (its EMA
    old policy is our `old` adapter). Its 8 steps are the base model's: the distilled 4B keeps 4."""
    c = _klein(flux2_ocr_nft_lora(), "flux2_klein_ocr_nft_lora")
    c.data.prompts_per_step, c.rollout.n = 48, 16
    c.algorithm.nft_timesteps, c.algorithm.nft_kappa = 2, 0.0
    c.actor.lr = 1e-4
    return c


def flux2_klein_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on FLUX.2-klein-4B OCR (LoRA): the best and the worst of 16 images, beta 100 (our FLUX.1
    variant's)."""
    return _klein(flux2_ocr_online_dpo_lora(), "flux2_klein_ocr_online_dpo_lora")


RECIPES = {f.__name__: f for f in (
    flux2_ocr_flowgrpo_lora, flux2_ocr_grpo_guard_lora, flux2_ocr_dppo_lora, flux2_ocr_nft_lora,
    flux2_ocr_online_dpo_lora, flux2_klein_ocr_flowgrpo_lora, flux2_klein_ocr_grpo_guard_lora,
    flux2_klein_ocr_dppo_lora, flux2_klein_ocr_nft_lora, flux2_klein_ocr_online_dpo_lora,
)}  # fmt: skip
