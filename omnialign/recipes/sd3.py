"""Stable Diffusion 3.5 recipes: OCR text rendering (FlowGRPO, AWM, DGPO, GARDO, TempFlow-GRPO) and offline
Diffusion-DPO.

OCR (`sd3_ocr_*`): point `model.path` at a local stable-diffusion-3.5-medium pipeline folder (T5 included) and
`data.prompts` / `data.val_prompts` at the parquet files of `omnialign prepare ocr`; the reward is OCR of the quoted
text. 512x512 at the model's shift 3, validated with 40 ODE steps at the rollout's CFG (the evaluation of Flow-GRPO,
AWM, GARDO and TempFlow-GRPO). Each recipe takes its reference's SD3.5-M config (OCR where it ships one), named in
its docstring; sizes are the global batch.

Offline DPO trains on pairs written by `omnialign prepare offline-dpo`:

    omnialign prepare offline-dpo prompts.jsonl data/sd3_pairs model.arch=sd3 model.path=models/sd3.5 \\
        rollout.n=8 rollout.height=512 rollout.width=512 rollout.guidance=4.5 'reward.weights={"ocr": 1}'
    omnialign train sd3_offline_dpo model.path=models/sd3.5 data.pairs=data/sd3_pairs

It reads stored VAE latents and prompt embeddings, so it loads the transformer alone.
"""

from omnialign.config import Config


def sd3_ocr_flowgrpo_lora() -> Config:
    """FlowGRPO on SD3.5-M OCR (yifan123/flow_grpo config/grpo.py:general_ocr_sd3): LoRA r32/a64, 48 prompts x 24
    images, CFG 4.5, eta 0.7, clip 1e-4, KL 0.004 (its 0.04 at |dt| 0.1), lr 3e-4, two optimizer steps a step; an
    SDE window of 2 in [0, 5) of 10 steps, as the other FlowGRPO recipes (the reference trains 9 of 10 SDE steps)."""
    c = Config(name="sd3_ocr_flowgrpo_lora", recipe="sd3_ocr_flowgrpo_lora")
    c.model.arch, c.model.path, c.model.dtype = "sd3", "models/stable-diffusion-3.5-medium", "bfloat16"
    c.model.lora.rank, c.model.lora.alpha = 32, 64
    c.data.prompts, c.data.val_prompts = "data/ocr/train.parquet", "data/ocr/test.parquet"
    c.data.prompts_per_step = 48
    c.data.val_seeds = 1
    c.rollout.n = 24
    c.rollout.steps, c.rollout.val_steps = 10, 40
    c.rollout.height = c.rollout.width = 512
    c.rollout.guidance = 4.5
    c.rollout.kind, c.rollout.eta = "sde", 0.7
    c.rollout.window_size, c.rollout.window_start, c.rollout.window_end = 2, 0, 5
    c.rollout.micro_batch_size = 24
    c.reward.weights = {"ocr": 1.0}
    c.algorithm.clip_range = 1e-4
    c.algorithm.kl_coef = 0.004
    c.actor.lr = 3e-4
    c.actor.micro_batch_size = 12
    c.actor.mini_batch_size = 576  # half the step's 1152 images: two optimizer steps, as the reference
    c.engine.activation_checkpointing = True
    c.trainer.total_steps = 1000
    c.trainer.val_every = 50
    c.trainer.save_every = 50
    return c


def _variant(base: Config, name: str) -> Config:
    base.name = base.recipe = name
    return base


def sd3_ocr_awm_lora() -> Config:
    """AWM on SD3.5-M OCR (scxue/advantage_weighted_matching config/dgx_awm.py:ocr_sd3_no_cfg_1node): 72 prompts x
    24 images of a 14-step ODE without CFG, 6 noise levels, ghuber 0.25, clip 1, KL 0.015 (its 0.003 on advantages
    scaled from +-5 to +-1), lr 3e-4, one optimizer step a step; its EMA-adapter KL is not implemented."""
    c = _variant(sd3_ocr_flowgrpo_lora(), "sd3_ocr_awm_lora")
    c.algorithm.name = "awm"
    c.data.prompts_per_step = 72  # the reference's 1728 images a step
    c.rollout.steps, c.rollout.guidance, c.rollout.window_size = 14, 1.0, 0
    c.algorithm.awm_timesteps = 6  # one per stratum of steps 1-13 (the reference: of 1-11, timestep_fraction 0.9)
    c.algorithm.awm_weighting, c.algorithm.awm_power = "ghuber", 0.25
    c.algorithm.clip_range = 1.0
    c.algorithm.kl_coef = 0.015
    c.actor.mini_batch_size = None
    return c


def sd3_ocr_dgpo_lora() -> Config:
    """DGPO on SD3.5-M OCR (Luo-Yihong/DGPO config/dgpo.py:general_ocr_sd3_4gpu, its default mode): LoRA r64/a128,
    8 prompts x 16 images of a 10-step ODE at CFG 4.5, trained without CFG; beta 100, clip 1e-2, KL 0.02, 4 noise
    levels of the 7 noisiest steps, lr 3e-4, one optimizer step a step."""
    c = _variant(sd3_ocr_flowgrpo_lora(), "sd3_ocr_dgpo_lora")
    c.algorithm.name = "dgpo"
    c.model.lora.rank, c.model.lora.alpha = 64, 128
    c.data.prompts_per_step, c.rollout.n = 8, 16
    c.rollout.window_size = 0
    c.rollout.micro_batch_size = c.actor.micro_batch_size = 16
    c.algorithm.dgpo_timesteps, c.algorithm.dgpo_first_steps = 4, 7
    c.algorithm.dpo_beta = 100.0
    c.algorithm.clip_range = 1e-2
    c.algorithm.kl_coef = 0.02
    c.actor.mini_batch_size = None
    return c


def sd3_ocr_gardo_lora() -> Config:
    """GARDO on SD3.5-M OCR (tinnerhrhe/GARDO config/gardo.py:general_ocr_sd3): the FlowGRPO recipe with SDE on the
    first 8 of 10 steps, all trained; OCR trained, aesthetic and ImageReward ranked beside it (weight 0); KL 0.004
    on the most uncertain tenth, reference refreshed past a KL of 3e-3 or after 16 steps (its 0.04 and 3e-4 at |dt|
    0.1); no std in the advantages. Set the two auxiliary models' paths in reward.options."""
    c = _variant(sd3_ocr_flowgrpo_lora(), "sd3_ocr_gardo_lora")
    c.algorithm.name = "gardo"
    c.rollout.window_size, c.rollout.window_end = 8, 8
    c.reward.weights = {"ocr": 1.0, "aesthetic": 0.0, "image_reward": 0.0}
    c.reward.options = {"aesthetic": {"path": "models/clip-vit-large-patch14",
                                      "head": "models/aesthetic/sac+logos+ava1-l14-linearMSE.pth"},
                        "image_reward": {"path": "models/image-reward"}}  # fmt: skip
    c.algorithm.gardo_auxiliary = ["aesthetic", "image_reward"]
    c.algorithm.gardo_share = 0.1
    c.algorithm.gardo_kl_threshold = 3e-3
    c.algorithm.ref_update_every = 16
    c.algorithm.norm_by_std = False
    return c


def sd3_ocr_tempflow_lora() -> Config:
    """TempFlow-GRPO on SD3.5-M OCR (Shredded-Pork/TempFlow-GRPO config/dgx.py:geneval_sd3_pr, a rule-based reward
    like OCR; pickscore_sd3_pr differs only in its KL, 0.001): 48 prompts x 4 ODE trunks of 10 steps at CFG 4.5,
    each trunk its own group; at each of steps 0-8, 6 SDE transitions (eta 0.7) leave the trunk's state, each
    finished by the ODE: 54 images and rows a trunk, 10368 a step (the reference's 48 GPUs x 4 trunks an epoch),
    two optimizer steps of 5184 rows (its gradient accumulation 2 of 4); clip 1e-4, KL 0.004 (its beta: the same
    exact Gaussian KL as ours), lr 3e-4, LoRA r32/a64. Its EMA of the adapter is `trainer.ema_decay`, left off."""
    c = _variant(sd3_ocr_flowgrpo_lora(), "sd3_ocr_tempflow_lora")
    c.algorithm.name = "tempflow"
    c.data.prompts_per_step, c.rollout.n = 48, 4  # 4 trunks a prompt: the rows of a (trunk, step) are a group
    c.rollout.kind, c.rollout.eta, c.rollout.steps = "sde", 0.7, 10
    c.rollout.branches, c.rollout.branch_steps = 6, None  # every step but the last
    c.rollout.window_size = 0
    c.algorithm.kl_coef = 0.004
    c.actor.mini_batch_size = 5184
    return c


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


RECIPES = {f.__name__: f for f in (sd3_ocr_flowgrpo_lora, sd3_ocr_awm_lora, sd3_ocr_dgpo_lora, sd3_ocr_gardo_lora,
                                   sd3_ocr_tempflow_lora, sd3_offline_dpo)}  # fmt: skip
