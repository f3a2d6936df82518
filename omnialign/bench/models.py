"""The benchmarks' full-size pipelines with random weights, built in memory (Qwen-Image and Qwen-Image-Edit, FLUX.1,
FLUX.2, SD3.5, Wan, Z-Image, LTX-2, the Qwen3-Omni thinker and Qwen3), and the transformer FLOP counts behind the recipe
bench's MFU."""

import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from diffusers import QwenImageTransformer2DModel

from omnialign.config import ModelConfig
from omnialign.models.base import LanguagePolicy
from omnialign.models.flux import GUIDANCE, FluxPolicy, kontext_resolutions
from omnialign.models.flux2 import Flux2Policy
from omnialign.models.ltx2 import LTX2Policy
from omnialign.models.qwen_image import QwenImagePolicy
from omnialign.models.sd3 import SD3Policy
from omnialign.models.wan import MAX_SEQUENCE_LENGTH, WanPolicy
from omnialign.models.zimage import ZImagePolicy

START = time.monotonic()


def progress(text: str, main: bool = True) -> None:
    """One progress line on stderr with the seconds since the bench started (a full-size build takes minutes)."""
    if main:
        print(f"[bench {time.monotonic() - START:6.0f} s] {text}", file=sys.stderr, flush=True)


@contextmanager
def built_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules made inside are created on `device` in `dtype` (random full-size weights without a host copy); the
    default dtype is restored after."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(default)


QWEN_IMAGE = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))  # fmt: skip


def full_qwen_image(
    device: torch.device, text_tokens: int, edit: bool = False, source_resize: bool = True
) -> QwenImagePolicy:
    """The Qwen-Image pipeline at its released sizes with random weights, built on `device` in bf16; with `edit`,
    Qwen-Image-Edit-2509 (the same parts, Qwen2.5-VL's image processor; sources sized as `source_resize` says)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omnialign.models.qwen_image_edit import QwenImageEditPolicy
    from omnialign.models.tiny import QWEN_IMAGE_SCHEDULER, qwen2_tokenizer, qwen_vl_image_processor

    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6,
                rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default"})  # fmt: skip
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584)
    with built_on(device, torch.bfloat16):
        transformer = QwenImageTransformer2DModel(**QWEN_IMAGE)
        encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
        vae = AutoencoderKLQwenImage()
    vae, encoder = vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    if edit:
        return QwenImageEditPolicy(transformer, vae, encoder, qwen2_tokenizer(), qwen_vl_image_processor(), scheduler,
                                   plus=True, max_sequence_length=text_tokens, source_resize=source_resize)  # fmt: skip
    return QwenImagePolicy(transformer, vae, encoder, qwen2_tokenizer(), scheduler, max_sequence_length=text_tokens)


# The released FLUX.1-dev / FLUX.1-Kontext-dev transformer (the class defaults, with the guidance embedding).
FLUX = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
            axes_dims_rope=(16, 56, 56))  # fmt: skip


def full_flux(device: torch.device, text_tokens: int, model: ModelConfig) -> FluxPolicy:
    """The FLUX.1-dev (or, for model.arch=flux_kontext, FLUX.1-Kontext-dev) pipeline at its released sizes with
    random weights, built on `device` in bf16: the transformer, CLIP-L, T5-XXL's encoder, the VAE. The tiny
    byte-level CLIP and character-level T5 tokenizers stand in (the prompts are synthetic)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from omnialign.models.tiny import FLUX_SCHEDULER, clip_tokenizer, t5_tokenizer

    clip_tok, t5_tok = clip_tokenizer(), t5_tokenizer()
    clip = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                          num_hidden_layers=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768,
                          bos_token_id=clip_tok.bos_token_id, eos_token_id=clip_tok.eos_token_id,
                          pad_token_id=clip_tok.pad_token_id)  # fmt: skip
    t5 = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                  feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip
    with built_on(device, torch.bfloat16):
        transformer = FluxTransformer2DModel(**FLUX)
        encoders = (CLIPTextModel(clip), T5EncoderModel(t5))
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                            sample_size=1024, use_quant_conv=False, use_post_quant_conv=False,
                            scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    return FluxPolicy(transformer, vae.requires_grad_(False).eval(), tuple(e.requires_grad_(False).eval() for e in
                      encoders), (clip_tok, t5_tok), FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER),
                      guidance=GUIDANCE[model.arch] if model.embedded_guidance is None else model.embedded_guidance,
                      edits=model.arch == "flux_kontext",
                      source_resolutions=kontext_resolutions() if model.source_resize and model.arch == "flux_kontext"
                      else None,
                      max_sequence_length=text_tokens)  # fmt: skip


# The released SD3.5 transformers by the folder name of a recipe's model.path (as tests/test_gpu.py builds them).
SD35 = {
    "stable-diffusion-3.5-medium": dict(num_layers=24, num_attention_heads=24, caption_projection_dim=1536,
                                        pos_embed_max_size=384, dual_attention_layers=tuple(range(13))),
    "stable-diffusion-3.5-large": dict(num_layers=38, num_attention_heads=38, caption_projection_dim=2432,
                                       pos_embed_max_size=192),
}  # fmt: skip


def full_sd3(device: torch.device, model: ModelConfig) -> SD3Policy:
    """The SD3.5 pipeline named by `model.path`'s folder (a key of `SD35`: medium 2.5 B, large 8.1 B) at its released
    sizes with random weights, built on `device` in bf16: the transformer, CLIP-L, CLIP-G and T5-XXL's encoder, the
    VAE. The tiny byte-level CLIP and character-level T5 tokenizers stand in (the prompts are synthetic)."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from omnialign.models.tiny import clip_tokenizer, t5_tokenizer

    size = SD35[Path(model.path).name]
    tokenizers = (clip_tokenizer(), clip_tokenizer(pad_token="!"), t5_tokenizer())

    def clip(tokenizer, hidden: int, layers: int, heads: int, act: str) -> CLIPTextConfig:
        return CLIPTextConfig(vocab_size=49408, hidden_size=hidden, intermediate_size=4 * hidden,
                              num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=77,
                              hidden_act=act, projection_dim=hidden, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip

    t5 = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                  feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip
    with built_on(device, torch.bfloat16):
        transformer = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, out_channels=16,
                                            attention_head_dim=64, joint_attention_dim=4096,
                                            pooled_projection_dim=2048, qk_norm="rms_norm", **size)  # fmt: skip
        encoders = (CLIPTextModelWithProjection(clip(tokenizers[0], 768, 12, 12, "quick_gelu")),
                    CLIPTextModelWithProjection(clip(tokenizers[1], 1280, 32, 20, "gelu")),
                    T5EncoderModel(t5))  # fmt: skip
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                            sample_size=1024, use_quant_conv=False, use_post_quant_conv=False,
                            scaling_factor=1.5305, shift_factor=0.0609)  # fmt: skip
    encoders = tuple(e.requires_grad_(False).eval() for e in encoders)
    return SD3Policy(
        transformer,
        vae.requires_grad_(False).eval(),
        encoders,
        tokenizers,
        shift=model.shift or 3.0,
        max_sequence_length=model.text_tokens or 256,
    )


# The released Wan transformers by the folder name of a recipe's model.path (diffusers' defaults are the 14B's:
# dim 5120 = 40 heads of 128, 40 layers, ffn 13824, text_dim 4096, 16 latent channels, patch (1, 2, 2)).
# A14B: two experts of the 14B's shape, the high-noise one above its boundary_ratio.
WAN = {
    "Wan2.1-T2V-1.3B-Diffusers": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "Wan2.1-T2V-14B-Diffusers": {},
    "Wan2.2-T2V-A14B-Diffusers": {},
}
WAN_BOUNDARY = {"Wan2.2-T2V-A14B-Diffusers": 0.875}
# google/umt5-xxl's encoder, the text encoder of every Wan pipeline.
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip


def full_wan(device: torch.device, model: ModelConfig) -> WanPolicy:
    """The Wan pipeline named by `model.path`'s folder (a key of `WAN`) at its released sizes with random weights,
    built on `device` in bf16: the transformer (Wan 2.2 A14B: both experts), the UMT5-XXL encoder, the Wan 2.1 VAE
    (`AutoencoderKLWan`'s default config). The tiny character-level T5 tokenizer stands in (the prompts are
    synthetic)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from omnialign.models.tiny import t5_tokenizer

    name = Path(model.path or "").name
    if name not in WAN:
        raise ValueError(f"model.path={model.path!r}: the full-size Wan benchmark builds a folder named one of "
                         f"{sorted(WAN)}; set model.path=models/NAME")  # fmt: skip
    boundary = WAN_BOUNDARY.get(name)
    with built_on(device, torch.bfloat16):
        transformer = WanTransformer3DModel(**WAN[name])
        second = None if boundary is None else WanTransformer3DModel(**WAN[name])
        encoder = UMT5EncoderModel(UMT5Config(**UMT5_XXL))
        vae = AutoencoderKLWan()
    return WanPolicy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(),
                     t5_tokenizer(), shift=model.shift or 3.0, frames=model.frames,
                     transformer_2=None if second is None else second.requires_grad_(False).eval(),
                     boundary_ratio=boundary,
                     max_sequence_length=model.text_tokens or MAX_SEQUENCE_LENGTH)  # fmt: skip


# Z-Image's scheduler shift by the folder name of a recipe's model.path (Tongyi-MAI/Z-Image and Z-Image-Turbo's
# scheduler_config.json: static shifts, no dynamic shifting). Both share the transformer: diffusers' class defaults
# are the released config (30 layers and 2 noise and 2 context refiners of 3840, 30 heads, 2560-wide captions).
ZIMAGE_SHIFTS = {"Z-Image": 6.0, "Z-Image-Turbo": 3.0}


def full_zimage(device: torch.device, text_tokens: int, model: ModelConfig) -> ZImagePolicy:
    """The Z-Image (or Z-Image-Turbo) pipeline named by `model.path`'s folder at its released sizes with random
    weights, built on `device` in bf16: the 6.15 B transformer, Qwen3-4B as `Qwen3Model` (the released text encoder),
    FLUX.1's VAE (which Z-Image ships). The small Qwen3 tokenizer of the tiny twins stands in (the prompts are
    synthetic)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    from omnialign.models.tiny import qwen3_bpe_tokenizer

    name = Path(model.path or "").name
    if name not in ZIMAGE_SHIFTS:
        raise ValueError(f"model.path={model.path!r}: the full-size Z-Image benchmark builds a folder named one of "
                         f"{sorted(ZIMAGE_SHIFTS)}; set model.path=models/NAME")  # fmt: skip
    tokenizer = qwen3_bpe_tokenizer()
    text = Qwen3Config(**QWEN3_COMMON, **QWEN3_SIZES["4b"], pad_token_id=tokenizer.pad_token_id)
    with built_on(device, torch.bfloat16):
        transformer = ZImageTransformer2DModel()
        encoder = Qwen3Model(text)
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                            sample_size=1024, use_quant_conv=False, use_post_quant_conv=False,
                            scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, use_dynamic_shifting=False,
                                                shift=ZIMAGE_SHIFTS[name])  # fmt: skip
    return ZImagePolicy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(), tokenizer,
                        scheduler, shift=model.shift, max_sequence_length=text_tokens)  # fmt: skip


# FLUX.2's transformers: diffusers' Flux2Transformer2DModel defaults are FLUX.2-dev's (8 double- and 48 single-stream
# blocks of 48 heads x 128, a 3 x 5120 context, the guidance embedding); the kleins', by the folder name of a recipe's
# model.path (their transformer/config.json, as mflux's configs of them): 4B 5 + 20 blocks of 24 heads and a
# 3 x 2560 context (Qwen3-4B's width), 9B 8 + 24 blocks of 32 heads and 3 x 4096 (Qwen3-8B's); no guidance embedding.
FLUX2_KLEIN = {
    "4B": dict(num_layers=5, num_single_layers=20, num_attention_heads=24, joint_attention_dim=7680,
               guidance_embeds=False),
    "9B": dict(num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288,
               guidance_embeds=False),
}  # fmt: skip
FLUX2_KLEIN_FOLDERS = {"FLUX.2-klein-4B": "4B", "FLUX.2-klein-base-4B": "4B", "FLUX.2-klein-9B": "9B",
                       "FLUX.2-klein-base-9B": "9B"}  # fmt: skip
FLUX2_KLEIN_ENCODERS = {"4B": "4b", "9B": "8b"}  # keys of QWEN3_SIZES
# The text stack of FLUX.2-dev's encoder, Mistral Small 3.1 (mistralai/Mistral-Small-3.1-24B-Instruct-2503's
# text_config: 40 layers of 5120, 32 query and 8 key-value heads of 128, MLP 32768, vocab 131072).
MISTRAL_SMALL = dict(vocab_size=131072, hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                     rms_norm_eps=1e-5, rope_theta=1e9, sliding_window=None)  # fmt: skip


def full_flux2(device: torch.device, text_tokens: int, model: ModelConfig) -> Flux2Policy:
    """FLUX.2-dev (model.arch=flux2) or the FLUX.2-klein named by model.path's folder (a key of FLUX2_KLEIN_FOLDERS)
    at its released sizes with random weights, built on `device` in bf16: the transformer, the text encoder's decoder
    up to the last layer the pipeline reads (Mistral Small 3.1's 30 of 40; Qwen3-4B's or Qwen3-8B's 27 of 36: the
    adapter keeps no more of a loaded encoder, and no LM head or vision tower) and the VAE (`AutoencoderKLFlux2`'s
    defaults, the released config). The tiny BPE tokenizers stand in (the prompts are synthetic).

    On one H200, FLUX.2-dev's transformer (32.2 B, 64 GB) and that encoder (17.9 B, 36 GB) stay on the GPU: about
    100 GB resident, the rest for a LoRA step at micro-batches of 4 (tests/test_gpu.py). The whole 24 B encoder
    (48 GB) would leave too little to train the 32 B transformer beside it; moving it off the GPU after each encoding
    would cost 36 GB of copies a step."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from transformers import MistralConfig, MistralModel, Qwen3Config, Qwen3Model

    from omnialign.models.flux2 import GUIDANCE as FLUX2_GUIDANCE
    from omnialign.models.flux2 import LAYERS
    from omnialign.models.tiny import FLUX2_SCHEDULER, mistral_bpe_tokenizer, qwen3_bpe_tokenizer

    klein = model.arch == "flux2_klein"
    name = Path(model.path or "").name
    if klein and name not in FLUX2_KLEIN_FOLDERS:
        raise ValueError(f"model.path={model.path!r}: the full-size FLUX.2-klein benchmark builds a folder named one "
                         f"of {sorted(FLUX2_KLEIN_FOLDERS)}; set model.path=models/NAME")  # fmt: skip
    layers = max(LAYERS[model.arch]) + 1
    with built_on(device, torch.bfloat16):
        if klein:
            size = FLUX2_KLEIN_FOLDERS[name]
            transformer = Flux2Transformer2DModel(**FLUX2_KLEIN[size])
            sizes = {**QWEN3_COMMON, **QWEN3_SIZES[FLUX2_KLEIN_ENCODERS[size]], "num_hidden_layers": layers}
            encoder = Qwen3Model(Qwen3Config(**sizes))
        else:
            transformer = Flux2Transformer2DModel()
            encoder = MistralModel(MistralConfig(**{**MISTRAL_SMALL, "num_hidden_layers": layers}))
        vae = AutoencoderKLFlux2()
    tokenizer = qwen3_bpe_tokenizer() if klein else mistral_bpe_tokenizer()
    policy = Flux2Policy(transformer, vae.requires_grad_(False).eval(), encoder, tokenizer,
                         FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER), klein=klein,
                         guidance=FLUX2_GUIDANCE if model.embedded_guidance is None else model.embedded_guidance,
                         shift=model.shift, max_sequence_length=text_tokens)  # fmt: skip
    policy.text_encoder.requires_grad_(False).eval()
    return policy


# LTX-2 (Lightricks/LTX-2, LTX-2.0) at its released sizes: the audio-video transformer is diffusers' class defaults
# with split rotary embeddings (18.9 B: 48 blocks, video 32 heads of 128 with 4096-wide text, audio 32 of 64 with 2048;
# 128 channels a token in both streams), the text connectors, the video VAE and the Gemma-3-12B text encoder as the
# diffusers conversion script (scripts/convert_ltx2_to_diffusers.py, version 2.0) and google/gemma-3-12b-it's
# config.json give them; the audio VAE's 16 kHz, hop 160 and 4x compression make 25 audio latents a second.
LTX2_TRANSFORMER = dict(rope_type="split")
LTX2_CONNECTORS = dict(caption_channels=3840, text_proj_in_factor=49, video_connector_num_attention_heads=30,
                       video_connector_attention_head_dim=128, video_connector_num_layers=2,
                       video_connector_num_learnable_registers=128, audio_connector_num_attention_heads=30,
                       audio_connector_attention_head_dim=128, audio_connector_num_layers=2,
                       audio_connector_num_learnable_registers=128, connector_rope_base_seq_len=4096,
                       rope_type="split")  # fmt: skip
LTX2_VAE = dict(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8)
GEMMA3_12B_TEXT = dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                       sliding_window=1024, max_position_embeddings=131072)  # fmt: skip
GEMMA3_SIGLIP = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                     num_attention_heads=16, image_size=896, patch_size=14, vision_use_head=False)  # fmt: skip


def full_ltx2(device: torch.device, model: ModelConfig) -> LTX2Policy:
    """LTX-2 at its released sizes with random weights, built on `device` in bf16: the 18.9 B audio-video transformer,
    the 1.4 B text connectors, the 1.2 B video VAE and Gemma-3-12B (`Gemma3ForConditionalGeneration`, 12.2 B with its
    SigLIP tower), about 67 GB; the audio VAE and vocoder are not built (the adapter does not load them). The tiny
    character-level Gemma tokenizer stands in (the prompts are synthetic); rotary settings of Gemma are left at
    transformers' defaults (they do not change sizes or FLOPs)."""
    from diffusers import AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from omnialign.models.ltx2 import MAX_SEQUENCE_LENGTH
    from omnialign.models.tiny import LTX2_SCHEDULER, gemma_tokenizer

    with built_on(device, torch.bfloat16):
        transformer = LTX2VideoTransformer3DModel(**LTX2_TRANSFORMER)
        connectors = LTX2TextConnectors(**LTX2_CONNECTORS)
        vae = AutoencoderKLLTX2Video(**LTX2_VAE)
        encoder = Gemma3ForConditionalGeneration(Gemma3Config(text_config=GEMMA3_12B_TEXT, vision_config=GEMMA3_SIGLIP,
                                                              mm_tokens_per_image=256))  # fmt: skip
    return LTX2Policy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(),
                      gemma_tokenizer(), connectors.requires_grad_(False).eval(),
                      FlowMatchEulerDiscreteScheduler(**LTX2_SCHEDULER), audio_rate=16000 / 160 / 4,
                      frames=model.frames, shift=model.shift,
                      max_sequence_length=model.text_tokens or MAX_SEQUENCE_LENGTH)  # fmt: skip


# --------------------------------------------------------------------------- language models

# The text stack of the Qwen3-Omni-30B-A3B thinker (released config): every layer MoE (128 experts of 768, 8 per
# token, so `intermediate_size` is unused), 32 query / 4 key-value heads of 128, interleaved M-RoPE.
QWEN3_OMNI_TEXT = dict(vocab_size=152064, hidden_size=2048, moe_intermediate_size=768, num_hidden_layers=48,
                       num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                       num_experts_per_tok=8, max_position_embeddings=65536, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True})  # fmt: skip
# Released Qwen3 dense sizes (vocab 151936, head_dim 128, rope theta 1e6); the small ones tie their embeddings.
QWEN3_SIZES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
    "14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip
QWEN3_COMMON = dict(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6})  # fmt: skip


def omni_processors() -> tuple:
    """Qwen3-Omni's media preprocessing: Qwen2-VL patches of 16 px merged 2 x 2, two frames a temporal patch
    (images kept between 56 x 56 and 28 x 28 x 16384 pixels), and Whisper features of 128 mel bins."""
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                      size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384})  # fmt: skip
    return images, WhisperFeatureExtractor(feature_size=128)


def language_policy(
    arch: str, size: str, device: torch.device, dtype: torch.dtype, towers: str = "full"
) -> LanguagePolicy:
    """A `LanguagePolicy` with random weights built on `device` in `dtype`: the Qwen3-Omni-30B-A3B thinker
    (`arch` qwen3_omni; full-size text stack; `towers` "full": the released vision tower, 27 blocks of 1152, and
    audio tower, 32 layers of 1280, which are transformers' defaults for these configs; "shrunk": the tiny towers)
    with Qwen3-Omni's media preprocessing (`omni_processors`), or a Qwen3 causal LM of `size` (a key of
    QWEN3_SIZES); `size="tiny"` gives the tiny twin of either (shrunk towers). The byte-level tokenizer of the tiny
    models (ids below 266) stands in for Qwen's: the benchmark's text is synthetic."""
    from transformers import (
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3OmniMoeThinkerConfig,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    from omnialign.models.qwen3 import CausalLMPolicy
    from omnialign.models.qwen3_omni import OmniThinkerPolicy
    from omnialign.models.tiny import TINY_OMNI_TEXT, byte_tokenizer, qwen3_sizes, thinker_config

    tokenizer = byte_tokenizer()
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with built_on(device, dtype):
        if arch == "qwen3_omni":
            text = {**(TINY_OMNI_TEXT if size == "tiny" else QWEN3_OMNI_TEXT), **special}
            config = thinker_config(text, tokenizer)  # shrunk towers
            if towers == "full" and size != "tiny":
                config.update(audio_config={"output_dim": text["hidden_size"]},
                              vision_config={"out_hidden_size": text["hidden_size"]})  # fmt: skip
            net = Qwen3OmniMoeThinkerForConditionalGeneration(Qwen3OmniMoeThinkerConfig(**config))
        elif arch == "qwen3":
            sizes = qwen3_sizes() if size == "tiny" else {**QWEN3_COMMON, **QWEN3_SIZES[size]}
            net = Qwen3ForCausalLM(Qwen3Config(**sizes, **special))
        else:
            raise ValueError(f"model.arch={arch!r}: the language benchmark builds qwen3 or qwen3_omni")
    net.generation_config.eos_token_id = special["eos_token_id"]
    net.generation_config.pad_token_id = special["pad_token_id"]
    if arch == "qwen3_omni":
        return OmniThinkerPolicy(net, tokenizer, *omni_processors())
    return CausalLMPolicy(net, tokenizer)


# --------------------------------------------------------------------------- FLOP counts


def transformer_flops(layers: int, dim: int, image_tokens: int, text_tokens: int) -> float:
    """MM-DiT forward FLOPs of one sample: dense layers per stream (24 L d^2 per token) + joint attention."""
    tokens = image_tokens + text_tokens
    return 24 * layers * dim**2 * tokens + 4 * layers * dim * tokens**2


def flux_layers_and_tokens(policy, height: int, width: int) -> tuple[int, int]:
    """FLUX's blocks (double- and single-stream: the same dense FLOPs per token) and image tokens per sample: the
    noisy tokens and, for Kontext, those of a source of the output size as the policy prepares it."""
    tc, multiple = policy.transformer.config, policy.vae_scale_factor * 2
    grid = policy.latent_shape(height, width)
    tokens = grid[0] * grid[1]
    if policy.edits:
        source = policy.source_pixels(torch.zeros(3, height, width)).shape
        tokens += source[1] // multiple * (source[2] // multiple)
    return tc.num_layers + tc.num_single_layers, tokens


def qwen_image_edit_tokens(policy, height: int, width: int) -> tuple[int, int]:
    """Qwen-Image-Edit's image tokens per sample (the noisy ones and those of a source of the output size as the
    policy sizes it) and its text tokens (that source's vision tokens and the padded instruction)."""
    (w, h), (vision_w, vision_h) = policy.source_sizes(width, height)
    multiple, merge = policy.vae_scale_factor * 2, policy.image_processor.merge_size
    grid = policy.latent_shape(height, width)
    vision = policy.image_processor.get_number_of_image_patches(vision_h, vision_w) // merge**2
    return grid[0] * grid[1] + (h // multiple) * (w // multiple), vision + policy.max_sequence_length


def wan_tokens(policy, height: int, width: int) -> int:
    """Wan's video tokens per sample: latent frames x (H / 16) x (W / 16) for the released VAE and patch (1, 2, 2)."""
    _, frames, h, w = policy.latent_shape(height, width)
    patch = policy.transformer.config.patch_size
    return frames // patch[0] * (h // patch[1]) * (w // patch[2])


def wan_flops(layers: int, dim: int, ffn: int, video_tokens: int, text_tokens: int) -> float:
    """Wan transformer forward FLOPs of one sample: per block, self-attention over the video tokens (projections
    8 N d^2, scores and values 4 N^2 d), cross-attention to the text (query and output 4 N d^2, keys and values
    4 T d^2, scores and values 4 N T d) and the MLP (4 N d ffn)."""
    n, t = video_tokens, text_tokens
    return layers * (12 * n * dim**2 + 4 * t * dim**2 + 4 * n * n * dim + 4 * n * t * dim + 4 * n * dim * ffn)


def zimage_tokens(policy, height: int, width: int, prompts: list[str]) -> tuple[int, int]:
    """Z-Image's image and caption tokens per sample as its transformer pads them (each to a multiple of 32): the
    (H/16)(W/16) patches, and the longest of `prompts` in the chat template (the batch's longest sets the length)."""
    _, h, w = policy.latent_shape(height, width)
    caption = int(policy.tokenize(prompts).attention_mask.sum(1).max())
    return math.ceil(h // 2 * (w // 2) / 32) * 32, math.ceil(caption / 32) * 32


def zimage_flops(policy, image_tokens: int, caption_tokens: int) -> float:
    """Z-Image transformer forward FLOPs of one sample: its single-stream blocks have an MM-DiT layer's dense FLOPs per
    token (attention projections 8 d^2 and the SwiGLU MLP of 8/3 d, 16 d^2: `transformer_flops`); the main layers run
    over the image and caption tokens together, the noise refiners over the image's, the context refiners over the
    caption's."""
    tc = policy.transformer.config
    return (transformer_flops(tc.n_layers, tc.dim, image_tokens, caption_tokens)
            + transformer_flops(tc.n_refiner_layers, tc.dim, image_tokens, 0)
            + transformer_flops(tc.n_refiner_layers, tc.dim, 0, caption_tokens))  # fmt: skip


def flux2_flops(policy, height: int, width: int, text_tokens: int) -> float:
    """FLUX.2 transformer forward FLOPs of one sample: every block (double- or single-stream) holds (4 + 3 r) d^2
    weights per token (attention 4 d^2, the SwiGLU MLP of ratio r = 3: 3 r d^2, fused in the single-stream blocks),
    2 FLOPs each, plus joint attention's scores and values (4 N d per token)."""
    c = policy.transformer.config
    layers, dim = c.num_layers + c.num_single_layers, c.num_attention_heads * c.attention_head_dim
    grid = policy.latent_shape(height, width)
    tokens = grid[0] * grid[1] + text_tokens
    return 2 * (4 + 3 * c.mlp_ratio) * layers * dim**2 * tokens + 4 * layers * dim * tokens**2


def ltx2_flops(layers: int, dim: int, audio_dim: int, video_tokens: int, audio_tokens: int, text_tokens: int) -> float:
    """LTX-2 transformer forward FLOPs of one sample: per block, for the video (N tokens of width d) and the audio (L of
    width a) each, self-attention (projections 8 N d^2, scores and values 4 N^2 d), attention to the text (query and
    output 4 N d^2, keys and values 4 T d^2 from the connectors' T tokens, scores and values 4 N T d) and the MLP of
    ratio 4 (16 N d^2); then audio-to-video attention (video queries and outputs through the audio width, 4 N d a; audio
    keys and values 4 L a^2; scores and values 4 N L a) and video-to-audio attention (4 L a^2, 4 N d a, 4 L N a)."""
    n, m, t, d, a = video_tokens, audio_tokens, text_tokens, dim, audio_dim
    stream = lambda k, w: 28 * k * w**2 + 4 * k * k * w + 4 * t * w**2 + 4 * k * t * w  # k tokens of width w
    return layers * (stream(n, d) + stream(m, a) + 2 * (4 * n * d * a + 4 * m * a * a + 4 * n * m * a))
