"""Reward functions and their combination, against real components: Tesseract, math-verify, files."""

import inspect
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from omnialign import rewards
from omnialign.config import RewardConfig, apply_overrides
from omnialign.recipes import RECIPES
from omnialign.rewards import CHAT_REWARDS, REWARDS, RewardError, RewardWorker, Scores, resolve, score
from omnialign.rewards.answers import choice, choice_letter, math_answer, options_of
from omnialign.rewards.jpeg import jpeg_compressibility, jpeg_incompressibility
from omnialign.rewards.ocr import ocr, ocr_similarity, ocr_targets
from omnialign.rewards.user import load_reward
from omnialign.rewards.vlm import judge_score, parse_judge
from omnialign.worlds.glyphs.data import render
from omnialign.worlds.glyphs.recognizer import glyph_ocr

FNS = Path(__file__).parent / "reward_fns.py"


def text_image(text: str, width: int = 360, height: int = 80) -> torch.Tensor:
    """Black text on white, (1, H, W) in [0, 1]."""
    image = Image.new("L", (width, height), 255)
    ImageDraw.Draw(image).text((12, 16), text, fill=0, font=ImageFont.load_default(size=40))
    return torch.from_numpy(np.asarray(image).copy()).float().div(255).unsqueeze(0)


@pytest.mark.parametrize(
    "text, target, expected",
    [
        ("hello", "hello", 1.0),
        ("Hello World", "helloworld", 1.0),  # case and whitespace are ignored
        ("a sign: HELLO there", "hello", 1.0),  # the target occurs in the text
        ("helo", "hello", 0.8),  # one deletion: 1 - 1/5
        ("kitten", "sitting", 1 - 3 / 7),  # k->s, e->i, +g
        ("", "abc", 0.0),  # distance 3 = len
        ("zzzzzzzz", "ab", 0.0),  # distance 8 is capped at len 2
        ("hello world", "hello word", 1 - 1 / 9),  # helloworld vs helloword: one deletion
    ],
)
def test_ocr_similarity_hand_computed(text, target, expected):
    assert ocr_similarity(text, target) == pytest.approx(expected)


def test_ocr_target_from_ground_truth_or_quotes_else_a_clear_error():
    assert ocr_targets(['a sign "OPEN" and "SALE"', "x"], [{}, {"ground_truth": "42"}]) == ["OPEN", "42"]
    with pytest.raises(ValueError, match=r"metadata\[0\] has no 'ground_truth' and prompts\[0\]='a cat'"):
        ocr_targets(["a cat"], [{}])
    with pytest.raises(ValueError, match="empty"):
        ocr_similarity("x", "  ")


@pytest.mark.tesseract
def test_tesseract_reads_rendered_text():
    images = torch.stack([text_image("HELLO WORLD"), text_image("Omni 42"), text_image("HELLO WORLD")])
    prompts = ["a poster", 'a sign that says "Omni 42"', "a poster"]
    metadata = [{"ground_truth": "hello world"}, {}, {"ground_truth": "hello word"}]
    scores = ocr(images, prompts, metadata)
    assert isinstance(scores, Scores) and scores == pytest.approx([1.0, 1.0, 1 - 1 / 9])
    assert scores.info[0] == {"text": "HELLO WORLD", "target": "hello world"}
    with pytest.raises(ValueError, match="scores images"):
        ocr(["text"], ["p"], [{"ground_truth": "x"}])


def test_ocr_without_tesseract_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH where no tesseract program lives
    with pytest.raises(RuntimeError, match="runs the tesseract program: apt-get install tesseract-ocr"):
        ocr(text_image("HELLO")[None], ["p"], [{"ground_truth": "hello"}])


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Alignment Score: 5\nCoherence Score: 3\nStyle Score: 1", {"alignment": 5, "coherence": 3, "style": 1}),
        (  # markdown, a scale in the label, "/5", and prose that mentions a dimension before the scores
            "The alignment is fine; 2 cats are shown.\n**Alignment Score (1-5):** 4/5\n"
            "**Coherence Score (1-5)**: 3.5\nStyle — 2 out of 5",
            {"alignment": 4, "coherence": 3.5, "style": 2},
        ),
        ('{"alignment": 2, "coherence": 7, "style": 0}', {"alignment": 2, "coherence": 5, "style": 1}),  # clamped
        ("Alignment Score: <1-5>\nAlignment Score: 3\nstyle score=4", {"alignment": 3, "style": 4}),  # echoed template
        ("I cannot rate this image.", {}),
    ],
)
def test_judge_parses_messy_replies(reply, expected):
    assert parse_judge(reply) == expected


def test_judge_score_maps_to_unit_interval_and_keeps_the_text():
    value, info = judge_score("Alignment Score: 5\nCoherence Score: 3\nStyle Score: 2")
    assert value == pytest.approx((1 + 0.5 + 0.25) / 3)
    assert info == {"alignment": 1.0, "coherence": 0.5, "style": 0.25,
                    "text": "Alignment Score: 5\nCoherence Score: 3\nStyle Score: 2"}  # fmt: skip
    value, info = judge_score("Style: 3")
    assert value == 0.5 and info["missing"] == ["alignment", "coherence"]
    assert judge_score("no idea")[0] == 0.0


def test_choice_is_exact_match_of_the_first_answer_tag():
    texts = ["<think>A?</think><answer> B </answer>", "<answer>b</answer>", "B", "<answer>C</answer><answer>B</answer>"]
    scores = choice(texts, ["q"] * 4, [{"ground_truth": "B"}] * 4)
    assert scores == [1.0, 0.0, 0.0, 0.0] and scores.info[2] == {"answer": None}
    with pytest.raises(ValueError, match=r"metadata\[0\] has no 'ground_truth'"):
        choice(["x"], ["q"], [{}])


def test_jpeg_compressibility_sign():
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    images = torch.cat([flat, noise])
    smaller, larger = jpeg_compressibility(images, ["", ""], [{}, {}])
    assert smaller > larger  # the flat image is more compressible
    assert jpeg_incompressibility(images, ["", ""], [{}, {}]) == [-smaller, -larger]
    assert -smaller < 2.0 < -larger  # kB: a flat 64x64 JPEG is under 2 kB, noise far above


def test_choice_letters_and_options():
    cases = {"B": "B", "(B)": "B", "B. 12": "B", "\\boxed{B}": "B", "$B$": "B", "\\boxed{\\text{C}}": "C"}
    assert {k: choice_letter(k) for k in cases} == cases
    assert choice_letter("A triangle") is None and choice_letter("12") is None
    assert options_of("Pick: A. 12 B. 15 C. $\\frac{1}{2}$", {}) == {"A": "12", "B": "15", "C": "$\\frac{1}{2}$"}
    assert options_of("q\n(A) x+1\n(B) 7", {}) == {"A": "x+1", "B": "7"}
    assert options_of("", {"options": ["3", "4"]}) == {"A": "3", "B": "4"}


@pytest.mark.math_verify
def test_math_letters_partial_credit_and_symbolic_equivalence():
    prompt = "What is 3 * 5? A. 12 B. 15 C. 18"
    cases = [  # (response, ground truth, expected)
        ("<answer>B</answer>", "B", 1.0),
        ("<think>...</think><answer>(B) 15</answer>", "B", 1.0),
        ("<answer>C</answer>", "B", 0.0),
        ("<answer>15</answer>", "B", 0.5),  # the right option's content instead of its letter
        ("<answer>12</answer>", "B", 0.0),
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),  # no tag: the whole response
        ("<answer>\\sqrt{18}</answer>", "3\\sqrt{2}", 1.0),
        ("<answer>(x+1)^2</answer>", "x^2+2x+1", 1.0),
        ("<answer>x^2+1</answer>", "x^2+2x+1", 0.0),
        ("<answer>$ 7 $</answer>", "7", 1.0),
    ]
    scores = math_answer([c[0] for c in cases], [prompt] * len(cases), [{"ground_truth": c[1]} for c in cases])
    assert scores == [c[2] for c in cases]


@pytest.mark.math_verify
def test_math_check_is_bounded_in_time():
    start = time.monotonic()
    scores = math_answer(["<answer>9^{9^{9}}</answer>"], ["q"], [{"ground_truth": "2"}], timeout=0.5)
    assert scores == [0.0] and scores.info[0]["timed_out"] and time.monotonic() - start < 3
    assert math_answer(["<answer>1/2</answer>"], ["q"], [{"ground_truth": "0.5"}]) == [1.0]  # a fresh helper


def test_user_function_from_a_file_plain_and_verl():
    plain = load_reward(f"{FNS}:mean_pixel")
    assert plain(torch.full((2, 1, 4, 4), 0.25), ["a", "b"], [{}, {}], offset=1.0) == [1.25, 1.25]
    verl = load_reward(f"{FNS}:compute_score")
    metadata = [{"data_source": "x", "ground_truth": "4"}, {"data_source": "detailed", "ground_truth": "4",
                                                             "extra_info": {"id": 7}}]  # fmt: skip
    scores = verl([" 4 ", "5"], ["q", "q"], metadata)
    assert scores == [1.0, 0.0] and scores.info == [{}, {"length": 1, "extra": {"id": 7}}]
    bound = rewards.lookup(f"{FNS}:compute_score", {"bonus": 0.5})
    assert bound(["4"], ["q"], [{"ground_truth": "4"}]) == [1.5]
    with pytest.raises(ValueError, match="'mean_pixel', 'not_finite'"):
        load_reward(f"{FNS}:missing")
    with pytest.raises(ValueError, match="existing file"):
        load_reward("no/such/file.py:fn")
    with pytest.raises(ValueError, match="do not fit"):
        rewards.lookup(f"{FNS}:compute_score", {"bonsu": 1})


def test_default_config_scores_like_glyph_ocr():
    images = (render(["3", "7"], seed=1) + 1) / 2
    result = score(images, ["3", "7"], [{}, {}], RewardConfig())
    assert torch.allclose(result.total, torch.tensor(glyph_ocr(images, ["3", "7"])))
    assert set(result.parts) == {"glyph_ocr"} and result.failed == {} and result.info == [{}, {}]


def test_weighted_sum_logs_each_reward_and_keeps_info():
    config = RewardConfig(weights={"choice": 2.0, f"{FNS}:compute_score": 0.5})
    texts = ["<answer>4</answer>", "4"]
    result = score(texts, ["q", "q"], [{"ground_truth": "4"}, {"ground_truth": "4"}], config)
    assert result.total.tolist() == [2.0, 0.5]
    assert result.parts["choice"].tolist() == [1.0, 0.0] and result.parts[f"{FNS}:compute_score"].tolist() == [0, 1]
    assert result.info[0] == {"choice": {"answer": "4"}}


@pytest.mark.parametrize("bad", ["broken", "not_finite", "too_few", "beyond_float32", "strings", "bools"])
def test_failing_optional_reward_scores_zero_and_a_required_one_stops(bad, caplog):
    name = f"{FNS}:{bad}"
    config = RewardConfig(weights={"choice": 1.0, name: 1.0}, optional=[name])
    texts, metadata = ["<answer>4</answer>", "x"], [{"ground_truth": "4"}] * 2
    result = score(texts, ["q", "q"], metadata, config)
    assert result.total.tolist() == [1.0, 0.0] and result.parts[name].tolist() == [0.0, 0.0]
    assert name in result.failed and name in caplog.text
    reason = {"broken": "the judge is down", "not_finite": "non-finite", "too_few": "1 scores for 2",
              "beyond_float32": r"beyond float32.*1e\+39", "strings": "returned str '1.0' for sample 0",
              "bools": "returned bool True for sample 0"}[bad]  # fmt: skip
    with pytest.raises(RewardError, match=f"required reward '{name}' failed: .*{reason}"):
        score(texts, ["q", "q"], metadata, RewardConfig(weights={"choice": 1.0, name: 1.0}))


def test_non_finite_images_are_named_as_the_cause_of_non_finite_scores():
    """A diverged policy draws NaN images; the reward that scores them NaN is not what failed."""
    images = torch.full((2, 1, 32, 32), 0.5)
    images[1, 0, 3, 3] = float("nan")
    with pytest.raises(RewardError, match="for outputs that hold non-finite values: the policy diverged"):
        score(images, ["3", "4"], [{}, {}], RewardConfig(weights={"glyph_ocr": 1.0}))


def test_scores_refuse_strings_bools_and_none():
    """A reward that builds its own Scores (as the HTTP client does) gets the same refusal as one returning a list."""
    with pytest.raises(TypeError, match=r"Scores got str '0.5' \(1 such\): a reward returns numbers"):
        Scores(["0.5", 1.0])
    with pytest.raises(TypeError, match="Scores got bool True"):
        Scores([True, 0.0])
    assert Scores([1, 0.5]) == [1.0, 0.5] and Scores(torch.tensor([0.25, 1.0])) == [0.25, 1.0]


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="'nope' is not a key of omnialign.rewards.REWARDS"):
        resolve(RewardConfig(weights={"nope": 1.0}))
    with pytest.raises(ValueError, match=r"reward.optional names \['judge'\]"):
        resolve(RewardConfig(weights={"choice": 1.0}, optional=["judge"]))
    with pytest.raises(ValueError, match="do not fit reward ocr"):
        resolve(RewardConfig(weights={"ocr": 1.0}, options={"ocr": {"psn": 3}}))
    with pytest.raises(ValueError, match="url"):  # ocr_vlm needs its endpoint
        resolve(RewardConfig(weights={"ocr_vlm": 1.0}))
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        resolve(RewardConfig(weights={"judge": 1.0}, remote={"judge": "localhost:8000"}))


def test_reward_config_from_the_command_line():
    config = apply_overrides(RECIPES["glyphs"](), [
        'reward.weights={"glyph_ocr": 1, "judge": 0.5}', "reward.optional=judge",
        'reward.remote={"judge": "http://127.0.0.1:8000"}', 'reward.options={"judge": {"timeout": 30, "retries": 2}}',
    ]).reward  # fmt: skip
    assert config.optional == ["judge"] and config.options == {"judge": {"timeout": 30, "retries": 2}}
    judge = resolve(config)["judge"]
    assert judge.url == "http://127.0.0.1:8000" and judge.retry["retries"] == 2


def test_worker_scores_chunks_in_the_background_in_order():
    config = RewardConfig(weights={"glyph_ocr": 1.0, "jpeg_compressibility": 0.01})
    texts = [str(i % 10) for i in range(12)]
    images = (render(texts, seed=3) + 1) / 2
    with RewardWorker(config) as worker:
        futures = [worker.submit(images[lo : lo + 4], texts[lo : lo + 4], [{}] * 4) for lo in range(0, 12, 4)]
        results = [f.result(timeout=30) for f in futures]
    expected = score(images, texts, [{}] * 12, config)
    assert torch.allclose(torch.cat([r.total for r in results]), expected.total, atol=1e-5)
    with RewardWorker(RewardConfig(weights={f"{FNS}:broken": 1.0})) as worker:
        with pytest.raises(RewardError, match="the judge is down"):
            worker.submit(images[:2], texts[:2], [{}, {}]).result(timeout=30)


def test_the_chat_rewards_are_those_with_an_endpoint_url():
    """`CHAT_REWARDS` (whose endpoints the trainer asks before the model loads) names exactly the rewards that take a
    `url`: a new VLM reward missing from it would go unchecked until its first scoring."""
    with_url = {name for name, fn in REWARDS.items() if "url" in inspect.signature(fn).parameters}
    assert set(CHAT_REWARDS) == with_url and len(with_url) == 7
