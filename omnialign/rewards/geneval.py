"""GenEval-style compositional checks (object count, colour, position) asked of a VLM behind an OpenAI-compatible
endpoint; the `geneval` reward and the per-image verdicts of `omnialign eval geneval`.

GenEval (Ghosh et al., NeurIPS 2023 Datasets and Benchmarks, github.com/djghosh13/geneval) describes each prompt
by one line of its `prompts/evaluation_metadata.jsonl`: `tag` (single_object, two_object, counting, colors,
position, color_attr), `include` (objects that must be there: `class`, `count`, optional `color`, optional
`position` = [relation, index of an earlier include entry]) and optional `exclude` (`class`, `count`: fewer than
`count` of them). GenEval finds the objects with a detector and names colours with CLIP; here a VLM answers one
short question per check, and the checks follow GenEval's `evaluate`:

- each include entry: its class is there at least `count` times ("How many clocks are there ...?", a number);
  then, if that holds, its colour ("What color is the car? ...", one of GenEval's ten colours); then, if both hold
  and its target entry held entirely, its position ("Is the cat to the left of the dog? ...", yes or no);
- each exclude entry: fewer than `count` of its class (the same count question, asked once per class and image).

Replies are parsed strictly: the whole reply, markup and punctuation around it aside, must be one number (digits,
or a word from zero to twenty, or "none"), one of the colours, or yes/no. Anything else is `malformed`: the check
fails and its info says so. An image scores 1.0 when every check holds (GenEval's per-image correctness), else 0.0;
info holds `partial` (the share of checks that hold), `malformed` (checks with a malformed reply) and `checks`
(each with its requirement, question, reply, parsed answer and verdict; a check skipped because an earlier one
failed has reply None).
"""

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from omnialign.rewards.base import Outputs, Scores, images_of
from omnialign.rewards.vlm import chat, served_model

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}
NUMBERS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split()
)}  # fmt: skip
COUNT_QUESTION = "How many {objects} are there in the image? Answer with a single number."
COLOR_QUESTION = f"What color is the {{object}}? Answer with one word: {', '.join(COLORS[:-1])} or {COLORS[-1]}."
POSITION_QUESTION = "Is the {object} {relation} the {other}? Answer yes or no."
FORMAT = ('GenEval\'s fields (prompts/evaluation_metadata.jsonl), e.g. "tag": "counting", "include": [{"class": '
          '"clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}]')  # fmt: skip


def plural(name: str) -> str:
    """GenEval's plural of a class name (its prompts are written with it)."""
    return f"{name}es" if name.endswith("s") else f"{name}s"


def _word(reply: str) -> str | None:
    m = re.fullmatch(r"[\W_]*([a-z]+|\d+)[\W_]*", reply.strip().lower())
    return m and m.group(1)


def parse_count(reply: str) -> int | None:
    """A reply that is one number (digits, a word up to twenty, "none"), else None."""
    word = _word(reply)
    return int(word) if word and word.isdigit() else {**NUMBERS, "none": 0}.get(word)


def parse_color(reply: str) -> str | None:
    """A reply that is one of `COLORS` (grey/gray is not one), else None."""
    word = _word(reply)
    return word if word in COLORS else None


def parse_yes_no(reply: str) -> bool | None:
    return {"yes": True, "no": False}.get(_word(reply))


def requirements(meta: dict, where: str) -> tuple[list[dict], list[dict]]:
    """The checked include and exclude lists of one prompt's metadata; ValueError naming the field otherwise."""
    include, exclude = meta.get("include"), meta.get("exclude") or []
    if not isinstance(include, list) or not include or not isinstance(exclude, list):
        raise ValueError(f"{where}: metadata include={include!r:.100}, exclude={exclude!r:.100}; give {FORMAT}")
    for j, req in enumerate(include + exclude):
        field = f"include[{j}]" if j < len(include) else f"exclude[{j - len(include)}]"
        count = req.get("count", 1) if isinstance(req, dict) else None
        if not isinstance(req, dict) or not isinstance(req.get("class"), str) or not req["class"].strip():
            raise ValueError(f'{where}: {field}={req!r:.100} needs a "class" name; give {FORMAT}')
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{where}: {field} count={count!r}; give a whole number of at least 1")
        if j >= len(include):
            continue
        if req.get("color") is not None and req["color"] not in COLORS:
            raise ValueError(f"{where}: {field} color={req['color']!r}; choose one of {', '.join(COLORS)}")
        position = req.get("position")
        if position is not None and not (isinstance(position, (list, tuple)) and len(position) == 2
                                          and position[0] in RELATIONS and isinstance(position[1], int)
                                          and 0 <= position[1] < j):  # fmt: skip
            raise ValueError(f"{where}: {field} position={position!r}; give [relation, index of an earlier include "
                             f"entry] with a relation among {', '.join(RELATIONS)}")  # fmt: skip
    return include, exclude


def evaluate(meta: dict, ask: Callable[[str], str]) -> tuple[bool, dict]:
    """GenEval's correctness of one image from the replies `ask(question)` gives, and its info (module doc)."""
    include, exclude = requirements(meta, "geneval")
    replies, checks, matched = {}, [], []

    def check(requirement: str, question: str, parse: Callable, holds: Callable, asked: bool = True) -> bool:
        if not asked:
            checks.append({"requirement": requirement, "question": question, "reply": None, "answer": None,
                           "holds": False})  # fmt: skip
            return False
        if question not in replies:
            replies[question] = ask(question)
        answer = parse(replies[question])
        ok = answer is not None and holds(answer)
        checks.append({"requirement": requirement, "question": question, "reply": replies[question],
                       "answer": answer, "holds": ok, "malformed": answer is None})  # fmt: skip
        return ok

    for req in include:
        name, n, color, position = req["class"], req.get("count", 1), req.get("color"), req.get("position")
        ok = check(f"{name} >= {n}", COUNT_QUESTION.format(objects=plural(name)), parse_count, lambda c, n=n: c >= n)
        if color is not None:
            ok = check(
                f"{name} is {color}", COLOR_QUESTION.format(object=name), parse_color, lambda c, w=color: c == w, ok
            )
        if position is not None:
            (relation, target), other = position, include[position[1]]["class"]
            question = POSITION_QUESTION.format(object=name, relation=RELATIONS[relation], other=other)
            ok = check(f"{name} {relation} {other}", question, parse_yes_no, bool, ok and matched[target])
        matched.append(ok)
    for req in exclude:
        name, n = req["class"], req.get("count", 1)
        check(f"{name} < {n}", COUNT_QUESTION.format(objects=plural(name)), parse_count, lambda c, n=n: c < n)
    held = [c["holds"] for c in checks]
    info = {"partial": sum(held) / len(held), "malformed": sum(c.get("malformed", False) for c in checks)}
    return all(held), {**info, "checks": checks}


def geneval(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str | None = None,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
) -> Scores:
    """Reward: 1.0 when a VLM finds every GenEval requirement of the prompt's metadata in the image, else 0.0
    (info: `partial`, `malformed`, `checks`); `model` defaults to the first one the endpoint lists."""
    images = images_of(outputs, "geneval")
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        requirements(meta, f"geneval: sample {i} ({prompt!r:.80})")
    model = model or served_model(url, api_key)
    sampling = {"temperature": 0.0, "max_tokens": 16} | (sampling or {})
    one = lambda image, meta: evaluate(meta, lambda q: chat(url, model, image, q, sampling, api_key, timeout))
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        results = list(pool.map(one, images, metadata))
    return Scores([float(ok) for ok, _ in results], [info for _, info in results])
