"""`omnialign prepare edit` on real files: both storage modes round-trip to the same pixels, and its errors."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from omnialign.cli import main
from omnialign.data.prompts import read_prompt_file, source_images
from omnialign.prepare.edit import parse_size, prepare_edit


def pixels(path: Path) -> torch.Tensor:
    """An image file as `source_images` reads a path."""
    return source_images({"sources": [str(path)]})[0]


def write_images(folder: Path) -> dict[str, Path]:
    """Random images of several modes, sizes and formats under folder/imgs."""
    rng = np.random.default_rng(0)
    (folder / "imgs").mkdir(parents=True)
    paths = {name: folder / "imgs" / name for name in ("rgb.png", "gray.png", "photo.jpg", "alpha.png", "mask.png")}
    Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)).save(paths["rgb.png"])
    Image.fromarray(rng.integers(0, 256, (9, 7), dtype=np.uint8)).save(paths["gray.png"])
    Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(paths["photo.jpg"], quality=80)
    Image.fromarray(rng.integers(0, 256, (8, 10, 4), dtype=np.uint8), "RGBA").save(paths["alpha.png"])
    mask = np.zeros((12, 20), np.uint8)
    mask[2:6, 3:9] = 255
    Image.fromarray(mask).save(paths["mask.png"])
    return paths


ROWS = [
    {"instruction": 'Write "OPEN" on the sign', "source": "imgs/rgb.png", "target_text": "OPEN", "mask": "imgs/mask.png"},  # noqa: E501
    {"instruction": "Make it brighter", "sources": ["imgs/gray.png", "imgs/photo.jpg"], "reference": "imgs/alpha.png"},
    {"instruction": "  Turn the cat into a dog  ", "source": "imgs/alpha.png"},
]  # fmt: skip


def write_input(folder: Path, kind: str, rows: list[dict] = ROWS) -> Path:
    """The rows as an editing dataset of one kind: .jsonl, .json, .csv or .parquet."""
    path = folder / f"edits.{kind}"
    if kind == "jsonl":
        path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        names = ["instruction", "source", "sources", "target_text", "reference", "mask"]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, names)
            writer.writeheader()
            for row in rows:  # a CSV cell lists several sources separated by ";"
                writer.writerow({**row, "sources": ";".join(row.get("sources", []))})
    else:
        names = list(dict.fromkeys(key for row in rows for key in row))  # from_pylist reads the first row's keys
        pq.write_table(pa.Table.from_pylist([{key: row.get(key) for key in names} for row in rows]), path)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet"])
def test_both_modes_round_trip_to_the_same_pixels(tmp_path, kind):
    files = write_images(tmp_path / "data")
    source = write_input(tmp_path / "data", kind)
    stored, referenced = tmp_path / "stored" / "edits.parquet", tmp_path / "ref" / "deeper" / "edits.parquet"
    counts = prepare_edit(source, stored)
    assert counts["rows"] == 3 and counts["images"] == 6 and counts["file_bytes"] == stored.stat().st_size
    assert counts["image_bytes"] > 0 and prepare_edit(source, referenced, store_images=False)["image_bytes"] == 0
    expected = [[files["rgb.png"]], [files["gray.png"], files["photo.jpg"]], [files["alpha.png"]]]
    for out, image_type in ((stored, pa.binary()), (referenced, pa.string())):
        schema = pq.read_schema(out)
        assert schema.names == ["prompt", "sources", "target_text", "reference", "mask"]
        assert schema.field("sources").type == pa.list_(image_type) and schema.field("mask").type == image_type
        prompts, metadata = read_prompt_file(out)
        assert prompts == ['Write "OPEN" on the sign', "Make it brighter", "Turn the cat into a dog"]
        assert [m["target_text"] for m in metadata] == ["OPEN", None, None]
        assert metadata[0]["reference"] is None and metadata[1]["mask"] is None
        for meta, paths in zip(metadata, expected):
            got, want = source_images(meta), [pixels(p) for p in paths]
            assert [g.shape for g in got] == [w.shape for w in want] and all(map(torch.equal, got, want))
        assert torch.equal(source_images({"sources": [metadata[1]["reference"]]})[0], pixels(files["alpha.png"]))
        assert torch.equal(source_images({"sources": [metadata[0]["mask"]]})[0], pixels(files["mask.png"]))
    assert pixels(files["gray.png"]).shape == (1, 9, 7) and pixels(files["alpha.png"]).shape == (3, 8, 10)
    paths = pq.read_table(referenced).column("sources").to_pylist()
    assert paths[1] == ["../../data/imgs/gray.png", "../../data/imgs/photo.jpg"]  # relative to OUT's folder


def test_size_resizes_stored_images_and_masks(tmp_path):
    files = write_images(tmp_path)
    out = tmp_path / "edits.parquet"
    prepare_edit(write_input(tmp_path, "jsonl"), out, size=(6, 4))
    _, metadata = read_prompt_file(out)
    rgb = np.asarray(Image.open(files["rgb.png"]).resize((6, 4), Image.Resampling.BICUBIC))
    assert torch.equal(source_images(metadata[0])[0], torch.from_numpy(rgb.copy()).permute(2, 0, 1).float() / 255)
    assert [s.shape for s in source_images(metadata[1])] == [(1, 4, 6), (3, 4, 6)]
    mask = source_images({"sources": [metadata[0]["mask"]]})[0]
    assert mask.shape == (1, 4, 6) and set(mask.unique().tolist()) == {0.0, 1.0}  # nearest: still black and white


def test_optional_columns_are_left_out_when_no_row_has_them(tmp_path):
    write_images(tmp_path)
    out = tmp_path / "edits.parquet"
    prepare_edit(write_input(tmp_path, "csv", [{"instruction": "x", "source": "imgs/rgb.png"}]), out)
    assert pq.read_schema(out).names == ["prompt", "sources"]
    assert read_prompt_file(out)[1][0].keys() == {"sources"}


BAD_ROWS = [
    ({"instruction": "x", "source": "imgs/nope.png"}, FileNotFoundError, r"edits.jsonl:2: source 'imgs/nope.png': no file .*nope.png \(paths are relative to the input file's folder"),  # noqa: E501
    ({"instruction": "x", "sources": ["imgs/rgb.png", "imgs/broken.png"]}, ValueError, r"edits.jsonl:2: sources\[1\] .*broken.png is not a readable image .*replace the file or drop the row"),  # noqa: E501
    ({"instruction": "x", "source": "imgs/rgb.png", "reference": "imgs/broken.png"}, ValueError, r"edits.jsonl:2: reference .*broken.png is not a readable image"),  # noqa: E501
    ({"instruction": "x", "image": "imgs/rgb.png"}, ValueError, r"edits.jsonl:2: unknown columns \['image'\]; an editing row has instruction, prompt, source, sources, .*rename or drop"),  # noqa: E501
    ({"instruction": "x"}, ValueError, r"edits.jsonl:2: the row has neither of 'source' and 'sources' \(its keys: \['instruction'\]\); give exactly one"),  # noqa: E501
    ({"source": "imgs/rgb.png"}, ValueError, r"edits.jsonl:2: the row has neither of 'instruction' and 'prompt'"),
    ({"instruction": "x", "prompt": "y", "source": "imgs/rgb.png"}, ValueError, r"edits.jsonl:2: the row has both of 'instruction' and 'prompt'"),  # noqa: E501
    ({"instruction": "   ", "source": "imgs/rgb.png"}, ValueError, r"edits.jsonl:2: instruction '   ' is empty or not a string; write the edit instruction"),  # noqa: E501
    ({"prompt": None, "source": "imgs/rgb.png"}, ValueError, r"edits.jsonl:2: prompt None is empty or not a string"),
    ({"instruction": "x", "sources": []}, ValueError, r"edits.jsonl:2: sources \[\] must be a non-empty list of image paths"),  # noqa: E501
    ({"instruction": "x", "source": "imgs/rgb.png", "target_text": 42}, ValueError, r"edits.jsonl:2: target_text 42 must be a string"),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize("row, error, message", BAD_ROWS)
def test_bad_rows_fail_naming_row_field_value_and_fix(tmp_path, row, error, message):
    write_images(tmp_path)
    (tmp_path / "imgs" / "broken.png").write_text("not an image")
    source = write_input(tmp_path, "jsonl", [{"instruction": "fine", "source": "imgs/rgb.png"}, row])
    out = tmp_path / "out" / "edits.parquet"
    with pytest.raises(error, match=message):
        prepare_edit(source, out)
    assert not out.exists() and not list(out.parent.glob("*.tmp"))  # nothing written, no temporary left
    with pytest.raises(SystemExit, match=f"prepare edit: .*{message}"):
        main(["prepare", "edit", str(source), str(out)])


def test_bad_files_and_options_fail_before_anything_is_written(tmp_path):
    write_images(tmp_path)
    source = write_input(tmp_path, "jsonl")
    cases = [
        ([str(tmp_path / "edits.txt"), "out.parquet"], r"edits.txt: an editing dataset is a .jsonl, .json, .csv, "),
        ([str(tmp_path / "missing.jsonl"), "out.parquet"], r"missing.jsonl does not exist"),
        ([str(source), str(tmp_path / "out.csv")], r"out.csv: the output is a prompt parquet; name it NAME.parquet"),
        ([str(source), str(tmp_path / "o.parquet"), "--size", "64"], r"--size '64': give the width and height .* WxH"),
        ([str(source), str(tmp_path / "o.parquet"), "--size", "8x8", "--reference-images"], r"drop --size or store"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit, match=f"prepare edit: .*{message}"):
            main(["prepare", "edit", *args])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SystemExit, match="empty.jsonl holds no rows"):
        main(["prepare", "edit", str(tmp_path / "empty.jsonl"), str(tmp_path / "o.parquet")])
    assert not list(tmp_path.glob("*.parquet"))


def test_the_command(tmp_path, capsys):
    files = write_images(tmp_path / "data")
    source = write_input(tmp_path / "data", "csv")
    out = tmp_path / "out" / "edits.parquet"
    main(["prepare", "edit", str(source), str(out), "--size", "5x3"])
    stored = sum(len(b) for row in pq.read_table(out).to_pylist() for b in [*row["sources"], row["reference"] or b""])
    stored += sum(len(row["mask"] or b"") for row in pq.read_table(out).to_pylist())
    expected = f"wrote {out} (3 rows, 6 images stored, {stored:,} bytes of PNG; {out.stat().st_size:,} bytes)\n"
    assert capsys.readouterr().out == expected
    _, metadata = read_prompt_file(out)
    assert source_images(metadata[2])[0].shape == (3, 3, 5) and files["alpha.png"].is_file()


def test_16_bit_grayscale_is_scaled_not_clipped_alike_in_every_path(tmp_path):
    """A 16-bit grayscale PNG (mode I;16) reads as its 8-bit equivalent (value / 257) through `prepare edit`, prompt
    sources and the reward server's decoding, with one channel in each: clipping made 99.5% of pixels white."""
    from omnialign.rewards.base import from_png

    ramp = np.linspace(0, 65535, 64 * 64).round().astype(np.uint16).reshape(64, 64)
    (tmp_path / "imgs").mkdir()
    Image.fromarray(ramp).save(tmp_path / "imgs" / "deep.png")
    assert Image.open(tmp_path / "imgs" / "deep.png").mode == "I;16"
    expected = torch.from_numpy((ramp / 257).round()).float().div(255)[None]
    direct = pixels(tmp_path / "imgs" / "deep.png")
    served = from_png((tmp_path / "imgs" / "deep.png").read_bytes(), "images[0]")
    out = tmp_path / "out" / "edits.parquet"
    prepare_edit(write_input(tmp_path, "jsonl", [{"instruction": "x", "source": "imgs/deep.png"}]), out)
    stored = source_images(read_prompt_file(out)[1][0])[0]
    for got in (direct, served, stored):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert 0.45 < float(direct.mean()) < 0.55  # a ramp, not white


def test_decompression_bombs_fail_naming_the_row_and_the_prompt(tmp_path, monkeypatch):
    """An image over Pillow's decompression-bomb limit is a ValueError naming where it came from (the row and
    field in `prepare edit`, the prompt and source in training), not a raw DecompressionBombError."""
    files = write_images(tmp_path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)  # the 12x20 rgb.png is then a bomb (over 2 x 50 pixels)
    row = r"edits.jsonl:1: sources\[0\] .*rgb.png is too large to decode .*drop the row"
    with pytest.raises(ValueError, match=row):
        prepare_edit(write_input(tmp_path, "jsonl", [{"instruction": "x", "source": "imgs/rgb.png"}]),
                     tmp_path / "out.parquet")  # fmt: skip
    with pytest.raises(ValueError, match=r"prompt 'x': source 0 .*rgb.png.* is too large to decode"):
        source_images({"sources": [str(files["rgb.png"])]}, "prompt 'x'")


@pytest.mark.parametrize("tensor", [torch.zeros(32, 32), torch.zeros(4, 8, 8), torch.zeros(3, 8, 8, dtype=torch.uint8)])
def test_tensor_sources_of_the_wrong_shape_or_type_fail_naming_the_prompt(tensor):
    """Sources given as tensors through the Python API are checked as files are: (C, H, W) float, C = 1 or 3."""
    with pytest.raises(ValueError, match=r"prompt 3: source 1 is a torch\.\w+ tensor of shape .*\(C, H, W\) float"):
        source_images({"sources": [torch.zeros(1, 8, 8), tensor]}, "prompt 3")


def test_prepare_edit_refuses_ambiguous_inputs_and_cleans_up_after_a_killed_run(tmp_path):
    """The input as OUT would be replaced; a column or key given twice would silently keep the last; a CSV saved by
    Excel ("CSV UTF-8", with a byte-order mark) is read; --size has an upper bound; the temporary file a killed run
    left (its process gone) is removed by the next run, a live run's is not."""
    write_images(tmp_path)
    parquet = write_input(tmp_path, "parquet", ROWS[:1])
    with pytest.raises(ValueError, match="is also the input: writing it would replace the dataset"):
        prepare_edit(parquet, parquet)
    (tmp_path / "twice.csv").write_text("instruction,source,source\nx,imgs/rgb.png,imgs/gray.png\n")
    with pytest.raises(ValueError, match=r"twice.csv: the header names columns \['source'\] more than once"):
        prepare_edit(tmp_path / "twice.csv", tmp_path / "o.parquet")
    (tmp_path / "twice.jsonl").write_text('{"instruction": "x", "source": "imgs/rgb.png", "source": "imgs/gray.png"}\n')
    with pytest.raises(ValueError, match=r"twice.jsonl:1: not JSON \(keys \['source'\] appear more than once"):
        prepare_edit(tmp_path / "twice.jsonl", tmp_path / "o.parquet")
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbfinstruction,source\nx,imgs/rgb.png\n")
    assert prepare_edit(tmp_path / "excel.csv", tmp_path / "o.parquet")["rows"] == 1
    with pytest.raises(ValueError, match=r"--size '100000x10': .* each 1 to 8192"):
        parse_size("100000x10")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, live = tmp_path / f".o.parquet.{dead.stdout.strip()}.tmp", tmp_path / f".o.parquet.{os.getppid()}.tmp"
    stale.write_bytes(b"half a parquet"), live.write_bytes(b"another run's")
    prepare_edit(tmp_path / "excel.csv", tmp_path / "o.parquet")
    assert not stale.exists() and live.exists()


@pytest.mark.parametrize("entry", [3, None, {"path": "imgs/rgb.png"}])
def test_source_entries_that_are_no_path_fail_naming_the_prompt(tmp_path, entry):
    """A "sources" entry that is a number, null or an object is refused when the prompt file is read, naming the line
    and the entry (it was an AttributeError later)."""
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "x", "sources": [entry]}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: source 0 is .*; an entry of \"sources\" is an image path"):
        read_prompt_file(tmp_path / "p.jsonl")
