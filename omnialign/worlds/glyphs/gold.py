"""The glyphs world's gold judge: which digit an image shows, or that it shows none.

A reward can be fooled, so a toy world's progress is judged by a model that no recipe trains or
selects against. The gold judge is a different architecture from the reward's recognizer (a small
residual network with batch norm and global pooling, against the recognizer's plain strided CNN
with per-slot heads) and reads one digit or "not a digit" (class 10). `omnialign prepare glyphs`
trains it on the renderer's digits under strong augmentation and on hard negatives (blobs, ovals
with dots, textures, superposed and swollen digits, noise); its accuracy and not-a-digit rates are
in `assets/pretrain.json`. Recipes report it at every validation (`reward.gold`), never train on it.

Beside it, the person judge (`assets/gold_person/`, stage `person`): the same network fine-tuned on RL samples a
person labelled by eye, read only at probability `PERSON_MIN_PROB`. It is strict: on three labelled sets it never
saw (960 images of twelve runs) it accepted none of the 165 that a person would not read as the prompted digit, and
65-81% of the readable ones (BENCHMARKS.md, "Gold judging"). `val/gold/person` is a lower bound on what a person
reads; `val/gold/accuracy` is nearer the person's reading and can be fooled.
"""

from functools import lru_cache

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from omnialign.worlds.glyphs.data import ASSETS, CHARSET
from omnialign.worlds.glyphs.shape import shape_accepts

NOT_A_DIGIT = len(CHARSET)
MIN_PROB = 0.7
"""A digit counts as read only at this probability or above. RL samples that fool the reward mostly fool the judge
with lower confidence than legible digits get: on 320 person-labelled RL samples it accepted 65% of the unreadable
ones by its plain argmax and 19% at 0.7, keeping 95% of the readable ones (BENCHMARKS.md, "Gold judging"). 0.7 is
the highest of 0.5, 0.6, ..., 0.9 at which it still reads 99% of the renderer's distorted digits
(`benchmarks/glyphs_judges.py`)."""


PERSON_MIN_PROB = 0.9
"""The person judge counts a digit only at this probability or above: 0.9 is where it accepted no unreadable image
of the labelled sets and still 98.5% of the renderer's clean digits (the issue's goals: under 2%, at least 97%)."""


class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class GoldJudge(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, width: int = 32, classes: int = len(CHARSET) + 1):
        super().__init__()
        w = width

        def down(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
            )

        self.net = nn.Sequential(
            nn.Conv2d(1, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(), Residual(w),
            down(w, 2 * w), Residual(2 * w), down(2 * w, 4 * w), Residual(4 * w),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(4 * w, classes),
        )  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 1, 32, 32) in [-1, 1] to logits (B, 11): digits 0-9, then not-a-digit."""
        return self.net(images)


@lru_cache(maxsize=4)
def load_gold(path: str = str(ASSETS / "gold"), device: torch.device | None = None) -> GoldJudge:
    return GoldJudge.from_pretrained(path).to(device).requires_grad_(False).eval()


@torch.no_grad()
def glyph_gold(
    images: torch.Tensor,
    prompts: list[str],
    metadata: list[dict] | None = None,
    path: str | None = None,
    person_path: str | None = None,
) -> list[float]:
    """`Scores`: 1.0 where the gold judge reads the prompted digit with probability `MIN_PROB` or more, else 0.0;
    info: what it reads (the digit; "?" for a digit below `MIN_PROB`; "-" for not a digit), `not_a_digit` (1.0
    or 0.0), `strict` (1.0 where it reads the prompted digit and the ink has that digit's shape too,
    `shape.shape_accepts`: a second check that works differently from the network) and `person` (1.0 where the
    person judge, `person_path`, reads the prompted digit with probability `PERSON_MIN_PROB` or more). Images
    (B, 1, H, W) in [0, 1]; prompts single digits."""
    from omnialign.rewards.base import Scores, images_of  # here: omnialign.rewards imports this world

    images = images_of(images, "glyph_gold")
    bad = [p for p in prompts if len(p) != 1 or p not in CHARSET]
    if bad:
        raise ValueError(f"glyph_gold reads one digit per image; prompts {bad[:3]} are not single digits "
                         "(validate on data.val_prompts=digits, or set reward.gold=null)")  # fmt: skip
    x = images.float() * 2 - 1
    prob, best = load_gold(path or str(ASSETS / "gold"), images.device)(x).softmax(-1).max(-1)
    person = load_gold(person_path or str(ASSETS / "gold_person"), images.device)(x).softmax(-1)
    digits = torch.tensor([CHARSET.index(p) for p in prompts], device=images.device)
    certain = (person.gather(1, digits[:, None])[:, 0] >= PERSON_MIN_PROB).tolist()  # above 0.5: its reading
    reads = [
        "-" if b == NOT_A_DIGIT else CHARSET[b] if p >= MIN_PROB else "?" for b, p in zip(best.tolist(), prob.tolist())
    ]
    shaped = shape_accepts(images.float().cpu(), digits.cpu()).tolist()
    return Scores([float(r == p) for r, p in zip(reads, prompts)],
                  [{"reads": r, "not_a_digit": float(r == "-"), "strict": float(r == p and s), "person": float(c)}
                   for r, p, s, c in zip(reads, prompts, shaped, certain)])  # fmt: skip
