"""`omnialign prepare avqa | mmk12 | omni-preference`: user annotation files to the language parquet layout.

Each reads a JSON list or JSONL file of items (keys below), resolves media paths against `media_root`
(default: the input file's folder), and writes `OUT.parquet` in the layout of `omnialign.data.language`
(prompt as chat messages, media paths, ground truth or chosen/rejected and scores, modality, split).
Missing media files are reported all together, with their paths, before anything is written (or the
items are dropped with `skip_missing`). Items without a `split` go to val when a stable hash of their
id falls in `val_fraction`.

- avqa: `question` (or `question_text`), `options` (or `multi_choice`, a list), `answer` (index or letter),
  media `video` / `audio` / `image` (one or several keys), optional `id`, `split`.
- mmk12: `question`, `answer` (a letter or a free-form value), optional `image`, `options`, `id`, `split`.
- omni-preference: `prompt` (or `question`), `chosen`, `rejected`, optional `chosen_score`, `rejected_score`,
  media `image` / `audio` / `video`, `id`, `split`.
"""

import hashlib
import json
from pathlib import Path

from omnialign.data.language import MEDIA_KINDS, modality_of, write_records

LETTERS = "ABCDEFGH"
ANSWER_FORMAT = " Answer with the option's letter inside <answer></answer>."


def read_items(path: Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input file {path} does not exist")
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    items = json.loads(text)
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of items (or a .jsonl file)")
    return items


def _media(item: dict, root: Path) -> list[dict]:
    out = []
    for kind in MEDIA_KINDS:
        values = item.get(kind)
        for value in [values] if isinstance(values, str) else values or []:
            out.append({"type": kind, kind: str((root / value).resolve())})
    return out


def _split(item: dict, key: str, val_fraction: float) -> str:
    if "split" in item:
        return "val" if item["split"] in ("val", "validation", "test") else "train"
    digest = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if digest < val_fraction else "train"


def _letter(answer, n_options: int, index: int) -> str:
    if isinstance(answer, int) or (isinstance(answer, str) and answer.isdigit()):
        answer = int(answer)
        if not 0 <= answer < n_options:
            raise ValueError(f"item {index}: answer index {answer} is outside its {n_options} options")
        return LETTERS[answer]
    letter = str(answer).strip().strip("()").upper()[:1]
    if letter not in LETTERS[:n_options]:
        raise ValueError(f"item {index}: answer {answer!r} is neither an option index nor one of {LETTERS[:n_options]}")
    return letter


def _record(item: dict, i: int, root: Path, text: str, val_fraction: float, source: str) -> dict:
    key = str(item.get("id", i))
    messages = [{"role": "user", "content": [*_media(item, root), {"type": "text", "text": text}]}]
    return {"id": key, "prompt": messages, "modality": modality_of(messages), "split": _split(item, key, val_fraction),
            "data_source": source}  # fmt: skip


def avqa(items: list[dict], root: Path, val_fraction: float) -> list[dict]:
    out = []
    for i, item in enumerate(items):
        options = item.get("options", item.get("multi_choice"))
        question = item.get("question", item.get("question_text"))
        if not options or question is None or "answer" not in item:
            raise ValueError(f"avqa item {i}: needs question, options (list) and answer; has {sorted(item)}")
        listed = " ".join(f"{LETTERS[k]}. {o}" for k, o in enumerate(options))
        record = _record(item, i, root, f"{question}\n{listed}\n{ANSWER_FORMAT.strip()}", val_fraction, "avqa")
        out.append(
            {**record, "ground_truth": _letter(item["answer"], len(options), i), "options": list(map(str, options))}
        )
    return out


def mmk12(items: list[dict], root: Path, val_fraction: float) -> list[dict]:
    out = []
    for i, item in enumerate(items):
        if "question" not in item or "answer" not in item:
            raise ValueError(f"mmk12 item {i}: needs question and answer; has {sorted(item)}")
        text = item["question"] + " Put the final answer inside <answer></answer>."
        record = _record(item, i, root, text, val_fraction, "mmk12")
        options = [str(o) for o in item.get("options") or []]
        out.append({**record, "ground_truth": str(item["answer"]), "options": options})
    return out


def omni_preference(items: list[dict], root: Path, val_fraction: float) -> list[dict]:
    out = []
    for i, item in enumerate(items):
        prompt = item.get("prompt", item.get("question"))
        if prompt is None or "chosen" not in item or "rejected" not in item:
            raise ValueError(f"omni-preference item {i}: needs prompt, chosen and rejected; has {sorted(item)}")
        record = _record(item, i, root, prompt, val_fraction, "omni-preference")
        out.append({**record, "chosen": str(item["chosen"]), "rejected": str(item["rejected"]),
                    "chosen_score": float(item.get("chosen_score", 1.0)),
                    "rejected_score": float(item.get("rejected_score", 0.0))})  # fmt: skip
    return out


KINDS = {"avqa": avqa, "mmk12": mmk12, "omni-preference": omni_preference}


def prepare(
    kind: str, source: Path, out: Path, media_root: Path | None = None, val_fraction: float = 0.05,
    skip_missing: bool = False,
) -> dict[str, int]:  # fmt: skip
    """Convert `source` to `out` (a .parquet file); returns row counts by split (and dropped items)."""
    if kind not in KINDS:
        raise ValueError(f"prepare {kind!r}: choose one of {', '.join(KINDS)}")
    root = Path(media_root) if media_root else Path(source).resolve().parent
    records = KINDS[kind](read_items(source), root, val_fraction)
    missing = {r["id"]: [p for p in _paths(r) if not Path(p).exists()] for r in records}
    missing = {k: v for k, v in missing.items() if v}
    if missing and not skip_missing:
        listing = "\n  ".join(f"{k}: {', '.join(v)}" for k, v in list(missing.items())[:20])
        raise FileNotFoundError(
            f"{sum(map(len, missing.values()))} media files of {len(missing)} items are missing (media root {root}):"
            f"\n  {listing}\nfix the paths or --media-root, or pass --skip-missing to drop those items"
        )
    records = [r for r in records if r["id"] not in missing]
    if not str(out).endswith(".parquet"):
        raise ValueError(f"output {out}: give a .parquet file name")
    write_records(records, Path(out))
    counts = {s: sum(r["split"] == s for r in records) for s in ("train", "val")}
    return {**counts, "dropped": len(missing)}


def _paths(record: dict) -> list[str]:
    return [c[c["type"]] for m in record["prompt"] for c in m["content"] if c["type"] in MEDIA_KINDS]
