"""`omnialign prepare ocr` and prompt files as `data.prompts`: round trips and the error messages."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from omnialign.cli import main
from omnialign.data.prompts import load_prompt_set, load_prompts, prompts_for_step, read_prompt_file
from omnialign.rewards.ocr import ocr_targets

TRAIN = 'A neon sign that says "OPEN" at night\n\n  A cake with "Happy 30th" in icing  \nA "a" and a "b"\n'


def prepare(tmp_path, files: dict[str, str]) -> str:
    source = tmp_path / "in"
    source.mkdir()
    for name, text in files.items():
        (source / name).write_text(text)
    main(["prepare", "ocr", str(source), str(tmp_path / "out")])
    return tmp_path / "out"


def test_prepare_ocr_round_trip_into_prompts_and_reward_targets(tmp_path, capsys):
    out = prepare(tmp_path, {"train.txt": TRAIN, "test.txt": 'Graffiti reading "OMNI ALIGN"'})
    assert f"{out / 'train.parquet'} (3 prompts)" in capsys.readouterr().out
    table = pq.read_table(out / "train.parquet")
    assert table.column_names == ["prompt", "ground_truth", "source", "line"]
    assert table.to_pylist() == [
        {"prompt": 'A neon sign that says "OPEN" at night', "ground_truth": "OPEN", "source": "train.txt", "line": 1},
        {"prompt": 'A cake with "Happy 30th" in icing', "ground_truth": "Happy 30th", "source": "train.txt", "line": 3},
        {"prompt": 'A "a" and a "b"', "ground_truth": "a", "source": "train.txt", "line": 4},
    ]
    prompts, metadata = load_prompt_set(str(out / "test.parquet"))
    assert prompts == ['Graffiti reading "OMNI ALIGN"']
    assert metadata == [{"ground_truth": "OMNI ALIGN", "source": "test.txt", "line": 1}]
    prompts, metadata = load_prompt_set(str(out / "train.parquet"))
    assert ocr_targets(prompts, metadata) == ["OPEN", "Happy 30th", "a"]  # what the OCR rewards will read
    assert load_prompts(str(out / "train.parquet")) == prompts
    assert prompts_for_step(prompts, 2, 0, 1) == prompts_for_step(["x", "y", "z"], 2, 0, 1)  # unchanged sampling


@pytest.mark.parametrize(
    "files, message",
    [
        ({"train.txt": TRAIN + "no quotes here\n"}, r"train.txt:5: no text between double quotes in 'no quotes here'"),
        ({"train.txt": 'one " quote\n'}, r"train.txt:1: no text between double quotes"),
        ({"train.txt": 'empty "" quotes\n'}, r"train.txt:1: the first pair of double quotes is empty"),
        ({"train.txt": TRAIN, "test.txt": "\n  \n"}, r"test.txt holds no prompts"),
        ({"val.txt": TRAIN}, r"holds neither train.txt nor test.txt"),
    ],
)
def test_prepare_ocr_errors_name_the_file_and_line(tmp_path, files, message):
    with pytest.raises(SystemExit, match=f"prepare ocr: .*{message}"):
        prepare(tmp_path, files)
    assert not (tmp_path / "out" / "train.parquet").exists()  # every file is checked before writing


def test_prompt_files_of_every_kind(tmp_path):
    (tmp_path / "p.txt").write_text("a cat\n\n a dog \n")
    (tmp_path / "p.json").write_text(json.dumps(["a cat", {"prompt": "a dog", "ground_truth": "DOG"}]))
    (tmp_path / "p.jsonl").write_text('"a cat"\n\n{"prompt": "a dog", "ground_truth": "DOG"}\n')
    assert read_prompt_file(tmp_path / "p.txt") == (["a cat", "a dog"], [{}, {}])
    for name in ("p.json", "p.jsonl"):
        assert load_prompt_set(str(tmp_path / name)) == (["a cat", "a dog"], [{}, {"ground_truth": "DOG"}])
    assert load_prompts("digits") == list("0123456789")  # glyphs sets still by name
    (tmp_path / "bom.txt").write_bytes("a cat\na dog\n".encode("utf-8-sig"))  # as Windows editors save it
    assert read_prompt_file(tmp_path / "bom.txt") == (["a cat", "a dog"], [{}, {}])


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("empty.txt", "\n\n", r"empty.txt holds no prompts"),
        ("bad.jsonl", '"ok"\n{"text": "x"}\n', r"bad.jsonl:2: expected a non-empty prompt string or an object"),
        ("bad.json", '{"prompt": "x"}', r"bad.json: expected a JSON list"),
        ("bad.yaml", "x", r"bad.yaml: prompt files end in .txt, .json, .jsonl, .parquet"),
    ],
)  # fmt: skip
def test_prompt_file_errors(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        read_prompt_file(tmp_path / name)


def test_unreadable_prompt_files_are_named(tmp_path):
    (tmp_path / "latin.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.txt: not UTF-8 text \(byte 3: invalid continuation byte\)"):
        read_prompt_file(tmp_path / "latin.txt")
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 half a file")
    with pytest.raises(ValueError, match=r"cut.parquet: not a readable parquet file \(.*\); write it again"):
        read_prompt_file(tmp_path / "cut.parquet")


def test_parquet_without_prompt_column_names_file_column_and_columns_found(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"caption": ["a cat"], "ground_truth": ["CAT"]}), path)
    with pytest.raises(
        ValueError, match=r"p.parquet: no column 'prompt'; columns found: \['caption', 'ground_truth'\]"
    ):
        load_prompt_set(str(path))
    with pytest.raises(ValueError, match=r"data.prompts='nope' is neither a prompt set .* nor a prompt file"):
        load_prompts("nope")
    with pytest.raises(FileNotFoundError, match="missing.parquet does not exist"):
        load_prompts(str(tmp_path / "missing.parquet"))
