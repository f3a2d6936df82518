"""OCR rewards: how closely the text read from an image matches the target text.

score = 1 - min(edit distance, len(target)) / len(target), after lowercasing and removing all
whitespace from both, and 1.0 when the target occurs in the transcription; in [0, 1], higher is
better. The target is `metadata["ground_truth"]`, else the first double-quoted span of the
prompt (`A sign that says "OPEN"` -> OPEN). Two transcription backends:

- `ocr`: Tesseract, the local program (Debian: `apt-get install tesseract-ocr`), one process
  per image, `concurrency` at a time.
- `ocr_vlm`: any vision-language model behind an OpenAI-compatible chat endpoint
  (`omnialign.rewards.vlm.chat`), asked with `prompt`, `sampling` options passed through.

`info` per sample: the transcription (`text`) and the `target`.
"""

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import torch
from rapidfuzz.distance import Levenshtein

from omnialign.rewards.base import Outputs, Scores, images_of, to_png
from omnialign.rewards.vlm import chat_each

OCR_PROMPT = "Transcribe all text in this image exactly as written. Reply with the text only, nothing else."


def normalize(text: str) -> str:
    return "".join(text.split()).lower()


def ocr_similarity(text: str, target: str) -> float:
    """1 - min(edit distance, len(target)) / len(target) of the normalised strings; 1 if target is in text."""
    text, target = normalize(text), normalize(target)
    if not target:
        raise ValueError("the OCR target is empty (after removing whitespace); give a non-empty ground_truth")
    if target in text:
        return 1.0
    return 1.0 - min(Levenshtein.distance(text, target), len(target)) / len(target)


def ocr_targets(prompts: list[str], metadata: list[dict]) -> list[str]:
    """Each sample's target: metadata ground_truth, else the first double-quoted span of the prompt."""
    targets = []
    for i, (prompt, meta) in enumerate(zip(prompts, metadata, strict=True)):
        if "ground_truth" in meta:
            targets.append(str(meta["ground_truth"]))
        elif prompt.count('"') >= 2:
            targets.append(prompt.split('"')[1])
        else:
            raise ValueError(
                f"OCR reward: metadata[{i}] has no 'ground_truth' and prompts[{i}]={prompt!r} quotes no text; "
                'give the target as metadata["ground_truth"] or in double quotes in the prompt'
            )
    return targets


def tesseract(image: torch.Tensor, psm: int = 6, lang: str = "eng", timeout: float = 60.0) -> str:
    """Tesseract's transcription of one image (C, H, W) in [0, 1]; psm is its page segmentation mode."""
    command = ["tesseract", "stdin", "stdout", "--psm", str(psm), "-l", lang]
    try:
        done = subprocess.run(command, input=to_png(image), capture_output=True, timeout=timeout,
                              env={**os.environ, "OMP_THREAD_LIMIT": "1"})  # fmt: skip
    except FileNotFoundError:
        raise RuntimeError("the ocr reward runs the tesseract program: apt-get install tesseract-ocr") from None
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}"
        )
    return done.stdout.decode(errors="replace").strip()


def _scores(texts: list[str], targets: list[str]) -> Scores:
    info = [{"text": text, "target": target} for text, target in zip(texts, targets)]
    return Scores([ocr_similarity(text, target) for text, target in zip(texts, targets)], info)


def ocr(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    psm: int = 11,
    lang: str = "eng",
    concurrency: int = 4,
) -> Scores:
    """Reward: OCR similarity of Tesseract's transcription to the target, in [0, 1]; higher is better."""
    images, targets = images_of(outputs, "ocr"), ocr_targets(prompts, metadata)
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        texts = list(pool.map(lambda image: tesseract(image, psm, lang), images))
    return _scores(texts, targets)


def ocr_vlm(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str,
    prompt: str = OCR_PROMPT,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
) -> Scores:
    """Reward: OCR similarity of a VLM's transcription (OpenAI-compatible endpoint) to the target; higher is better."""
    images, targets = images_of(outputs, "ocr_vlm"), ocr_targets(prompts, metadata)
    texts = chat_each(images, [prompt] * len(targets), concurrency, url=url, model=model,
                      sampling={"temperature": 0.0, "max_tokens": 256} | (sampling or {}), api_key=api_key,
                      timeout=timeout)  # fmt: skip
    return _scores(texts, targets)
