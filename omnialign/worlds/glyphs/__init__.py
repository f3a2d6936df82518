"""The glyphs world: a tiny text-to-image flow model learns to draw the digit it is asked for.

- `data`: the seeded renderer of digit images, the prompt sets, augmentations and hard negatives.
- `model`: the policy (diffusers' SD3 transformer, tiny, on 32x32 pixels) and its character encoder.
- `recognizer`: the reward's OCR (`glyph_ocr`), which RL trains against.
- `gold`: the gold judge (`glyph_gold`), a different network that no recipe trains or selects against,
  reported beside the reward at every validation as `val/gold/accuracy` and `val/gold/not_a_digit`.
- `pretrain`: `omnialign prepare glyphs`, which makes every shipped model in `assets/` from a seed.
- `recipes`: one recipe per diffusion algorithm, all from the same base, prompts, reward and judge.
- `edit`: the edit task (redraw a source image's digit as the requested one, in the same place and size): its
  reward `glyph_edit` and gold judge `glyph_edit_gold`; the edit model ships in `assets/edit/`, its prompt sets
  are `EDIT_SETS` (`edits`, `edits_val`) and its recipes `glyphs_edit*`.
- `video`: the video task (a 4-frame clip of the prompt's digit on every frame, drawn by a tiny real Wan
  transformer, `model.arch=glyphs_video`): its reward `glyph_video` and gold judge `glyph_video_gold`, both per
  frame; the video model ships in `assets/video/` and its recipes are `glyphs_video*`.
"""

from omnialign.worlds.glyphs.data import EDIT_SETS, PROMPT_SETS
from omnialign.worlds.glyphs.gold import glyph_gold
from omnialign.worlds.glyphs.model import load
from omnialign.worlds.glyphs.recipes import RECIPES
from omnialign.worlds.glyphs.recognizer import glyph_ocr

__all__ = ["EDIT_SETS", "PROMPT_SETS", "RECIPES", "glyph_gold", "glyph_ocr", "load"]
