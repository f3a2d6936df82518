"""The glyphs video task: a tiny text-to-video model draws a short clip of the digit it is asked for on every frame.

The network is diffusers' real `WanTransformer3DModel` with a tiny config, on 1-channel pixel videos of
`FRAMES` frames of 32x32 (patch 1x4x4: 256 tokens; the weights shipped before 2026-12-02 use 1x2x2, 1024 tokens,
and their config says so), with the world's character encoder, so the video path (Wan's 3D attention, its rotary
positions over frames, height and width, and sequence parallelism) runs on a CPU. Its weights ship in
`assets/video/` (stage `video` of `omnialign prepare glyphs`), made as the text-to-image base: first trained on
clean clips of the prompt's digit drawn in one style each (font size, stroke and offset shared by the frames), then
briefly with a share of the prompts replaced by random ones, so that it draws one digit per clip but the asked-for
one only part of the time, and RL has something to teach. (The weights shipped before 2026-12-02 were trained once,
from scratch, with each frame showing a random other digit half of the time: 17% of frames right, and clips that
change digit from frame to frame.)

Why not a count across frames ("3456")? Wan's only positions are rotary, relative ones: a token cannot tell which
frame of the clip it is in, so the real Wan network cannot learn which digit of a count belongs to its frame (a
first version, trained 4000 steps on counts, read right on 8% of frames, chance level).

Reward `glyph_video`: the mean over frames of the recognizer's probability of the prompt's digit. Gold judge
`glyph_video_gold` (validation only): the share of frames the gold network reads as the prompt's digit; info
`not_a_digit` (share of frames that are no digit), `clip` (1.0 when every frame is right), `steady` (1.0 when
every frame shows one and the same digit, whichever: the temporal check, `val/gold/steady`) and `reads`.
"""

from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from torch import nn

from omnialign.config import ModelConfig
from omnialign.worlds.glyphs.data import ASSETS, CHARSET, FRAMES
from omnialign.worlds.glyphs.gold import glyph_gold
from omnialign.worlds.glyphs.model import CharEncoder, GlyphsPolicy
from omnialign.worlds.glyphs.recognizer import glyph_ocr

VIDEO = ASSETS / "video"
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def video_transformer(dim: int = 64, layers: int = 4, heads: int = 2, patch: int = 4) -> WanTransformer3DModel:
    """The glyphs video generator: Wan's DiT on 1-channel 32x32 frames, patch 1 x `patch` x `patch`, the char
    encoder's width."""
    return WanTransformer3DModel(patch_size=(1, patch, patch), num_attention_heads=heads,
                                 attention_head_dim=dim // heads, in_channels=1, out_channels=1, text_dim=64,
                                 freq_dim=64, ffn_dim=4 * dim, num_layers=layers, rope_max_seq_len=64)  # fmt: skip


class GlyphsVideoPolicy(GlyphsPolicy):
    """`DiffusionPolicy` over the glyphs video generator; latents are the pixels (B, 1, FRAMES, SIZE, SIZE) in
    [-1, 1], decoded to videos (B, FRAMES, 1, SIZE, SIZE) in [0, 1]."""

    lora_targets = LORA_TARGETS

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond) -> torch.Tensor:
        dtype = self.dtype
        return self.transformer(hidden_states=latents.to(dtype), timestep=sigma * 1000,
                                encoder_hidden_states=cond["hidden"].to(dtype), return_dict=False)[0]  # fmt: skip

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float().clamp(-1, 1) + 1) / 2).transpose(1, 2)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        return (1, FRAMES, height, width)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.blocks)


def load(config: ModelConfig | None = None) -> GlyphsVideoPolicy:
    """The glyphs video policy from `config.path` (default: the shipped weights in assets/video); encoder frozen."""
    config = config or ModelConfig()
    root = Path(config.path) if config.path else VIDEO
    if not (root / "transformer").is_dir():
        raise FileNotFoundError(
            f"no glyphs video model at {root}: run `omnialign prepare glyphs --out {root.parent} --stages "
            "video_teacher video`"
        )
    transformer = WanTransformer3DModel.from_pretrained(root / "transformer", torch_dtype=getattr(torch, config.dtype))
    if config.transformer_only:
        return GlyphsVideoPolicy(transformer, None, shift=config.shift or 1.0)
    text_encoder = CharEncoder.from_pretrained(root / "text_encoder").requires_grad_(False).eval()
    return GlyphsVideoPolicy(transformer, text_encoder, shift=config.shift or 1.0)


def _frames(videos: torch.Tensor, prompts: list[str], reward: str) -> tuple[torch.Tensor, list[str]]:
    """Every frame (B * F, 1, H, W) and the digit it should show."""
    from omnialign.rewards.video import videos_of  # here: omnialign.rewards imports this world

    videos = videos_of(videos, reward)
    bad = [p for p in prompts if len(p) != 1 or p not in CHARSET]
    if bad:
        raise ValueError(f"{reward} reads the prompt's digit on every frame: prompts {bad[:3]} are not single digits "
                         "(train and validate on data.prompts=digits)")  # fmt: skip
    return videos.flatten(0, 1), [p for p in prompts for _ in range(videos.shape[1])]


@torch.no_grad()
def glyph_video(videos: torch.Tensor, prompts: list[str], metadata: list[dict], path: str | None = None) -> list[float]:
    """Reward in [0, 1]: the mean over frames of the recognizer's probability of the prompt's digit. info: `frames`,
    each frame's probability. `path`: another recognizer folder (default: the shipped one)."""
    from omnialign.rewards.base import Scores

    frames, digits = _frames(videos, prompts, "glyph_video")
    p = torch.tensor(glyph_ocr(frames, digits, None, path)).view(len(prompts), -1)
    return Scores(p.mean(1).tolist(), [{"frames": row} for row in p.tolist()])


@torch.no_grad()
def glyph_video_gold(
    videos: torch.Tensor, prompts: list[str], metadata: list[dict], path: str | None = None
) -> list[float]:
    """`Scores`: the share of frames the gold judge reads as the prompt's digit. info: `reads` (one character per frame,
    "-" for no digit), `not_a_digit`, `strict` and `person` (shares of frames, as `glyph_gold`), `clip` (1.0 when every
    frame is read right) and `steady` (1.0 when every frame is read as one and the same digit, right or not: a clip
    that flickers between digits is 0)."""
    from omnialign.rewards.base import Scores

    frames, digits = _frames(videos, prompts, "glyph_video_gold")
    gold = glyph_gold(frames, digits, None, path)
    f = videos.shape[1]
    right = torch.tensor(list(gold)).view(len(prompts), f)
    reads = ["".join(i["reads"] for i in gold.info[k * f : (k + 1) * f]) for k in range(len(prompts))]
    shares = ("not_a_digit", "strict", "person")  # of the clip's frames
    info = [{"reads": reads[k], **{key: sum(i[key] for i in gold.info[k * f : (k + 1) * f]) / f for key in shares},
             "clip": float(right[k].all()), "steady": float(len(set(reads[k])) == 1 and reads[k][0] in CHARSET)}
            for k in range(len(prompts))]  # fmt: skip
    return Scores(right.mean(1).tolist(), info)
