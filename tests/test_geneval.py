"""GenEval-style evaluation: the `geneval` reward and `omnialign eval geneval` against a stub VLM over loopback HTTP
that answers each question from a known truth per image (keyed by the image's pixels)."""

import base64
import hashlib
import io
import json
import re
import threading
from collections import defaultdict
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from http_stub import JSONHandler, serving
from PIL import Image

from omnialign import cli, evaluate, judge
from omnialign.config import RewardConfig
from omnialign.data.prompts import load_prompt_set
from omnialign.rewards import REWARDS, score
from omnialign.rewards.client import RewardServerError
from omnialign.rewards.geneval import geneval, parse_color, parse_count, parse_yes_no, requirements

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    (r"How many (.+) are there in the image\? Answer with a single number\.", "counts"),
    (r"What color is the (.+)\? Answer with one word: red, orange, yellow, green, blue, purple, pink, brown, black "
     r"or white\.", "colors"),
    (r"Is the (.+ (?:to the left of|to the right of|above|below) the .+)\? Answer yes or no\.", "relations"),
]  # fmt: skip


def pixels_key(png: bytes) -> str:
    return hashlib.sha1(np.asarray(Image.open(io.BytesIO(png))).tobytes()).hexdigest()


class VLM(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint: `truth[pixels_key(image)][kind][subject]` is the reply to a question
    about that image (a missing subject: "0" for counts, "No" for relations); `fail_at`: from that many chat
    requests on, answer HTTP 400. `seen`: (image key, question) of every chat request, `bodies` the bodies."""

    daemon_threads = True

    def __init__(self, truth, fail_at=None, model="stub-vlm"):
        super().__init__(("127.0.0.1", 0), Handler)
        self.truth, self.fail_at, self.seen, self.bodies, self.lock = truth, fail_at, [], [], threading.Lock()
        self.model = model  # the model /v1/models lists

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(JSONHandler):
    server: VLM

    def do_GET(self):
        self.answer(200 if self.path == "/v1/models" else 404, {"object": "list", "data": [{"id": self.server.model}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        (content,) = [m["content"] for m in body["messages"]]
        (url,) = [c["image_url"]["url"] for c in content if c["type"] == "image_url"]
        (question,) = [c["text"] for c in content if c["type"] == "text"]
        image = pixels_key(base64.b64decode(url.removeprefix("data:image/png;base64,")))
        with self.server.lock:
            if self.server.fail_at is not None and len(self.server.seen) >= self.server.fail_at:
                return self.answer(400, {"error": "stub refuses"})
            self.server.seen.append((image, question))
            self.server.bodies.append(body)
        kind, subject = next((k, m.group(1)) for p, k in QUESTIONS if (m := re.fullmatch(p, question)))
        reply = self.server.truth[image][kind].get(subject, {"counts": "0", "relations": "No"}.get(kind))
        self.answer(200, {"object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]})  # fmt: skip


@contextmanager
def vlm(truth, fail_at=None, model="stub-vlm"):
    with serving(VLM(truth, fail_at, model)) as server:
        yield server


@pytest.mark.parametrize(
    "parse, reply, answer",
    [(parse_count, "3", 3), (parse_count, " Three.", 3), (parse_count, "**2**", 2), (parse_count, "none", 0),
     (parse_count, "zero", 0), (parse_count, "twenty", 20), (parse_count, "12", 12), (parse_count, "2 or 3", None),
     (parse_count, "There are three.", None), (parse_count, "many", None), (parse_count, "", None),
     (parse_count, "2.5", None), (parse_color, "Red.", "red"), (parse_color, "`white`", "white"),
     (parse_color, "gray", None), (parse_color, "dark red", None), (parse_color, "3", None),
     (parse_yes_no, "Yes", True), (parse_yes_no, "no.", False), (parse_yes_no, "maybe", None),
     (parse_yes_no, "Yes, it is.", None)],
)  # fmt: skip
def test_strict_parsers(parse, reply, answer):
    assert parse(reply) == answer


@pytest.mark.parametrize(
    "meta, message",
    [({"tag": "single_object"}, "include=None"), ({"include": []}, "include=\\[\\]"),
     ({"include": [{"count": 1}]}, 'include\\[0\\].*needs a "class"'),
     ({"include": [{"class": "dog", "count": 0}]}, "include\\[0\\] count=0"),
     ({"include": [{"class": "dog", "count": "2"}]}, "include\\[0\\] count='2'"),
     ({"include": [{"class": "dog"}], "exclude": [{"class": "dog", "count": True}]}, "exclude\\[0\\] count=True"),
     ({"include": [{"class": "car", "color": "grey"}]}, "color='grey'; choose one of red"),
     ({"include": [{"class": "a"}, {"class": "b", "position": ["behind", 0]}]}, "include\\[1\\] position="),
     ({"include": [{"class": "a", "position": ["left of", 0]}]}, "index of an earlier include entry")],
)  # fmt: skip
def test_bad_metadata_is_named(meta, message):
    with pytest.raises(ValueError, match=message):
        requirements(meta, "prompt 3")


def solid(i: int) -> torch.Tensor:
    return torch.tensor([i * 25, 255 - i * 20, (i * 70) % 256]).div(255).view(3, 1, 1).expand(3, 8, 8).clone()


def test_reward_over_http(tmp_path):
    """Nine images, each with its own truth; the reward through `rewards.score`, the summary by hand."""
    one = lambda c: {"class": c, "count": 1}  # noqa: E731
    cases = [  # (tag, metadata, the truth of the image: replies by question kind and subject)
        ("single_object", {"include": [one("dog")]}, {"counts": {"dogs": "1"}}),
        ("two_object", {"include": [one("dog"), one("cat")]}, {"counts": {"dogs": "One."}}),  # no cat
        ("counting", {"include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}]},
         {"counts": {"clocks": "**two**"}}),
        ("counting", {"include": [{"class": "clock", "count": 3}], "exclude": [{"class": "clock", "count": 4}]},
         {"counts": {"clocks": "3 or 4"}}),  # malformed: both checks fail
        ("colors", {"include": [{**one("car"), "color": "red"}]}, {"counts": {"cars": "1"}, "colors": {"car": "Red."}}),
        ("color_attr", {"include": [{**one("car"), "color": "red"}, {**one("bench"), "color": "green"}]},
         {"counts": {"cars": "1"}, "colors": {"car": "red", "bench": "green"}}),  # no bench: its colour is not asked
        ("position", {"include": [one("train"), {**one("potted plant"), "position": ["right of", 0]}]},
         {"counts": {"trains": "1", "potted plants": "1"},
          "relations": {"potted plant to the right of the train": "Yes"}}),
        ("position", {"include": [one("train"), {**one("potted plant"), "position": ["right of", 0]}]},
         {"counts": {"trains": "1", "potted plants": "1"},
          "relations": {"potted plant to the right of the train": "It is."}}),  # malformed
        ("counting", {"include": [{"class": "clock", "count": 4}], "exclude": [{"class": "clock", "count": 5}]},
         {"counts": {"clocks": "4"}}),
    ]  # fmt: skip
    images = torch.stack([solid(i) for i in range(len(cases))])
    keys = [hashlib.sha1((im.permute(1, 2, 0) * 255).round().byte().numpy().tobytes()).hexdigest() for im in images]
    truth = {k: t for k, (_, _, t) in zip(keys, cases)}
    metadata = [{"tag": tag, **meta} for tag, meta, _ in cases]
    config = RewardConfig(weights={"geneval": 1.0})
    with vlm(truth) as server:
        config.options = {"geneval": {"url": server.url + "/v1", "concurrency": 3}}
        result = score(images, [f"prompt {i}" for i in range(len(cases))], metadata, config)
    assert REWARDS["geneval"] is geneval
    assert result.parts["geneval"].tolist() == [1, 0, 1, 0, 1, 0, 1, 0, 1]
    info = [i["geneval"] for i in result.info]
    assert [i["partial"] for i in info] == pytest.approx([1, 0.5, 1, 0, 1, 0.5, 1, 2 / 3, 1])
    assert [i["malformed"] for i in info] == [0, 0, 0, 2, 0, 0, 0, 1, 0]
    assert [c["requirement"] for c in info[5]["checks"]] == ["car >= 1", "car is red", "bench >= 1", "bench is green"]
    assert info[5]["checks"][3] == {"requirement": "bench is green", "question": "What color is the bench? Answer "
                                    "with one word: red, orange, yellow, green, blue, purple, pink, brown, black or "
                                    "white.", "reply": None, "answer": None, "holds": False}  # fmt: skip
    assert info[3]["checks"][1] == {"requirement": "clock < 4", "question": "How many clocks are there in the image? "
                                    "Answer with a single number.", "reply": "3 or 4", "answer": None, "holds": False,
                                    "malformed": True}  # fmt: skip
    assert info[7]["checks"][2]["reply"] == "It is." and info[7]["checks"][2]["malformed"]
    # one request per question (a class's count asked once per image), each with that image alone, greedy
    per_image = [sum(k == key for k, _ in server.seen) for key in keys]
    assert per_image == [1, 2, 1, 1, 2, 3, 3, 3, 1]
    assert {(b["model"], b["temperature"], b["max_tokens"]) for b in server.bodies} == {("stub-vlm", 0.0, 16)}

    # the summary: accuracy per tag, the score the mean over tags (not over images)
    rows = [{"tag": tag, "correct": bool(v), "partial": i["partial"], "malformed": i["malformed"]}
            for (tag, _, _), v, i in zip(cases, result.parts["geneval"].tolist(), info)]  # fmt: skip
    summary = evaluate.summarize(rows)
    by_tag = {t: c["accuracy"] for t, c in summary["by_tag"].items()}
    assert by_tag == pytest.approx({"single_object": 1, "two_object": 0, "counting": 2 / 3, "colors": 1,
                                    "color_attr": 0, "position": 0.5})  # fmt: skip
    assert summary["score"] == pytest.approx((1 + 0 + 2 / 3 + 1 + 0 + 0.5) / 6)
    assert summary["overall"] == pytest.approx({"n": 9, "correct": 5, "accuracy": 5 / 9, "malformed": 3,
                                                "partial": (6 + 2 / 3) / 9})  # fmt: skip


def test_unreachable_endpoint_and_bad_metadata():
    image = solid(0)[None]
    with pytest.raises(
        RewardServerError,
        match="no answer after 3 attempts.*is the OpenAI-compatible endpoint up at http://127.0.0.1:9/v1",
    ):
        geneval(image, ["a dog"], [{"include": [{"class": "dog", "count": 1}]}], url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="geneval: sample 0 \\('a dog'\\): metadata include=None"):
        geneval(image, ["a dog"], [{"tag": "single_object"}], url="http://127.0.0.1:9/v1", model="m")


GLYPH_META = [  # GenEval's format, for the glyphs world (prompts are digits; classes are their names)
    {"prompt": "7", "tag": "single_object", "include": [{"class": "seven", "count": 1}]},
    {"prompt": "4", "tag": "single_object", "include": [{"class": "four", "count": 1}]},
    {"prompt": "22", "tag": "counting", "include": [{"class": "two", "count": 2}],
     "exclude": [{"class": "two", "count": 3}]},
    {"prompt": "35", "tag": "position", "include": [{"class": "three", "count": 1},
                                                    {"class": "five", "count": 1, "position": ["right of", 0]}]},
    {"prompt": "1", "tag": "colors", "include": [{"class": "one", "count": 1, "color": "white"}]},
]  # fmt: skip
RIGHT = {"counts": {"sevens": "1", "fours": "1", "twos": "2", "threes": "1", "fives": "1", "ones": "1"},
         "colors": {"one": "White"}, "relations": {"five to the right of the three": "yes"}}  # fmt: skip
# sample 1 of each prompt: three 2s (fails exclude), 5 not right of 3, a colour reply outside the list
WRONG = {**RIGHT, "counts": {**RIGHT["counts"], "twos": "3"}, "colors": {"one": "whitish"},
         "relations": {"five to the right of the three": "No."}}  # fmt: skip


def write_meta(path: Path) -> Path:
    path.write_text("".join(json.dumps(m) + "\n" for m in GLYPH_META))
    return path


def test_eval_resumes_and_refuses_other_settings(tmp_path):
    meta, out = write_meta(tmp_path / "meta.jsonl"), tmp_path / "eval" / "g.jsonl"
    prompts, metadata = load_prompt_set(str(meta))  # GenEval lines are prompt files: the other keys are metadata
    assert prompts == ["7", "4", "22", "35", "1"] and metadata[3] == {k: v for k, v in GLYPH_META[3].items()
                                                                       if k != "prompt"}  # fmt: skip
    run = lambda **kw: evaluate.main(str(meta), out, **{"seeds": 2, "concurrency": 1, **kw},  # noqa: E731
                                     overrides=["rollout.val_steps=3", "rollout.micro_batch_size=4"])  # fmt: skip
    with pytest.raises(ValueError, match="--judge-url: 10 images wait for scores"):
        run()  # the images are made and cached first
    files = judge.stage_files(out)
    images = {(r["index"], r["file"]): r["image"] for r in map(json.loads, files["reference"].read_text().splitlines())}
    assert len(images) == 10 and {f for _, f in images} == {"meta.jsonl#0", "meta.jsonl#1"}
    keys = {k: pixels_key((out.parent / path).read_bytes()) for k, path in images.items()}
    assert len(set(keys.values())) == 10  # every seed draws its own image
    truth = {h: RIGHT if file.endswith("#0") else WRONG for (_, file), h in keys.items()}

    # killed at the 6th request: the five images scored before it are kept and never asked about again
    with vlm(truth, fail_at=5) as server, pytest.raises(RewardServerError, match="HTTP 400: stub refuses"):
        run(judge_url=server.url)
    first = [json.loads(line) for line in files["judge"].read_text().splitlines()]
    assert [(r["index"], r["sample"]) for r in first] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    # resumed against an endpoint that now serves another model: refused, not mixed into one file
    with vlm(truth, model="another-vlm") as server:
        with pytest.raises(ValueError, match="judge_model.*'cached': 'stub-vlm', 'now': 'another-vlm'"):
            run(judge_url=server.url)
        assert server.seen == []
    with vlm(truth) as server:
        summary = run(judge_url=server.url)
    scored = {pixels_key((out.parent / r["image"]).read_bytes()) for r in first}
    assert len(server.seen) == 16 - 5 and not scored & {h for h, _ in server.seen}
    rows = [json.loads(line) for line in files["judge"].read_text().splitlines()]
    assert [judge.key(r) for r in rows] == [judge.key(it) for it in evaluate.geneval_items(str(meta), 2, None)]
    assert [r["correct"] for r in rows] == [True, True, True, True, True, False, True, False, True, False]
    assert (
        rows[9]["checks"][1]["reply"] == "whitish"
        and rows[9]["malformed"] == 1
        and rows[0]["judge_model"] == "stub-vlm"
    )
    expected = {"single_object": (4, 4), "counting": (2, 1), "position": (2, 1), "colors": (2, 1)}
    assert {t: (c["n"], c["correct"]) for t, c in summary["by_tag"].items()} == expected
    assert summary["score"] == pytest.approx((1 + 0.5 + 0.5 + 0.5) / 4) and summary["overall"]["accuracy"] == 0.7
    assert json.loads(files["summary"].read_text()) == summary

    # a rerun asks nothing; other settings on cached results are refused, naming what changed
    with vlm(truth) as server:
        assert run(judge_url=server.url) == summary and server.seen == []
        with pytest.raises(ValueError, match="judge_model.*'cached': 'stub-vlm', 'now': 'other'"):
            run(judge_url=server.url, judge_model="other")
    with pytest.raises(ValueError, match="val_steps.*'cached': 3, 'now': 4"):
        evaluate.main(str(meta), out, seeds=2, overrides=["rollout.val_steps=4"])


def test_cli(tmp_path, monkeypatch, capsys):
    """`omnialign eval geneval` through the command line's own parser and printout (in this process; `python -m
    omnialign` itself is exercised by the serve-reward and prepare subprocess tests)."""
    meta = write_meta(tmp_path / "meta.jsonl")
    monkeypatch.chdir(ROOT)
    with vlm(defaultdict(lambda: {**RIGHT, "counts": {**RIGHT["counts"], "twos": "1"}})) as server:  # any image
        cli.main(["eval", "geneval", "--data", str(meta), "--judge-url", server.url, "--out", str(tmp_path / "g.jsonl"),
                  "--seeds", "1", "rollout.val_steps=2"])  # fmt: skip
    assert len(server.seen) == 8  # 1 + 1 + 1 (the count of twos, asked once) + 3 + 2
    summary = json.loads((tmp_path / "g.summary.json").read_text())
    assert {t: c["accuracy"] for t, c in summary["by_tag"].items()} == {"single_object": 1, "counting": 0,
                                                                         "position": 1, "colors": 1}  # fmt: skip
    stdout = capsys.readouterr().out
    assert "score (mean over tags): 0.7500" in stdout
    assert re.search(r"counting\s+1\s+0\s+0\.000\s+0\.500\s+0", stdout)


def test_two_data_files_of_one_name_share_no_image_and_no_noise(tmp_path):
    """a/meta.jsonl and b/meta.jsonl into one --out: each prompt keeps its own cached image and its own noise (before,
    the second file's images overwrote the first's, and prompt "0" was scored on the image drawn for "5")."""
    out = tmp_path / "eval" / "g.jsonl"
    for folder, digit in (("a", "0"), ("b", "5")):
        (tmp_path / folder).mkdir()
        meta = {"tag": "single_object", "include": [{"class": digit, "count": 1}], "prompt": digit}
        (tmp_path / folder / "meta.jsonl").write_text(json.dumps(meta) + "\n")
    images = {}
    for folder in ("a", "b"):
        with pytest.raises(ValueError, match="--judge-url: 1 images wait for scores"):
            evaluate.main(str(tmp_path / folder / "meta.jsonl"), out, seeds=1, overrides=["rollout.val_steps=3"])
        rows = [json.loads(line) for line in judge.stage_files(out)["reference"].read_text().splitlines()]
        images[folder] = {r["question"]: (out.parent / r["image"]).read_bytes() for r in rows}
    assert list(images["a"]) == ["0"] and list(images["b"]) == ["0", "5"]
    assert images["b"]["0"] == images["a"]["0"] and images["b"]["5"] != images["a"]["0"]
