"""Pretrain the glyphs world from a seed: the gold judge, the reward's recognizer and the base generator,
then harden the recognizer against what RL finds to fool it.

    omnialign prepare glyphs --out omnialign/worlds/glyphs/assets --device cuda   # rebuilds what ships
    omnialign prepare glyphs --out /tmp/glyphs --stages base fooling   # later stages from earlier ones in --out
    omnialign prepare glyphs --out /tmp/g --gold-steps 50 --recognizer-steps 50 --clean-steps 50 \
        --noisy-steps 20 --stages gold recognizer teacher base    # a quick check of the script itself

The shipped assets were made so (pretrain.json says the same): gold, recognizer and teacher on one H200
(84 s, 50 s, 219 s), base (505 s), fooling (637 s) and rl_negatives (399 s) on a 2-core CPU, where the
first three stages would take about 5 hours; the shipped gold judge was then fine-tuned on that CPU
(`--stages gold --gold-init`, 300 steps, 324 s).

1. The gold judge (`gold.py`) learns the renderer's digits under strong augmentation (half of them drawn
   bold, hazy, glowing or grainy first, as generators draw them) and the hard negatives of `data.negatives` and
   `rl_negatives`, with an explicit not-a-digit class.
2. The recognizer (`recognizer.py`, the reward) learns strings of one and two characters under the
   same augmentation, and reads every negative as blank (probability near 0 for every digit).
3. The generator (rectified flow, logit-normal t, 10% empty prompts, an EMA of its weights) first
   learns clean glyphs (`clean_steps`; its EMA ships as `teacher/`, the distillation teacher), then
   `noisy_steps` with a share `label_noise` of its prompts replaced by random ones: the shipped base
   draws legible digits but the asked-for one only part of the time, what RL has to fix.
4. Fooling rounds: RL recipes (`fool_recipes`) train for `fool_steps` against the recognizer; their
   validation samples that the recognizer scores above 0.5 but the gold judge does not read as the
   prompted digit are added to a bank of fooling samples, and the recognizer is fine-tuned with them
   as negatives; this repeats until a round finds under `fool_tolerance` of such samples or
   `fool_rounds` are done. The bank ships as `recognizer/fooling_samples.pt`.
5. RL negatives: images from RL runs that fooled both the reward and the gold judge, which a person
   judged not to be digits (`rl_negatives`, shipped as `gold/rl_negatives.pt`), fine-tune both models
   as negatives.
6. The person judge (`gold_person/`, `val/gold/person`): a copy of the gold judge fine-tuned to read as a person
   does, on 640 RL samples labelled by eye (`gold/person_labels.pt`; readable as their digit, unreadable as no
   digit) beside stage gold's batches and lightly augmented renders (300 steps, 645 s on a 2-core CPU).

7. Stage `edit` makes the edit model (`assets/edit/`). Stages `video_teacher` and `video` make the video model in the
   generator's two phases: a tiny `WanTransformer3DModel` from scratch on clean clips (`assets/video_teacher/`;
   `--video-init FOLDER` continues a saved one instead), then with a share of its prompts replaced
   (`assets/video/`, what ships as the video base), on the GPU in minutes.

Everything is seeded. The report (`pretrain.json`) holds each model's measured quality and the time
of each phase. No recipe ever trains or selects against the gold judge.
"""

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from omnialign.config import ModelConfig
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import sample
from omnialign.worlds.glyphs.data import (
    ASSETS,
    CHARSET,
    EDIT_SETS,
    FRAMES,
    NEGATIVE_KINDS,
    PROMPT_SETS,
    SIZE,
    augment,
    bank,
    bold_or_hazy,
    edit_bank,
    negatives,
    render,
    variants,
)
from omnialign.worlds.glyphs.gold import NOT_A_DIGIT, GoldJudge
from omnialign.worlds.glyphs.model import CharEncoder, GlyphsPolicy, edit_transformer, load, tiny_transformer
from omnialign.worlds.glyphs.recognizer import Recognizer
from omnialign.worlds.glyphs.video import GlyphsVideoPolicy, glyph_video, glyph_video_gold, video_transformer
from omnialign.worlds.glyphs.video import load as load_video

STAGES = ("gold", "recognizer", "teacher", "base", "fooling", "rl_negatives", "person", "edit", "video_teacher",
          "video")  # fmt: skip


@dataclass
class PretrainConfig:
    out: str = str(ASSETS)
    """Folder for `gold/`, `recognizer/`, `transformer/`, `text_encoder/`, `teacher/` and `pretrain.json`."""
    seed: int = 0
    """Seed of every draw (images, noise, initial weights)."""
    device: str = "auto"
    """Where to train: cpu, cuda, or auto (cuda when there is one)."""
    gold_steps: int = 3000
    """Optimizer steps of the gold judge (batch 256)."""
    gold_init: str | None = None
    """Stage gold: fine-tune this judge folder (peak lr 5e-4) instead of training a new one (peak lr 2e-3)."""
    recognizer_steps: int = 3000
    """Optimizer steps of the recognizer (batch 256)."""
    clean_steps: int = 8000
    """Teacher: generator steps on correctly labelled glyphs (batch 256, one-cycle learning rate)."""
    noisy_steps: int = 400
    """Base: steps from the teacher with `label_noise` of the prompts replaced by random ones, at `noisy_lr`."""
    noisy_batch: int = 128
    """Batch of the base's steps."""
    noisy_ema: float = 0.995
    """EMA decay of the base's steps (the EMA starts at the teacher)."""
    label_noise: float = 0.6
    """Share of prompts replaced in the second phase: the base follows its prompt only partly."""
    lr: float = 1e-3
    """Peak learning rate of the generator's first phase."""
    noisy_lr: float = 2e-4
    """Constant learning rate of the second phase."""
    ema: float = 0.999
    """Decay of the exponential moving average of the teacher's weights (what ships)."""
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    """Stages to run, in order; a stage that does not run loads its output from `out` (see `STAGES`)."""
    eval_every: int = 1000
    """Evaluate the generator (reward, gold accuracy, not-a-digit) every this many steps."""
    eval_count: int = 2000
    """Fresh negatives (and twice fewer renders) in the gold judge's and the recognizer's quality reports."""
    snapshots: str | None = None
    """Also save the EMA generator at every evaluation under this folder (for choosing settings)."""
    prompt_set: str = "digits"
    """Prompts the generator learns (see `PROMPT_SETS`)."""
    fool_rounds: int = 3
    """Most rounds of RL against the recognizer (0: none)."""
    fool_recipes: list[str] = field(default_factory=lambda: ["glyphs_online_dpo"])
    """Recipes whose runs look for fooling samples, in parallel processes."""
    fool_steps: int = 300
    """Training steps of each fooling run (validation at 0, 1/3, 2/3 and the end, 32 seeds per digit)."""
    fool_tolerance: float = 0.03
    """Stop once at most this share of the rewarded (> 0.5) validation samples fool the recognizer."""
    refresh_steps: int = 1000
    """Recognizer fine-tuning steps after each round that found fooling samples."""
    rl_negatives: str = str(ASSETS / "gold" / "rl_negatives.pt")
    """Stage rl_negatives: uint8 images (N, 1, SIZE, SIZE) from RL runs that fooled both the reward and the gold
    judge, which a person judged not to be digits; both models are fine-tuned with them as negatives. Stage gold
    also trains with them as negatives when the file exists."""
    rl_negative_steps: int = 120
    """Fine-tuning steps of the gold judge and of the recognizer in stage rl_negatives."""
    person_labels: str = str(ASSETS / "gold" / "person_labels.pt")
    """Stage person: RL samples a person labelled by eye, {"images": uint8 (N, 1, SIZE, SIZE), "prompts": the
    prompted digits, "marks": "yes" (readable as the prompted digit), "no" (unreadable) or "unsure"}."""
    person_steps: int = 300
    """Stage person: fine-tuning steps of the person judge, a copy of the gold judge (`gold_person/`)."""
    edit_steps: int = 1500
    """Stage edit: steps of the edit model, from the base with a zero-initialised source channel (batch 256)."""
    edit_copy: float = 0.5
    """Stage edit: share of its examples whose result is the source digit itself (in place of the requested one):
    the shipped edit model keeps the place and size but makes the asked-for edit only part of the time."""
    edit_lr: float = 5e-4
    """Stage edit: peak learning rate (one cycle); the text encoder stays frozen."""
    video_steps: int = 8000
    """Stage video_teacher: steps of the glyphs video model from scratch (with its own text encoder) on clean clips,
    every frame the prompt's digit."""
    video_batch: int = 256
    """Stages video_teacher and video: clips per step (the text-to-image teacher's batch)."""
    video_lr: float = 1e-3
    """Stage video_teacher: peak learning rate (one cycle)."""
    video_init: str | None = None
    """Stage video_teacher: continue this video model folder (its transformer and text encoder, patch as saved) for
    `video_steps` on a fresh one-cycle schedule instead of starting from scratch."""
    video_patch: int = 4
    """Stage video_teacher: the video model's patch, 1 x this x this pixels (4: 256 tokens a clip; 2: 1024)."""
    video_noisy_steps: int = 400
    """Stage video: steps from the video teacher with `video_noise` of the clips' prompts replaced by random ones, at
    `noisy_lr` and EMA `noisy_ema`, the text encoder frozen (the text-to-image base's recipe): the shipped video
    model draws one digit per clip, the asked-for one only part of the time."""
    video_noise: float = 0.6
    """Stage video: share of clips whose prompt is replaced by a random one."""
    video_stop_gold: float | None = None
    """Stage video: stop at the first evaluation whose gold accuracy per frame is at most this (the base's target,
    e.g. 0.45), shipping the model evaluated there; None runs all `video_noisy_steps`."""
    video_eval_seeds: int = 8
    """Stages video_teacher and video: seeds per digit in each evaluation (10 x this many clips)."""


def stored_images(path: str | Path) -> torch.Tensor:
    """Images saved as uint8 (N, 1, SIZE, SIZE) (the RL negatives, the fooling bank), in [-1, 1]."""
    return torch.load(path).float().div(127.5).sub(1)


def pick_device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device; pass --device cpu "
                         "or auto")  # fmt: skip
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def _one_cycle(opt: torch.optim.Optimizer, lr: float, steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(steps, 2), pct_start=0.1)


def negative_pool(steps: int, seed: int, device: torch.device) -> torch.Tensor:
    """The negatives (see `data.negatives`) of a stage of `steps` steps: 200 a step, at most 50,000, drawn once;
    batches take them with a fresh mild augmentation."""
    n = min(50_000, 200 * steps)
    g = torch.Generator().manual_seed(seed)
    return torch.cat([negatives(2000, g, device)[0] for _ in range(-(-n // 2000))])[:n]


def pick(pool: torch.Tensor, n: int, g: torch.Generator, strength: float) -> torch.Tensor:
    """n random images of `pool`, augmented with `strength`."""
    return augment(pool[torch.randint(0, len(pool), (n,), generator=g).to(pool.device)], g, strength)


def digit_batch(
    digits: torch.Tensor, n: int, g: torch.Generator, varied: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """n augmented digit images from the bank `digits` (10 x 250 variants) and their digit (n,); a share `varied`
    of them drawn bold or hazy first (`data.bold_or_hazy`)."""
    index = torch.randint(0, len(digits), (n,), generator=g).to(digits.device)
    x = digits[index]
    if varied:
        x = torch.where((torch.rand(n, 1, 1, 1, generator=g) < varied).to(x.device), bold_or_hazy(x, g), x)
    return augment(x, g), index // (len(digits) // len(CHARSET))


def gold_batch(
    digits: torch.Tensor, pool: torch.Tensor, hard: torch.Tensor | None, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of stage gold, images and labels: 154 augmented digits of the bank `digits` (half of them bold or
    hazy first) and 102 negatives (class 10) from `pool`, 26 of them from `hard` when given."""
    n_hard = 0 if hard is None else 26
    pos, labels = digit_batch(digits, 154, g, varied=0.5)
    parts = [pos, pick(pool, 102 - n_hard, g, 0.5)] + ([pick(hard, n_hard, g, 0.3)] if n_hard else [])
    return torch.cat(parts), torch.cat([labels, torch.full((102,), NOT_A_DIGIT, device=digits.device)])


def train_gold(config: PretrainConfig, device: torch.device, steps: int, model: GoldJudge | None = None,
               hard: torch.Tensor | None = None, lr: float = 2e-3) -> GoldJudge:  # fmt: skip
    """Train a new gold judge (or fine-tune `model`): 60% augmented digits (half of them bold or hazy first),
    40% negatives (class 10; a quarter of them from `hard` when given), label smoothing 0.05."""
    g = torch.Generator().manual_seed(config.seed + 11 + (0 if hard is None else len(hard)))
    torch.manual_seed(config.seed + 11)
    digits = bank(PROMPT_SETS["digits"])[0].to(device)
    pool = negative_pool(steps, config.seed + 12, device)
    model = (model or GoldJudge()).to(device).train()
    hard = None if hard is None else hard.to(device)

    def loss() -> torch.Tensor:
        x, y = gold_batch(digits, pool, hard, g)
        return F.cross_entropy(model(x), y, label_smoothing=0.05)

    return fit(model, loss, steps, lr, "gold judge")


def train_person_judge(config: PretrainConfig, device: torch.device, gold: Path) -> GoldJudge:
    """Fine-tune the gold judge saved in `gold` to a person's reading: each step, stage gold's batch (with the RL
    negatives), 48 of `config.person_labels` (readable ones as their digit, unreadable ones as not a digit, a third
    of them unreadable; unsure ones left out) and 48 renders, both lightly augmented (strength 0.3), so that the
    renderer's own bold 5s, 6s and 9s stay confident where the labels teach closed loops to be no digit."""
    g = torch.Generator().manual_seed(config.seed + 123)
    torch.manual_seed(config.seed + 123)
    digits = bank(PROMPT_SETS["digits"])[0].to(device)
    pool = negative_pool(config.person_steps, config.seed + 12, device)
    hard = stored_images(config.rl_negatives).to(device)
    model = GoldJudge.from_pretrained(gold).to(device).train()
    labels = torch.load(config.person_labels)
    keep = torch.tensor([m != "unsure" for m in labels["marks"]])
    no = torch.tensor([m == "no" for m in labels["marks"]])[keep]
    images = (labels["images"][keep].float() / 255 * 2 - 1).to(device)
    target = torch.tensor([CHARSET.index(p) for p in labels["prompts"]])[keep].masked_fill(no, NOT_A_DIGIT)
    weight = torch.where(no, 1 / no.sum(), 2 / (~no).sum())

    def loss() -> torch.Tensor:
        x, y = gold_batch(digits, pool, hard, g)
        pick = torch.multinomial(weight, 48, replacement=True, generator=g)
        labelled = augment(images[pick], g, 0.3)
        index = torch.randint(0, len(digits), (48,), generator=g).to(device)
        x = torch.cat([x, labelled, augment(digits[index], g, 0.3)])
        y = torch.cat([y, target[pick].to(device), index // (len(digits) // len(CHARSET))])
        return F.cross_entropy(model(x), y, label_smoothing=0.05)

    return fit(model, loss, config.person_steps, 5e-4, "person judge")


def fit(model: torch.nn.Module, loss: Callable[[], torch.Tensor], steps: int, lr: float, desc: str) -> torch.nn.Module:
    """`steps` AdamW steps on `loss()`, which draws its own batch; one-cycle learning rate. Returns the eval model."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = _one_cycle(opt, lr, steps)
    bar = tqdm(range(steps), desc=desc, dynamic_ncols=True, mininterval=5)
    for _ in bar:
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{value.item():.3f}", refresh=False)
    return model.eval()


@torch.no_grad()
def gold_quality(model: GoldJudge, seed: int, device: torch.device, count: int = 2000) -> dict[str, float]:
    """Accuracy on count / 2 fresh renders (the renderer's own images) and on augmented ones; not-a-digit
    rate on `count` fresh negatives, by kind."""
    g = torch.Generator().manual_seed(seed + 777)
    texts = PROMPT_SETS["digits"] * (count // 20)
    renders = render(texts, seed=seed + 777)
    target = torch.tensor([CHARSET.index(t) for t in texts], device=device)
    out = {}
    varied = (("augmented", augment(renders, g)), ("bold_or_hazy", augment(bold_or_hazy(renders, g), g, 0.5)))
    for name, images in (("renders", renders), *varied):
        out[f"accuracy/{name}"] = (model(images.to(device)).argmax(-1) == target).float().mean().item()
    neg, kind = negatives(count, g)
    reads = model(neg.to(device)).argmax(-1).cpu()
    out["not_a_digit/all_negatives"] = (reads == NOT_A_DIGIT).float().mean().item()
    for k, name in enumerate(NEGATIVE_KINDS):
        out[f"not_a_digit/{name}"] = (reads[kind == k] == NOT_A_DIGIT).float().mean().item()
    return out


def recognizer_batch(
    strings: tuple[torch.Tensor, torch.Tensor],
    texts: list[str],
    pool: torch.Tensor,
    fooling: torch.Tensor | None,
    g: torch.Generator,
    size: int = 256,
) -> tuple[torch.Tensor, list[str]]:
    """Half augmented strings (one or two characters) with their text, the rest negatives labelled '':
    a quarter of the batch from the fooling bank when there is one."""
    images, which = strings
    n_pos = size // 2
    index = torch.randint(0, len(images), (n_pos,), generator=g)
    pos = augment(images[index.to(images.device)], g, strength=0.7)
    n_fool = size // 4 if fooling is not None and len(fooling) else 0
    parts = [pos, pick(pool, size - n_pos - n_fool, g, 0.5)]
    if n_fool:
        parts.append(pick(fooling, n_fool, g, 0.3))
    return torch.cat(parts), [texts[i] for i in which[index].tolist()] + [""] * (size - n_pos)


def train_recognizer(config: PretrainConfig, device: torch.device, steps: int, model: Recognizer | None = None,
                     fooling: torch.Tensor | None = None, lr: float = 2e-3) -> Recognizer:  # fmt: skip
    """Train a new recognizer (or fine-tune `model`) for `steps`, with the fooling bank as negatives."""
    g = torch.Generator().manual_seed(config.seed + 23 + (0 if fooling is None else len(fooling)))
    torch.manual_seed(config.seed + 23)
    texts = PROMPT_SETS["digits"] + PROMPT_SETS["pairs"]
    strings = bank(texts)
    # as many single digits as pairs: repeat the singles' variants to the pairs' count
    singles = strings[1] < len(PROMPT_SETS["digits"])
    repeat = int((~singles).sum() // singles.sum())
    strings = (torch.cat([strings[0][singles].repeat(repeat, 1, 1, 1), strings[0][~singles]]),
               torch.cat([strings[1][singles].repeat(repeat), strings[1][~singles]]))  # fmt: skip
    strings = (strings[0].to(device), strings[1])
    pool = negative_pool(steps, config.seed + 24, device)
    fooling = None if fooling is None else fooling.to(device)
    model = (model or Recognizer()).to(device).train()

    def loss() -> torch.Tensor:
        images, labels = recognizer_batch(strings, texts, pool, fooling, g)
        return F.cross_entropy(model(images).flatten(0, 1), model.targets(labels).flatten())

    return fit(model, loss, steps, lr, "recognizer")


@torch.no_grad()
def recognizer_quality(model: Recognizer, seed: int, device: torch.device, count: int = 2000) -> dict[str, float]:
    """String accuracy on fresh single and double renders; on negatives, the mean of the largest
    probability it gives any single digit (a blob must score near 0 for every digit)."""
    texts = PROMPT_SETS["digits"] * 20 + PROMPT_SETS["pairs"] * 2
    images = render(texts, seed=seed + 777).to(device)
    correct = (model(images).argmax(-1) == model.targets(texts)).all(-1).float()
    neg, kind = negatives(count, torch.Generator().manual_seed(seed + 778))
    best = model.digit_probs(neg.to(device)).max(-1).values.cpu()
    out = {"accuracy/single": correct[:200].mean().item(), "accuracy/pair": correct[200:].mean().item(),
           "negatives/max_digit_p": best.mean().item()}  # fmt: skip
    for k, name in enumerate(NEGATIVE_KINDS):
        out[f"negatives/max_digit_p/{name}"] = best[kind == k].mean().item()
    return out


@torch.no_grad()
def evaluate_generator(policy: GlyphsPolicy, recognizer: Recognizer, gold: GoldJudge, prompts: list[str],
                       seeds: list[int], device: torch.device, steps: int = 10) -> dict[str, float]:  # fmt: skip
    """ODE samples, one per (prompt, seed): the reward's mean, the gold accuracy and not-a-digit rate."""
    texts = [p for p in prompts for _ in seeds]
    generators = [torch.Generator().manual_seed(s) for _ in prompts for s in seeds]
    out = sample(policy.velocity, generators, (1, SIZE, SIZE), policy.schedule(steps, SIZE, SIZE),
                 policy.encode_prompts(texts), device=device)  # fmt: skip
    images = out.final.clamp(-1, 1)
    reads = gold(images).argmax(-1)
    right = (reads == torch.tensor([CHARSET.index(t[0]) for t in texts], device=device)).float().mean().item()
    return {"reward": recognizer.string_log_prob(images, texts).exp().mean().item(),
            "gold_accuracy": right if all(len(t) == 1 for t in texts) else float("nan"),
            "not_a_digit": (reads == NOT_A_DIGIT).float().mean().item()}  # fmt: skip


def generator_step(
    loss: torch.Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler | None,
    params: list[torch.Tensor],
    ema_params: list[torch.Tensor],
    decay: float,
) -> None:
    """One optimizer step of a generator on `loss` (gradient norm clipped to 1), then its EMA weights at `decay`."""
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if sched is not None:
        sched.step()
    with torch.no_grad():
        torch._foreach_lerp_(ema_params, params, 1 - decay)


def flow_loop(
    config: PretrainConfig,
    policy: GlyphsPolicy,
    steps: int,
    ema_decay: float,
    lr: float,
    one_cycle: bool,
    draw: Callable[[torch.Generator], tuple[torch.Tensor, list[str], dict]],
    evaluate: Callable[[GlyphsPolicy], dict[str, float]],
    name: str,
    snapshot: str,
    seed: int,
    stop: Callable[[dict], bool] = lambda quality: False,
) -> tuple[GlyphsPolicy, list[dict]]:
    """Rectified flow on the batches `draw(g)` returns (clean latents on the device, their prompts, more conditions
    such as an edit's source images), 10% of the prompts emptied, logit-normal t; trains what requires grad. Returns
    the EMA of the weights (decay `ema_decay`) and its evaluations (`evaluate(ema)`) every `eval_every` steps, saved
    as `snapshot`_STEP under `config.snapshots` too when set. Stops early after an evaluation that `stop` accepts."""
    ema = type(policy)(copy.deepcopy(policy.transformer), copy.deepcopy(policy.text_encoder))
    modules = (policy.transformer, policy.text_encoder)
    pairs = [(p, q) for m, e in zip(modules, (ema.transformer, ema.text_encoder))
             for p, q in zip(m.parameters(), e.parameters()) if p.requires_grad]  # fmt: skip
    params, ema_params = [p for p, _ in pairs], [q for _, q in pairs]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = _one_cycle(opt, lr, steps) if one_cycle else None
    g = torch.Generator().manual_seed(seed)
    history = []
    bar = tqdm(range(1, steps + 1), desc=name, dynamic_ncols=True, mininterval=5)
    for step in bar:
        x0, texts, extra = draw(g)
        batch = len(texts)
        texts = [t if keep else "" for t, keep in zip(texts, (torch.rand(batch, generator=g) > 0.1).tolist())]
        noise = torch.randn(x0.shape, generator=g).to(x0.device)
        sigma = torch.sigmoid(torch.randn(batch, generator=g)).to(x0.device)  # logit-normal
        hidden, pooled = policy.text_encoder(policy.text_encoder.tokenize(texts))
        v = policy.velocity(sde.add_noise(x0, noise, sigma), sigma, {"hidden": hidden, "pooled": pooled, **extra})
        loss = F.mse_loss(v, sde.velocity_target(x0, noise))
        generator_step(loss, opt, sched, params, ema_params, ema_decay)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        if step % config.eval_every == 0 or step == steps:
            quality = evaluate(ema)
            history.append({"step": step, "loss": loss.item(), **quality})
            bar.write(
                f"{name} step {step}: loss {loss.item():.4f} " + " ".join(f"{k} {v:.3f}" for k, v in quality.items())
            )
            if config.snapshots:
                save_policy(ema, Path(config.snapshots) / f"{snapshot}_{step:05d}")
            if stop(quality):
                bar.write(f"{name}: stopped at step {step}")
                break
    return ema, history


def train_flow(
    config: PretrainConfig,
    policy: GlyphsPolicy,
    steps: int,
    batch: int,
    label_noise: float,
    ema_decay: float,
    lr: float,
    one_cycle: bool,
    judges: tuple[Recognizer, GoldJudge],
    device: torch.device,
    seed: int,
) -> tuple[GlyphsPolicy, list[dict]]:
    """`flow_loop` on the renderer's images of the prompt set, a share `label_noise` of the prompts replaced by
    random ones; evaluated by `evaluate_generator`."""
    prompts = PROMPT_SETS[config.prompt_set]
    images, which = bank(prompts)
    images, which = images.to(device), which.to(device)

    def draw(g: torch.Generator) -> tuple[torch.Tensor, list[str], dict]:
        index = torch.randint(0, len(images), (batch,), generator=g).to(device)
        texts = [prompts[i] for i in which[index].tolist()]
        if label_noise:
            shown = [prompts[i] for i in torch.randint(0, len(prompts), (batch,), generator=g)]
            mislabel = (torch.rand(batch, generator=g) < label_noise).tolist()
            texts = [s if bad else t for t, s, bad in zip(texts, shown, mislabel)]
        return images[index], texts, {}

    def evaluate(ema: GlyphsPolicy) -> dict[str, float]:
        return evaluate_generator(ema, *judges, prompts, list(range(1000, 1008)), device)

    return flow_loop(config, policy, steps, ema_decay, lr, one_cycle, draw, evaluate, "generator", "step", seed)


def train_teacher(config: PretrainConfig, judges: tuple[Recognizer, GoldJudge], device: torch.device
                  ) -> tuple[GlyphsPolicy, list[dict]]:  # fmt: skip
    """The prompt-faithful generator: `clean_steps` on correctly labelled glyphs, one-cycle learning rate."""
    torch.manual_seed(config.seed)
    policy = GlyphsPolicy(tiny_transformer().to(device), CharEncoder().to(device))
    return train_flow(config, policy, config.clean_steps, 256, 0.0, config.ema, config.lr, True, judges, device,
                      config.seed + 1)  # fmt: skip


def train_base(config: PretrainConfig, teacher: GlyphsPolicy, judges: tuple[Recognizer, GoldJudge],
               device: torch.device) -> tuple[GlyphsPolicy, list[dict]]:  # fmt: skip
    """The shipped base: the teacher fine-tuned for `noisy_steps` with `label_noise` of its prompts
    replaced, at a small constant rate and with the text encoder frozen. Its glyphs stay clean while
    it forgets part of its prompt following."""
    policy = GlyphsPolicy(copy.deepcopy(teacher.transformer).requires_grad_(True),
                          copy.deepcopy(teacher.text_encoder).requires_grad_(False))  # fmt: skip
    return train_flow(config, policy, config.noisy_steps, config.noisy_batch, config.label_noise, config.noisy_ema,
                      config.noisy_lr, False, judges, device, config.seed + 2)  # fmt: skip


@torch.no_grad()
def evaluate_edit(policy: GlyphsPolicy, out: Path, device: torch.device, seeds: int = 8) -> dict[str, float]:
    """ODE samples of the 20 validation edits x `seeds`: the edit reward's mean and the edit gold judge's rates."""
    from omnialign.worlds.glyphs.edit import glyph_edit, glyph_edit_gold

    prompts, metadata = EDIT_SETS["edits_val"]()
    texts, meta = [p for p in prompts for _ in range(seeds)], [m for m in metadata for _ in range(seeds)]
    sources = [[s.to(device) for s in m["sources"]] for m in meta]
    generators = [torch.Generator().manual_seed(1000 + i % seeds) for i in range(len(texts))]
    x = sample(policy.velocity, generators, (1, SIZE, SIZE), policy.schedule(10, SIZE, SIZE),
               policy.encode_prompts(texts, sources), device=device).final  # fmt: skip
    images = policy.decode(x)
    gold = glyph_edit_gold(images, texts, meta, str(out / "gold"))
    quality = {"reward": sum(glyph_edit(images, texts, meta, str(out / "recognizer"))) / len(texts),
               "gold_accuracy": sum(gold) / len(texts)}  # fmt: skip
    for key in ("kept", "copied", "not_a_digit", "edited"):
        quality[key] = sum(i[key] for i in gold.info) / len(texts)
    return quality


def train_edit(config: PretrainConfig, base: GlyphsPolicy, out: Path, device: torch.device
               ) -> tuple[GlyphsPolicy, list[dict]]:  # fmt: skip
    """The glyphs edit model: the base with a source channel (`model.edit_transformer`), trained by `flow_loop` on
    edits of `data.edit_bank` (batch 256, one-cycle `edit_lr`, an EMA of the weights, decay 0.995, the text encoder
    frozen), a share `edit_copy` of them showing the source digit again instead of the requested one."""
    policy = GlyphsPolicy(edit_transformer(base.transformer).to(device), base.text_encoder.requires_grad_(False))
    edits, batch = edit_bank().to(device), 256

    def draw(g: torch.Generator) -> tuple[torch.Tensor, list[str], dict]:
        where = torch.randint(0, len(edits), (batch,), generator=g)
        target = torch.randint(0, len(CHARSET), (batch,), generator=g)
        source = (target + torch.randint(1, len(CHARSET), (batch,), generator=g)) % len(CHARSET)
        drawn = torch.where(torch.rand(batch, generator=g) < config.edit_copy, source, target)
        x0, shown = edits[where.to(device), drawn.to(device)], edits[where.to(device), source.to(device)]
        return x0, [CHARSET[t] for t in target.tolist()], {"source": shown}

    return flow_loop(config, policy, config.edit_steps, 0.995, config.edit_lr, True, draw,
                     lambda ema: evaluate_edit(ema, out, device), "edit", "edit", config.seed + 5)  # fmt: skip


@torch.no_grad()
def evaluate_video(policy: GlyphsVideoPolicy, out: Path, device: torch.device, seeds: int = 8) -> dict[str, float]:
    """ODE samples of the 10 digits x `seeds`: the reward's mean, the gold judge's per-frame accuracy, its share of
    frames that are no digit, of clips read right on every frame and of clips showing one digit on every frame."""
    prompts = [p for p in PROMPT_SETS["digits"] for _ in range(seeds)]
    generators = [torch.Generator().manual_seed(1000 + i % seeds) for i in range(len(prompts))]
    x = sample(policy.velocity, generators, policy.latent_shape(SIZE, SIZE), policy.schedule(10, SIZE, SIZE),
               policy.encode_prompts(prompts), device=device).final  # fmt: skip
    videos, meta = policy.decode(x), [{} for _ in prompts]
    gold = glyph_video_gold(videos, prompts, meta, str(out / "gold"))
    return {"reward": sum(glyph_video(videos, prompts, meta, str(out / "recognizer"))) / len(prompts),
            "gold_accuracy": sum(gold) / len(prompts),
            **{k: sum(i[k] for i in gold.info) / len(prompts) for k in ("not_a_digit", "clip", "steady")}}  # fmt: skip


def video_flow(
    config: PretrainConfig,
    policy: GlyphsVideoPolicy,
    steps: int,
    label_noise: float,
    ema_decay: float,
    lr: float,
    one_cycle: bool,
    out: Path,
    device: torch.device,
    seed: int,
    stop: Callable[[dict], bool] = lambda quality: False,
) -> tuple[GlyphsVideoPolicy, list[dict]]:
    """`flow_loop` on clips of `FRAMES` frames of one digit, in one of the renderer's styles shared by its frames
    (`data.variants`), a share `label_noise` of the clips' prompts replaced by random ones; evaluated by
    `evaluate_video`."""
    frames = torch.stack([variants(c) for c in CHARSET]).to(device)  # (digit, style, 1, SIZE, SIZE)
    batch = config.video_batch

    def draw(g: torch.Generator) -> tuple[torch.Tensor, list[str], dict]:
        digit = torch.randint(0, len(CHARSET), (batch,), generator=g)
        style = torch.randint(0, frames.shape[1], (batch,), generator=g)
        x0 = frames[digit.to(device), style.to(device)][:, :, None].expand(-1, -1, FRAMES, -1, -1)  # (B, 1, F, H, W)
        said = torch.where(torch.rand(batch, generator=g) < label_noise,
                           torch.randint(0, len(CHARSET), (batch,), generator=g), digit)  # fmt: skip
        return x0, [CHARSET[i] for i in said.tolist()], {}

    def evaluate(ema: GlyphsVideoPolicy) -> dict[str, float]:
        return evaluate_video(ema, out, device, config.video_eval_seeds)

    snapshot = "video" if label_noise else "video_teacher"
    return flow_loop(config, policy, steps, ema_decay, lr, one_cycle, draw, evaluate, "video", snapshot, seed, stop)


def train_video_teacher(config: PretrainConfig, out: Path, device: torch.device
                        ) -> tuple[GlyphsVideoPolicy, list[dict]]:  # fmt: skip
    """The prompt-faithful video model (`video.video_transformer`, its own `CharEncoder`), as the text-to-image
    teacher: `video_steps` on clean clips from scratch (or from `video_init`), one-cycle learning rate, EMA `ema`."""
    torch.manual_seed(config.seed + 6)
    if config.video_init:
        init = load_video(ModelConfig(path=config.video_init))
        policy = GlyphsVideoPolicy(init.transformer.requires_grad_(True).train().to(device),
                                   init.text_encoder.requires_grad_(True).train().to(device))  # fmt: skip
    else:
        policy = GlyphsVideoPolicy(video_transformer(patch=config.video_patch).to(device), CharEncoder().to(device))
    return video_flow(config, policy, config.video_steps, 0.0, config.ema, config.video_lr, True, out, device,
                      config.seed + 7)  # fmt: skip


def train_video(config: PretrainConfig, teacher: GlyphsVideoPolicy, out: Path, device: torch.device
                ) -> tuple[GlyphsVideoPolicy, list[dict]]:  # fmt: skip
    """The shipped video model, as the text-to-image base: the video teacher fine-tuned for `video_noisy_steps` with
    `video_noise` of its prompts replaced, at `noisy_lr` (constant) and EMA `noisy_ema`, the text encoder frozen;
    with `video_stop_gold`, only until its gold accuracy per frame has fallen to that."""
    policy = GlyphsVideoPolicy(copy.deepcopy(teacher.transformer).requires_grad_(True),
                               copy.deepcopy(teacher.text_encoder).requires_grad_(False))  # fmt: skip
    target = config.video_stop_gold

    def reached(quality: dict) -> bool:
        return target is not None and quality["gold_accuracy"] <= target

    return video_flow(config, policy, config.video_noisy_steps, config.video_noise, config.noisy_ema,
                      config.noisy_lr, False, out, device, config.seed + 8, reached)  # fmt: skip


def fooling_runs(config: PretrainConfig, round_dir: Path) -> None:
    """Train every fooling recipe for `fool_steps` against the recognizer in `out`, in parallel processes."""
    out = Path(config.out).resolve()
    options = {"glyph_ocr": {"path": str(out / "recognizer")}, "glyph_gold": {"path": str(out / "gold")}}
    every = max(config.fool_steps // 3, 1)
    procs = []
    for recipe in config.fool_recipes:
        command = [sys.executable, "-m", "omnialign", "train", recipe, f"model.path={out}",
                   f"reward.options={json.dumps(options)}", f"trainer.output_dir={round_dir}",
                   f"trainer.total_steps={config.fool_steps}", f"trainer.val_every={every}",
                   f"trainer.save_every={config.fool_steps}", "trainer.save_val_images=true", "trainer.progress=false",
                   "data.val_seeds=32"]  # fmt: skip
        log = open(round_dir / f"{recipe}.log", "w")
        procs.append((recipe, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())))
    for recipe, proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"fooling run {recipe} failed: see {round_dir / (recipe + '.log')}")


@torch.no_grad()
def find_fooling(round_dir: Path, recognizer: Recognizer, gold: GoldJudge, device: torch.device,
                 threshold: float = 0.5) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """Validation samples of the round's runs that the recognizer scores above `threshold` while the gold
    judge does not read the prompted digit: (F, 1, SIZE, SIZE) in [-1, 1], and counts per run."""
    found, counts = [], {}
    for run in sorted(p for p in round_dir.iterdir() if p.is_dir()):
        for path in sorted((run / "samples").glob("step_*.pt")):
            saved = torch.load(path)
            images = saved["images"].float().div(255).mul(2).sub(1).to(device)
            prompts = saved["prompts"]
            reward = recognizer.string_log_prob(images, prompts).exp()
            target = torch.tensor([CHARSET.index(p) for p in prompts], device=device)
            fooled = (reward > threshold) & (gold(images).argmax(-1) != target)
            found.append(images[fooled].cpu())
            c = counts.setdefault(run.name, {"samples": 0, "rewarded": 0, "fooling": 0})
            c["samples"] += len(prompts)
            c["rewarded"] += int((reward > threshold).sum())
            c["fooling"] += int(fooled.sum())
    return torch.cat(found), counts


def save_policy(policy: GlyphsPolicy, root: Path) -> None:
    policy.transformer.save_pretrained(root / "transformer")
    policy.text_encoder.save_pretrained(root / "text_encoder")


def prepare_glyphs(config: PretrainConfig) -> dict:
    """Run `config.stages` (each saves its models under config.out; a stage not run loads them from there)
    and return the pretraining report, `pretrain.json`, which keeps the entries of earlier calls."""
    out, device = Path(config.out), pick_device(config.device)
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(config.stages) - set(STAGES))
    if unknown:
        raise ValueError(f"stages {unknown} unknown: choose from {', '.join(STAGES)}")
    report = json.loads((out / "pretrain.json").read_text()) if (out / "pretrain.json").exists() else {}
    report.setdefault("seconds", {})
    report[f"config/{'+'.join(config.stages)}"] = {**asdict(config), "device": str(device)}
    clock = time.time()

    def lap(name: str) -> None:
        nonlocal clock
        report["seconds"][name] = round(time.time() - clock, 1)
        clock = time.time()
        (out / "pretrain.json").write_text(json.dumps(report, indent=2))

    if "gold" in config.stages:
        hard = stored_images(config.rl_negatives) if Path(config.rl_negatives).exists() else None
        init = GoldJudge.from_pretrained(config.gold_init) if config.gold_init else None
        gold = train_gold(config, device, config.gold_steps, init, hard, lr=5e-4 if init else 2e-3)
        report["gold"] = gold_quality(gold, config.seed, device, config.eval_count)
        print("gold judge:", json.dumps(report["gold"]))
        gold.save_pretrained(out / "gold")
        lap(f"gold ({device.type})")
    gold = GoldJudge.from_pretrained(out / "gold").to(device).eval()
    if "recognizer" in config.stages:
        recognizer = train_recognizer(config, device, config.recognizer_steps)
        report["recognizer"] = recognizer_quality(recognizer, config.seed, device, config.eval_count)
        print("recognizer:", json.dumps(report["recognizer"]))
        recognizer.save_pretrained(out / "recognizer")
        lap(f"recognizer ({device.type})")
    recognizer = Recognizer.from_pretrained(out / "recognizer").to(device).eval()
    if "teacher" in config.stages:
        teacher, report["teacher"] = train_teacher(config, (recognizer, gold), device)
        save_policy(teacher, out / "teacher")
        lap(f"teacher ({device.type})")
    if "base" in config.stages:
        teacher = load(ModelConfig(path=str(out / "teacher")))
        teacher.transformer.to(device)
        base, report["base"] = train_base(config, teacher.to(device), (recognizer, gold), device)
        save_policy(base, out)
        lap(f"base ({device.type})")
    if "fooling" in config.stages:
        harden_recognizer(config, out, recognizer, gold, device, report, lap)
    if "rl_negatives" in config.stages:
        hard = stored_images(config.rl_negatives)
        gold = train_gold(config, device, config.rl_negative_steps, gold, hard, lr=5e-4)
        recognizer = train_recognizer(config, device, config.rl_negative_steps, recognizer, hard, lr=5e-4)
        report["rl_negatives"] = {
            "count": len(hard),
            "gold": gold_quality(gold, config.seed, device, config.eval_count),
            "recognizer": recognizer_quality(recognizer, config.seed, device, config.eval_count),
        }
        with torch.no_grad():
            report["rl_negatives"]["gold_not_a_digit"] = (
                (gold(hard.to(device)).argmax(-1) == NOT_A_DIGIT).float().mean().item()
            )
            report["rl_negatives"]["recognizer_max_digit_p"] = (
                recognizer.digit_probs(hard.to(device)).amax(-1).mean().item()
            )
        print("after the RL negatives:", json.dumps(report["rl_negatives"]))
        gold.save_pretrained(out / "gold")
        recognizer.save_pretrained(out / "recognizer")
        if Path(config.rl_negatives).resolve() != (out / "gold" / "rl_negatives.pt").resolve():
            shutil.copy(config.rl_negatives, out / "gold" / "rl_negatives.pt")
        lap(f"rl_negatives ({device.type})")
    if "person" in config.stages:
        person = train_person_judge(config, device, out / "gold")
        report["person"] = gold_quality(person, config.seed, device, config.eval_count)
        print("person judge:", json.dumps(report["person"]))
        person.save_pretrained(out / "gold_person")
        if Path(config.person_labels).resolve() != (out / "gold" / "person_labels.pt").resolve():
            shutil.copy(config.person_labels, out / "gold" / "person_labels.pt")
        lap(f"person ({device.type})")
    if "edit" in config.stages:
        base = load(ModelConfig(path=str(out))).to(device)
        edit, report["edit"] = train_edit(config, base, out, device)
        report["edit_base"] = evaluate_edit(GlyphsPolicy(edit_transformer(base.transformer).to(device),
                                                         base.text_encoder.to(device)), out, device)  # fmt: skip
        save_policy(edit, out / "edit")
        lap(f"edit ({device.type})")
    if "video_teacher" in config.stages:
        teacher, report["video_teacher"] = train_video_teacher(config, out, device)
        save_policy(teacher, out / "video_teacher")
        lap(f"video_teacher ({device.type})")
    if "video" in config.stages:
        teacher = load_video(ModelConfig(path=str(out / "video_teacher")))
        teacher.transformer.to(device)
        video_model, report["video"] = train_video(config, teacher.to(device), out, device)
        save_policy(video_model, out / "video")
        lap(f"video ({device.type})")
    report["seconds"]["total"] = round(sum(v for k, v in report["seconds"].items() if k != "total"), 1)
    (out / "pretrain.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out}; seconds per stage: {report['seconds']}")
    return report


def harden_recognizer(config: PretrainConfig, out: Path, recognizer: Recognizer, gold: GoldJudge,
                      device: torch.device, report: dict, lap) -> None:  # fmt: skip
    """Fooling rounds (see the module docstring), continuing the bank and the rounds of earlier calls."""
    bank_path = out / "recognizer" / "fooling_samples.pt"
    fooling = stored_images(bank_path) if bank_path.exists() else torch.zeros(0, 1, SIZE, SIZE)
    rounds = report.setdefault("fooling_rounds", [])
    for r in range(len(rounds), len(rounds) + config.fool_rounds):
        round_dir = out / "fooling_runs" / f"round_{r}"
        round_dir.mkdir(parents=True, exist_ok=True)
        fooling_runs(config, round_dir)
        found, counts = find_fooling(round_dir, recognizer, gold, device)
        rewarded = sum(c["rewarded"] for c in counts.values())
        share = len(found) / max(rewarded, 1)
        rounds.append({"round": r, "runs": counts, "fooling_share": share})
        print(f"fooling round {r}: {len(found)} of {rewarded} rewarded samples fool the recognizer ({share:.3f})")
        lap(f"fooling_round_{r} ({device.type})")
        if share <= config.fool_tolerance:
            break
        fooling = torch.cat([fooling, found])
        recognizer = train_recognizer(config, device, config.refresh_steps, recognizer, fooling, lr=5e-4)
        rounds[-1]["recognizer_after"] = recognizer_quality(recognizer, config.seed, device, config.eval_count)
        print("recognizer after the round:", json.dumps(rounds[-1]["recognizer_after"]))
        recognizer.save_pretrained(out / "recognizer")
        torch.save(fooling.add(1).mul(127.5).round().to(torch.uint8), bank_path)
        lap(f"refresh_{r} ({device.type})")
