"""FLUX.1-dev and FLUX.1-Kontext: the `DiffusionPolicy` over diffusers' `FluxPipeline` / `FluxKontextPipeline`
components (`FluxTransformer2DModel`, `AutoencoderKL`, `CLIPTextModel`, `T5EncoderModel`), loaded from disk.

Everything mirrors the pipelines exactly (a test samples with both and compares):
- prompts: CLIP-L's pooled output (77 tokens) and T5's last hidden state over `max_sequence_length`
  tokens (512 by default). The pipeline pads T5 to that fixed length and passes no mask, so the
  padding is attended to; conditions of any two batches concatenate. Text ids are zeros.
- latents are the pipeline's packed latents (2x2 patches of the VAE latent in the channels) kept on
  their token grid, (B, H/16, W/16, 4*16) for the released VAE; image ids are (0, row, column).
- FLUX.1-dev is guidance-distilled: instead of true CFG the transformer embeds a guidance value
  (`model.embedded_guidance`; the pipelines' `guidance_scale`), the same at rollout and in training.
  True CFG (`rollout.guidance` > 1 with a negative prompt) is the pipelines' `true_cfg_scale` on top.
- the transformer receives the scheduler timestep sigma*1000, cast to the compute dtype, / 1000.
- the schedule: linspace(1, 1/N, N) sigmas, shifted by the scheduler's dynamic shift with mu
  interpolated in the output's image token count (`sde.sigma_schedule(mu=...)` is the scheduler's
  exponential time shift), then 0.
- decode: unpack, divide by the VAE's scaling factor, add its shift factor, decode.

FLUX.1-Kontext (`model.arch=flux_kontext`, `edits`) conditions on one source image per prompt, as
`FluxKontextPipeline` does: the source (an 8-bit image; grayscale becomes RGB) has its size floored to a
multiple of 16 and, with `model.source_resize` (the pipeline's default `_auto_resize`), is resized to the
preferred Kontext resolution (about 1 MP) whose aspect ratio is nearest its own, with PIL's Lanczos filter
as the pipeline resizes PIL images; it is VAE-encoded (the distribution's mode), shifted and scaled, packed
into tokens and appended after the noisy tokens with image ids (1, row, column); the prediction of the
source tokens is dropped. The packed source latents and their ids are kept in the conditions. Sources of
one batch must come out the same size (the pipeline would silently resize every source of its batch to
the first one's size); since a training step concatenates the conditions of all its samples, every
source of a prompt set should: with `model.source_resize` one aspect ratio bucket, without it one size.
"""

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from PIL import Image
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, CLIPTextModel, PreTrainedTokenizerBase, T5EncoderModel

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import pipeline_schedule, train_sigmas
from omnialign.models.base import check_size
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 512  # the pipelines' default T5 length, and their largest
GUIDANCE = {"flux": 3.5, "flux_kontext": 2.5}  # FluxPipeline's default guidance_scale; the Kontext model card's
PARTS = ("transformer", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler")
PIPELINES = {"flux": "FluxPipeline", "flux_kontext": "FluxKontextPipeline"}

LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
    "proj_mlp",
]
"""Flow-GRPO's FLUX targets (peft `target_modules`): the 12 attention and MLP projections of each double-stream
block, and each single-stream block's query, key, value and MLP input projections."""


def grid_ids(height: int, width: int, first: float, device: torch.device) -> torch.Tensor:
    """Position ids (height*width, 3) float32 of a token grid, row-major: (first, row, column)."""
    rows = torch.arange(height, device=device, dtype=torch.float32)[:, None].expand(height, width)
    cols = torch.arange(width, device=device, dtype=torch.float32)[None, :].expand(height, width)
    return torch.stack([torch.full_like(rows, first), rows, cols], dim=-1).reshape(-1, 3)


def kontext_resolutions() -> list[tuple[int, int]]:
    """diffusers' `PREFERRED_KONTEXT_RESOLUTIONS`, (width, height) pairs of about 1 MP, the sizes a Kontext source is
    resized to. Imported when asked for: the Kontext pipeline's module imports transformers' image processors, which
    warn on every run without torchvision."""
    from diffusers.pipelines.flux import pipeline_flux_kontext

    return pipeline_flux_kontext.PREFERRED_KONTEXT_RESOLUTIONS


class FluxPolicy:
    """`DiffusionPolicy` over FLUX.1 (and FLUX.1-Kontext with `edits`); latents (B, H/16, W/16, 64) are packed
    tokens on their grid."""

    lora_targets = LORA_TARGETS
    transformer_2 = None

    def __init__(
        self,
        transformer: FluxTransformer2DModel,
        vae: AutoencoderKL | None,
        text_encoders: tuple[CLIPTextModel, T5EncoderModel] | None,
        tokenizers: tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase] | None,
        scheduler: FlowMatchEulerDiscreteScheduler,
        guidance: float = GUIDANCE["flux"],
        edits: bool = False,
        source_resolutions: list[tuple[int, int]] | None = None,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.text_encoders = text_encoders  # CLIP-L, T5
        self.tokenizers = tokenizers
        self.scheduler = scheduler
        self.guidance = guidance  # embedded when the transformer has guidance_embeds (FLUX.1-dev, Kontext)
        self.edits = edits
        self.source_resolutions = source_resolutions  # (width, height) choices of Kontext sources; None: own size
        self.shift = shift  # None: the scheduler config's (dynamic) shift
        self.max_sequence_length = max_sequence_length
        self.vae_scale_factor = 8 if vae is None else 2 ** (len(vae.config.block_out_channels) - 1)

    def to(self, device: torch.device) -> "FluxPolicy":
        for module in (self.vae, *(self.text_encoders or ())):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: list[list[torch.Tensor]] | None = None) -> TensorDict:
        """embeds (B, max_sequence_length, T5 width) in T5's dtype, pooled (B, CLIP width) in CLIP's dtype; an
        editing model adds source_latents (B, S, 64) in the VAE's dtype and source_ids (B, S, 3) float32."""
        clip, t5 = self.text_encoders
        tokens = self.tokenizers[0](prompts, padding="max_length", max_length=self.tokenizers[0].model_max_length,
                                    truncation=True, return_tensors="pt").input_ids  # fmt: skip
        pooled = clip(tokens.to(clip.device), output_hidden_states=False).pooler_output.to(clip.dtype)
        tokens = self.tokenizers[1](prompts, padding="max_length", max_length=self.max_sequence_length,
                                    truncation=True, return_tensors="pt").input_ids  # fmt: skip
        embeds = t5(tokens.to(t5.device), output_hidden_states=False)[0].to(t5.dtype)
        cond = TensorDict(embeds=embeds, pooled=pooled, batch_size=[len(prompts)])
        if self.edits:
            cond["source_latents"], cond["source_ids"] = self.encode_sources(prompts, sources)
        return cond

    def source_pixels(self, image: torch.Tensor) -> torch.Tensor:
        """One source (C, H, W) in [0, 1] as the Kontext pipeline prepares a PIL image: (3, h, w) in [-1, 1]."""
        multiple = self.vae_scale_factor * 2
        height, width = image.shape[-2] // multiple * multiple, image.shape[-1] // multiple * multiple
        if self.source_resolutions:
            _, width, height = min((abs(width / height - w / h), w, h) for w, h in self.source_resolutions)
            height, width = height // multiple * multiple, width // multiple * multiple
        pixels = (image.detach().float().cpu() * 255).round().clamp(0, 255).to(torch.uint8)
        pil = Image.fromarray(pixels.permute(1, 2, 0).squeeze(-1).numpy()).convert("RGB")
        pil = pil.resize((width, height), resample=Image.Resampling.LANCZOS)
        return torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255).permute(2, 0, 1) * 2 - 1

    def encode_sources(
        self, prompts: list[str], sources: list[list[torch.Tensor]] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed source latents (B, S, 64) and their ids (B, S, 3), first id 1 (see the module docstring)."""
        if sources is None or len(sources) != len(prompts) or any(len(s) != 1 for s in sources):
            counts = None if sources is None else [len(s) for s in sources]
            raise ValueError(
                f"FLUX.1-Kontext edits one source image per prompt: got {len(prompts)} prompts and source counts "
                f'{counts}; give each prompt exactly one image in its "sources"'
            )
        multiple = self.vae_scale_factor * 2
        for prompt, (source,) in zip(prompts, sources):
            if min(source.shape[-2:]) < multiple:
                raise ValueError(f"FLUX.1-Kontext: the source of prompt {prompt!r:.80} is {tuple(source.shape[-2:])} "
                                 f"pixels (height, width); its sides are floored to multiples of {multiple}, so it "
                                 f"would vanish: give sources at least {multiple} pixels per side")  # fmt: skip
        pixels = [self.source_pixels(s[0]) for s in sources]
        sizes = sorted({tuple(p.shape[1:]) for p in pixels})
        if len(sizes) > 1:
            raise ValueError(
                f"FLUX.1-Kontext sources of one batch must prepare to one size, got {sizes} (height, width): the "
                "conditions of a batch (and of a training step) concatenate. Store the sources at one size "
                "(`omnialign prepare edit --size WxH`) or, with model.source_resize=true, at one aspect ratio"
            )
        config = self.vae.config
        x = torch.stack(pixels).to(self.vae.device, self.vae.dtype)
        z = (self.vae.encode(x).latent_dist.mode() - config.shift_factor) * config.scaling_factor
        batch, channels, height, width = z.shape
        packed = z.reshape(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
        packed = packed.reshape(batch, height // 2 * (width // 2), channels * 4)
        ids = grid_ids(height // 2, width // 2, 1.0, z.device)
        return packed, ids.expand(batch, -1, -1).contiguous()

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        batch, height, width, channels = latents.shape
        dtype, device = self.dtype, latents.device
        tokens = latents.reshape(batch, height * width, channels).to(dtype)
        ids = grid_ids(height, width, 0.0, device)
        if self.edits:  # the source tokens follow the noisy ones; their prediction is dropped
            tokens = torch.cat([tokens, cond["source_latents"].to(dtype)], dim=1)
            ids = torch.cat([ids, cond["source_ids"][0].to(device)])
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((batch,), self.guidance, device=device, dtype=torch.float32)
        embeds = cond["embeds"]
        v = self.transformer(
            hidden_states=tokens,
            timestep=(sigma * 1000).to(dtype) / 1000,  # the pipelines': scheduler timestep in latents dtype, / 1000
            guidance=guidance,
            pooled_projections=cond["pooled"].to(dtype),
            encoder_hidden_states=embeds.to(dtype),
            txt_ids=embeds.new_zeros(embeds.shape[1], 3, dtype=torch.float32),
            img_ids=ids,
            return_dict=False,
        )[0]
        return v[:, : height * width].reshape(latents.shape)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = latents.shape
        z = channels // 4
        x = latents.reshape(batch, height, width, z, 2, 2).permute(0, 3, 1, 4, 2, 5)
        x = x.reshape(batch, z, 2 * height, 2 * width).to(self.vae.dtype)
        x = x / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(x, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        multiple = self.vae_scale_factor * 2
        check_size("FLUX images", height, width, multiple)
        return (height // multiple, width // multiple, self.transformer.config.in_channels)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        tokens_h, tokens_w, _ = self.latent_shape(height, width)
        return pipeline_schedule(num_steps, self.scheduler.config, tokens_h * tokens_w, self.shift)

    def train_sigmas(self) -> torch.Tensor:
        config = self.scheduler.config
        return train_sigmas(1.0 if config.use_dynamic_shifting else config.shift, config.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return [*self.transformer.transformer_blocks, *self.transformer.single_transformer_blocks]


def load(config: ModelConfig) -> FluxPolicy:
    """Load from `config.path`, a folder in the diffusers `FluxPipeline` (model.arch=flux) or `FluxKontextPipeline`
    (model.arch=flux_kontext) layout; encoders frozen, eval."""
    release = "FLUX.1-Kontext-dev" if config.arch == "flux_kontext" else "FLUX.1-dev"
    root = pipeline_folder(config, PARTS, PIPELINES[config.arch], f"black-forest-labs/{release}")
    if config.text_tokens is not None and not 1 <= config.text_tokens <= MAX_SEQUENCE_LENGTH:
        raise ValueError(
            f"model.text_tokens={config.text_tokens}: the FLUX pipelines take 1 to {MAX_SEQUENCE_LENGTH} T5 tokens"
        )
    dtype = getattr(torch, config.dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    transformer = FluxTransformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    options = dict(
        guidance=GUIDANCE[config.arch] if config.embedded_guidance is None else config.embedded_guidance,
        edits=config.arch == "flux_kontext",
        source_resolutions=kontext_resolutions() if config.source_resize and config.arch == "flux_kontext" else None,
        shift=config.shift,
        max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH,
    )
    if config.transformer_only:  # offline training on stored latents and embeddings
        return FluxPolicy(transformer, None, None, None, scheduler, **options)
    encoders = (
        CLIPTextModel.from_pretrained(root / "text_encoder", dtype=dtype),
        T5EncoderModel.from_pretrained(root / "text_encoder_2", dtype=dtype),
    )
    return FluxPolicy(
        transformer=transformer,
        vae=AutoencoderKL.from_pretrained(root / "vae", torch_dtype=dtype).requires_grad_(False).eval(),
        text_encoders=tuple(e.requires_grad_(False).eval() for e in encoders),
        tokenizers=(
            AutoTokenizer.from_pretrained(root / "tokenizer"),
            AutoTokenizer.from_pretrained(root / "tokenizer_2"),
        ),
        scheduler=scheduler,
        **options,
    )
