"""The Qwen3-Omni thinker as a `LanguagePolicy`: text, image, audio and video in, text out.

`load` reads a local folder: a whole Qwen3-Omni checkpoint (`Qwen3OmniMoeForConditionalGeneration`,
built without the talker and code-to-wave parts, whose weights are skipped) or a thinker alone.
The vision and audio towers are frozen. Media are encoded here, per prompt, the way the released
processor does (image patches and Whisper features; video as frames), because transformers' video
processor needs torchvision: `encode` expands each `<|image_pad|>`, `<|audio_pad|>` and `<|video_pad|>`
of the chat template to its token count and keeps the tensors with the prompt.

LoRA: the default targets are the language model's attention projections by full path (`q_proj` alone
would also hit the audio tower). The MoE experts are fused 3-D parameters in transformers 5 (the
released checkpoints store them per expert), so adapters on them would not line up with adapters
trained elsewhere: targets naming expert or router modules are refused.
"""

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from transformers import (
    AutoConfig,
    AutoTokenizer,
    DynamicCache,
    Qwen3OmniMoeForConditionalGeneration,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    WhisperFeatureExtractor,
)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoeThinkerTextModel,
    Qwen3OmniMoeVisionEncoder,
)
from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

from omnialign.config import ModelConfig
from omnialign.models.base import Prefill
from omnialign.models.qwen3 import ATTENTION, CausalLMPolicy, last_logits_head

SAMPLE_RATE = 16000
MOE_NAMES = re.compile(r"(^|\.)(experts|gate|gate_proj|up_proj|down_proj|gate_up_proj|shared_expert\w*)$")


def load_image(item) -> Image.Image:
    return (item if isinstance(item, Image.Image) else Image.open(item)).convert("RGB")


def load_audio(item) -> np.ndarray:
    """A mono float waveform at 16 kHz: an array as given, or a .wav (PCM 8/16/32-bit) or .npy file."""
    if not isinstance(item, (str, Path)):
        return np.asarray(item, dtype=np.float32)
    path = Path(item)
    if path.suffix == ".npy":
        return np.load(path).astype(np.float32)
    if path.suffix != ".wav":
        raise ValueError(f"audio file {path}: only .wav and .npy (16 kHz waveform) are read; convert it first")
    import wave

    with wave.open(str(path)) as f:
        width, rate, channels = f.getsampwidth(), f.getframerate(), f.getnchannels()
        raw = np.frombuffer(f.readframes(f.getnframes()), dtype={1: np.uint8, 2: np.int16, 4: np.int32}[width])
    wave_ = (raw.astype(np.float32) - (128 if width == 1 else 0)) / float(2 ** (8 * width - 1))
    wave_ = wave_.reshape(-1, channels).mean(1)
    if rate != SAMPLE_RATE:  # linear resampling
        n = int(round(len(wave_) * SAMPLE_RATE / rate))
        wave_ = np.interp(np.linspace(0, len(wave_) - 1, n), np.arange(len(wave_)), wave_).astype(np.float32)
    return wave_


def load_frames(item) -> np.ndarray:
    """Video frames (T, H, W, 3) uint8: an array as given, a .npy file, or a folder of images (sorted)."""
    if not isinstance(item, (str, Path)):
        return np.asarray(item)
    path = Path(item)
    if path.is_dir():
        return np.stack([np.asarray(load_image(p)) for p in sorted(path.iterdir())])
    if path.suffix == ".npy":
        return np.load(path)
    raise ValueError(f"video {path}: give a folder of frame images or a .npy array (T, H, W, 3); decode it first")


def video_patches(frames: np.ndarray, ip: Qwen2VLImageProcessorPil) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2-VL video patches: frames resized like images, pairs of frames (temporal patch) flattened.

    Returns pixel values (N, 3 * tp * p * p) and the grid (1, 3) = (T / tp, H / p, W / p)."""
    p, m, tp = ip.patch_size, ip.merge_size, ip.temporal_patch_size
    if len(frames) % tp:
        frames = np.concatenate([frames, np.repeat(frames[-1:], tp - len(frames) % tp, 0)])
    h, w = smart_resize(frames.shape[1], frames.shape[2], factor=p * m, min_pixels=ip.size["shortest_edge"],
                        max_pixels=ip.size["longest_edge"])  # fmt: skip
    x = np.stack([np.asarray(Image.fromarray(f).convert("RGB").resize((w, h), Image.BICUBIC)) for f in frames])
    x = (x.astype(np.float32) / 255 - np.array(ip.image_mean)) / np.array(ip.image_std)
    t, gh, gw = len(x) // tp, h // p, w // p
    x = x.transpose(0, 3, 1, 2).reshape(t, tp, 3, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(t * gh * gw, 3 * tp * p * p)
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.tensor([[t, gh, gw]])


DENSE_EXPERTS_MAX_TOKENS = 512


def dense_decode_experts(
    experts: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The thinker's routed experts (gated, no biases) in generation (`OmniThinkerPolicy.generate`) on hidden (T, H)
    with each token's picks (T, k) and routing weights (T, k). Up to DENSE_EXPERTS_MAX_TOKENS tokens (a decode step):
    every expert on every token, mixed by the routing weights (0 for experts not picked), so each expert's weights
    are read once; at decode the picks of a batch touch most experts anyway, and the extra FLOPs cost less than
    `batched_mm`, which transformers' `generate` would switch to and which copies an expert's weights per (token,
    pick). More tokens (the prefill): `grouped_mm`, which every forward outside generation keeps."""
    if hidden.shape[0] > DENSE_EXPERTS_MAX_TOKENS:
        return grouped_mm_experts_forward(experts, hidden, top_k_index, top_k_weights)
    mix = torch.zeros(hidden.shape[0], experts.num_experts, dtype=torch.float32, device=hidden.device)
    mix.scatter_(1, top_k_index, top_k_weights.float())  # (T, E)
    up = experts._apply_gate(hidden @ experts.gate_up_proj.transpose(1, 2))  # (E, T, I)
    out = up @ experts.down_proj.transpose(1, 2)  # (E, T, H)
    return torch.einsum("eth,te->th", out.float(), mix).to(hidden.dtype)


ALL_EXPERTS_FUNCTIONS.register("dense_decode", dense_decode_experts)


def find(net: nn.Module, kind: type) -> nn.Module:
    """The one submodule of `kind`: transformers moved the thinker's parts between versions (5.17: `model`,
    `visual`, `audio_tower` side by side; 5.24: under `model`, the text stack as `model.language_model`)."""
    (found,) = [m for m in net.modules() if isinstance(m, kind)]
    return found


def _expand(text: str, token: str, counts: list[int], kind: str) -> str:
    parts = text.split(token)
    if len(parts) - 1 != len(counts):
        raise ValueError(
            f"the chat template wrote {len(parts) - 1} {kind} placeholders for {len(counts)} {kind} inputs"
        )
    return parts[0] + "".join(token * n + part for n, part in zip(counts, parts[1:]))


class OmniThinkerPolicy(CausalLMPolicy):
    """`LanguagePolicy` over `Qwen3OmniMoeThinkerForConditionalGeneration`."""

    def __init__(self, transformer: nn.Module, tokenizer, image_processor, feature_extractor):
        super().__init__(transformer, tokenizer)
        self.image_processor, self.feature_extractor = image_processor, feature_extractor
        self.language_model = find(transformer, Qwen3OmniMoeThinkerTextModel)
        self.frozen = [find(transformer, Qwen3OmniMoeVisionEncoder), find(transformer, Qwen3OmniMoeAudioEncoder)]
        config = transformer.config
        # the placeholders, and the starts that transformers' M-RoPE counts as media wherever they stand (a sampled
        # audio start in a response made the training forward look for an audio that is not there)
        self.banned_token_ids = [config.image_token_id, config.audio_token_id, config.video_token_id,
                                 config.vision_start_token_id, config.audio_start_token_id]  # fmt: skip
        for tower in self.frozen:
            tower.requires_grad_(False)
        layers = self.language_model.layers
        prefix = next(name for name, m in transformer.named_modules() if m is layers)
        self.lora_targets = [f"{prefix}.{i}.self_attn.{p}" for i in range(len(layers)) for p in ATTENTION]

    @contextmanager
    def generating(self) -> Iterator[None]:
        """The experts of `dense_decode_experts` for a generation; the training, old-policy and reference forwards
        keep the network's own, so that their log-probs agree bit for bit."""
        own = self.transformer.get_experts_implementation()
        self.transformer.set_experts_implementation("dense_decode")
        try:
            yield
        finally:
            self.transformer.set_experts_implementation(own)

    def generate(
        self, ids: torch.Tensor, mask: torch.Tensor, media: list | None, options: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.generating():
            return super().generate(ids, mask, media, options)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, media: list | None) -> Prefill:
        """The prompts through the thinker's own forward (towers, deepstack, M-RoPE), as training runs them, into a
        cache, at the M-RoPE positions the forward would compute (computed once here, for the next one too); the
        first new token's rotary position is one past the prompt's largest, alike on the three M-RoPE axes (as
        transformers continues a prompt)."""
        inputs = self.media_inputs(media, ids.device)
        features = inputs.get("feature_attention_mask")
        positions, _ = self.transformer.get_rope_index(
            ids, inputs.get("image_grid_thw"), inputs.get("video_grid_thw"), mask, False,
            None if features is None else features.sum(-1), inputs.get("video_second_per_grid"),
        )  # fmt: skip
        cache = DynamicCache()
        with last_logits_head(self.transformer), warnings.catch_warnings():
            # transformers 5.24 names it `cache`; 5.17 (the lowest supported) knows only this name
            warnings.filterwarnings("ignore", "`past_key_values` is deprecated", FutureWarning)
            out = self.transformer(input_ids=ids, attention_mask=mask, **inputs, position_ids=positions,
                                   past_key_values=cache, use_cache=True)  # fmt: skip
        last = positions.masked_fill(~mask.bool(), 0).amax((0, 2))
        return Prefill(out.logits[:, -1], [layer.keys for layer in cache.layers],
                       [layer.values for layer in cache.layers], (last[:, None] + 1).repeat(3, 1, 1))  # fmt: skip

    def blocks(self) -> list[nn.Module]:
        """The decoder layers, then each tower whole: generation runs the towers outside the network's forward,
        so they must be units of their own when sharded."""
        return [*self.language_model.layers, *self.frozen]

    def to(self, device: torch.device) -> "OmniThinkerPolicy":
        return self  # the towers belong to the sharded network and move with it

    def encode(self, messages: list[list[dict]]) -> tuple[list[list[int]], list[dict | None]]:
        tok, ids, media = self.tokenizer, [], []
        for conversation in messages:
            text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
            items = [c for m in conversation if not isinstance(m["content"], str) for c in m["content"]]
            encoded: dict[str, torch.Tensor] = {}
            images = [load_image(c["image"]) for c in items if c["type"] == "image"]
            if images:
                out = self.image_processor(images=images, return_tensors="pt")
                encoded.update(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])
                merge = self.image_processor.merge_size**2
                text = _expand(text, tok.image_token, [int(g.prod()) // merge for g in out["image_grid_thw"]], "image")
            audios = [load_audio(c["audio"]) for c in items if c["type"] == "audio"]
            if audios:
                out = self.feature_extractor(audios, sampling_rate=SAMPLE_RATE, padding=True,
                                             return_attention_mask=True, return_tensors="pt")  # fmt: skip
                encoded.update(input_features=out["input_features"], feature_attention_mask=out["attention_mask"])
                counts = _get_feat_extract_output_lengths(out["attention_mask"].sum(-1), 50).tolist()
                text = _expand(text, tok.audio_token, counts, "audio")
            videos = [c for c in items if c["type"] == "video"]
            if videos:
                tp = self.image_processor.temporal_patch_size
                parts = [video_patches(load_frames(c["video"]), self.image_processor) for c in videos]
                grid = torch.cat([g for _, g in parts])
                seconds = torch.tensor([tp / float(c.get("fps", 2.0)) for c in videos])
                encoded.update(pixel_values_videos=torch.cat([v for v, _ in parts]), video_grid_thw=grid,
                               video_second_per_grid=seconds)  # fmt: skip
                merge = self.image_processor.merge_size**2
                text = _expand(text, tok.video_token, [int(g.prod()) // merge for g in grid], "video")
            ids.append(tok(text, add_special_tokens=False).input_ids)
            media.append(encoded or None)
        return ids, media

    def media_inputs(self, media: list | None, device: torch.device) -> dict:
        """The media of a batch as network inputs: concatenated, audio features padded to the longest."""
        present = [m for m in media or [] if m]
        if not present:
            return {}
        out = {}
        for key in sorted({k for m in present for k in m}):
            values = [m[key] for m in present if key in m]
            if key in ("input_features", "feature_attention_mask"):
                longest = max(v.shape[-1] for v in values)
                values = [nn.functional.pad(v, (0, longest - v.shape[-1])) for v in values]
            out[key] = torch.cat(values).to(device)
        return out

    def forward_inputs(self, ids: torch.Tensor, mask: torch.Tensor, media: list | None) -> dict:
        return self.media_inputs(media, ids.device)  # positions (3-D rope) come from the mask and the grids


def check_lora_targets(targets: list[str] | None) -> None:
    """Refuse LoRA targets on the MoE experts or routers (fused parameters; adapters would not line up)."""
    bad = [t for t in targets or [] if MOE_NAMES.search(t)]
    if bad:
        raise ValueError(
            f"model.lora.targets={targets}: {bad} name MoE experts or routers, which transformers 5 fuses into "
            "3-D parameters, so adapters on them would not line up with exported ones; target the attention "
            "projections (the default) instead"
        )


def load(config: ModelConfig) -> OmniThinkerPolicy:
    """The thinker from a local Qwen3-Omni folder (whole model or thinker only), towers frozen."""
    root = Path(config.path or "")
    if not config.path or not (root / "config.json").exists():
        raise FileNotFoundError(f"model.path={config.path!r}: give the local folder of a Qwen3-Omni checkpoint")
    check_lora_targets(config.lora.targets)
    dtype = getattr(torch, config.dtype)
    if AutoConfig.from_pretrained(root).model_type == "qwen3_omni_moe":
        whole = Qwen3OmniMoeForConditionalGeneration.from_pretrained(root, dtype=dtype, enable_audio_output=False)
        thinker = whole.thinker
    else:
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(root, dtype=dtype)
    return OmniThinkerPolicy(thinker, AutoTokenizer.from_pretrained(root),
                             Qwen2VLImageProcessorPil.from_pretrained(root),
                             WhisperFeatureExtractor.from_pretrained(root))  # fmt: skip
