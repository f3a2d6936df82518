"""The glyphs edit task's reward and gold judge: draw the requested digit where the source's digit is.

A source image shows one digit (`data.edit_set`); the prompt names another. The reward (`glyph_edit`) is the
recognizer's probability of the requested digit times how well the result keeps the source's place and size
(`keep`, from the boxes around the ink). The gold judge (`glyph_edit_gold`), reported at validation only and
never trained or selected against, reads the result with the gold network and measures its box against where
the requested digit belongs ("target_box" of the edit's metadata).
"""

import torch

from omnialign.worlds.glyphs.data import ink_box
from omnialign.worlds.glyphs.gold import glyph_gold
from omnialign.worlds.glyphs.recognizer import glyph_ocr

KEEP_SCALE = 4.0
"""Pixels of box offset (centre x + centre y + height) at which the reward's `keep` term falls to 1/e."""
KEPT_SHIFT, KEPT_HEIGHT = 2.0, 3.0
"""The gold judge's place check: box centre within 2 px on each axis, height within 3 px."""


def _sources(metadata: list[dict], reward: str) -> torch.Tensor:
    if any("sources" not in m for m in metadata):
        raise ValueError(f'reward {reward!r} compares each result with its source image (metadata "sources"); '
                         "train on an edit prompt set (data.prompts=edits)")  # fmt: skip
    return torch.stack([m["sources"][0] for m in metadata])


@torch.no_grad()
def glyph_edit(images: torch.Tensor, prompts: list[str], metadata: list[dict], path: str | None = None) -> list[float]:
    """Reward in [0, 1]: p(requested digit | result) from the recognizer, times exp(-offset / KEEP_SCALE), the
    offset being |dx| + |dy| of the ink box centres plus |dh| of their heights, result against source, in pixels.
    info: `keep` (the second factor) and `offset`. `path`: another recognizer folder (default: the shipped one)."""
    from omnialign.rewards.base import Scores, images_of  # here: omnialign.rewards imports this world

    images = images_of(images, "glyph_edit")
    p = torch.tensor(glyph_ocr(images, prompts, metadata, path), device=images.device)
    offset = (ink_box(images) - ink_box(_sources(metadata, "glyph_edit").to(images.device))).abs().sum(1)
    keep = torch.exp(-offset / KEEP_SCALE)
    return Scores((p * keep).tolist(), [{"keep": k, "offset": o} for k, o in zip(keep.tolist(), offset.tolist())])


@torch.no_grad()
def glyph_edit_gold(
    images: torch.Tensor, prompts: list[str], metadata: list[dict], path: str | None = None
) -> list[float]:
    """`Scores`: 1.0 where the gold judge reads the requested digit, else 0.0. info: `reads` ("-": not a digit),
    `not_a_digit`, `copied` (it reads the source's digit), `kept` (the ink box is where the requested digit
    belongs: `KEPT_SHIFT`, `KEPT_HEIGHT`) and `edited` (read right and kept)."""
    from omnialign.rewards.base import Scores, images_of

    images = images_of(images, "glyph_edit_gold")
    if any("target_box" not in m or "source_digit" not in m for m in metadata):
        raise ValueError('glyph_edit_gold needs "target_box" and "source_digit" in the metadata: validate on the '
                         "glyphs edit set (data.val_prompts=edits_val), or set reward.gold=null")  # fmt: skip
    gold = glyph_gold(images, prompts, metadata, path)  # the digit read, as the text-to-image gold judge reads it
    delta = (ink_box(images).cpu() - torch.tensor([m["target_box"] for m in metadata])).abs()
    kept = ((delta[:, :2].amax(1) <= KEPT_SHIFT) & (delta[:, 2] <= KEPT_HEIGHT)).tolist()
    info = [{**i, "copied": float(i["reads"] == m["source_digit"]), "kept": float(k), "edited": float(ok and k)}
            for i, m, k, ok in zip(gold.info, metadata, kept, gold)]  # fmt: skip
    return Scores(list(gold), info)
