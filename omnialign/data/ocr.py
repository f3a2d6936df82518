"""`omnialign prepare ocr`: the OCR prompt files of the public text-rendering set to parquet.

Each input line is one prompt whose target text sits between its first pair of double quotes
(`A neon sign that says "OPEN" at night` -> OPEN). `train.txt` and `test.txt` of INPUT_DIR
become `train.parquet` and `test.parquet` in OUT_DIR with the columns

    prompt        string  the line, stripped of surrounding whitespace
    ground_truth  string  the text between the first pair of double quotes
    source        string  the input file name (train.txt)
    line          int64   the line number in that file (1-based)

Blank lines are skipped; a line without a quoted text, or a file without prompts, is an error
that names the file and the line. Use the result as `data.prompts=OUT_DIR/train.parquet`: the
ground truth reaches the OCR rewards as `metadata["ground_truth"]`.
"""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SPLITS = ("train", "test")


def ground_truth(prompt: str, where: str) -> str:
    """The text between the first pair of double quotes of a prompt; ValueError naming `where` otherwise."""
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(
            f"{where}: no text between double quotes in {prompt!r:.200}; OCR prompts quote their "
            'target text, e.g. A sign that says "OPEN" (fix or delete the line)'
        )
    if not parts[1].strip():
        raise ValueError(f"{where}: the first pair of double quotes is empty in {prompt!r:.200}; quote the target text")
    return parts[1]


def read_ocr_prompts(path: str | Path) -> pa.Table:
    """One OCR prompt file as a table with columns prompt, ground_truth, source, line."""
    path = Path(path)
    rows = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        prompt = text.strip()
        if prompt:
            rows.append((prompt, ground_truth(prompt, f"{path}:{number}"), number))
    if not rows:
        raise ValueError(f"{path} holds no prompts; an OCR prompt file has one prompt per line")
    prompts, truths, lines = zip(*rows)
    return pa.table(
        {
            "prompt": pa.array(prompts, pa.string()),
            "ground_truth": pa.array(truths, pa.string()),
            "source": pa.array([path.name] * len(rows), pa.string()),
            "line": pa.array(lines, pa.int64()),
        }
    )


def prepare_ocr(input_dir: str | Path, out_dir: str | Path) -> dict[str, tuple[Path, int]]:
    """Convert INPUT_DIR/{train,test}.txt (those present, at least one) to OUT_DIR/{train,test}.parquet.

    Every file is read and checked before anything is written. Returns {split: (parquet path, prompts)}.
    """
    input_dir, out_dir = Path(input_dir), Path(out_dir)
    found = {split: input_dir / f"{split}.txt" for split in SPLITS if (input_dir / f"{split}.txt").is_file()}
    if not found:
        raise FileNotFoundError(
            f"{input_dir} holds neither train.txt nor test.txt; point INPUT_DIR at the folder "
            "of the OCR prompt files (one prompt per line, target text in double quotes)"
        )
    tables = {split: read_ocr_prompts(path) for split, path in found.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, table in tables.items():
        written[split] = (out_dir / f"{split}.parquet", table.num_rows)
        pq.write_table(table, written[split][0])
    return written
