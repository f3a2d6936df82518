"""Qwen-Image: the `DiffusionPolicy` over diffusers' `QwenImagePipeline` components, loaded from disk.

Everything mirrors `diffusers.QwenImagePipeline` exactly (a test samples with both and compares):
- prompts go through the Qwen2.5-VL chat template; the last hidden state of the valid tokens is
  kept minus the 34 template prefix tokens, truncated to `max_sequence_length`. The pipeline pads
  to the longest prompt of its batch; we pad to `max_sequence_length` so that conditions of any
  two batches (cond and uncond for CFG, micro-batches of a trajectory) concatenate. The mask
  keeps the padding out of attention and text positions do not depend on it.
- latents are the pipeline's packed latents (2x2 patches of the VAE latent in the channels),
  kept on their token grid: (B, H/16, W/16, 4*z) for the released VAE (factor 8). The last dim
  is the pipeline's packed channel dim, so true CFG's norm rescale over dim -1 is the pipeline's;
  the grid tells `velocity` the RoPE image shape and `decode` how to unpack.
- the transformer receives the scheduler timestep sigma*1000, cast to the latents' dtype, /1000.
- the schedule is the dynamic shift (mu from the image token count, per the scheduler config),
  then the scheduler's terminal stretch (`shift_terminal`, 0.02 for the released model).
- the attention's rotary embedding is diffusers' complex product computed in real float32 arithmetic
  (`real_rotary`, installed in diffusers on import): the same bits, and compiled into the blocks' graphs.
- the VAE's causal 3D convolutions run an image (one frame, no cache) as 2D convolutions with their kernels' last
  time slice (`one_frame_conv`, installed in diffusers on import): the same sums, without the two frames of zeros.
- the text mask reaches the transformer's attention without a host sync per forward (`text_lengths`, installed in
  diffusers on import): diffusers' version copies a length to the card, which waits for the card's queued work.
"""

from pathlib import Path

import torch
from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
from diffusers.models.autoencoders import autoencoder_kl_qwenimage
from diffusers.models.transformers import transformer_qwenimage
from tensordict import TensorDict
from torch import nn
from torch.nn import functional as F
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2_5_VLForConditionalGeneration

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import pipeline_schedule, train_sigmas
from omnialign.models.base import check_size

PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_TOKENS = 34  # tokens of the template before the prompt, dropped from the embeddings
TOKENIZER_MAX_LENGTH = 1024  # the pipeline's truncation of the prompt part
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default `max_sequence_length`
PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")

LORA_TARGETS = [
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "img_mlp.net.0.proj",
    "img_mlp.net.2",
    "txt_mlp.net.0.proj",
    "txt_mlp.net.2",
]
"""The 12 attention and MLP projections of each `QwenImageTransformerBlock` (peft `target_modules`)."""

complex_rotary = transformer_qwenimage.apply_rotary_emb_qwen


def real_rotary(
    x: torch.Tensor, freqs_cis: torch.Tensor, use_real: bool = True, use_real_unbind_dim: int = -1
) -> torch.Tensor:
    """diffusers' `apply_rotary_emb_qwen` with its complex path (`use_real=False`, the one Qwen-Image's attention
    takes) in real float32 arithmetic: x (B, S, H, D) rotated by freqs_cis (S, D/2) complex, (a + ib)(c + is) over
    x's consecutive pairs. The same bits as the complex multiply, which inductor leaves to an eager kernel in every
    compiled block; in real numbers it is compiled with the block (the step 3.4% faster on an H200, BENCHMARKS.md)."""
    if use_real:
        return complex_rotary(x, freqs_cis, use_real, use_real_unbind_dim)
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = torch.view_as_real(freqs_cis).unsqueeze(1).unbind(-1)
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(3).type_as(x)


transformer_qwenimage.apply_rotary_emb_qwen = real_rotary  # the attention processor looks the name up at each call

causal_conv = autoencoder_kl_qwenimage.QwenImageCausalConv3d.forward


def one_frame_conv(
    self: autoencoder_kl_qwenimage.QwenImageCausalConv3d, x: torch.Tensor, cache_x: torch.Tensor | None = None
) -> torch.Tensor:
    """diffusers' `QwenImageCausalConv3d.forward` on x (B, C, T, H, W). An image (T = 1, no cache) under the full
    causal padding (kernel_size[0] - 1 frames of zeros before it) meets only the kernel's last time slice: that slice
    as a 2D convolution is the same sum, without the padded copy and two thirds of the arithmetic of a 3-frame
    kernel. Anything else (a video's frames, a cache) takes diffusers' path."""
    if x.shape[2] != 1 or cache_x is not None or self._padding[4] != self.kernel_size[0] - 1:
        return causal_conv(self, x, cache_x)
    width, _, height = self._padding[:3]  # F.pad's order: W, W, H, H, T, 0
    return F.conv2d(x[:, :, 0], self.weight[:, :, -1], self.bias, self.stride[1:], (height, width)).unsqueeze(2)


autoencoder_kl_qwenimage.QwenImageCausalConv3d.forward = one_frame_conv  # every Qwen-Image VAE: images are one frame

library_text_lengths = transformer_qwenimage.compute_text_seq_len_from_mask


def text_lengths(
    encoder_hidden_states: torch.Tensor, encoder_hidden_states_mask: torch.Tensor | None
) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """diffusers' `compute_text_seq_len_from_mask` for text (B, S, D) and its mask (B, S): the text length S for the
    rotary, each row's last valid position + 1 (S for a row with none), the mask as bool. diffusers copies S to the
    card for the rows with none, a copy from pageable memory that waits for all the card's queued work, once per
    transformer forward; here S is a Python scalar, which the kernel takes as an argument: the same values."""
    length = encoder_hidden_states.shape[1]
    if encoder_hidden_states_mask is None:
        return length, None, None
    mask = encoder_hidden_states_mask.bool()
    last = torch.where(mask, torch.arange(length, device=mask.device), 0).amax(1) + 1
    return length, torch.where(mask.any(1), last, length), mask


transformer_qwenimage.compute_text_seq_len_from_mask = text_lengths  # the transformer's forward looks it up per call


class QwenImagePolicy:
    """`DiffusionPolicy` over Qwen-Image; latents (B, H/16, W/16, 4*z) are packed tokens on their grid."""

    lora_targets = LORA_TARGETS
    edits = False
    transformer_2 = None

    def __init__(
        self,
        transformer: QwenImageTransformer2DModel,
        vae: AutoencoderKLQwenImage | None,
        text_encoder: Qwen2_5_VLForConditionalGeneration | None,
        tokenizer: PreTrainedTokenizerBase | None,
        scheduler: FlowMatchEulerDiscreteScheduler,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.shift = shift  # None: the dynamic shift of the scheduler config
        self.max_sequence_length = max_sequence_length
        self.vae_scale_factor = 8 if vae is None else 2 ** len(vae.config.temperal_downsample)

    def to(self, device: torch.device) -> "QwenImagePolicy":
        for module in (self.vae, self.text_encoder):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """embeds (B, max_sequence_length, D) in the text encoder's dtype, mask (B, max_sequence_length) long."""
        tokens = self.tokenizer(
            [PROMPT_TEMPLATE.format(p) for p in prompts],
            max_length=TOKENIZER_MAX_LENGTH + TEMPLATE_TOKENS,
            padding=True,
            truncation=True,
            return_tensors="pt",
        ).to(self.text_encoder.device)
        hidden = self.text_encoder(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            output_hidden_states=True,
            logits_to_keep=1,  # the logits are not used: no head GEMM over 152k tokens for every prompt token
        ).hidden_states[-1]
        length = self.max_sequence_length
        embeds = hidden.new_zeros(len(prompts), length, hidden.shape[-1])
        mask = torch.zeros(len(prompts), length, dtype=torch.long, device=hidden.device)
        for i, (row, valid) in enumerate(zip(hidden, tokens.attention_mask.bool())):
            kept = row[valid][TEMPLATE_TOKENS:][:length]
            embeds[i, : len(kept)], mask[i, : len(kept)] = kept, 1
        return TensorDict(embeds=embeds, mask=mask, batch_size=[len(prompts)])

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        return self.transformer_velocity(latents, sigma, cond)

    def transformer_velocity(
        self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict, sources: tuple[torch.Tensor, ...] = ()
    ) -> torch.Tensor:
        """The transformer's velocity at `latents`; an editing model's packed source latents (B, h_i, w_i, 4*z)
        follow the latent tokens in the sequence, each with its RoPE image shape, and their outputs are dropped."""
        batch, height, width, channels = latents.shape
        dtype = self.dtype
        grids = (latents, *sources)
        v = self.transformer(
            hidden_states=torch.cat([g.reshape(batch, -1, channels) for g in grids], 1).to(dtype),
            timestep=(sigma * 1000).to(dtype) / 1000,  # the pipeline's: scheduler timestep in latents dtype, / 1000
            encoder_hidden_states=cond["embeds"].to(dtype),
            encoder_hidden_states_mask=cond["mask"],
            img_shapes=[[(1, g.shape[1], g.shape[2]) for g in grids]] * batch,
            return_dict=False,
        )[0]
        return v[:, : height * width].reshape(latents.shape)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = latents.shape
        z = channels // 4
        x = latents.reshape(batch, height, width, z, 2, 2).permute(0, 3, 1, 4, 2, 5)
        x = x.reshape(batch, z, 1, 2 * height, 2 * width).to(self.vae.dtype)  # (B, z, frames=1, h, w)
        mean = torch.tensor(self.vae.config.latents_mean, device=x.device, dtype=x.dtype).view(1, z, 1, 1, 1)
        std = torch.tensor(self.vae.config.latents_std, device=x.device, dtype=x.dtype).view(1, z, 1, 1, 1)
        image = self.vae.decode(x * std + mean, return_dict=False)[0][:, :, 0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        multiple = self.vae_scale_factor * 2
        check_size("Qwen-Image images", height, width, multiple)
        return (height // multiple, width // multiple, self.transformer.config.in_channels)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        tokens_h, tokens_w, _ = self.latent_shape(height, width)
        return pipeline_schedule(num_steps, self.scheduler.config, tokens_h * tokens_w, self.shift)

    def train_sigmas(self) -> torch.Tensor:
        config = self.scheduler.config
        return train_sigmas(1.0 if config.use_dynamic_shifting else config.shift, config.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.transformer_blocks)


def pipeline_folder(config: ModelConfig, parts: tuple[str, ...], layout: str, repository: str) -> Path:
    """`config.path` as a folder of a diffusers pipeline (`layout`, in words) with `parts`; errors name what is
    missing and point at `repository`, the released model."""
    if config.path is None:
        raise ValueError(
            f"model.path is required for model.arch={config.arch}: set model.path=DIR, a {layout} folder "
            f"(with {', '.join(p + '/' for p in parts)})"
        )
    root = Path(config.path)
    missing = [part for part in parts if not (root / part).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"model.path={config.path} is not a {layout} folder: missing {', '.join(p + '/' for p in missing)}. "
            f"Point model.path at a local copy of the {repository} repository (or a folder written by the "
            "pipeline's save_pretrained)"
        )
    return root


def check_template_prefix(tokenizer: PreTrainedTokenizerBase, prefix: str, tokens: int, where: Path) -> None:
    """ValueError unless `tokenizer` splits the template `prefix` (the part a pipeline drops) into `tokens`."""
    count = len(tokenizer(prefix).input_ids)
    if count != tokens:
        raise ValueError(
            f"{where} splits the prompt template prefix into {count} tokens, not {tokens}: it is not the "
            "Qwen2.5-VL tokenizer the pipeline expects"
        )


def load_networks(root: Path, dtype: torch.dtype) -> dict:
    """The transformer, the frozen text encoder and VAE (eval) and the scheduler of a Qwen-Image pipeline folder."""
    text_encoder = Qwen2_5_VLForConditionalGeneration.from_pretrained(root / "text_encoder", dtype=dtype)
    vae = AutoencoderKLQwenImage.from_pretrained(root / "vae", torch_dtype=dtype)
    return dict(
        transformer=QwenImageTransformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype),
        vae=vae.requires_grad_(False).eval(),
        text_encoder=text_encoder.requires_grad_(False).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler"),
    )


def load(config: ModelConfig) -> QwenImagePolicy:
    """Load from `config.path`, a folder in the diffusers `QwenImagePipeline` layout; encoders frozen, eval."""
    root = pipeline_folder(config, PARTS, "QwenImagePipeline", "Qwen/Qwen-Image")
    dtype = getattr(torch, config.dtype)
    if config.transformer_only:  # offline training on stored latents and embeddings
        transformer = QwenImageTransformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
        return QwenImagePolicy(transformer, None, None, None, FlowMatchEulerDiscreteScheduler.from_pretrained(
            root / "scheduler"), shift=config.shift)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    check_template_prefix(tokenizer, PROMPT_TEMPLATE.split("{}")[0], TEMPLATE_TOKENS, root / "tokenizer")
    return QwenImagePolicy(**load_networks(root, dtype), tokenizer=tokenizer, shift=config.shift,
                           max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH)  # fmt: skip
