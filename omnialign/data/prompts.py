"""Prompt sets and prompt sampling: each step takes B prompts from an endless stream of seeded permutations.

A prompt set is a glyphs set by name (digits, pairs; the edit sets edits, edits_val) or a file: `.txt` (one
prompt per line), `.json` (a list of prompts or of objects with a "prompt" key), `.jsonl` (one such item per line)
or `.parquet` (a `prompt` column, e.g. from `omnialign prepare ocr`). Every other key or column
of a prompt (`ground_truth`, ...) is its metadata, which rewards receive (`load_prompt_set`).

An editing prompt (an instruction) brings its source images in the metadata key "sources": a list whose
entries are image paths (relative ones from the prompt file's folder), encoded image bytes (PNG, JPEG: a
parquet binary column) or float tensors (C, H, W) in [0, 1]. `source_images` decodes one prompt's; the
trainer hands the decoded tensors to the rollout and, in the metadata, to the rewards. The optional
"reference" and "mask" images (one each, paths or bytes) pass to the rewards as they are, paths made absolute.

The stream depends only on (seed, step), so resuming at a step needs no saved state beyond the
step itself, and every rank computes the same global list before taking its share of groups.
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from omnialign.rewards.base import check_image, from_png
from omnialign.worlds.glyphs import EDIT_SETS, PROMPT_SETS

PROMPT_FILE_TYPES = (".txt", ".json", ".jsonl", ".parquet")


def _prompt_item(item: object, where: str) -> tuple[str, dict]:
    """A JSON item (a string, or an object with a "prompt" string) as (prompt, metadata)."""
    meta = dict(item) if isinstance(item, dict) else {}
    prompt = meta.pop("prompt", None) if isinstance(item, dict) else item
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(
            f'{where}: expected a non-empty prompt string or an object with a "prompt" string, got {item!r:.200}'
        )
    return prompt, meta


def _text(path: Path) -> str:
    """A text file's contents; a UTF-8 byte-order mark is dropped, not made part of the first prompt."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None


def read_prompt_file(path: str | Path) -> tuple[list[str], list[dict]]:
    """Prompts and their metadata dicts (one per prompt) from a .txt, .json, .jsonl or .parquet file."""
    path = Path(path)
    if path.suffix not in PROMPT_FILE_TYPES:
        raise ValueError(f"{path}: prompt files end in {', '.join(PROMPT_FILE_TYPES)}; got {path.suffix or 'none'}")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    if path.suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except pa.ArrowException as e:
            raise ValueError(f"{path}: not a readable parquet file ({e}); write it again, e.g. with pyarrow") from None
        if "prompt" not in table.column_names:
            raise ValueError(
                f"{path}: no column 'prompt'; columns found: {table.column_names}. "
                "A prompt parquet needs a string column named prompt (other columns become metadata)"
            )
        rows = table.to_pylist()
        items = [(row, f"{path} row {i}") for i, row in enumerate(rows)]
    elif path.suffix == ".txt":
        lines = _text(path).splitlines()
        items = [(line.strip(), f"{path}:{i}") for i, line in enumerate(lines, 1) if line.strip()]
    elif path.suffix == ".jsonl":
        items = []
        for i, line in enumerate(_text(path).splitlines(), 1):
            if line.strip():
                try:
                    items.append((json.loads(line), f"{path}:{i}"))
                except ValueError as e:
                    raise ValueError(f"{path}:{i}: not JSON ({e}): {line!r:.200}") from None
    else:
        text = _text(path)
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
        if not isinstance(data, list):
            raise ValueError(
                f'{path}: expected a JSON list of prompts (strings or objects with "prompt"), got {type(data).__name__}'
            )
        items = [(item, f"{path} item {i}") for i, item in enumerate(data)]
    if not items:
        raise ValueError(f"{path} holds no prompts; give at least one")
    prompts, metadata = zip(*(_prompt_item(item, where) for item, where in items))
    for meta, (_, where) in zip(metadata, items):
        if "sources" in meta:
            meta["sources"] = _source_paths(meta["sources"], path.parent, where)
        for key in ("reference", "mask"):  # one image each (`omnialign prepare edit`); a path is relative as a source's
            if isinstance(meta.get(key), str):
                meta[key] = str(path.parent / meta[key])
    return list(prompts), list(metadata)


def _source_paths(sources: object, folder: Path, where: str) -> list:
    """A prompt's "sources" with relative paths made absolute from `folder`; FileNotFoundError for a missing file."""
    if not isinstance(sources, (list, tuple)) or not sources:
        raise ValueError(f'{where}: "sources" must be a non-empty list of image paths or bytes, got {sources!r:.200}')
    out = []
    for i, source in enumerate(sources):
        if not isinstance(source, (str, bytes)):
            raise ValueError(f'{where}: source {i} is {source!r:.200}; an entry of "sources" is an image path (a '
                             "string, relative to the prompt file) or the image's bytes")  # fmt: skip
        if isinstance(source, str):
            source = folder / source
            if not source.is_file():
                raise FileNotFoundError(f'{where}: source image {source} does not exist (paths in "sources" are '
                                        f"relative to the prompt file's folder {folder})")  # fmt: skip
            source = str(source)
        out.append(source)
    return out


def check_sources(metadata: list[dict], field: str) -> None:
    """Every prompt's source images readable (`check_image`: headers and checksums, not the pixels), so that a bad
    one fails at the start of a run, naming its prompt, rather than at the step that first draws it."""
    for i, meta in enumerate(metadata):
        for j, source in enumerate(meta.get("sources", [])):
            if not isinstance(source, torch.Tensor):
                name = source if isinstance(source, str) else f"{len(source)} bytes"
                check_image(source, f"{field} item {i}: source {j} ({name:.200})")


def source_images(meta: dict, where: str = "prompt") -> list[torch.Tensor]:
    """The source images of one editing prompt, `meta["sources"]`, as float tensors (C, H, W) in [0, 1] (C = 1 for
    grayscale, else 3); ValueError naming the prompt `where` and the entry when one is missing or unreadable."""
    if "sources" not in meta:
        raise ValueError(f'{where} has no "sources": an editing model needs the source images of every prompt '
                         "(a prompt file from `omnialign prepare edit`)")  # fmt: skip
    images = []
    for i, source in enumerate(meta["sources"]):
        if isinstance(source, torch.Tensor):
            if source.dim() != 3 or source.shape[0] not in (1, 3) or not source.is_floating_point():
                raise ValueError(f"{where}: source {i} is a {source.dtype} tensor of shape {tuple(source.shape)}; "
                                 "a source tensor is (C, H, W) float with C = 1 or 3, values in [0, 1]")  # fmt: skip
            images.append(source)
            continue
        name = source if isinstance(source, str) else f"{len(source)} bytes"
        images.append(from_png(source, f"{where}: source {i} ({name:.200})"))
    return images


def load_prompt_set(name: str) -> tuple[list[str], list[dict]]:
    """The prompts of `data.prompts` and one metadata dict per prompt (empty for the glyphs text sets)."""
    if name in PROMPT_SETS:
        return list(PROMPT_SETS[name]), [{} for _ in PROMPT_SETS[name]]
    if name in EDIT_SETS:
        return EDIT_SETS[name]()
    if not name.endswith(PROMPT_FILE_TYPES):
        raise ValueError(
            f"data.prompts={name!r} is neither a prompt set {sorted(PROMPT_SETS | EDIT_SETS)} nor a prompt file "
            f"({', '.join(PROMPT_FILE_TYPES)}); name one of them"
        )
    return read_prompt_file(name)


def load_prompts(name: str) -> list[str]:
    """The prompts of a prompt set: a glyphs set by name (digits, pairs) or a prompt file (see the module doc)."""
    return load_prompt_set(name)[0]


def prompts_for_step(prompts: list[str], per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the `per_step` prompts of a step (1-based steps), drawn without replacement
    within each pass over the data; a pass is a permutation seeded by (seed, pass)."""
    first = (step - 1) * per_step
    out = []
    for i in range(first, first + per_step):
        epoch, pos = divmod(i, len(prompts))
        perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[pos]))
    return out
