"""Qwen-Image text-rendering recipes mirroring the published FlowGRPO family (512x512, 10 rollout steps).

Point `model.path` at a local Qwen-Image pipeline folder and `data.prompts` / `data.val_prompts` at
the parquet files of `omnialign prepare ocr` (the public OCR prompt set). The reward is OCR of the
quoted text (`ocr`, Tesseract; `reward.weights={"ocr_vlm": 1}` with `reward.options` uses a VLM
behind an OpenAI-compatible endpoint). Sizes are the global batch; under torchrun each GPU takes
its share of the prompts.

The `qwen_image_edit_*` recipes are their Qwen-Image-Edit twins: `model.path` a Qwen-Image-Edit, -2509 or -2511
pipeline folder, the data an edit prompt parquet of `omnialign prepare edit` (instruction, source images stored
at the rollout size with `--size 512x512`, `target_text`), the reward OCR of the requested text (`ocr_edit`; add
`pixel_preservation` or the VLM edit judges with `reward.weights`).
"""

from omnialign.config import Config


def qwen_image_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Qwen-Image OCR: LoRA r64/a128, 32 prompts x 16 images, true CFG 4, eta 1.2, window 2 in [0, 5)."""
    c = Config(name="qwen_image_ocr_flowgrpo_lora", recipe="qwen_image_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "qwen_image", "models/Qwen-Image", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 32
    c.data.val_seeds = 1
    c.rollout.n = 16
    c.rollout.steps, c.rollout.val_steps = 10, 50
    c.rollout.height = c.rollout.width = 512
    c.rollout.guidance, c.rollout.cfg_rescale, c.rollout.negative_prompt = 4.0, True, " "
    c.rollout.kind, c.rollout.eta = "sde", 1.2
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 2, 0, 5
    c.rollout.micro_batch_size = 16
    c.reward.weights = {"ocr": 1.0}
    c.algorithm.clip_range = 1e-5
    c.actor.lr = 3e-4
    c.actor.micro_batch_size = 16
    c.engine.activation_checkpointing = True
    c.engine.compile = True  # regional compile: 0.62 -> 0.84 images/GPU/s on one H200 (BENCHMARKS.md)
    c.trainer.total_steps = 1000
    c.trainer.val_every = 50
    c.trainer.save_every = 50
    return c


def qwen_image_ocr_flowgrpo_full() -> Config:
    """FlowGRPO on Qwen-Image OCR, full fine-tuning: no CFG, lr 3e-5, fp32 master weights and optimizer state."""
    c = qwen_image_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_ocr_flowgrpo_full"
    c.model.lora.rank = c.model.lora.alpha = 0
    c.rollout.guidance, c.rollout.cfg_rescale = 1.0, False
    c.actor.lr = 3e-5
    return c


def qwen_image_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Qwen-Image OCR (LoRA): the KL trust region replaces ratio clipping."""
    c = qwen_image_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_ocr_dppo_lora"
    c.algorithm.name, c.algorithm.dppo_tau = "dppo", 1e-5
    return c


def qwen_image_ocr_nft_lora() -> Config:
    """DiffusionNFT on Qwen-Image OCR (LoRA): 24 prompts x 12 images, CFG-free ODE rollout."""
    c = qwen_image_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_ocr_nft_lora"
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_kappa = "nft", 0.1, 1e-4
    c.data.prompts_per_step, c.rollout.n = 24, 12
    c.rollout.guidance, c.rollout.cfg_rescale, c.rollout.window_size = 1.0, False, 0
    c.actor.micro_batch_size = 12
    return c


def qwen_image_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Qwen-Image OCR (LoRA): 16 samples per prompt, top against bottom."""
    c = qwen_image_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_ocr_online_dpo_lora"
    c.algorithm.name, c.algorithm.dpo_beta = "online_dpo", 100.0
    c.rollout.window_size = 0
    c.actor.micro_batch_size = 8  # pairs
    return c


def qwen_image_ocr_tempflow_lora() -> Config:
    """TempFlow-GRPO on Qwen-Image OCR (Shredded-Pork/TempFlow-GRPO config/dgx.py:pickscore_qwenimage_pr, a PickScore
    run): 48 prompts x 4 ODE trunks of 10 steps (50 to validate) at true CFG 4 (rescaled, negative prompt " "), each
    trunk its own group; at each of steps 0-8, 6 SDE transitions (eta 1.2) leave the trunk's state, each finished by
    the ODE: 54 images and rows a trunk, 10368 a step (the reference's 48 GPUs x 4 trunks an epoch), two optimizer
    steps of 5184 rows; LoRA r64/a128, clip 1e-4, no KL (its beta 0), lr 3e-4, 250 steps (its epochs)."""
    c = qwen_image_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_ocr_tempflow_lora"
    c.algorithm.name = "tempflow"
    c.data.prompts_per_step, c.rollout.n = 48, 4  # 4 trunks a prompt: the rows of a (trunk, step) are a group
    c.rollout.kind, c.rollout.eta, c.rollout.steps = "sde", 1.2, 10  # its weight 1.53 = 1 / mean std at eta 1.2
    c.rollout.branches, c.rollout.branch_steps = 6, None  # every step but the last
    c.rollout.window_size = 0
    c.algorithm.clip_range, c.algorithm.kl_coef = 1e-4, 0.0
    c.actor.mini_batch_size = 5184
    c.trainer.total_steps = 250
    return c


def _edit(c: Config, name: str) -> Config:
    """A Qwen-Image OCR recipe as its Qwen-Image-Edit twin: edits of source images, sources used at their size."""
    c.name = c.recipe = name
    c.model.arch, c.model.path = "qwen_image_edit", "models/Qwen-Image-Edit-2509"
    c.model.source_resize = False  # sources stored at 512x512: 1024 source tokens per image instead of 4096
    c.data.prompts, c.data.val_prompts = "data/edit/train.parquet", "data/edit/test.parquet"
    c.reward.weights = {"ocr_edit": 1.0}
    return c


def qwen_image_edit_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on Qwen-Image-Edit: render the requested text into the source image (LoRA, true CFG 4)."""
    return _edit(qwen_image_ocr_flowgrpo_lora(), "qwen_image_edit_ocr_flowgrpo_lora")


def qwen_image_edit_ocr_dppo_lora() -> Config:
    """Flow-DPPO on Qwen-Image-Edit (LoRA): the KL trust region replaces ratio clipping."""
    return _edit(qwen_image_ocr_dppo_lora(), "qwen_image_edit_ocr_dppo_lora")


def qwen_image_edit_ocr_nft_lora() -> Config:
    """DiffusionNFT on Qwen-Image-Edit (LoRA): 24 prompts x 12 edits, CFG-free ODE rollout."""
    return _edit(qwen_image_ocr_nft_lora(), "qwen_image_edit_ocr_nft_lora")


def qwen_image_edit_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on Qwen-Image-Edit (LoRA): the best edit of each source against the worst."""
    return _edit(qwen_image_ocr_online_dpo_lora(), "qwen_image_edit_ocr_online_dpo_lora")


def qwen_image_edit_ocr_grpo_guard_lora() -> Config:
    """GRPO-Guard on Qwen-Image-Edit (LoRA): FlowGRPO with ratio normalisation and step reweighting."""
    c = qwen_image_edit_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_edit_ocr_grpo_guard_lora"
    c.algorithm.name = "grpo_guard"
    return c


def qwen_image_edit_ocr_mixgrpo_lora() -> Config:
    """MixGRPO on Qwen-Image-Edit (LoRA): one SDE window for the whole batch, sliding one step toward the image
    every 25 steps through [0, 5), ODE elsewhere."""
    c = qwen_image_edit_ocr_flowgrpo_lora()
    c.name = c.recipe = "qwen_image_edit_ocr_mixgrpo_lora"
    c.rollout.window_schedule, c.rollout.window_shift_every = "progressive", 25
    return c


EDIT_RECIPES = {
    f.__name__: f
    for f in (qwen_image_edit_ocr_flowgrpo_lora, qwen_image_edit_ocr_dppo_lora, qwen_image_edit_ocr_nft_lora,
              qwen_image_edit_ocr_online_dpo_lora, qwen_image_edit_ocr_grpo_guard_lora,
              qwen_image_edit_ocr_mixgrpo_lora)
}  # fmt: skip
