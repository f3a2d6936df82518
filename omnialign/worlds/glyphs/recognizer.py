"""The glyphs world's reward: a small CNN reading up to two characters from a 32x32 image.

Each of `positions` heads classifies one character slot over CHARSET plus a blank. A string's
probability is the product of its characters' probabilities and blanks for the unused slots, so
an image that is no string (all blanks) scores near 0 for every prompt. Trained by `omnialign
prepare glyphs` on augmented renders and on the hard negatives of `data.negatives`, then
fine-tuned on the samples with which RL fooled it (`recognizer/fooling_samples.pt`).
"""

from functools import lru_cache

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from omnialign.worlds.glyphs.data import ASSETS, CHARSET


class Recognizer(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, charset: str = CHARSET, positions: int = 2, width: int = 32):
        super().__init__()
        w = width
        self.features = nn.Sequential(
            nn.Conv2d(1, w, 3, padding=1), nn.GELU(),
            nn.Conv2d(w, w, 3, padding=1, stride=2), nn.GELU(),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.GELU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1, stride=2), nn.GELU(),
            nn.Flatten(), nn.Linear(2 * w * 8 * 8, 128), nn.GELU(),
        )  # fmt: skip
        self.head = nn.Linear(128, positions * (len(charset) + 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 1, 32, 32) in [-1, 1] to logits (B, positions, len(charset) + 1)."""
        return self.head(self.features(images)).unflatten(1, (self.config.positions, -1))

    def targets(self, texts: list[str]) -> torch.Tensor:
        """Class ids (B, positions); the blank is the last class, the empty text is all blanks."""
        blank = len(self.config.charset)
        ids = [[self.config.charset.index(c) for c in t] + [blank] * (self.config.positions - len(t)) for t in texts]
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def string_log_prob(self, images: torch.Tensor, texts: list[str]) -> torch.Tensor:
        """log p(text | image) for each image, (B,)."""
        log_probs = F.log_softmax(self(images).float(), dim=-1)
        return log_probs.gather(-1, self.targets(texts).unsqueeze(-1)).squeeze(-1).sum(-1)

    def digit_probs(self, images: torch.Tensor) -> torch.Tensor:
        """p(d | image) for each one-character text d of the charset, (B, len(charset)): the reward each would get."""
        log_probs = F.log_softmax(self(images).float(), dim=-1)  # (B, positions, classes)
        blank = len(self.config.charset)
        return (log_probs[:, 0, :blank] + log_probs[:, 1:, blank].sum(-1, keepdim=True)).exp()


@lru_cache(maxsize=4)
def load_recognizer(path: str = str(ASSETS / "recognizer"), device: torch.device | None = None) -> Recognizer:
    return Recognizer.from_pretrained(path).to(device).requires_grad_(False).eval()


@torch.no_grad()
def glyph_ocr(
    images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None, path: str | None = None
) -> list[float]:
    """Reward: the recognizer's probability of the prompted string; images (B, 1, H, W) in [0, 1].
    `path`: another recognizer folder (default: the shipped one)."""
    from omnialign.rewards.base import images_of  # here: omnialign.rewards imports this world

    images = images_of(images, "glyph_ocr")
    recognizer = load_recognizer(path or str(ASSETS / "recognizer"), images.device)
    return recognizer.string_log_prob(images * 2 - 1, prompts).exp().tolist()
