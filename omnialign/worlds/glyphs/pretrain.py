"""Pretrain the glyphs world from a seed on a CPU: the recognizer (its OCR) and the base generator.

    omnialign prepare glyphs                    # writes omnialign/worlds/glyphs/assets/ (what ships)
    omnialign prepare glyphs --out /tmp/glyphs --generator-steps 200

The recognizer learns to read rendered strings under noise and texture augmentation and to
answer "blank" on noise-only and texture-only negatives. The generator (rectified flow,
logit-normal t, 10% empty prompts for CFG, an EMA of its weights) learns to draw clean glyphs,
but a share `label_noise` of its training images carry a random prompt, so the shipped base
model draws a legible glyph for every prompt yet the asked-for one only part of the time:
deliberately imperfect prompt following, as text rendering is for large models, that RL can fix.
"""

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from omnialign.diffusion import sde
from omnialign.diffusion.sampling import sample
from omnialign.worlds.glyphs.data import ASSETS, CHARSET, PROMPT_SETS, SIZE, render
from omnialign.worlds.glyphs.model import CharEncoder, GlyphsPolicy, SD3Transformer2DModel, tiny_transformer
from omnialign.worlds.glyphs.recognizer import Recognizer


@dataclass
class PretrainConfig:
    out: str = str(ASSETS)
    """Folder for `transformer/`, `text_encoder/`, `recognizer/` and `pretrain.json`."""
    seed: int = 0
    """Seed of every draw (renders, noise, initial weights)."""
    recognizer_steps: int = 800
    """Optimizer steps of the recognizer (batch 128)."""
    clean_steps: int = 1200
    """Generator steps on correctly labelled glyphs (batch 128, one-cycle learning rate)."""
    noisy_steps: int = 100
    """Then steps with `label_noise` of the prompts replaced by random ones, at `noisy_lr`."""
    label_noise: float = 0.6
    """Share of prompts replaced in the second phase: the base follows its prompt only partly."""
    lr: float = 1e-3
    """Peak learning rate of the first phase."""
    noisy_lr: float = 2e-4
    """Constant learning rate of the second phase."""
    ema: float = 0.995
    """Decay of the exponential moving average of the generator's weights (what ships)."""
    eval_every: int = 100
    """Evaluate the generator's ODE reward every this many steps."""
    snapshots: str | None = None
    """Also save the EMA generator at every evaluation under this folder (for choosing settings)."""
    prompt_set: str = "digits"
    """Prompts the generator learns (see `omnialign.worlds.glyphs.data.PROMPT_SETS`)."""


def textures(n: int, generator: torch.Generator) -> torch.Tensor:
    """Texture-only images (n, 1, SIZE, SIZE) in [-1, 1]: checkerboards, stripes, noise, blobs."""
    i = torch.arange(SIZE).view(SIZE, 1)
    j = torch.arange(SIZE).view(1, SIZE)
    out = []
    for kind, period, phase in torch.randint(0, 8, (n, 3), generator=generator).tolist():
        period = 1 + period % 4
        if kind < 2:
            pattern = ((i + phase) // period + (j + phase) // period) % 2 * 2.0 - 1
        elif kind < 4:
            pattern = ((i if kind == 2 else j) + phase) // period % 2 * 2.0 - 1
        elif kind < 6:
            pattern = torch.randn(SIZE, SIZE, generator=generator)
        else:
            low = torch.randn(1, 1, 2 + period, 2 + period, generator=generator)
            pattern = F.interpolate(low, size=(SIZE, SIZE), mode="bilinear")[0, 0] * 1.5
        out.append(pattern.float().clamp(-1, 1).expand(SIZE, SIZE))
    return torch.stack(out).unsqueeze(1)


def random_patch_mask(n: int, generator: torch.Generator) -> torch.Tensor:
    """Masks (n, 1, SIZE, SIZE) of one random rectangle each, from a quarter to the whole image."""
    masks = torch.zeros(n, 1, SIZE, SIZE)
    for m, (h, w, y, x) in zip(masks, torch.randint(SIZE // 4, SIZE + 1, (n, 4), generator=generator).tolist()):
        y, x = y % (SIZE - h + 1), x % (SIZE - w + 1)
        m[:, y : y + h, x : x + w] = 1
    return masks


def recognizer_batch(step: int, seed: int, size: int = 128) -> tuple[torch.Tensor, list[str]]:
    """A training batch: 3/4 augmented renders with their text, 1/4 negatives labelled ''."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    n_pos = size * 3 // 4
    lengths = torch.randint(1, 3, (n_pos,), generator=g).tolist()
    chars = torch.randint(0, len(CHARSET), (n_pos, 2), generator=g).tolist()
    texts = ["".join(CHARSET[c] for c in cs[:n]) for cs, n in zip(chars, lengths)]
    pos = render(texts, seed=seed * 1_000_003 + step)
    # keep the label under flow noise (sigma < 0.3) and under textures painted on a patch
    sigma = torch.rand(n_pos, generator=g) * 0.3 * (torch.rand(n_pos, generator=g) < 0.5)
    pos = sde.add_noise(pos, torch.randn(pos.shape, generator=g), sigma)
    amp = (torch.rand(n_pos, 1, 1, 1, generator=g) * 0.6) * (torch.rand(n_pos, 1, 1, 1, generator=g) < 0.4)
    pos = pos + amp * random_patch_mask(n_pos, g) * textures(n_pos, g)
    # negatives: textures, heavily noised renders, empty images
    n_neg = size - n_pos
    neg = textures(n_neg, g)
    heavy = render(["".join(CHARSET[c] for c in cs[:1]) for cs in chars[:n_neg]], seed=seed + step)
    sigma = 0.7 + 0.3 * torch.rand(n_neg, generator=g)
    noised = sde.add_noise(heavy, torch.randn(heavy.shape, generator=g), sigma)
    kind = torch.randint(0, 3, (n_neg, 1, 1, 1), generator=g)
    neg = torch.where(kind == 0, neg, torch.where(kind == 1, noised, -torch.ones_like(neg)))
    return torch.cat([pos, neg]).clamp(-1.5, 1.5), texts + [""] * n_neg


def train_recognizer(config: PretrainConfig) -> Recognizer:
    torch.manual_seed(config.seed)
    model = Recognizer()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=config.recognizer_steps)
    bar = tqdm(range(config.recognizer_steps), desc="recognizer", dynamic_ncols=True)
    for step in bar:
        images, texts = recognizer_batch(step, config.seed)
        loss = F.cross_entropy(model(images).flatten(0, 1), model.targets(texts).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.eval()


@torch.no_grad()
def recognizer_accuracy(model: Recognizer, seed: int) -> dict[str, float]:
    """String accuracy on clean single and double renders, and mean p(blank) on negatives."""
    texts = PROMPT_SETS["digits"] * 20 + PROMPT_SETS["pairs"] * 2
    images = render(texts, seed=seed + 777)
    correct = (model(images).argmax(-1) == model.targets(texts)).all(-1).float()
    negatives = textures(200, torch.Generator().manual_seed(seed + 778))
    blank = model.string_log_prob(negatives, [""] * 200).exp().mean()
    return {"accuracy/single": correct[:200].mean().item(), "accuracy/pair": correct[200:].mean().item(),
            "negatives/p_blank": blank.item()}  # fmt: skip


@torch.no_grad()
def ode_reward(
    policy: GlyphsPolicy, recognizer: Recognizer, prompts: list[str], seeds: list[int], steps: int = 10
) -> float:
    """Mean recognizer probability of the prompt over ODE samples, one per (prompt, seed)."""
    texts = [p for p in prompts for _ in seeds]
    generators = [torch.Generator().manual_seed(s) for _ in prompts for s in seeds]
    out = sample(policy.velocity, generators, (1, SIZE, SIZE), policy.schedule(steps, SIZE, SIZE),
                 policy.encode_prompts(texts))  # fmt: skip
    return recognizer.string_log_prob(out.final.clamp(-1, 1), texts).exp().mean().item()


def train_generator(
    config: PretrainConfig, recognizer: Recognizer
) -> tuple[GlyphsPolicy, SD3Transformer2DModel, list[dict]]:
    """Phase 1 learns clean glyphs (one-cycle learning rate); phase 2 continues at a small constant
    rate with `label_noise` of the prompts replaced and the text encoder frozen, which weakens
    prompt following but keeps the glyphs clean. The EMA of the weights is what ships; the EMA
    transformer at the end of phase 1 ships too, as the teacher of on-policy distillation."""
    torch.manual_seed(config.seed)
    policy = GlyphsPolicy(tiny_transformer(), CharEncoder())
    ema = GlyphsPolicy(copy.deepcopy(policy.transformer), copy.deepcopy(policy.text_encoder))
    params = [p for m in (policy.transformer, policy.text_encoder) for p in m.parameters()]
    ema_params = [p for m in (ema.transformer, ema.text_encoder) for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.clean_steps, pct_start=0.05)
    prompts = PROMPT_SETS[config.prompt_set]
    g = torch.Generator().manual_seed(config.seed + 1)
    history = []
    total = config.clean_steps + config.noisy_steps
    bar = tqdm(range(1, total + 1), desc="generator", dynamic_ncols=True)
    for step in bar:
        noisy = step > config.clean_steps
        texts = [prompts[i] for i in torch.randint(0, len(prompts), (128,), generator=g)]
        x0 = render(texts, seed=config.seed * 7919 + step)
        if step == config.clean_steps + 1:  # phase 2 fixes the (EMA) text encoder: the teacher shares it
            teacher = copy.deepcopy(ema.transformer)
            policy.text_encoder.load_state_dict(ema.text_encoder.state_dict())
            policy.text_encoder.requires_grad_(False)
            params = list(policy.transformer.parameters())
            ema_params = list(ema.transformer.parameters())
        if noisy:
            shown = [prompts[i] for i in torch.randint(0, len(prompts), (128,), generator=g)]
            mislabel = (torch.rand(128, generator=g) < config.label_noise).tolist()
            texts = [s if bad else t for t, s, bad in zip(texts, shown, mislabel)]
        texts = [t if keep else "" for t, keep in zip(texts, (torch.rand(128, generator=g) > 0.1).tolist())]
        noise = torch.randn(x0.shape, generator=g)
        sigma = torch.sigmoid(torch.randn(128, generator=g))  # logit-normal
        hidden, pooled = policy.text_encoder(policy.text_encoder.tokenize(texts))
        v = policy.velocity(sde.add_noise(x0, noise, sigma), sigma, {"hidden": hidden, "pooled": pooled})
        loss = F.mse_loss(v, sde.velocity_target(x0, noise))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], 1.0)
        opt.step()
        if noisy:
            for group in opt.param_groups:
                group["lr"] = config.noisy_lr
        else:
            sched.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - config.ema)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if step % config.eval_every == 0 or step == total:
            reward = ode_reward(ema, recognizer, prompts, seeds=list(range(1000, 1008)))
            history.append({"step": step, "phase": "noisy" if noisy else "clean", "loss": loss.item(),
                            "ode_reward": reward})  # fmt: skip
            bar.write(f"generator step {step} ({history[-1]['phase']}): loss {loss.item():.4f} ODE reward {reward:.3f}")
            if config.snapshots:
                ema.transformer.save_pretrained(Path(config.snapshots) / f"step_{step:05d}" / "transformer")
                ema.text_encoder.save_pretrained(Path(config.snapshots) / f"step_{step:05d}" / "text_encoder")
    ema.text_encoder.requires_grad_(False).eval()
    return ema, teacher, history


def prepare_glyphs(config: PretrainConfig) -> dict:
    """Train both models, save them under config.out, and return the pretraining report."""
    out = Path(config.out)
    start = time.time()
    recognizer = train_recognizer(config)
    report = {"config": asdict(config), "recognizer": recognizer_accuracy(recognizer, config.seed)}
    print("recognizer:", report["recognizer"])
    policy, teacher, history = train_generator(config, recognizer)
    report.update(generator=history, seconds=round(time.time() - start, 1))
    recognizer.save_pretrained(out / "recognizer")
    policy.transformer.save_pretrained(out / "transformer")
    policy.text_encoder.save_pretrained(out / "text_encoder")
    teacher.save_pretrained(out / "teacher" / "transformer")
    policy.text_encoder.save_pretrained(out / "teacher" / "text_encoder")
    (out / "pretrain.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out} in {report['seconds']} s; final ODE reward {history[-1]['ode_reward']:.3f}")
    return report
