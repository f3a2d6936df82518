"""FLUX.1-dev text rendering and FLUX.1-Kontext editing recipes: FlowGRPO LoRA and its algorithm variants (AWM,
GARDO, TempFlow-GRPO and BranchGRPO on FLUX.1-dev only, where their references run).

FLUX.1-dev (`flux_ocr_*`): point `model.path` at a local FLUX.1-dev pipeline folder and `data.prompts` /
`data.val_prompts` at the parquet files of `omnialign prepare ocr`; the reward is OCR of the quoted text.
The settings follow Flow-GRPO's FLUX runs: 512x512, 6 rollout steps (28 to validate), the embedded guidance
3.5 and no true CFG (the model is guidance-distilled), 128 T5 tokens, LoRA r64/a128 on its 13 projections.

FLUX.1-Kontext (`flux_kontext_edit_*`): `model.path` is a FLUX.1-Kontext-dev folder and the prompts are
edit instructions with one source image each and the text to render, the parquet files of `omnialign prepare
edit` with the sources stored at the rollout size (`--size 512x512`). The recipes use them at that size
(`model.source_resize=false`: 1024 source tokens beside the image's 1024; the pipeline's default resize to
about 1 MP would make them 4096). The reward is OCR of the requested text (`ocr_edit`); add
`pixel_preservation` or the VLM edit judges with `reward.weights` (docs/rewards.md) to also reward keeping the
source. Embedded guidance 2.5, as the model card and Flow-GRPO's Kontext run.

Sizes are the global batch; under torchrun each GPU takes its share of the prompts.
"""

from omnialign.config import Config


def flux_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on FLUX.1-dev OCR: LoRA r64/a128, 32 prompts x 16 images, embedded guidance 3.5, eta 0.9,
    window 2 in [0, 3) of 6 steps."""
    c = Config(name="flux_ocr_flowgrpo_lora", recipe="flux_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "flux", "models/FLUX.1-dev", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.model.text_tokens = 128  # Flow-GRPO's FLUX length: the OCR prompts fit (the pipelines' default is 512)
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 32
    c.data.val_seeds = 1
    c.rollout.n = 16
    c.rollout.steps, c.rollout.val_steps = 6, 28
    c.rollout.height = c.rollout.width = 512
    c.rollout.guidance = 1.0  # no true CFG: model.embedded_guidance (None: 3.5) steers instead
    c.rollout.kind, c.rollout.eta = "sde", 0.9
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 2, 0, 3
    c.rollout.micro_batch_size = 16
    c.reward.weights = {"ocr": 1.0}
    c.algorithm.clip_range = 1e-5
    c.actor.lr = 3e-4
    c.actor.micro_batch_size = 16
    c.engine.activation_checkpointing = True
    c.engine.compile = True
    c.trainer.total_steps = 1000
    c.trainer.val_every = 50
    c.trainer.save_every = 50
    return c


def _variant(base: Config, name: str) -> Config:
    base.name = base.recipe = name
    return base


def flux_ocr_dance_lora() -> Config:
    """DanceGRPO on FLUX.1-dev OCR (XueZeyue/DanceGRPO scripts/finetune/finetune_flux_grpo.sh, an HPSv2 run): 12 images
    a prompt from one shared initial noise, its Dance SDE (eta 0.3) at static shift 3 over 16 steps, 9 of the first
    15 trained (its timestep_fraction 0.6 with ignore_last), clip 1e-4, advantages clipped to +-5, no KL. Ours: OCR for
    HPSv2, the base's LoRA r64/a128 at lr 3e-4 where it fine-tunes every weight at lr 1e-5, 512x512 where it renders
    720x720, and the 9 steps a contiguous window with ODE steps around it, where it samples every step by the SDE
    and trains a random subset (the same forwards and trained rows a step). BranchGRPO's speed claim is against it."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_dance_lora")
    c.model.shift = 3.0
    c.rollout.n, c.rollout.steps = 12, 16
    c.rollout.kind, c.rollout.eta, c.rollout.shared_init_noise = "dance", 0.3, True
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 9, 0, 15
    c.rollout.micro_batch_size = c.actor.micro_batch_size = 12
    c.algorithm.clip_range, c.algorithm.adv_clip, c.algorithm.kl_coef = 1e-4, 5.0, 0.0
    return c


def flux_ocr_grpo_guard_lora() -> Config:
    """GRPO-Guard on FLUX.1-dev OCR (LoRA): FlowGRPO with ratio normalisation and step reweighting."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_grpo_guard_lora")
    c.algorithm.name, c.algorithm.clip_range = "grpo_guard", 2e-5
    return c


def flux_ocr_mixgrpo_lora() -> Config:
    """MixGRPO on FLUX.1-dev OCR (LoRA): one SDE window for the whole batch, sliding over the 6 steps."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_mixgrpo_lora")
    c.rollout.window_end = None
    c.rollout.window_schedule, c.rollout.window_shift_every = "progressive", 25
    return c


def flux_ocr_dppo_lora() -> Config:
    """Flow-DPPO on FLUX.1-dev OCR (LoRA): the KL trust region replaces ratio clipping."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_dppo_lora")
    c.algorithm.name, c.algorithm.dppo_tau = "dppo", 1e-5
    return c


def flux_ocr_nft_lora() -> Config:
    """DiffusionNFT on FLUX.1-dev OCR (LoRA): 24 prompts x 12 images, ODE rollout."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_nft_lora")
    c.algorithm.name, c.algorithm.nft_beta, c.algorithm.nft_kappa = "nft", 0.1, 1e-4
    c.data.prompts_per_step, c.rollout.n = 24, 12
    c.rollout.window_size = 0
    c.actor.micro_batch_size = 12
    return c


def flux_ocr_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on FLUX.1-dev OCR (LoRA): 16 samples per prompt, top against bottom."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_online_dpo_lora")
    c.algorithm.name, c.algorithm.dpo_beta = "online_dpo", 100.0
    c.rollout.window_size = 0
    c.actor.micro_batch_size = 8  # pairs
    return c


def flux_ocr_awm_lora() -> Config:
    """AWM on FLUX.1-dev OCR (X-GenGroup/Flow-Factory examples/awm/lora/flux1/default.yaml, a PickScore run): 48
    prompts x 16 images of a 10-step ODE, 4 noise levels, ghuber 0.25, clip 1, advantages clipped to +-1, no
    reference KL (its EMA-policy KL 0.1 is not implemented), lr 3e-4."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_awm_lora")
    c.algorithm.name = "awm"
    c.data.prompts_per_step = 48
    c.rollout.steps, c.rollout.window_size = 10, 0
    c.algorithm.awm_timesteps = 4  # one per stratum of steps 1-9 (the reference: of steps 0-6, sigma >= 0.3)
    c.algorithm.awm_weighting, c.algorithm.awm_power = "ghuber", 0.25
    c.algorithm.clip_range, c.algorithm.adv_clip = 1.0, 1.0
    c.algorithm.kl_coef = 0.0
    return c


def flux_ocr_gardo_lora() -> Config:
    """GARDO on FLUX.1-dev OCR (tinnerhrhe/GARDO config/gardo.py:hps_flux, its HPS proxy replaced by OCR): 48
    prompts x 24 images, SDE (eta 0.9) on the first 4 of 6 steps, all trained, clip 1e-4; aesthetic and ImageReward
    ranked beside OCR (weight 0); KL 1.3e-3 on the most uncertain tenth, reference refreshed past 2.3e-3 or after 16
    steps (its 0.01 and 3e-4 at those steps' mean |dt| 0.13); two optimizer steps a step, no std in the advantages.
    Set the two auxiliary models' paths in reward.options."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_gardo_lora")
    c.algorithm.name = "gardo"
    c.data.prompts_per_step, c.rollout.n = 48, 24
    c.rollout.window_size, c.rollout.window_end = 4, 4
    c.rollout.micro_batch_size, c.actor.micro_batch_size = 24, 12
    c.actor.mini_batch_size = 576  # half the step's 1152 images: two optimizer steps, as the reference
    c.reward.weights = {"ocr": 1.0, "aesthetic": 0.0, "image_reward": 0.0}
    c.reward.options = {"aesthetic": {"path": "models/clip-vit-large-patch14",
                                      "head": "models/aesthetic/sac+logos+ava1-l14-linearMSE.pth"},
                        "image_reward": {"path": "models/image-reward"}}  # fmt: skip
    c.algorithm.gardo_auxiliary = ["aesthetic", "image_reward"]
    c.algorithm.clip_range = 1e-4
    c.algorithm.kl_coef = 1.3e-3
    c.algorithm.gardo_share = 0.1
    c.algorithm.gardo_kl_threshold = 2.3e-3
    c.algorithm.ref_update_every = 16
    c.algorithm.norm_by_std = False
    return c


def flux_ocr_tempflow_lora() -> Config:
    """TempFlow-GRPO on FLUX.1-dev OCR (Shredded-Pork/TempFlow-GRPO config/dgx.py:flux_pr, an HPSv3 run): 1024x1024,
    48 prompts x 4 ODE trunks of 10 steps (50 to validate) at embedded guidance 3.5, each trunk its own group; at
    each of steps 0-8, 6 SDE transitions (eta 0.9) leave the trunk's state, each finished by the ODE: 54 images and
    rows a trunk, 10368 a step (the reference's 48 GPUs x 4 trunks an epoch), two optimizer steps of 5184 rows;
    LoRA r32/a64, clip 1e-4, KL 0.004 (its beta: the same exact Gaussian KL as ours), lr 3e-4, 250 steps (its
    epochs). Micro-batches of 4, the base's 16 at 512x512 in tokens. Its EMA of the adapter is
    `trainer.ema_decay`, left off."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_tempflow_lora")
    c.algorithm.name = "tempflow"
    c.model.lora.rank, c.model.lora.alpha = 32, 64
    c.data.prompts_per_step, c.rollout.n = 48, 4  # 4 trunks a prompt: the rows of a (trunk, step) are a group
    c.rollout.height = c.rollout.width = 1024
    c.rollout.steps, c.rollout.val_steps = 10, 50
    c.rollout.kind, c.rollout.eta = "sde", 0.9  # FLUX's, per the reference's comment; its weight 1.73 = 1 / mean std
    c.rollout.branches, c.rollout.branch_steps = 6, None  # every step but the last
    c.rollout.window_size = 0
    c.rollout.micro_batch_size = c.actor.micro_batch_size = 4
    c.algorithm.clip_range, c.algorithm.kl_coef = 1e-4, 0.004
    c.actor.mini_batch_size = 5184
    c.trainer.total_steps = 250
    return c


def flux_ocr_branchgrpo_lora() -> Config:
    """BranchGRPO on FLUX.1-dev OCR (Fredreic1849/BranchGRPO scripts/finetune/finetune_flux_branchgrpo_8gpus.sh, an
    HPSv2.1 run): 16 prompts a step (its 2 trees per GPU x 8 GPUs), one tree each: Dance SDE (eta 0.3) on all 20
    steps at its static shift 3 (28 ODE steps to validate), splitting in two at steps 0, 3, 6 and 9: 16 leaves, 218
    edges a tree, 3488 rows a step in one optimizer step; clip 1e-3, advantages clipped to +-5, no KL, mean
    fusion, no pruning, 300 steps (its iterations). Ours: OCR for HPSv2.1, the base's LoRA r64/a128 at lr 3e-4 where
    the reference fine-tunes every weight at lr 1e-5, the base's 512x512 where it renders 720x720 (2025 tokens a
    sample against 1024; `rollout.height=rollout.width=720` for its size). Micro-batches of 16 rows, FlowGRPO's at
    512x512, where the reference's 4 divide each of its 8 GPUs' 436 rows (109 is prime): passes of 2 or 4 rows cost
    more than their arithmetic (BENCHMARKS.md, BranchGRPO against DanceGRPO).
    Split noise 1 (ours), not its 4: with 1 each stored log-prob is the density its sample was drawn from, where its
    split children are drawn 4x wider than the std that scores them (and their log-prob gradient is 4x larger); on
    glyphs its Dance eta 0.3 with 4x split noise stayed flat over 100 steps (BENCHMARKS.md "BranchGRPO on glyphs").
    `rollout.split_noise_scale=4` reproduces it. Its depth-pruned row (DepPru) has no recipe: the depths it pruned
    are not published as a fixed set (its launcher's sliding window is not implemented here)."""
    c = _variant(flux_ocr_flowgrpo_lora(), "flux_ocr_branchgrpo_lora")
    c.algorithm.name = "branchgrpo"
    c.model.shift = 3.0  # the reference's static sd3_time_shift (the base: FLUX's dynamic shift, 1.88 at 512x512)
    c.data.prompts_per_step, c.rollout.n = 16, 1  # one tree per prompt: its depths are the groups
    c.rollout.steps = 20
    c.rollout.kind, c.rollout.eta = "dance", 0.3
    c.rollout.split_steps, c.rollout.split_factor, c.rollout.split_noise_scale = [0, 3, 6, 9], 2, 1.0
    c.rollout.window_size, c.rollout.window_end = 0, None  # every edge of the tree is an SDE row
    c.algorithm.clip_range, c.algorithm.adv_clip, c.algorithm.kl_coef = 1e-3, 5.0, 0.0
    c.actor.micro_batch_size, c.actor.mini_batch_size = 16, None
    c.trainer.total_steps = 300
    return c


def _kontext(base: Config, name: str) -> Config:
    """A FLUX.1-dev OCR recipe moved to FLUX.1-Kontext text editing: the same algorithm settings, edit prompts of
    512x512 sources, the `ocr_edit` reward, half the micro-batches (a sample carries its source's tokens too)."""
    c = _variant(base, name)
    c.model.arch, c.model.path = "flux_kontext", "models/FLUX.1-Kontext-dev"
    c.model.source_resize = False  # sources stored at 512x512 (prepare edit --size): 1024 tokens, not 4096
    c.data.prompts, c.data.val_prompts = "data/edit/train.parquet", "data/edit/test.parquet"
    c.reward.weights = {"ocr_edit": 1.0}
    c.actor.micro_batch_size //= 2
    c.rollout.micro_batch_size //= 2
    return c


def flux_kontext_edit_flowgrpo_lora() -> Config:
    """FlowGRPO on FLUX.1-Kontext text editing: LoRA r64/a128, 32 instructions x 16 edits at 512x512 of 512x512
    sources, embedded guidance 2.5, eta 0.9, window 2 in [0, 3) of 6 steps."""
    return _kontext(flux_ocr_flowgrpo_lora(), "flux_kontext_edit_flowgrpo_lora")


def flux_kontext_edit_grpo_guard_lora() -> Config:
    """GRPO-Guard on FLUX.1-Kontext text editing (LoRA)."""
    return _kontext(flux_ocr_grpo_guard_lora(), "flux_kontext_edit_grpo_guard_lora")


def flux_kontext_edit_mixgrpo_lora() -> Config:
    """MixGRPO on FLUX.1-Kontext text editing (LoRA): one sliding SDE window for the whole batch."""
    return _kontext(flux_ocr_mixgrpo_lora(), "flux_kontext_edit_mixgrpo_lora")


def flux_kontext_edit_dppo_lora() -> Config:
    """Flow-DPPO on FLUX.1-Kontext text editing (LoRA)."""
    return _kontext(flux_ocr_dppo_lora(), "flux_kontext_edit_dppo_lora")


def flux_kontext_edit_nft_lora() -> Config:
    """DiffusionNFT on FLUX.1-Kontext text editing (LoRA): 24 instructions x 12 edits, ODE rollout."""
    return _kontext(flux_ocr_nft_lora(), "flux_kontext_edit_nft_lora")


def flux_kontext_edit_online_dpo_lora() -> Config:
    """Online Diffusion-DPO on FLUX.1-Kontext text editing (LoRA): the best and the worst edit of each instruction."""
    return _kontext(flux_ocr_online_dpo_lora(), "flux_kontext_edit_online_dpo_lora")


RECIPES = {f.__name__: f for f in (
    flux_ocr_flowgrpo_lora, flux_ocr_dance_lora, flux_ocr_grpo_guard_lora, flux_ocr_mixgrpo_lora, flux_ocr_dppo_lora,
    flux_ocr_nft_lora, flux_ocr_online_dpo_lora, flux_ocr_awm_lora, flux_ocr_gardo_lora, flux_ocr_tempflow_lora,
    flux_ocr_branchgrpo_lora, flux_kontext_edit_flowgrpo_lora, flux_kontext_edit_grpo_guard_lora,
    flux_kontext_edit_mixgrpo_lora, flux_kontext_edit_dppo_lora, flux_kontext_edit_nft_lora,
    flux_kontext_edit_online_dpo_lora,
)}  # fmt: skip
