"""Try a gold judge of another kind (issue 29, item 3): the shipped gold judge fine-tuned adversarially (PGD in an
L2 ball of radius EPS on every training image, digits and negatives, beside the clean batch), so that a sample
that is not a digit cannot pass by carrying small digit-like features. An experiment: the judge it writes is
measured by `benchmarks/glyphs_judges.py OUT --min-prob 0 0.5 0.7 0.9`, not shipped.

    python benchmarks/glyphs_robust_judge.py OUT [--steps 300] [--eps 1.0] [--pgd 3] [--device cuda]

The batches are stage gold's (`pretrain.gold_batch`: 60% augmented digits, half of them bold or hazy first, 40%
negatives, a quarter of those the saved RL hacks); images are in [-1, 1] (32x32), so EPS 1.0 moves the pixels by
0.03 RMS.
"""

import argparse

import torch
import torch.nn.functional as F

from omnialign.worlds.glyphs.data import ASSETS, PROMPT_SETS, bank
from omnialign.worlds.glyphs.gold import GoldJudge
from omnialign.worlds.glyphs.pretrain import fit, gold_batch, negative_pool, pick_device, stored_images


def attack(model: GoldJudge, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int) -> torch.Tensor:
    """Projected gradient ascent of the cross-entropy in the L2 ball of radius eps around each image."""
    delta = torch.zeros_like(x, requires_grad=True)
    for _ in range(steps):
        (grad,) = torch.autograd.grad(F.cross_entropy(model(x + delta), y), delta)
        delta = (
            delta.detach()
            + 2.5 * eps / steps * grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12)[:, None, None, None]
        )
        scale = (eps / delta.flatten(1).norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
        delta = (delta * scale[:, None, None, None]).requires_grad_(True)
    return (x + delta).clamp(-1, 1).detach()


def finetune_parser(doc: str) -> argparse.ArgumentParser:
    """The options every gold-judge fine-tune experiment takes: OUT, --steps, --device."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="auto")
    return parser


def finetune_inputs(device: torch.device) -> tuple:
    """What a fine-tune of the shipped gold judge draws stage gold's batches from, seeded: the generator, the digit
    bank, the negative pool, the saved RL hacks, and the shipped judge in training mode."""
    g = torch.Generator().manual_seed(123)
    torch.manual_seed(123)
    digits = bank(PROMPT_SETS["digits"])[0].to(device)
    pool = negative_pool(250, 12, device)  # the full pool, 50,000
    hard = stored_images(ASSETS / "gold" / "rl_negatives.pt").to(device)
    return g, digits, pool, hard, GoldJudge.from_pretrained(ASSETS / "gold").to(device).train()


def main() -> None:
    parser = finetune_parser(__doc__)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--pgd", type=int, default=3)
    args = parser.parse_args()
    g, digits, pool, hard, model = finetune_inputs(pick_device(args.device))

    def loss() -> torch.Tensor:
        x, y = gold_batch(digits, pool, hard, g)
        model.eval()  # the attack sees fixed batch-norm statistics
        adv = attack(model, x, y, args.eps, args.pgd)
        model.train()
        return F.cross_entropy(model(torch.cat([x, adv])), torch.cat([y, y]), label_smoothing=0.05)

    fit(model, loss, args.steps, 5e-4, f"gold judge, PGD eps {args.eps}").save_pretrained(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
