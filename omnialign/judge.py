"""`omnialign judge`: a judge model behind an OpenAI-compatible endpoint compares a trained model with its base.

    omnialign judge --data data/avqa.parquet --base models/Qwen3-Omni --adapter runs/qwen3_omni_grpo \\
        --judge-url http://127.0.0.1:8001 --out eval/results.jsonl

Three stages (`--stage all` runs them in order; each is resumable and can be rerun alone):
- `reference`: the base model answers every item (greedy decoding; diffusion models: one ODE image per prompt from
  a per-item seed) -> `NAME.reference.jsonl` (images under `NAME.reference/`);
- `trained`: base + adapter, the same way -> `NAME.trained.jsonl` (`NAME.trained/`);
- `judge`: each pair of answers, in a seeded random order per item, to the judge -> verdicts `NAME.jsonl` and
  `NAME.summary.json` (win/tie/loss/malformed and win rates of the trained model, per modality and overall).
`NAME` is `--out` without `.jsonl`. Every stage walks the data in the same order and keys each item by
(data file, row index, uid); a rerun skips what is cached, and each answer or verdict is appended and flushed as
it is made, so an interrupted stage keeps what it finished (a cut-off last line is dropped). `NAME.settings.json`
records each stage's settings: a stage with cached results refuses to continue under other settings.

`--adapter` may name a PEFT folder, a full model folder, an omnialign checkpoint (`step_XXXXXX`) or run folder
(newest checkpoint), or a verl `global_step_N` / `actor` folder (its `lora_adapter/` or `huggingface/`); a training
checkpoint is exported once with `omnialign.export` to `NAME.adapter/`. docs/judge.md has the prompts, what is sent
for each medium and the file formats.
"""

import base64
import hashlib
import io
import json
import os
import random
import re
import shutil
import wave
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image
from tqdm import tqdm

from omnialign.config import VIDEO_ARCHS, Config, apply_overrides
from omnialign.data.language import MEDIA_KINDS, cap_by_modality, read_records
from omnialign.data.prompts import load_prompt_set
from omnialign.engine import checkpoint, dist
from omnialign.export import export, run_config
from omnialign.models import LOADERS
from omnialign.models.qwen3_omni import SAMPLE_RATE, load_audio, load_frames, load_image
from omnialign.rewards.base import to_pil
from omnialign.rewards.client import RewardServerError, post_json
from omnialign.rewards.vlm import served_model
from omnialign.rollout.diffusion import generate_ode
from omnialign.rollout.language import generate
from omnialign.worlds.glyphs import PROMPT_SETS

STAGES = ("reference", "trained", "judge")
MODALITIES = ("text", "image", "audio", "video", "mixed")
LANGUAGE_ARCHS = ("qwen3", "qwen3_omni")
PIPELINES = {
    "StableDiffusion3Pipeline": "sd3",
    "QwenImagePipeline": "qwen_image",
    "FluxPipeline": "flux",
    "Flux2Pipeline": "flux2",
    "Flux2KleinPipeline": "flux2_klein",
    "ZImagePipeline": "zimage",
}
OMNI_TYPES = ("qwen3_omni_moe", "qwen3_omni_moe_thinker")  # any other transformers causal LM loads as qwen3
VIDEO_FRAMES = 8  # frames of a video shown to the judge
MAX_TOKENS = 2048  # of a judge reply
REPLY_CHARS = 16_384  # of a judge reply kept in the verdict file (an endpoint may ignore max_tokens)

LANGUAGE_HEAD = """Please act as an impartial judge and compare the answers of two AI assistants to the user request \
below. The request's media, if any, follow its text.

[User request]
{question}"""
LANGUAGE_TAIL = """[Answer A]
{a}
[End of Answer A]

[Answer B]
{b}
[End of Answer B]

Which answer responds better to the request: more correct, more faithful to the media, more helpful and clear? \
Do not let the order of the answers or their length influence you. Explain briefly, then end your reply with your \
verdict on its own line: [[A]] if Answer A is better, [[B]] if Answer B is better, [[C]] for a tie."""
IMAGE_HEAD = """Please act as an impartial judge and compare two images generated from the same text prompt.

[Prompt]
{question}

[Image A]"""
IMAGE_TAIL = """Which image shows what the prompt asks for more faithfully, with fewer artifacts and better quality? \
Do not let the order of the images influence you. Explain briefly, then end your reply with your verdict on its own \
line: [[A]] if Image A is better, [[B]] if Image B is better, [[C]] for a tie."""


# --------------------------------------------------------------------------- files, caches, settings


def stage_files(out: Path) -> dict[str, Path]:
    """The files of a judge run named after `--out` (NAME.jsonl): caches, image folders, verdicts, summary."""
    out = Path(out)
    if out.suffix != ".jsonl":
        raise ValueError(f"--out {out}: give a .jsonl file name (e.g. results.jsonl); the stage files go beside it")
    name = out.parent / out.name[: -len(".jsonl")]
    return {"reference": Path(f"{name}.reference.jsonl"), "trained": Path(f"{name}.trained.jsonl"), "judge": out,
            "reference_images": Path(f"{name}.reference"), "trained_images": Path(f"{name}.trained"),
            "summary": Path(f"{name}.summary.json"), "settings": Path(f"{name}.settings.json"),
            "adapter": Path(f"{name}.adapter")}  # fmt: skip


def key(row: dict) -> tuple[str, int, str]:
    """What joins the stages: (data file, row index, uid)."""
    return row["file"], int(row["index"]), str(row["uid"])


def read_cache(path: Path) -> dict[tuple, dict]:
    """The rows of a stage file by key; a cut-off last line (an interrupted write) is removed from the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    rows = {}
    for number, line in enumerate(data[:end].decode().splitlines(), 1):
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number} is not JSON ({e}); delete that line to redo its item") from None
        rows[key(row)] = row
    return rows


def judge_endpoint(url: str | None, model: str | None, settings: Path, stage: str) -> tuple[str | None, str | None]:
    """(API base, judge model) of a stage: the model named, else the one the endpoint serves, so that the settings
    record it and a resume against an endpoint serving another model is refused; without an endpoint (nothing left
    to ask), the model the stage recorded."""
    if url is None:
        known = json.loads(settings.read_text()) if settings.exists() else {}
        return None, model or known.get(stage, {}).get("judge_model")
    api = chat_url(url)
    return api, model or served_model(api)


def record_settings(path: Path, stage: str, settings: dict, cache: Path, cached: bool) -> None:
    """Write a stage's settings to NAME.settings.json; a stage with cached results must keep its settings."""
    settings = json.loads(json.dumps(settings))
    known = json.loads(path.read_text()) if path.exists() else {}
    before = known.get(stage)
    if cached and before is not None and before != settings:
        changed = {k: {"cached": before.get(k), "now": settings.get(k)} for k in sorted({*before, *settings})
                   if before.get(k) != settings.get(k)}  # fmt: skip
        raise ValueError(
            f"{stage}: {cache} was made with other settings {changed}; pass the same options to continue it, "
            f"or delete it to start the stage over"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**known, stage: settings}, indent=2))


# --------------------------------------------------------------------------- models and adapters


def detect_arch(base: Path) -> str:
    """The adapter architecture of a model folder, from its config files."""
    root = Path(base)
    if (root / "model_index.json").exists():
        name = json.loads((root / "model_index.json").read_text()).get("_class_name")
        if name not in PIPELINES:
            raise ValueError(f"--base {root} holds a {name}; judge reads {', '.join(PIPELINES)} pipelines")
        return PIPELINES[name]
    encoder = root / "text_encoder" / "config.json"
    if encoder.exists() and json.loads(encoder.read_text()).get("_class_name") == "CharEncoder":
        return "glyphs"
    if (root / "config.json").exists():
        model_type = json.loads((root / "config.json").read_text()).get("model_type")
        return "qwen3_omni" if model_type in OMNI_TYPES else "qwen3"
    raise FileNotFoundError(
        f"--base {root}: not a model folder (no model_index.json, config.json or glyphs text_encoder/); "
        "give the local folder of the base model"
    )


def find_adapter(path: str | Path) -> tuple[str, Path]:
    """What `--adapter` names: ("peft" | "full", folder) or ("checkpoint", an omnialign step_XXXXXX folder)."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"--adapter {root} is not a folder")
    steps = [p for p in root.glob("global_step_*") if p.name.rsplit("_", 1)[1].isdigit()]
    if steps:  # a verl run folder: its newest step
        root = max(steps, key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if (root / "checkpoints").is_dir():
        found = checkpoint.latest(root)
        if found is None:
            raise FileNotFoundError(f"--adapter {root}: a run folder without a complete checkpoint in checkpoints/")
        return "checkpoint", found
    if (root / ".metadata").exists():
        return "checkpoint", root
    subs = ("", "lora_adapter", "huggingface", "actor", "actor/lora_adapter", "actor/huggingface")
    places = [root / sub for sub in subs]
    for place in places:
        if (place / "adapter_config.json").exists():
            return "peft", place
    for place in places:
        if (place / "config.json").exists() and any(place.glob("*.safetensors")):
            return "full", place
    shards = [*root.glob("model_world_size_*.pt"), *root.glob("actor/model_world_size_*.pt")]
    hint = (" It holds verl FSDP shards: merge them first (python -m verl.model_merger merge --backend fsdp "
            "--local_dir DIR --target_dir OUT) and pass OUT.") if shards else ""  # fmt: skip
    raise FileNotFoundError(
        f"--adapter {root}: no PEFT adapter (adapter_config.json), full model (config.json + *.safetensors), "
        f"omnialign checkpoint (.metadata) or run folder (checkpoints/) in it or its lora_adapter/, huggingface/, "
        f"actor/.{hint}"
    )


def build_config(base: str | None, adapter: tuple[str, Path] | None, overrides: list[str], seed: int) -> Config:
    """The model and generation settings: the run's config when the adapter is an omnialign checkpoint (its arch,
    base, dtype, generation and rollout settings), else the defaults with the arch read from `--base`; then
    `--base`, `--seed` and the overrides."""
    from_run = adapter is not None and adapter[0] == "checkpoint"
    config = run_config(adapter[1]) if from_run else Config()
    if base is not None:
        if not Path(base).is_dir():
            raise FileNotFoundError(f"--base {base} is not a folder: give the local folder of the base model")
        config.model.path = str(Path(base).resolve())
        if not from_run and not any(o.startswith("model.arch=") for o in overrides):
            config.model.arch = detect_arch(Path(base))
    elif not from_run:
        raise ValueError("--base: give the base model's folder (only an omnialign checkpoint names its own base)")
    config.model.transformer_only = False
    config.seed = seed
    config = apply_overrides(config, overrides)
    if config.model.arch not in LOADERS:
        raise ValueError(f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}")
    if config.model.arch in VIDEO_ARCHS:
        raise ValueError(f"model.arch={config.model.arch} draws videos, and judge and eval geneval compare images or "
                         "texts: judge a video model's runs by its validation metrics (val/*) instead")  # fmt: skip
    return config


def exported(checkpoint_dir: Path, out_dir: Path) -> tuple[str, Path]:
    """A training checkpoint exported once (omnialign export) to out_dir: ("peft", dir) or ("full", dir)."""
    source = out_dir / "exported_from.txt"
    if not (source.exists() and source.read_text() == str(checkpoint_dir.resolve())):
        shutil.rmtree(out_dir, ignore_errors=True)
        print(f"exporting {checkpoint_dir} to {out_dir}")
        export(checkpoint_dir, out_dir)
        source.write_text(str(checkpoint_dir.resolve()))  # written last: marks a complete export
    return ("peft" if (out_dir / "adapter_config.json").exists() else "full"), out_dir


def load_policy(config: Config, adapter: tuple[str, Path] | None, device: torch.device):
    """The base policy on `device`, with a PEFT adapter merged in or its network replaced by a full model."""
    from peft import PeftModel

    policy = LOADERS[config.model.arch](config.model)
    net = policy.transformer.to(device)
    if adapter is not None:
        kind, path = adapter
        if kind == "peft":
            net = PeftModel.from_pretrained(net, path).merge_and_unload()
        else:
            net = type(net).from_pretrained(path).to(device, getattr(torch, config.model.dtype))
    policy.transformer = net.eval()
    return policy.to(device)


# --------------------------------------------------------------------------- data


def digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def question_text(messages: list[dict]) -> str:
    """The text of chat messages (roles named when there are several)."""
    parts = []
    for m in messages:
        content = m["content"]
        text = content if isinstance(content, str) else "\n".join(c["text"] for c in content if c["type"] == "text")
        parts.append(text if len(messages) == 1 else f"{m['role']}: {text}")
    return "\n".join(parts)


def language_items(data: str, split: str) -> list[dict]:
    """The records of `split` of a parquet file (or of each parquet file in a folder, sorted by name)."""
    root = Path(data)
    files = sorted(root.glob("*.parquet")) if root.is_dir() else [root]
    if not files or not all(f.suffix == ".parquet" and f.exists() for f in files):
        raise FileNotFoundError(
            f"--data {data}: give a .parquet file of `omnialign prepare avqa|mmk12|omni-preference` or a folder of them"
        )
    items = []
    for f in files:
        if "split" not in pq.read_schema(f).names:
            raise ValueError(f"{f}: no split column; write it with `omnialign prepare ...`")
        rows = [i for i, s in enumerate(pq.read_table(f, columns=["split"]).column("split").to_pylist()) if s == split]
        if rows:
            name = str(f.relative_to(root)) if root.is_dir() else f.name
            for index, r in zip(rows, read_records(f, split)):
                items.append({"file": name, "index": index, "uid": str(r.get("id") or digest(r["prompt"])),
                              "modality": r["modality"], "prompt": r["prompt"],
                              "question": question_text(r["prompt"])})  # fmt: skip
    if not items:
        raise ValueError(f"--data {data}: no rows of split {split!r}; pass --split train or val")
    return items


def image_items(data: str) -> list[dict]:
    """The prompts of a prompt set (glyphs set name or prompt file) as items."""
    prompts, metadata = load_prompt_set(data)
    name = data if data in PROMPT_SETS else Path(data).name
    return [{"file": name, "index": i, "uid": str(m.get("id") or digest(p)), "modality": "image", "prompt": p,
             "question": p} for i, (p, m) in enumerate(zip(prompts, metadata))]  # fmt: skip


def walk(config: Config, data: str, split: str, modalities: list[str] | None, max_samples: int | None) -> list[dict]:
    """The items every stage walks, in one order: the data's, filtered by modality, capped evenly by modality."""
    items = image_items(data) if is_image(config) else language_items(data, split)
    found = sorted({it["modality"] for it in items})
    items = [it for it in items if modalities is None or it["modality"] in modalities]
    if not items:
        raise ValueError(f"--modalities {modalities}: --data {data} holds only {found}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"--max-samples {max_samples}: give at least 1")
    return cap_by_modality(items, max_samples)


def is_image(config: Config) -> bool:
    return config.model.arch not in LANGUAGE_ARCHS


def item_seed(seed: int, item: dict) -> int:
    """The noise seed of an item's image: the same for the base and the trained model, another for another prompt
    (two data files of one name)."""
    return int(hashlib.sha1(f"{seed}/{item['file']}/{item['index']}/{item['uid']}".encode()).hexdigest()[:12], 16)


def trained_first(seed: int, item: dict) -> bool:
    """Whether the trained model's answer is shown as A: a coin flip seeded per item."""
    return random.Random(f"{seed}/{item['file']}/{item['index']}/{item['uid']}").random() < 0.5


# --------------------------------------------------------------------------- generation stages


def generation_settings(config: Config) -> dict:
    m = config.model
    settings = {"arch": m.arch, "base": m.path, "dtype": m.dtype, "seed": config.seed}
    if is_image(config):
        keep = ("val_steps", "height", "width", "guidance", "guidance_2", "cfg_rescale", "negative_prompt")
        rollout = {k: v for k, v in asdict(config.rollout).items() if k in keep}
        if rollout["guidance_2"] is None:  # absent unless set, so that stages cached before it keep their settings
            del rollout["guidance_2"]
        return {**settings, "shift": m.shift, "text_tokens": m.text_tokens, **rollout}
    return {**settings, "max_new_tokens": config.generation.max_new_tokens, "stop": config.generation.stop}


def answer(policy, items: list[dict], config: Config, device: torch.device, folder: Path) -> list[dict]:
    """The answers of one chunk: texts, or images saved as PNG under `folder` (path relative to its parent)."""
    prompts = [it["prompt"] for it in items]
    if not is_image(config):
        _, texts = generate(policy, prompts, 1, torch.arange(len(items)), config.generation, device, config.seed,
                            greedy=True)  # fmt: skip
        return [{"answer": t} for t in texts]
    seeds = torch.tensor([item_seed(config.seed, it) for it in items])
    images = generate_ode(policy, prompts, seeds, config.rollout, device)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for it, image in zip(items, images):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{it['file']}-{it['index']:06d}-{it['uid']}")  # uid: one per prompt
        path = folder / f"{name}.png"
        to_pil(image).save(path)
        rows.append({"image": str(path.relative_to(folder.parent))})
    return rows


def run_generation(stage: str, items: list[dict], config: Config, adapter: tuple[str, Path] | None,
                   files: dict[str, Path]) -> None:  # fmt: skip
    """The reference or trained stage: answer every item not cached yet, appending a line per answer."""
    path = files[stage]
    done = read_cache(path)
    todo = [it for it in items if key(it) not in done]
    settings = generation_settings(config)
    if stage == "trained":
        if adapter is None:
            raise ValueError("--stage trained needs --adapter")
        settings["adapter"] = str(adapter[1].resolve())
    record_settings(files["settings"], stage, settings, path, cached=bool(done))
    print(f"{stage}: {len(items) - len(todo)} of {len(items)} answers cached in {path}")
    if not todo:
        return
    if stage == "trained":
        adapter = exported(adapter[1], files["adapter"]) if adapter[0] == "checkpoint" else adapter
    device = dist.init().device
    policy = load_policy(config, adapter if stage == "trained" else None, device)
    chunk = config.rollout.micro_batch_size if is_image(config) else config.generation.micro_batch_size
    with path.open("a") as f:
        for lo in tqdm(range(0, len(todo), chunk), desc=stage, leave=False):
            part = todo[lo : lo + chunk]
            for it, row in zip(part, answer(policy, part, config, device, files[f"{stage}_images"])):
                f.write(json.dumps({**identity(it), **row}) + "\n")
            f.flush()
    print(f"{stage}: wrote {len(todo)} answers to {path}")


def identity(item: dict) -> dict:
    return {k: item[k] for k in ("file", "index", "uid", "modality", "question")}


# --------------------------------------------------------------------------- the judge


def text_part(text: str) -> dict:
    return {"type": "text", "text": text}


def png_part(image: Image.Image | bytes) -> dict:
    """An image as a base64 PNG data URL part."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        image = buffer.getvalue()
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()}}


def wav_bytes(waveform: np.ndarray) -> bytes:
    """A 16 kHz float waveform as 16-bit mono WAV."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(SAMPLE_RATE)
        f.writeframes((np.clip(waveform, -1, 1) * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


def media_parts(kind: str, value, sent: list[str]) -> list[dict]:
    """One media item of a prompt as message parts: an image as a PNG data URL, audio as `input_audio` (WAV),
    a video as `VIDEO_FRAMES` evenly spaced frames (PNG data URLs); a kind not in `sent` as a text note."""
    if kind not in sent:
        return [text_part(f"[{kind} not shown to the judge]")]
    if kind == "image":
        return [png_part(load_image(value))]
    if kind == "audio":
        data = base64.b64encode(wav_bytes(load_audio(value))).decode()
        return [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]
    frames = load_frames(value)
    picked = np.unique(np.linspace(0, len(frames) - 1, min(VIDEO_FRAMES, len(frames))).round().astype(int))
    note = text_part(f"[video: {len(picked)} of its {len(frames)} frames, in order]")
    return [note, *(png_part(Image.fromarray(np.asarray(frames[i], dtype=np.uint8))) for i in picked)]


def judge_content(item: dict, first: dict, second: dict, root: Path, sent: list[str]) -> list:
    """The user message of a judge request: the question, its media, then answers (or images) A and B."""
    if item["modality"] == "image" and "image" in first:  # generated images
        images = [(root / row["image"]).read_bytes() for row in (first, second)]
        return [text_part(IMAGE_HEAD.format(question=item["question"])), png_part(images[0]), text_part("[Image B]"),
                png_part(images[1]), text_part(IMAGE_TAIL)]  # fmt: skip
    media = [c for m in item["prompt"] if not isinstance(m["content"], str) for c in m["content"]
             if c["type"] in MEDIA_KINDS]  # fmt: skip
    parts = [text_part(LANGUAGE_HEAD.format(question=item["question"]))]
    for c in media:
        parts += media_parts(c["type"], c[c["type"]], sent)
    return [*parts, text_part(LANGUAGE_TAIL.format(a=first["answer"], b=second["answer"]))]


_NAME = r"(?:answer|response|image|assistant|output)"
_LEAD = r"\b\s*(?:is|:|=|-)?\s*[*_\"'`(\[]*\s*"  # "verdict: **", "winner is ("
_TIERS = [  # strongest first; a tier that finds two different verdicts makes the reply malformed
    [r"\[\[\s*(A|B|C|tie)\s*\]\]"],
    [rf"\b(?:verdict|winner|decision|preference|better\s+{_NAME}){_LEAD}(?:{_NAME}\s+)?(?-i:(A|B|C))\b",
     rf"\b(?:verdict|decision){_LEAD}(tie)\b"],
    [rf"\b{_NAME}\s+(?-i:(A|B))\s+(?:is|was)\s+(?:\w+\s+)?(?:better|superior|preferred|stronger)\b",
     rf"\bprefer(?:red)?\s+(?:{_NAME}\s+)?(?-i:(A|B))\b"],
    [r"\b(?:it'?s|it\s+is|this\s+is|that'?s|call\s+it)\s+a\s+(tie|draw)\b",
     r"\b(?:both|they)\s+are\s+(equally\s+\w+|tied|equal)\b", r"\b(neither)\s+(?:\w+\s+)?is\s+better\b"],
    [rf"^[\W_]*(?:{_NAME}\s+)?(A|B|tie|draw)[\W_]*$"],
]  # fmt: skip
_TIERS = [[re.compile(p, re.I) for p in tier] for tier in _TIERS]
_JSON_KEYS = ("verdict", "winner", "better", "preferred", "preference", "choice", "decision", "result")


def _side(value: str) -> str | None:
    m = re.fullmatch(rf"[\W_]*(?:{_NAME}\s*)?(a|b|c|tie|draw|equal|both|neither)[\W_]*", value.strip().lower())
    return None if m is None else {"a": "A", "b": "B"}.get(m.group(1), "tie")


def parse_verdict(reply: str) -> str | None:
    """A judge's verdict: "A", "B" or "tie", or None when the reply names none or contradicts itself.

    Signals, strongest first: a JSON object with a verdict key ({"verdict": "A"}, {"winner": "Answer B"}); [[A]],
    [[B]], [[C]] (tie); "verdict: B", "the better answer is A"; "Answer A is better", "I prefer B"; "it's a tie",
    "both are equally good"; a bare "A", "B" or "tie". The first kind found decides; if it names two different
    verdicts the reply is malformed."""
    found = []
    for block in re.findall(r"\{[^{}]*\}", reply):
        try:
            obj = json.loads(block)
        except ValueError:
            continue
        if isinstance(obj, dict):
            found += [_side(v) for k, v in obj.items() if k.lower() in _JSON_KEYS and isinstance(v, str) and _side(v)]
    tiers = [found] + [[m.group(1) for p in tier for m in p.finditer(reply)] for tier in _TIERS]
    for tier in tiers:
        verdicts = {v if v in ("A", "B", "tie") else _side(v) or "tie" for v in tier}
        if verdicts:
            return verdicts.pop() if len(verdicts) == 1 else None
    return None


def chat_url(url: str) -> str:
    """The API base: `url` itself, or `url/v1` when it has no path (http://127.0.0.1:8001)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--judge-url {url!r}: expected http://HOST:PORT or an API base such as http://HOST:PORT/v1")
    return url if urlparse(url).path else url + "/v1"


def judge_item(item: dict, reference: dict, trained: dict, api: str, model: str, seed: int, root: Path,
               sent: list[str]) -> dict:  # fmt: skip
    """Ask the judge about one item; the verdict row (its outcome from the trained model's side)."""
    order = ("trained", "reference") if trained_first(seed, item) else ("reference", "trained")
    rows = {"trained": trained, "reference": reference}
    content = judge_content(item, rows[order[0]], rows[order[1]], root, sent)
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0.0,
            "max_tokens": MAX_TOKENS}  # fmt: skip
    reply = post_json(f"{api}/chat/completions", body, os.environ.get("OPENAI_API_KEY"))
    try:
        text = reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise RewardServerError(f"{api}: not a chat completion: {reply!r:.300}") from None
    verdict = parse_verdict(text)
    if verdict in (None, "tie"):
        outcome = verdict or "malformed"
    else:
        outcome = "win" if order["AB".index(verdict)] == "trained" else "loss"
    field = "image" if "image" in trained else "answer"
    return {**identity(item), "A": order[0], "B": order[1], "verdict": verdict or "malformed", "outcome": outcome,
            "reply": text if len(text) <= REPLY_CHARS else text[:REPLY_CHARS] + f" [... {len(text)} characters]",
            "judge_model": model, "answers": {k: rows[k][field] for k in order}}  # fmt: skip


def counts(rows: list[dict]) -> dict:
    c = Counter(r["outcome"] for r in rows)
    judged = c["win"] + c["tie"] + c["loss"]
    return {"n": len(rows), "win": c["win"], "tie": c["tie"], "loss": c["loss"], "malformed": c["malformed"],
            "win_rate": c["win"] / judged if judged else None,
            "win_rate_ties_half": (c["win"] + c["tie"] / 2) / judged if judged else None,
            "trained_shown_first": sum(r["A"] == "trained" for r in rows),
            "judge_picked_first": sum(r["verdict"] == "A" for r in rows),
            "judge_picked_second": sum(r["verdict"] == "B" for r in rows)}  # fmt: skip


def summarize(rows: list[dict]) -> dict:
    """Outcomes of the trained model overall and per modality (win rates over the well-formed verdicts)."""
    modalities = sorted({r["modality"] for r in rows})
    return {"overall": counts(rows), "by_modality": {m: counts([r for r in rows if r["modality"] == m])
                                                     for m in modalities}}  # fmt: skip


def append_in_order(path: Path, todo: list[dict], fn: Callable[[dict], dict], concurrency: int, desc: str) -> None:
    """`fn` of each item of `todo`, `concurrency` at a time; each result is appended to `path` as a JSON line and
    flushed as soon as it and every one before it are done (in order, so a failure stops the rest)."""
    with ThreadPoolExecutor(concurrency) as pool, path.open("a") as f:
        bar = tqdm(total=len(todo), desc=desc, leave=False)
        for lo in range(0, len(todo), concurrency):
            for row in pool.map(fn, todo[lo : lo + concurrency]):
                f.write(json.dumps(row) + "\n")
                f.flush()
                bar.update()
        bar.close()


def run_judge(items: list[dict], files: dict[str, Path], url: str | None, model: str | None, seed: int,
              concurrency: int, sent: list[str]) -> dict:  # fmt: skip
    """The judge stage: a verdict per item not judged yet (appended line by line), then the summary."""
    caches = {stage: read_cache(files[stage]) for stage in ("reference", "trained")}
    for stage, cache in caches.items():
        missing = sum(key(it) not in cache for it in items)
        if missing:
            raise ValueError(
                f"judge: {missing} of {len(items)} items have no {stage} answer in {files[stage]}: "
                f"run --stage {stage} first (with the same --data, --modalities, --max-samples)"
            )
    known = json.loads(files["settings"].read_text()) if files["settings"].exists() else {}
    reference = known.get("reference", {})
    trained = {k: v for k, v in known.get("trained", {}).items() if k != "adapter"}
    if reference != trained:
        raise ValueError(f"judge: the reference and trained answers were made with different settings "
                         f"({reference} vs {trained}, in {files['settings']}); rerun one of those stages")  # fmt: skip
    path = files["judge"]
    done = read_cache(path)
    todo = [it for it in items if key(it) not in done]
    api, model = judge_endpoint(url, model, files["settings"], "judge")
    settings = {"judge_model": model, "seed": seed, "judge_media": sorted(sent)}
    record_settings(files["settings"], "judge", settings, path, cached=bool(done))
    print(f"judge: {len(items) - len(todo)} of {len(items)} verdicts cached in {path}")
    if todo:
        if api is None:
            raise ValueError("--stage judge needs --judge-url (an OpenAI-compatible endpoint)")
        ask = lambda it: judge_item(it, caches["reference"][key(it)], caches["trained"][key(it)], api, model, seed,
                                    path.parent, sent)  # fmt: skip
        append_in_order(path, todo, ask, concurrency, "judge")
        done = read_cache(path)
    summary = summarize([done[key(it)] for it in items])
    files["summary"].write_text(json.dumps(summary, indent=2))
    return summary


def format_summary(summary: dict) -> str:
    """The summary as a small table, one line per modality and overall."""
    lines = [f"{'':<10}{'n':>6}{'win':>6}{'tie':>6}{'loss':>6}{'malformed':>10}{'win rate':>10}{'ties half':>10}"]
    for name, c in [*summary["by_modality"].items(), ("overall", summary["overall"])]:
        rates = [f"{r:>10.3f}" if r is not None else f"{'-':>10}" for r in (c["win_rate"], c["win_rate_ties_half"])]
        lines.append(
            f"{name:<10}{c['n']:>6}{c['win']:>6}{c['tie']:>6}{c['loss']:>6}{c['malformed']:>10}{''.join(rates)}"
        )
    return "\n".join(lines)


def main(
    data: str,
    out: Path,
    stage: str = "all",
    base: str | None = None,
    adapter: str | None = None,
    judge_url: str | None = None,
    judge_model: str | None = None,
    modalities: list[str] | None = None,
    split: str = "val",
    max_samples: int | None = None,
    seed: int = 0,
    overrides: list[str] = (),
    concurrency: int = 4,
    judge_media: list[str] = MEDIA_KINDS,
) -> dict | None:
    """Run one stage (or all three) of a judge comparison; returns the summary when the judge stage ran."""
    if stage not in (*STAGES, "all"):
        raise ValueError(f"--stage {stage!r}: choose one of {', '.join(STAGES)} or all")
    bad = [m for m in modalities or [] if m not in MODALITIES] + [m for m in judge_media if m not in MEDIA_KINDS]
    if bad:
        raise ValueError(f"unknown modalities {bad}: choose among {', '.join(MODALITIES)}")
    if concurrency < 1:
        raise ValueError(f"--concurrency {concurrency}: give at least 1")
    files = stage_files(out)
    found = find_adapter(adapter) if adapter is not None else None
    config = build_config(base, found, list(overrides), seed)
    items = walk(config, data, split, modalities, max_samples)
    stages = STAGES if stage == "all" else (stage,)
    if stage == "all" and judge_url is not None and judge_model is None:  # an endpoint that is down fails now, not
        judge_model = served_model(chat_url(judge_url))  # after the answers are generated
    summary = None
    for name in stages:
        if name == "judge":
            summary = run_judge(items, files, judge_url, judge_model, seed, concurrency, list(judge_media))
        else:
            run_generation(name, items, config, found, files)
    return summary
