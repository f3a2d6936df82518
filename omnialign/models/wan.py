"""Wan 2.1 / 2.2 text-to-video: the `DiffusionPolicy` over diffusers' `WanPipeline` components
(`WanTransformer3DModel`, `AutoencoderKLWan`, `UMT5EncoderModel`), loaded from disk (`model.arch=wan`).

Everything mirrors `diffusers.WanPipeline` (a test samples with both and compares):
- prompts are cleaned as the pipeline cleans them, tokenized to `max_sequence_length` (512 by default)
  and encoded by UMT5 with the attention mask; each prompt's embeddings past its own tokens are zeroed,
  as the pipeline trims and zero-pads them, so conditions of any two batches concatenate. The
  transformer gets no text mask. True CFG is the pipeline's: `rollout.guidance` is its `guidance_scale`
  (5.0 in its example), `rollout.negative_prompt` its `negative_prompt`.
- latents are the VAE's (B, C, F', H/8, W/8) for the released VAE, F' = (frames - 1) / 4 + 1, where
  `model.frames` is the pipeline's `num_frames` (81 by default); the transformer receives sigma*1000.
  Wan 2.2 TI2V's `expand_timesteps` gives every token that same timestep in text-to-video (its mask is
  all ones), which the transformer treats as the one per sample: nothing changes.
- the schedule: the released scheduler is UniPCMultistep with flow sigmas (`flow_shift` 3.0 for 480p,
  5.0 for 720p), a multistep solver over linspace(1, 1/1000, N+1)[:-1] shifted. Our samplers step
  Euler/SDE transitions on sigmas, so `schedule` gives what `FlowMatchEulerDiscreteScheduler(shift=
  flow_shift)` gives: linspace(1, shifted(1/1000), N) shifted again, then 0. ODE sampling with it equals
  the pipeline run with that scheduler swapped in (the test does this), not the pipeline's UniPC output.
- Wan 2.2 A14B's two experts: when the folder has `transformer_2` and model_index.json a `boundary_ratio`,
  `velocity` runs `transformer` (the high-noise expert) where sigma >= boundary_ratio and `transformer_2`
  below, as the pipeline does (`high_noise(sigma)` is that test). CFG is `rollout.guidance` on the high-noise
  expert's steps and `rollout.guidance_2` (the pipeline's `guidance_scale_2`; None: rollout.guidance) on the
  low-noise expert's, per sample (`rollout.diffusion.step_guidance`, used by rollout, replay and validation alike;
  a model without two experts refuses guidance_2). Only `transformer` is trained (LoRA and checkpoints see only
  it): it lays out the composition and motion the rewards judge, and one trained expert keeps one set of weights
  per run. `transformer_2` stays frozen; the engine splits its tokens (engine.sequence_parallel) and shards it
  over the processes like the trained one (trainer/build.py), so no GPU holds all 14B of its parameters. A
  velocity computed with gradients below the boundary fails: keep the SDE window (`rollout.window_end`) in the
  high-noise steps.
- decode: latents * latents_std + latents_mean, the Wan VAE, [-1, 1] to [0, 1]: videos (B, F, C, H, W). Image
  rewards score each frame through `reward.per_frame`; grids show each video as a strip of its frames.
"""

import json

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase, UMT5EncoderModel

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import scheduler_sigma_min, sigma_schedule, train_sigmas
from omnialign.models.base import check_size
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 512  # the pipeline's default `max_sequence_length`
PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
SHIFT_KEYS = {"UniPCMultistepScheduler": "flow_shift", "FlowMatchEulerDiscreteScheduler": "shift"}

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]
"""The self- and cross-attention projections and the MLP of each `WanTransformerBlock` (peft `target_modules`)."""


class WanPolicy:
    """`DiffusionPolicy` over Wan 2.1 / 2.2 text-to-video; latents are the normalized VAE latents (B, C, F', H', W')."""

    lora_targets = LORA_TARGETS
    edits = False

    def __init__(
        self,
        transformer: WanTransformer3DModel,
        vae: AutoencoderKLWan | None,
        text_encoder: UMT5EncoderModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
        shift: float,
        frames: int = 81,
        transformer_2: WanTransformer3DModel | None = None,
        boundary_ratio: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
        num_train_timesteps: int = 1000,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.transformer_2 = transformer_2  # Wan 2.2's low-noise expert, frozen; None: one transformer
        self.boundary_ratio = boundary_ratio
        self.vae = vae
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.shift = shift
        self.frames = frames
        self.max_sequence_length = max_sequence_length
        self.num_train_timesteps = num_train_timesteps
        self.temporal_factor = 4 if vae is None else vae.config.scale_factor_temporal
        self.spatial_factor = 8 if vae is None else vae.config.scale_factor_spatial

    def to(self, device: torch.device) -> "WanPolicy":
        for module in (self.vae, self.text_encoder):  # the engine places transformer and transformer_2
            if module is not None:
                module.to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """embeds (B, max_sequence_length, UMT5 width) in the encoder's dtype, zero past each prompt's tokens."""
        tokens = self.tokenizer(
            [prompt_clean(p) for p in prompts],
            padding="max_length",
            max_length=self.max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        ).to(self.text_encoder.device)
        hidden = self.text_encoder(tokens.input_ids, tokens.attention_mask).last_hidden_state
        embeds = hidden * tokens.attention_mask.unsqueeze(-1).to(hidden.dtype)  # the pipeline's trim and zero-pad
        return TensorDict(embeds=embeds, batch_size=[len(prompts)])

    def _expert(
        self, transformer: nn.Module, latents: torch.Tensor, sigma: torch.Tensor, embeds: torch.Tensor
    ) -> torch.Tensor:
        dtype = self.dtype
        return transformer(
            hidden_states=latents.to(dtype),
            timestep=sigma * self.num_train_timesteps,
            encoder_hidden_states=embeds.to(dtype),
            return_dict=False,
        )[0]

    def high_noise(self, sigma: torch.Tensor) -> torch.Tensor | None:
        """Where the high-noise expert `transformer` runs, per sample (B,) bool: the pipeline's test on its timesteps
        (timestep >= boundary_ratio * num_train_timesteps); None with one transformer. `rollout.guidance_2`
        applies where this is False."""
        if self.transformer_2 is None:
            return None
        return sigma * self.num_train_timesteps >= self.boundary_ratio * self.num_train_timesteps

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        high = self.high_noise(sigma)
        if high is None:
            return self._expert(self.transformer, latents, sigma, cond["embeds"])
        if high.all():
            return self._expert(self.transformer, latents, sigma, cond["embeds"])
        if torch.is_grad_enabled():
            raise ValueError(
                f"Wan 2.2 trains only its high-noise expert `transformer` (sigma >= boundary_ratio="
                f"{self.boundary_ratio}); a training step at sigma={sigma[~high].min().item():.3f} would run the "
                "frozen `transformer_2`: lower rollout.window_end so that the SDE window stays in the high-noise steps"
            )
        low = self._expert(self.transformer_2, latents[~high], sigma[~high], cond["embeds"][~high])
        v = low.new_empty(latents.shape)
        v[~high] = low
        if high.any():
            v[high] = self._expert(self.transformer, latents[high], sigma[high], cond["embeds"][high]).to(v.dtype)
        return v

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, C, F', H', W') to videos (B, F, C, H, W) as float in [0, 1]: video rewards score them, and
        image rewards score each frame through `reward.per_frame`."""
        config = self.vae.config
        x = latents.to(self.vae.dtype)
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        inverse_std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        video = self.vae.decode(x / inverse_std + mean, return_dict=False)[0]  # (B, C, F, H, W) in [-1, 1]
        return (video.float() / 2 + 0.5).clamp(0, 1).transpose(1, 2)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """(C, F', H', W') for videos of `self.frames` frames of height x width."""
        multiple = self.spatial_factor * self.transformer.config.patch_size[1]
        check_size("Wan videos", height, width, multiple)
        frames = (self.frames - 1) // self.temporal_factor + 1
        f = self.spatial_factor
        return (self.transformer.config.in_channels, frames, height // f, width // f)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """FlowMatchEulerDiscreteScheduler(shift).set_timesteps(num_steps)'s sigmas, then 0 (see the module doc)."""
        end = scheduler_sigma_min(self.shift, self.num_train_timesteps)
        return sigma_schedule(num_steps, shift=self.shift, sigma_min=end)

    def train_sigmas(self) -> torch.Tensor:
        return train_sigmas(self.shift, self.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.blocks)


def load(config: ModelConfig) -> WanPolicy:
    """Load from `config.path`, a folder in the diffusers `WanPipeline` layout (Wan 2.2 A14B: with `transformer_2/`
    and `boundary_ratio` in model_index.json); encoders, VAE and `transformer_2` frozen, eval."""
    root = pipeline_folder(config, PARTS, "WanPipeline", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    index = json.loads((root / "model_index.json").read_text())
    scheduler = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    if scheduler["_class_name"] not in SHIFT_KEYS:
        raise ValueError(
            f"{root / 'scheduler'}: scheduler {scheduler['_class_name']} is not a flow-matching scheduler of Wan; "
            f"expected one of {sorted(SHIFT_KEYS)}"
        )
    dtype = getattr(torch, config.dtype)
    vae = None if config.transformer_only else AutoencoderKLWan.from_pretrained(root / "vae", torch_dtype=dtype)
    temporal = 4 if vae is None else vae.config.scale_factor_temporal
    if config.frames < 1 or (config.frames - 1) % temporal:
        raise ValueError(
            f"model.frames={config.frames}: (frames - 1) must be divisible by the VAE's temporal factor {temporal} "
            f"(e.g. {(max(config.frames, 1) - 1) // temporal * temporal + 1}); change model.frames"
        )
    boundary_ratio = index.get("boundary_ratio")
    experts = boundary_ratio is not None and (root / "transformer_2").is_dir()
    second = WanTransformer3DModel.from_pretrained(root / "transformer_2", torch_dtype=dtype) if experts else None
    policy = WanPolicy(
        transformer=WanTransformer3DModel.from_pretrained(root / "transformer", torch_dtype=dtype),
        vae=None if vae is None else vae.requires_grad_(False).eval(),
        text_encoder=None,
        tokenizer=None,
        shift=config.shift or scheduler[SHIFT_KEYS[scheduler["_class_name"]]],
        frames=config.frames,
        transformer_2=None if second is None else second.requires_grad_(False).eval(),
        boundary_ratio=boundary_ratio if experts else None,
        max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH,
        num_train_timesteps=scheduler["num_train_timesteps"],
    )
    if not config.transformer_only:  # offline training on stored latents and embeddings needs no encoder
        policy.tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
        text_encoder = UMT5EncoderModel.from_pretrained(root / "text_encoder", dtype=dtype)
        policy.text_encoder = text_encoder.requires_grad_(False).eval()
    return policy
