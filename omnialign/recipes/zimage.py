"""Z-Image and Z-Image-Turbo text rendering recipes (`model.arch=zimage`): FlowGRPO LoRA and its variants on Z-Image,
DiffusionNFT and AWM on Z-Image-Turbo.

Point `model.path` at a local Tongyi-MAI/Z-Image (or Z-Image-Turbo) pipeline folder and `data.prompts` /
`data.val_prompts` at the parquet files of `omnialign prepare ocr`; the reward is OCR of the quoted text. Sizes are
the global batch; under torchrun each GPU takes its share of the prompts.

Z-Image (`zimage_ocr_*`) takes X-GenGroup/Flow-Factory's Z-Image configs (examples/grpo/lora/z_image/default.yaml,
examples/nft/lora/z_image/default.yaml, PickScore runs; OCR here): 512x512, LoRA r64/a128 on its 7 projections of
every block, 48 prompts x 16 images, 10 steps (40 to validate) at CFG 4 in the pipeline's convention (its
guidance_scale and the model card's 4; rollout.guidance = 1 + 4 here, see models/zimage.py), the scheduler's shift 6,
lr 3e-4, advantages normalised per group (its global_std false), no KL. FlowGRPO: SDE (eta 0.7, its noise level) on
one step drawn from steps 1-3 (its sde_steps), clip 1e-4, two optimizer steps a step. Its EMA of the weights (an
evaluation copy, `trainer.ema_decay`) is left off. The variants' own settings come from our FLUX.1 recipes where
Flow-Factory has no Z-Image config (GRPO-Guard, Flow-DPPO, online DPO). 128 text tokens: exact while a prompt fits
(Z-Image drops the padding; the pipeline's 512 would only cost text encoder work). Regional compilation is off: the
transformer's sequence length follows the captions' (a multiple of 32 per caption, the longest of a batch), so
compiled blocks would recompile for each new length.

Z-Image-Turbo (`zimage_turbo_ocr_*`) is distilled (Decoupled-DMD, then DMDR) to sample in 8 steps at shift 3 without
CFG: its network makes the 8 jumps of that Euler schedule (sigma 1, 0.95, 0.90, 0.83, 0.75, 0.64, 0.5, 0.3, then
0); it is not the flow field of the data at every noise level. It gets recipes only for the algorithms that train
without a per-step log-probability:
- DiffusionNFT and AWM noise the clean rollout images by the forward process at noise levels of the rollout
  schedule (here the 8 the model was distilled at) and train a flow-matching objective weighted by the reward; the
  rollout is any solver's, here the plain 8-step ODE the model was made for, so the images scored are the model's
  own samples.
- The FlowGRPO family (GRPO-Guard, Flow-DPPO, MixGRPO, GARDO, TempFlow-GRPO, BranchGRPO) trains on the log-prob of
  noisy transitions, and an 8-step ODE has none: the noise must be injected at some of the 8 steps. There each step
  spans a large interval (the last jumps from 0.3 to 0), so a transition's noise is a large share of what remains
  to denoise, with few steps left to absorb it; and the SDE's drift correction, which keeps each step's marginal
  only when the network's velocity is the data's flow field, relies on exactly what distillation gave up. The
  rollouts then drift off the images the model makes, and the reward scores those. (Flow-Factory does ship a FlowGRPO
  config for Turbo, SDE on one of steps 1-3 of 6; `zimage_ocr_flowgrpo_lora model.path=models/Z-Image-Turbo
  rollout.guidance=1 rollout.steps=8` runs that experiment.)
Online Diffusion-DPO trains on the forward process too (ODE rollouts, one pair per prompt) and would suit; it has no
Turbo reference setting, so no recipe: `zimage_ocr_online_dpo_lora` with the Turbo overrides above runs it.
Validation takes 9 steps, the model card's pipeline call.
"""

from omnialign.config import Config


def zimage_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Z-Image OCR (Flow-Factory's Z-Image GRPO LoRA config): LoRA r64/a128, 48 prompts x 16 images, CFG
    4 (rollout.guidance 5), eta 0.7 on one SDE step in [1, 4) of 10, clip 1e-4, lr 3e-4, two optimizer steps a step."""
    c = Config(name="zimage_ocr_flowgrpo_lora", recipe="zimage_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "zimage", "models/Z-Image", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.model.text_tokens = 128
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 48
    c.data.val_seeds = 1
    c.rollout.n = 16
    c.rollout.steps, c.rollout.val_steps = 10, 40
    c.rollout.height = c.rollout.width = 512
    c.rollout.guidance = 5.0  # the pipeline's guidance_scale 4: pos + 4 (pos - neg)
    c.rollout.kind, c.rollout.eta = "sde", 0.7
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 1, 1, 4
    c.rollout.micro_batch_size = 16
    c.reward.weights = {"ocr": 1.0}
    c.algorithm.clip_range = 1e-4
    c.algorithm.global_std = False
    c.actor.lr = 3e-4
    c.actor.micro_batch_size = 16
    c.actor.mini_batch_size = 384  # half the step's 768 images: two optimizer steps, as the reference
    c.engine.activation_checkpointing = True
    c.trainer.total_steps = 1000
    c.trainer.val_every = 40
    c.trainer.save_every = 40
    return c


def _variant(base: Config, name: str) -> Config:
    base.name = base.recipe = name
    return base


def zimage_ocr_grpo_guard_lora() -> Config:
    """GRPO-Guard on Z-Image OCR (LoRA): FlowGRPO with ratio normalisation and step reweighting, twice the clip range
    (as flux_ocr_grpo_guard_lora)."""
    c = _variant(zimage_ocr_flowgrpo_lora(), "zimage_ocr_grpo_guard_lora")
    c.algorithm.name, c.algorithm.clip_range = "grpo_guard", 2e-4
    return c


def zimage_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Z-Image OCR (LoRA): the KL trust region (tau 1e-5, as flux_ocr_dppo_lora) replaces ratio
    clipping."""
    c = _variant(zimage_ocr_flowgrpo_lora(), "zimage_ocr_dppo_lora")
    c.algorithm.name, c.algorithm.dppo_tau = "dppo", 1e-5
    return c


def zimage_ocr_nft_lora() -> Config:
    """DiffusionNFT on Z-Image OCR (Flow-Factory's Z-Image NFT LoRA config): 48 prompts x 16 images of a 10-step ODE
    at CFG 4, beta 0.1, 2 training noise levels a step (its 2; drawn from the whole schedule, where it draws from the
    noisier half), no KL, one optimizer step a step."""
    c = _variant(zimage_ocr_flowgrpo_lora(), "zimage_ocr_nft_lora")
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_timesteps = "nft", 0.1, 2
    c.rollout.window_size = 0
    c.actor.mini_batch_size = None
    return c


def zimage_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Z-Image OCR (LoRA; flux_ocr_online_dpo_lora's settings): the best against the worst of
    each prompt's 16 ODE samples, beta 100, one optimizer step a step."""
    c = _variant(zimage_ocr_flowgrpo_lora(), "zimage_ocr_online_dpo_lora")
    c.algorithm.name, c.algorithm.dpo_beta = "online_dpo", 100.0
    c.rollout.window_size = 0
    c.actor.micro_batch_size, c.actor.mini_batch_size = 8, None  # pairs
    return c


def _turbo(base: Config, name: str) -> Config:
    """A Z-Image recipe moved to Z-Image-Turbo: its folder (the scheduler's shift 3), the distilled 8 steps without
    CFG, 9 to validate (the model card's call)."""
    c = _variant(base, name)
    c.model.path = "models/Z-Image-Turbo"
    c.rollout.guidance = 1.0  # the pipeline's guidance_scale 0: no CFG
    c.rollout.steps, c.rollout.val_steps = 8, 9
    return c


def zimage_turbo_ocr_nft_lora() -> Config:
    """DiffusionNFT on Z-Image-Turbo OCR (Flow-Factory's Turbo NFT config, LoRA r64/a128 and lr 3e-4 of its Z-Image
    LoRA config where it fine-tunes every weight at 1e-5): 48 prompts x 16 images of the 8-step ODE, beta 0.1, 3 of
    the 8 noise levels a step, advantages normalised over the batch (its global_std true)."""
    c = _turbo(zimage_ocr_nft_lora(), "zimage_turbo_ocr_nft_lora")
    c.algorithm.nft_timesteps = 3
    c.algorithm.global_std = True
    return c


def zimage_turbo_ocr_awm_lora() -> Config:
    """AWM on Z-Image-Turbo OCR (Flow-Factory's AWM settings, examples/awm/lora/flux1/default.yaml, as
    flux_ocr_awm_lora): 48 prompts x 16 images of the 8-step ODE, 4 noise levels (one per stratum of steps 1-7),
    ghuber 0.25, clip 1, advantages clipped to +-1 and normalised over the batch, no KL (its EMA-policy KL is not
    implemented), one optimizer step a step."""
    c = _turbo(zimage_ocr_flowgrpo_lora(), "zimage_turbo_ocr_awm_lora")
    c.algorithm.name = "awm"
    c.rollout.window_size = 0
    c.algorithm.awm_timesteps = 4
    c.algorithm.awm_weighting, c.algorithm.awm_power = "ghuber", 0.25
    c.algorithm.clip_range, c.algorithm.adv_clip = 1.0, 1.0
    c.algorithm.global_std = True
    c.actor.mini_batch_size = None
    return c


RECIPES = {f.__name__: f for f in (
    zimage_ocr_flowgrpo_lora, zimage_ocr_grpo_guard_lora, zimage_ocr_dppo_lora, zimage_ocr_nft_lora,
    zimage_ocr_online_dpo_lora, zimage_turbo_ocr_nft_lora, zimage_turbo_ocr_awm_lora,
)}  # fmt: skip
