"""Rewards for text answers checked against `metadata["ground_truth"]`; both in [0, 1], higher is better.

- `choice`: 1 when the payload of the response's first `<answer>...</answer>` equals the ground
  truth (both stripped of surrounding whitespace), else 0 (also when there is no answer tag).
- `math` (MMK12 style): the answer is the first `<answer>` payload, else the whole response.
  A ground truth that is a choice letter (A-H) scores 1 for that letter ("B", "(B)", "B. 12",
  `\\boxed{B}`), 0 for another letter, and `option_credit` when the response gives the right
  option's content instead of a letter (options from `metadata["options"]`, a list in letter
  order or a dict by letter, else read from "A. ... B. ..." in the prompt). A free-form ground
  truth scores 1 when the answer is the same string (ignoring spaces and `$`) or math-verify
  finds it symbolically equal (`omnialign.rewards.symbolic`), each check bounded to `timeout`
  seconds; one that runs over scores 0 and is marked `timed_out` in the sample's info.
"""

import re

from omnialign.rewards.base import Outputs, Scores, texts_of
from omnialign.rewards.symbolic import equivalent

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_LETTER = re.compile(r"\(?([A-H])\)?(?:\s*[.:：)、]\s*.*)?", re.S)
_OPTION = re.compile(r"(?:^|\s)\(?([A-H])[.:：)]\s*(.+?)(?=\s+\(?[A-H][.:：)]\s|\n|$)")


def answer_payload(text: str) -> str | None:
    """The stripped content of the first <answer>...</answer>, or None."""
    match = _ANSWER.search(text)
    return match.group(1).strip() if match else None


def ground_truth(metadata: list[dict], reward: str) -> list[str]:
    for i, meta in enumerate(metadata):
        if "ground_truth" not in meta:
            raise ValueError(f"reward {reward!r}: metadata[{i}] has no 'ground_truth'; add it to the prompt set")
    return [str(meta["ground_truth"]).strip() for meta in metadata]


def choice(outputs: Outputs, prompts: list[str], metadata: list[dict]) -> Scores:
    """Reward: 1 when the first <answer> payload equals the ground truth exactly, else 0."""
    texts, truths = texts_of(outputs, "choice"), ground_truth(metadata, "choice")
    answers = [answer_payload(text) for text in texts]
    return Scores([float(a == t) for a, t in zip(answers, truths)], [{"answer": a} for a in answers])


def choice_letter(answer: str) -> str | None:
    """The option letter an answer gives ("B", "(B)", "B. 12", "\\boxed{B}"), or None."""
    answer = re.sub(r"\\(?:text|mathrm|textbf)\{([^{}]*)\}", r"\1", answer)
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", answer)
    text = (boxed[-1] if boxed else answer).strip().strip("$").strip()
    match = _LETTER.fullmatch(text)
    return match.group(1) if match else None


def options_of(prompt: str, meta: dict) -> dict[str, str]:
    """The options by letter: metadata["options"] (list or dict), else "A. ..." items of the prompt."""
    options = meta.get("options")
    if isinstance(options, dict):
        return {str(k).strip().upper(): str(v) for k, v in options.items()}
    if isinstance(options, list):
        return {chr(ord("A") + i): str(v) for i, v in enumerate(options)}
    return {letter: content.strip() for letter, content in _OPTION.findall(prompt)}


def _normal(text: str) -> str:
    return re.sub(r"\s|\$|\\left|\\right|\\!|\\,", "", text).rstrip(".")


def _same(gold: str, answer: str, timeout: float, info: dict) -> bool:
    if _normal(gold) == _normal(answer):
        return True
    same = equivalent(gold, answer, timeout)
    if same is None:
        info["timed_out"] = True
    return bool(same)


def math_answer(
    outputs: Outputs, prompts: list[str], metadata: list[dict], *, option_credit: float = 0.5, timeout: float = 5.0
) -> Scores:
    """Reward: MMK12-style math answers: choice letters, partial credit for an option's content, symbolic equality."""
    texts, truths = texts_of(outputs, "math"), ground_truth(metadata, "math")
    scores, infos = [], []
    for text, truth, prompt, meta in zip(texts, truths, prompts, metadata):
        payload = answer_payload(text)
        answer = text if payload is None else payload
        info = {"answer": answer}
        gold = _LETTER.fullmatch(truth.rstrip("."))
        if gold and len(truth) <= 4:  # a choice letter
            letter = choice_letter(answer)
            if letter is not None:
                score = float(letter == gold.group(1))
            else:
                content = options_of(prompt, meta).get(gold.group(1))
                score = option_credit if content and _same(content, answer, timeout, info) else 0.0
        else:
            score = float(_same(truth, answer, timeout, info))
        scores.append(score)
        infos.append(info)
    return Scores(scores, infos)
