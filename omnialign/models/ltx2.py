"""LTX-2 text-to-video: the `DiffusionPolicy` over diffusers' `LTX2Pipeline` components (`LTX2VideoTransformer3DModel`,
`AutoencoderKLLTX2Video`, `LTX2TextConnectors`, a Gemma-3 text encoder loaded as `Gemma3ForConditionalGeneration`),
loaded from disk (`model.arch=ltx2`). LTX-2 generates a video and its audio together in one transformer; here the
rewards judge the video.

Everything mirrors `diffusers.LTX2Pipeline` (a test samples with both and compares the decoded videos):
- prompts: stripped, tokenized by the Gemma tokenizer padded on the left to `max_sequence_length` (the pipeline's
  1024; `model.text_tokens`) with the BOS token, encoded by Gemma-3 with the mask; every hidden state (the embeddings
  and each of the 48 layers) is stacked per token, and the text connectors turn that into the video stream's and the
  audio stream's conditions: per-layer masked normalisation, a projection, then per stream a small transformer whose
  learned registers replace the padding (so the length must be a multiple of their count, 128, and the transformer
  attends to every position: the padding length is part of the input, like FLUX's; the connectors' mask, all set
  then, goes along). The conditions are what the connectors give, so any two batches concatenate. (LTX-2.3's
  connectors normalise per token and project per stream: the same call. Its folder has this layout but is untested.)
- latents: the video's normalised latents (the VAE's per-channel mean and std; F' = (frames - 1) / 8 + 1 latent
  frames of H/32 x W/32, patch 1: one token each) as the pipeline packs them, (F' H' W', 128) tokens, followed by the
  audio's packed latents, (L, 128) with L = round(frames / 24 fps x 25 latents a second), normalised by the audio
  VAE's statistics: one tensor (F' H' W' + L, 128) a sample. The transformer gets `num_frames`, `height`, `width`
  and `fps` 24 (the pipeline's `frame_rate`) and builds the same rotary positions as the pipeline; `latent_shape`
  remembers the video grid of the size it is asked for, which `velocity` and `decode` read (the tokens alone do not
  say H' and W').
- the audio: the pipeline denoises both streams with one network at the same sigmas, and the video's velocity reads
  the audio state at every step (audio-to-video cross-attention), the audio's the video state. The diffusers
  pipeline has no video-only mode (`isolate_modalities` cuts the cross-attention only for its modality guidance, an
  extra forward), so the audio is not switched off: its latents ride in the policy's latents and are part of the
  trained state. The SDE, its log-probs and every objective act on the joint (video, audio) latent, so a transition
  is the Gaussian of the whole state the network reads and the log-prob ratio is exact; keeping the audio on the
  ODE inside the SDE window (X-GenGroup/Flow-Factory's LTX-2 adapter) would need a noise mask in the model-free
  sampler and would drop the audio's dependence on the trained weights (through video-to-audio attention) from the
  ratio. The marginal-preserving SDE keeps the audio's distribution; it is a small share of the state (126 of the
  6270 tokens of a 121-frame 512x768 video). ODE sampling (window 0, validation) is the pipeline's joint
  denoising exactly. The audio's own weights are frozen: LoRA (`lora_targets`) reaches the video stream only, and
  the audio is generated and then dropped (`decode` gives the video; the audio VAE and vocoder are not loaded).
- the timestep: the network receives sigma x 1000 as `timestep` and as `sigma` (float32), for both streams.
- the schedule: linspace(1, 1/N, N), the exponential dynamic shift with mu from the video's token count (base 1024
  and max 4096 tokens, shifts 0.95 and 2.05 in the released scheduler config), then the terminal stretch to 0.1
  (`shift_terminal`), then 0. `model.shift` replaces the dynamic shift by a static one.
- guidance: the pipeline's CFG, in x0 space with a delta, equals v_u + g (v_c - v_u); `rollout.guidance` is its
  `guidance_scale` for video and audio alike (its `audio_guidance_scale` left to default to it), with
  `rollout.negative_prompt` its `negative_prompt`. Its spatio-temporal guidance (a forward skipping self-attention in
  chosen blocks), modality guidance (a forward without cross-modal attention) and guidance rescale (its defaults:
  STG 1, modality 3, rescale 0.7, audio CFG 7, LTX-2.3's, for both streams) are not implemented: our sampling is the
  pipeline called with stg_scale=0, modality_scale=1, guidance_rescale=0 and their audio_* twins 0, 1, 0 and
  audio_guidance_scale=None, as Flow-Factory's LTX-2 configs sample.
- decode: the video tokens unpacked to (B, 128, F', H', W'), x std / scaling_factor + mean, the video VAE (decode
  timestep 0 when the VAE is timestep-conditioned), [-1, 1] to [0, 1]: videos (B, F, C, H, W), frames = (F' - 1) x 8
  + 1. Image rewards score each frame through `reward.per_frame`.
Sequence parallelism is refused (`config.validate`): diffusers' context-parallel plan of the transformer splits the
video and text tokens but not the audio's.
"""

import json

import torch
from diffusers import AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline, LTX2VideoTransformer3DModel
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, Gemma3ForConditionalGeneration, PreTrainedTokenizerBase

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import pipeline_schedule, train_sigmas
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 1024  # the pipeline's default `max_sequence_length`
FRAME_RATE = 24.0  # the pipeline's default `frame_rate`
PARTS = ("transformer", "vae", "audio_vae", "text_encoder", "tokenizer", "connectors", "scheduler")

LORA_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
                "attn2.to_out.0", "audio_to_video_attn.to_q", "audio_to_video_attn.to_k", "audio_to_video_attn.to_v",
                "audio_to_video_attn.to_out.0", "ff.net.0.proj", "ff.net.2"]  # fmt: skip
"""The video stream's projections in each `LTX2VideoTransformerBlock` (peft `target_modules`): its self-attention, its
cross-attention to the text, its attention to the audio (video queries) and its MLP; the half of Flow-Factory's 28
default targets that writes the video (the other half, audio self- and text attention, video-to-audio attention and
the audio MLP, stays frozen: the rewards do not hear the audio)."""


class LTX2Policy:
    """`DiffusionPolicy` over LTX-2 text-to-video; latents are the packed video tokens followed by the packed audio
    tokens, (B, F' H' W' + L, 128), both normalised as the pipeline keeps them."""

    lora_targets = LORA_TARGETS
    edits = False
    transformer_2 = None

    def __init__(
        self,
        transformer: LTX2VideoTransformer3DModel,
        vae: AutoencoderKLLTX2Video | None,
        text_encoder: Gemma3ForConditionalGeneration | None,
        tokenizer: PreTrainedTokenizerBase | None,
        connectors: LTX2TextConnectors | None,
        scheduler: FlowMatchEulerDiscreteScheduler,
        audio_rate: float,
        frames: int = 121,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.connectors = connectors
        self.scheduler = scheduler
        self.audio_rate = audio_rate  # audio latents a second: sample rate / mel hop / the audio VAE's 4
        self.frames = frames
        self.shift = shift  # None: the scheduler config's dynamic shift
        self.max_sequence_length = max_sequence_length
        self.temporal_factor = 8 if vae is None else vae.temporal_compression_ratio
        self.spatial_factor = 32 if vae is None else vae.spatial_compression_ratio
        self.audio_tokens = round(frames / FRAME_RATE * audio_rate)  # the pipeline's audio_num_frames
        self.grid: tuple[int, int, int] | None = None  # (F', H', W') of the last latent_shape

    def to(self, device: torch.device) -> "LTX2Policy":
        for module in (self.vae, self.text_encoder, self.connectors):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """video (B, T, D) and audio (B, T, D_audio) text conditions from the connectors, in their dtype, and their
        mask (B, T) bool; T = max_sequence_length."""
        tokens = self.tokenizer([p.strip() for p in prompts], padding="max_length", max_length=self.max_sequence_length,
                                truncation=True, add_special_tokens=True,
                                return_tensors="pt").to(self.text_encoder.device)  # fmt: skip
        hidden = self.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                                   output_hidden_states=True, logits_to_keep=1).hidden_states  # fmt: skip
        embeds = torch.stack(hidden, dim=-1).flatten(2, 3).to(self.text_encoder.dtype)
        video, audio, mask = self.connectors(embeds, tokens.attention_mask, padding_side=self.tokenizer.padding_side)
        return TensorDict(video=video, audio=audio, mask=mask.bool(), batch_size=[len(prompts)])

    def _video_tokens(self, latents: torch.Tensor) -> int:
        if self.grid is None or latents.shape[1] != self.grid[0] * self.grid[1] * self.grid[2] + self.audio_tokens:
            raise ValueError(
                f"LTX-2 latents of {latents.shape[1]} tokens do not match the video grid {self.grid} of the last "
                f"latent_shape and {self.audio_tokens} audio tokens: call policy.latent_shape(height, width) for "
                "their size first"
            )
        return self.grid[0] * self.grid[1] * self.grid[2]

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        n, (f, h, w) = self._video_tokens(latents), self.grid
        dtype = self.dtype
        x, t = latents.to(dtype), sigma.float() * 1000  # the pipeline's scheduler timestep, as timestep and sigma
        video, audio = self.transformer(
            hidden_states=x[:, :n],
            audio_hidden_states=x[:, n:],
            encoder_hidden_states=cond["video"].to(dtype),
            audio_encoder_hidden_states=cond["audio"].to(dtype),
            timestep=t,
            sigma=t,
            encoder_attention_mask=cond["mask"],
            audio_encoder_attention_mask=cond["mask"],
            num_frames=f,
            height=h,
            width=w,
            fps=FRAME_RATE,
            audio_num_frames=self.audio_tokens,
            use_cross_timestep=True,  # the pipeline's default; the same sigma for both streams either way
            return_dict=False,
        )
        return torch.cat([video, audio], dim=1)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, F' H' W' + L, C) to videos (B, F, C, H, W) as float in [0, 1]; the audio tokens are dropped."""
        n, (f, h, w) = self._video_tokens(latents), self.grid
        vae, config = self.vae, self.vae.config
        x = LTX2Pipeline._unpack_latents(latents[:, :n].to(vae.dtype), f, h, w)
        x = LTX2Pipeline._denormalize_latents(x, vae.latents_mean, vae.latents_std, config.scaling_factor)
        timestep = torch.zeros(len(x), device=x.device, dtype=x.dtype) if config.timestep_conditioning else None
        video = vae.decode(x, timestep, return_dict=False)[0]  # (B, C, F, H, W) in [-1, 1]
        return (video.float() / 2 + 0.5).clamp(0, 1).transpose(1, 2)

    def video_grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(F', H', W'): latent frames and the latent height and width of a video of `self.frames` frames."""
        multiple = self.spatial_factor * self.transformer.config.patch_size
        if height % multiple or width % multiple or min(height, width) < 2 * multiple:
            raise ValueError(
                f"LTX-2 videos must have height and width divisible by {multiple} and at least {2 * multiple} (its "
                f"VAE pads latent frames by reflection), got {height}x{width}: change rollout.height / rollout.width"
            )
        f = self.spatial_factor
        return (self.frames - 1) // self.temporal_factor + 1, height // f, width // f

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """(F' H' W' + L, C): the video's tokens, then the audio's; remembers the video grid for `velocity`."""
        self.grid = self.video_grid(height, width)
        f, h, w = self.grid
        return (f * h * w + self.audio_tokens, self.transformer.config.in_channels)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        f, h, w = self.video_grid(height, width)
        return pipeline_schedule(num_steps, self.scheduler.config, f * h * w, self.shift)

    def train_sigmas(self) -> torch.Tensor:
        config = self.scheduler.config
        return train_sigmas(1.0 if config.use_dynamic_shifting else config.shift, config.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.transformer_blocks)


def load(config: ModelConfig) -> LTX2Policy:
    """Load from `config.path`, a folder in the diffusers `LTX2Pipeline` layout; text encoder, connectors and video VAE
    frozen, eval (the audio VAE's config only; the vocoder is not read)."""
    root = pipeline_folder(config, PARTS, "LTX2Pipeline", "Lightricks/LTX-2")
    dtype = getattr(torch, config.dtype)
    transformer = LTX2VideoTransformer3DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    tc = transformer.config
    if tc.in_channels != tc.audio_in_channels:
        raise ValueError(
            f"{root / 'transformer'}: video tokens of {tc.in_channels} and audio tokens of {tc.audio_in_channels} "
            "channels; the LTX-2 adapter keeps both in one latent tensor and needs them equal (128 in LTX-2)"
        )
    audio = json.loads((root / "audio_vae" / "config.json").read_text())
    audio_rate = audio["sample_rate"] / audio["mel_hop_length"] / LATENT_DOWNSAMPLE_FACTOR
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    vae = None if config.transformer_only else AutoencoderKLLTX2Video.from_pretrained(root / "vae", torch_dtype=dtype)
    temporal = 8 if vae is None else vae.temporal_compression_ratio
    if config.frames < 1 or (config.frames - 1) % temporal:
        raise ValueError(
            f"model.frames={config.frames}: (frames - 1) must be divisible by the VAE's temporal factor {temporal} "
            f"(e.g. {(max(config.frames, 1) - 1) // temporal * temporal + 1}); change model.frames"
        )
    text_tokens = config.text_tokens or MAX_SEQUENCE_LENGTH
    options = dict(audio_rate=audio_rate, frames=config.frames, shift=config.shift, max_sequence_length=text_tokens)
    if config.transformer_only:  # offline training on stored latents and conditions
        return LTX2Policy(transformer, None, None, None, None, scheduler, **options)
    connectors = LTX2TextConnectors.from_pretrained(root / "connectors", torch_dtype=dtype)
    registers = connectors.config.video_connector_num_learnable_registers or 1
    if text_tokens % registers:
        raise ValueError(
            f"model.text_tokens={text_tokens}: LTX-2's text connectors replace the padding with {registers} learned "
            f"registers and need a multiple of {registers} (the pipeline's {MAX_SEQUENCE_LENGTH}); change "
            "model.text_tokens"
        )
    encoder = Gemma3ForConditionalGeneration.from_pretrained(root / "text_encoder", dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    tokenizer.padding_side = "left"  # as the pipeline sets it
    return LTX2Policy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(), tokenizer,
                      connectors.requires_grad_(False).eval(), scheduler, **options)  # fmt: skip
