"""`omnialign prepare edit`: an image-editing dataset on disk to a prompt parquet, its images stored or referenced.

INPUT is a .jsonl (one object per line), .json (a list of objects), .csv (a header row) or .parquet file
whose rows have

    instruction or prompt   the edit instruction, a non-empty string
    source or sources       the source image's path, or a list of paths (in a CSV cell: separated by ";"),
                            relative to INPUT's folder (or absolute)
    target_text             optional: the text the edit should render (the `ocr_edit` reward's target)
    reference               optional: the path of a reference result image
    mask                    optional: the path of a mask image, white where the edit may change the source
                            (the `pixel_preservation` reward compares the rest)

and no other columns. A null or empty optional value (an empty CSV cell) leaves it out for that row.
OUT.parquet has the columns

    prompt       string          the instruction
    sources      list<binary>    the source images as PNG (--store-images, the default; resized by --size WxH),
                 or list<string> or their paths relative to OUT's folder (--reference-images)
    target_text  string          where some row has one (null in the others)
    reference    binary|string   as sources, where some row has one (null in the others)
    mask         binary|string   as sources, where some row has one (null in the others)

which `omnialign.data.prompts.read_prompt_file` reads as prompts with their metadata and
`omnialign.data.prompts.source_images` decodes (8-bit grayscale images stay one channel, every other
mode becomes RGB). Every row is checked, and each of its files found, before any image is read; images
are then decoded and written in groups of rows to OUT's folder under a temporary name, renamed to OUT
when all are done, so a failure leaves no OUT behind.
"""

import csv
import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from omnialign.rewards.base import open_image

INPUT_TYPES = (".jsonl", ".json", ".csv", ".parquet")
COLUMNS = ("instruction", "prompt", "source", "sources", "target_text", "reference", "mask")
IMAGE_FIELDS = ("reference", "mask")  # one image each, stored or referenced as the sources are
GROUP_ROWS = 256  # rows decoded and written at a time
MAX_SIDE = 8192  # of --size: a side beyond it is a typo, not an editing dataset


def parse_size(text: str) -> tuple[int, int]:
    """`--size WxH` as (width, height); ValueError naming the value otherwise."""
    width, _, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit() and 0 < int(width) <= MAX_SIDE and 0 < int(height) <= MAX_SIDE):
        raise ValueError(f"--size {text!r}: give the width and height in pixels as WxH, each 1 to {MAX_SIDE}, "
                         "e.g. 512x512")  # fmt: skip
    return int(width), int(height)


def read_rows(path: Path) -> list[tuple[dict, str]]:
    """The rows of INPUT as (dict, where) pairs; `where` names the file and the line, item or row."""
    if path.suffix not in INPUT_TYPES:
        raise ValueError(f"{path}: an editing dataset is a {', '.join(INPUT_TYPES)} file; got {path.suffix or 'none'}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give the editing dataset's file")
    if path.suffix == ".parquet":
        return [(row, f"{path} row {i}") for i, row in enumerate(pq.read_table(path).to_pylist())]
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: Excel's "CSV UTF-8" starts with a BOM
            reader = csv.DictReader(f, restkey="(cells beyond the header)")
            twice = sorted({name for name in reader.fieldnames or [] if reader.fieldnames.count(name) > 1})
            if twice:
                raise ValueError(f"{path}: the header names columns {twice} more than once; keep one of each")
            rows = []
            for row in reader:
                row = {key: value or None for key, value in row.items()}  # an empty cell: no value
                if isinstance(row.get("sources"), str):
                    row["sources"] = [p.strip() for p in row["sources"].split(";") if p.strip()]
                rows.append((row, f"{path}:{reader.line_num}"))
            return rows
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append((json.loads(line, object_pairs_hook=_unique_keys), f"{path}:{number}"))
                except ValueError as e:
                    raise ValueError(f"{path}:{number}: not JSON ({e}): {line!r:.200}") from None
        return rows
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of objects (one per edit), got {type(data).__name__}")
    return [(item, f"{path} item {i}") for i, item in enumerate(data)]


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict; ValueError for a key given twice (json would keep the last silently)."""
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"keys {twice} appear more than once in one object; keep one of each")
    return dict(pairs)


def _one_of(row: dict, names: tuple[str, str], where: str) -> tuple[str, object]:
    """(name, value) of the one key of `names` that the row sets; ValueError when none or both do."""
    given = [name for name in names if row.get(name) is not None] or [name for name in names if name in row]
    if len(given) != 1:
        what = "neither" if not given else "both"
        raise ValueError(f"{where}: the row has {what} of {names[0]!r} and {names[1]!r} (its keys: {sorted(row)}); "
                         f"give exactly one")  # fmt: skip
    return given[0], row[given[0]]


def _file(value: object, field: str, folder: Path, where: str) -> Path:
    """An image path of the row as an existing file; FileNotFoundError or ValueError naming it otherwise."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {field} must be an image path (a non-empty string), got {value!r:.200}")
    path = folder / value
    if not path.is_file():
        raise FileNotFoundError(f"{where}: {field} {value!r}: no file {path} (paths are relative to the input "
                                f"file's folder {folder}); fix the path or add the file")  # fmt: skip
    return path


def check_row(row: object, folder: Path, where: str) -> dict:
    """A row as {prompt, sources: [Path], target_text?, reference?: Path, mask?: Path}; ValueError or
    FileNotFoundError naming the row, the field, the value and the fix."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object with instruction and source, got {row!r:.200}")
    wrong = sorted(set(row) - set(COLUMNS))
    if wrong:
        raise ValueError(f"{where}: unknown columns {wrong}; an editing row has {', '.join(COLUMNS)} "
                         "(rename or drop the others)")  # fmt: skip
    field, prompt = _one_of(row, ("instruction", "prompt"), where)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: {field} {prompt!r:.200} is empty or not a string; write the edit instruction")
    field, sources = _one_of(row, ("source", "sources"), where)
    if field == "source":
        sources, names = [sources], ["source"]
    elif isinstance(sources, list) and sources:
        names = [f"sources[{i}]" for i in range(len(sources))]
    else:
        raise ValueError(f"{where}: sources {sources!r:.200} must be a non-empty list of image paths")
    out = {"prompt": prompt.strip(), "sources": [_file(s, n, folder, where) for s, n in zip(sources, names)]}
    target = row.get("target_text")
    if target not in (None, ""):
        if not isinstance(target, str):
            raise ValueError(f"{where}: target_text {target!r:.200} must be a string; quote it")
        out["target_text"] = target
    for key in IMAGE_FIELDS:
        if row.get(key) not in (None, ""):
            out[key] = _file(row[key], key, folder, where)
    return out


def load_image(path: Path, field: str, where: str) -> Image.Image:
    """The image at `path`, fully decoded, 8-bit grayscale ("L") or RGB as `source_images` reads it."""
    try:
        return open_image(path, f"{where}: {field} {path}")
    except ValueError as e:
        raise ValueError(f"{e}; replace the file or drop the row") from None


def _alive(pid: int) -> bool:
    """Whether a process of this id runs (a temporary file of a live run is left alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def prepare_edit(
    input_path: str | Path, out: str | Path, store_images: bool = True, size: tuple[int, int] | None = None
) -> dict[str, int]:
    """Convert an editing dataset to OUT.parquet (see the module doc). Returns counts: rows, images (stored or
    referenced), image_bytes (of the stored PNGs; 0 when referenced) and file_bytes (of OUT)."""
    input_path, out = Path(input_path), Path(out)
    if out.suffix != ".parquet":
        raise ValueError(f"{out}: the output is a prompt parquet; name it NAME.parquet")
    if out.resolve() == input_path.resolve():
        raise ValueError(f"{out} is also the input: writing it would replace the dataset; choose another OUT")
    if size is not None and not store_images:
        raise ValueError("--size resizes stored images, and --reference-images keeps the files as they are: "
                         "drop --size or store the images")  # fmt: skip
    rows = [(check_row(row, input_path.parent, where), where) for row, where in read_rows(input_path)]
    if not rows:
        raise ValueError(f"{input_path} holds no rows; give at least one edit")
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.parent.resolve()
    image_type = pa.binary() if store_images else pa.string()
    fields = [("prompt", pa.string()), ("sources", pa.list_(image_type))]
    fields += [("target_text", pa.string())] * any("target_text" in row for row, _ in rows)
    fields += [(key, image_type) for key in IMAGE_FIELDS if any(key in row for row, _ in rows)]
    schema = pa.schema(fields)
    counts = {"rows": len(rows), "images": 0, "image_bytes": 0, "file_bytes": 0}

    def encode(path: Path, field: str, where: str) -> bytes | str:
        """One image as stored PNG bytes, or its path from OUT's folder once it has been read."""
        image = load_image(path, field, where)
        counts["images"] += 1
        if not store_images:
            return os.path.relpath(path.resolve(), folder)
        if size is not None:
            image = image.resize(size, Image.Resampling.NEAREST if field == "mask" else Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        counts["image_bytes"] += buffer.tell()
        return buffer.getvalue()

    for stale in out.parent.glob(f".{out.name}.*.tmp"):  # left by a killed run, whose process is gone
        pid = stale.name.removeprefix(f".{out.name}.").removesuffix(".tmp")
        if pid.isdigit() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            for lo in range(0, len(rows), GROUP_ROWS):
                columns = {name: [] for name in schema.names}
                for row, where in rows[lo : lo + GROUP_ROWS]:
                    columns["prompt"].append(row["prompt"])
                    columns["sources"].append([encode(p, f"sources[{i}]", where) for i, p in enumerate(row["sources"])])
                    if "target_text" in columns:
                        columns["target_text"].append(row.get("target_text"))
                    for key in IMAGE_FIELDS:
                        if key in columns:
                            columns[key].append(encode(row[key], key, where) if key in row else None)
                writer.write_table(pa.table(columns, schema=schema))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    counts["file_bytes"] = out.stat().st_size
    return counts
