"""FLUX.2: the `DiffusionPolicy` over diffusers' `Flux2Pipeline` (FLUX.2-dev, `model.arch=flux2`) and
`Flux2KleinPipeline` (FLUX.2-klein 4B and 9B, distilled or base, `model.arch=flux2_klein`) components
(`Flux2Transformer2DModel`, `AutoencoderKLFlux2`, and a Mistral3 or Qwen3 text encoder), loaded from disk. The two
pipelines differ only in the text encoder and in guidance, so one class serves both.

Everything mirrors the pipelines exactly (a test samples with both and compares):
- prompts, FLUX.2-dev: `format_input` makes a system turn (the pipeline's SYSTEM_MESSAGE) and a user turn of text
  blocks per prompt ("[IMG]" removed), the tokenizer (a Mistral processor in the release) applies its chat template
  with no generation prompt, pads and truncates to `max_sequence_length` (512 by default); FLUX.2-klein: each
  prompt as one user message through Qwen3's chat template with the generation prompt and `enable_thinking=False`,
  then the tokenizer pads and truncates to that length. The encoder runs with the attention mask; the hidden states
  after layers (10, 20, 30) for Mistral, (9, 18, 27) for Qwen3 are stacked and concatenated per token into
  (B, L, 3 * width). The transformer gets no mask, so the padding is attended to (as FLUX.1's T5 padding):
  `model.text_tokens` is the pipeline's `max_sequence_length`, not a free choice. Text ids are (0, 0, 0, l).
- the encoder keeps only the decoder layers up to the last one read, without its LM head or vision tower: the
  hidden states the pipeline takes are those of the first layers, so they are the same (a test compares).
- latents are the pipeline's packed latents (2x2 patches of the VAE latent in the channels) kept on their token
  grid, (B, H/16, W/16, 4*32) for the released VAE; image ids are (0, row, column, 0).
- FLUX.2-dev is guidance-distilled, as FLUX.1-dev: the transformer embeds a guidance value (`model.embedded_guidance`,
  the pipeline's `guidance_scale`, default 4.0) and there is no true CFG. FLUX.2-klein has no guidance embedding;
  the base models take true CFG (the pipeline's `guidance_scale` > 1, default 4.0, against the empty prompt: our
  `rollout.guidance` with `rollout.negative_prompt=""`, no renormalisation); the distilled ones (`is_distilled` in
  model_index.json: FLUX.2-klein-4B and -9B, 4 steps) ignore `guidance_scale`, so run them with
  `rollout.guidance=1` (a rollout with CFG on one is refused: `rollout.diffusion.step_guidance`).
- the transformer receives the scheduler timestep sigma*1000, cast to the compute dtype, / 1000.
- the schedule: linspace(1, 1/N, N) sigmas, shifted by the scheduler's exponential time shift with the pipelines'
  `compute_empirical_mu` (a fit in the image token count and N), then 0 (`model.shift`: a static shift instead).
- decode: unpack, undo the VAE's batch norm (running mean and sqrt(running var + eps)), unpatchify, decode.

Reference images (the pipelines' `image`, FLUX.2's editing) are not supported: `edits` is False.
"""

import json

import torch
from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, format_input
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, Mistral3ForConditionalGeneration, PreTrainedTokenizerBase, Qwen3ForCausalLM

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import sigma_schedule, train_sigmas
from omnialign.models.base import check_size
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 512  # both pipelines' default
GUIDANCE = 4.0  # Flux2Pipeline's default guidance_scale, embedded by FLUX.2-dev
LAYERS = {"flux2": (10, 20, 30), "flux2_klein": (9, 18, 27)}  # the pipelines' text_encoder_out_layers
PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
PIPELINES = {"flux2": "Flux2Pipeline", "flux2_klein": "Flux2KleinPipeline"}
RELEASES = {"flux2": "FLUX.2-dev", "flux2_klein": "FLUX.2-klein-4B"}

LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.linear_in",
    "ff.linear_out",
    "ff_context.linear_in",
    "ff_context.linear_out",
    "attn.to_qkv_mlp_proj",
]
"""Flow-Factory's FLUX.2 and FLUX.2-klein targets (`default_target_modules` of its flux2.py and flux2_klein.py, peft
`target_modules`): the 12 attention and SwiGLU projections of each double-stream block, and each single-stream
block's fused query, key, value and MLP input projection. (Its list also names "attn.to_out.0" for the single-stream
blocks, whose output projection is a plain `attn.to_out`: that entry hits only the double-stream blocks there too.)"""


def decoder_layers(encoder: nn.Module, last: int) -> nn.Module:
    """The decoder of a text encoder (Mistral3's language model, Qwen3's `model`) without its LM head or vision
    tower, keeping its layers up to `last` (hidden state `last` is the output of layer `last - 1`; the final
    entry, normed, is never read). Raises when it has fewer layers than the pipeline reads."""
    decoder = encoder.get_decoder()
    if len(decoder.layers) < last:
        raise ValueError(
            f"the FLUX.2 pipelines read hidden state {last} of the text encoder, which has only "
            f"{len(decoder.layers)} layers: model.path's text_encoder/ is not the released encoder"
        )
    decoder.layers = decoder.layers[: last + 1]
    return decoder


def token_ids(*columns: torch.Tensor) -> torch.Tensor:
    """Position ids (N, 4) of the pipelines' (t, h, w, l) axes, each column flattened, int64."""
    return torch.stack([c.reshape(-1) for c in torch.broadcast_tensors(*columns)], dim=-1)


class Flux2Policy:
    """`DiffusionPolicy` over FLUX.2-dev (Mistral3 encoder) and FLUX.2-klein (`klein`: Qwen3 encoder); latents
    (B, H/16, W/16, 128) are packed tokens on their grid."""

    lora_targets = LORA_TARGETS
    edits = False
    transformer_2 = None

    def __init__(
        self,
        transformer: Flux2Transformer2DModel,
        vae: AutoencoderKLFlux2 | None,
        text_encoder: nn.Module | None,
        tokenizer: PreTrainedTokenizerBase | None,
        scheduler: FlowMatchEulerDiscreteScheduler,
        klein: bool = False,
        guidance: float = GUIDANCE,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
        distilled: bool = False,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.klein = klein
        self.distilled = distilled  # a step-distilled klein: its pipeline ignores guidance_scale (no CFG)
        self.layers = LAYERS["flux2_klein" if klein else "flux2"]
        self.text_encoder = None if text_encoder is None else decoder_layers(text_encoder, max(self.layers))
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.guidance = guidance  # embedded when the transformer has guidance_embeds (FLUX.2-dev)
        self.shift = shift  # None: the scheduler config's (dynamic) shift with the pipelines' empirical mu
        self.max_sequence_length = max_sequence_length
        self.vae_scale_factor = 8 if vae is None else 2 ** (len(vae.config.block_out_channels) - 1)

    def to(self, device: torch.device) -> "Flux2Policy":
        for module in (self.vae, self.text_encoder):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    def tokens(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """input_ids and attention_mask (B, max_sequence_length) of the prompts, as the pipeline makes them."""
        length = self.max_sequence_length
        if self.klein:
            texts = [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                        add_generation_prompt=True, enable_thinking=False)
                     for p in prompts]  # fmt: skip
            return self.tokenizer(texts, return_tensors="pt", padding="max_length", truncation=True, max_length=length)
        return self.tokenizer.apply_chat_template(
            format_input(prompts, system_message=SYSTEM_MESSAGE), add_generation_prompt=False, tokenize=True,
            return_dict=True, return_tensors="pt", padding="max_length", truncation=True, max_length=length,
        )  # fmt: skip

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """embeds (B, max_sequence_length, 3 * encoder width) in the text encoder's dtype."""
        inputs = self.tokens(prompts)
        device = self.text_encoder.device
        hidden = self.text_encoder(input_ids=inputs["input_ids"].to(device),
                                   attention_mask=inputs["attention_mask"].to(device), output_hidden_states=True,
                                   use_cache=False).hidden_states  # fmt: skip
        out = torch.stack([hidden[k] for k in self.layers], dim=1).to(self.text_encoder.dtype)
        batch, layers, length, width = out.shape
        embeds = out.permute(0, 2, 1, 3).reshape(batch, length, layers * width)
        return TensorDict(embeds=embeds, batch_size=[len(prompts)])

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        batch, height, width, channels = latents.shape
        dtype, device = self.dtype, latents.device
        embeds = cond["embeds"]
        zero = torch.zeros(1, dtype=torch.long, device=device)
        rows, cols = torch.arange(height, device=device), torch.arange(width, device=device)
        img_ids = token_ids(zero[:, None, None], rows[None, :, None], cols[None, None, :], zero[:, None, None])
        txt_ids = token_ids(zero, zero, zero, torch.arange(embeds.shape[1], device=device))
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((batch,), self.guidance, device=device, dtype=torch.float32)
        v = self.transformer(
            hidden_states=latents.reshape(batch, height * width, channels).to(dtype),
            encoder_hidden_states=embeds.to(dtype),
            timestep=(sigma * 1000).to(dtype) / 1000,  # the pipelines': scheduler timestep in latents dtype, / 1000
            img_ids=img_ids.expand(batch, -1, -1),
            txt_ids=txt_ids.expand(batch, -1, -1),
            guidance=guidance,
            return_dict=False,
        )[0]
        return v.reshape(latents.shape)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        x = latents.permute(0, 3, 1, 2).to(self.vae.dtype)  # (B, 4*z, H/16, W/16), the pipelines' unpacked latents
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(x)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(x)
        image = self.vae.decode(Flux2Pipeline._unpatchify_latents(x * std + mean), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        multiple = self.vae_scale_factor * 2
        check_size("FLUX.2 images", height, width, multiple)
        return (height // multiple, width // multiple, self.transformer.config.in_channels)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        config = self.scheduler.config
        if self.shift is not None:
            return sigma_schedule(num_steps, shift=self.shift)
        if not config.use_dynamic_shifting:
            return sigma_schedule(num_steps, shift=config.shift)
        tokens_h, tokens_w, _ = self.latent_shape(height, width)
        return sigma_schedule(num_steps, mu=compute_empirical_mu(tokens_h * tokens_w, num_steps))

    def train_sigmas(self) -> torch.Tensor:
        config = self.scheduler.config
        return train_sigmas(1.0 if config.use_dynamic_shifting else config.shift, config.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return [*self.transformer.transformer_blocks, *self.transformer.single_transformer_blocks]


def chat_tokenizer(folder) -> PreTrainedTokenizerBase:
    """The tokenizer of a pipeline's tokenizer/ folder with its chat template. FLUX.2-dev's folder holds a Pixtral
    processor (which needs torchvision); its tokenizer applies the same template to text-only chats and gives the
    same ids, and takes the template from the folder's chat_template.json where its own config has none."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.chat_template is None and (folder / "chat_template.json").exists():
        tokenizer.chat_template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    if tokenizer.chat_template is None:
        raise ValueError(f"{folder} has no chat template: the FLUX.2 pipelines format prompts with it")
    return tokenizer


def load(config: ModelConfig) -> Flux2Policy:
    """Load from `config.path`, a folder in the diffusers `Flux2Pipeline` (model.arch=flux2) or `Flux2KleinPipeline`
    (model.arch=flux2_klein) layout; encoders frozen, eval."""
    layout = PIPELINES[config.arch]
    root = pipeline_folder(config, PARTS, layout, f"black-forest-labs/{RELEASES[config.arch]}")
    index = root / "model_index.json"
    components = json.loads(index.read_text()) if index.exists() else {"_class_name": layout}
    found = components["_class_name"]
    if found != layout:
        other = {v: k for k, v in PIPELINES.items()}.get(found)
        fix = f"set model.arch={other}" if other else f"point model.path at a {layout} folder"
        raise ValueError(f"model.path={config.path} holds a {found}, not the {layout} of model.arch={config.arch}: "
                         f"{fix}")  # fmt: skip
    if config.text_tokens is not None and config.text_tokens < 1:
        raise ValueError(f"model.text_tokens={config.text_tokens}: the FLUX.2 pipelines take at least 1 text token")
    dtype = getattr(torch, config.dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    transformer = Flux2Transformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    if config.embedded_guidance is not None and not transformer.config.guidance_embeds:
        raise ValueError(
            f"model.embedded_guidance={config.embedded_guidance}: {RELEASES[config.arch]}'s transformer has no "
            "guidance embedding; leave it unset (FLUX.2-klein's base models take true CFG, rollout.guidance)"
        )
    options = dict(
        klein=config.arch == "flux2_klein",
        guidance=GUIDANCE if config.embedded_guidance is None else config.embedded_guidance,
        shift=config.shift,
        max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH,
        distilled=components.get("is_distilled", False),
    )
    if config.transformer_only:  # offline training on stored latents and embeddings
        return Flux2Policy(transformer, None, None, None, scheduler, **options)
    encoder = (Qwen3ForCausalLM if options["klein"] else Mistral3ForConditionalGeneration).from_pretrained(
        root / "text_encoder", dtype=dtype
    )
    vae = AutoencoderKLFlux2.from_pretrained(root / "vae", torch_dtype=dtype)
    policy = Flux2Policy(transformer, vae.requires_grad_(False).eval(), encoder, chat_tokenizer(root / "tokenizer"),
                         scheduler, **options)  # fmt: skip
    policy.text_encoder.requires_grad_(False).eval()
    return policy
