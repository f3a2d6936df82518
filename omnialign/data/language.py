"""Language data: prompt and preference records, the parquet layout, and the samplers of language runs.

A record is a dict: `prompt` (chat messages, media items naming files), `modality` (text, image,
audio, video or mixed), `split` (train or val) and, for RL, `ground_truth` (and any other metadata the
rewards read); for preference pairs `chosen` and `rejected` (response texts) and their scores.

The parquet layout (written by `omnialign prepare`): one row per record, `prompt` as a JSON string of
the messages, `media` the list of media paths (relative to the file's folder), every other field as a
column. A set is a built-in name (`choice`, `choice_pairs`) or such a file.
"""

import json
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

MEDIA_KINDS = ("image", "audio", "video")


def media_paths(messages: list[dict]) -> list[str]:
    """The media file paths that chat messages name, in order."""
    return [str(c[c["type"]]) for m in messages if not isinstance(m["content"], str) for c in m["content"]
            if c["type"] in MEDIA_KINDS and isinstance(c[c["type"]], str)]  # fmt: skip


def modality_of(messages: list[dict]) -> str:
    kinds = {c["type"] for m in messages if not isinstance(m["content"], str) for c in m["content"]} - {"text"}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "text")


def write_records(records: list[dict], path: Path) -> Path:
    """Records to the parquet layout (`prompt` as JSON, `media` listed)."""
    rows = [{**r, "prompt": json.dumps(r["prompt"]), "media": media_paths(r["prompt"])} for r in records]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return Path(path)


def _resolve(messages: list[dict], root: Path) -> list[dict]:
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [{**c, c["type"]: str(root / c[c["type"]])} if c["type"] in MEDIA_KINDS else c for c in content]
        out.append({**m, "content": content})
    return out


def read_records(path: Path, split: str) -> list[dict]:
    """The records of one split of a parquet file, media paths made absolute; fails naming missing files."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist: write it with `omnialign prepare ...`")
    rows = pq.read_table(path).to_pylist()
    splits = sorted({r.get("split") for r in rows}, key=str)
    records = [{**r, "prompt": _resolve(json.loads(r["prompt"]), path.parent)} for r in rows if r.get("split") == split]
    if not records:
        raise ValueError(f"{path} has no rows of split {split!r} (its splits: {splits})")
    missing = [p for r in records for p in media_paths(r["prompt"]) if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"{path}: {len(missing)} media files are missing, e.g. {missing[:5]}")
    return records


def load_records(spec: str, split: str) -> list[dict]:
    """A built-in set (choice, choice_pairs) or a parquet file, one split."""
    from omnialign.worlds import choice

    builtin = {"choice": choice.questions, "choice_pairs": choice.pairs}
    if spec in builtin:
        return builtin[spec](split)
    if not spec.endswith(".parquet"):
        raise ValueError(
            f"data.prompts={spec!r}: give {' or '.join(builtin)} or a .parquet file from `omnialign prepare`"
        )
    return read_records(Path(spec), split)


def cap_by_modality(records: list[dict], limit: int | None) -> list[dict]:
    """At most `limit` records taken round-robin over the modalities (sorted), each in file order, so that
    the cap is split evenly and a small modality's unused share goes to the others."""
    if limit is None or limit >= len(records):
        return records
    by = defaultdict(list)
    for r in records:
        by[r["modality"]].append(r)
    queues, out = [by[k] for k in sorted(by)], []
    depth = 0
    while len(out) < limit:
        out += [q[depth] for q in queues if depth < len(q)][: limit - len(out)]
        depth += 1
    return out


def pair_batches(records: list[dict], pairs_per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the `pairs_per_step` pairs of a step (1-based): every batch holds one modality.

    Each pass over the data permutes each modality's pairs and cuts them into batches (a short last
    batch is topped up from the start of the same permutation), then shuffles the batch order; seeded
    by (seed, pass), so a step depends only on the seed and the step."""
    by = defaultdict(list)
    for i, r in enumerate(records):
        by[r["modality"]].append(i)
    per_pass = sum(-(-len(v) // pairs_per_step) for v in by.values())
    epoch, index = divmod(step - 1, per_pass)
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    batches = []
    for key in sorted(by):
        rows = [by[key][j] for j in torch.randperm(len(by[key]), generator=g).tolist()]
        for lo in range(0, len(rows), pairs_per_step):
            batch = rows[lo : lo + pairs_per_step]
            batches.append(batch + (rows * pairs_per_step)[: pairs_per_step - len(batch)])
    return batches[torch.randperm(len(batches), generator=g)[index]]
