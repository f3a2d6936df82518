"""`omnialign eval geneval`: GenEval-style compositional accuracy (objects, counts, colours, positions) of an image
generator, each image checked by a VLM behind an OpenAI-compatible endpoint (`omnialign.rewards.geneval`).

    omnialign eval geneval --data evaluation_metadata.jsonl --base models/sd3.5 --adapter runs/sd3_geneval \\
        --judge-url http://127.0.0.1:8001 --out eval/geneval.jsonl rollout.val_steps=28 rollout.guidance=4.5

Two steps, each resumable as `omnialign judge`'s stages are (it reuses judge.py's files, caches and settings):
- images: judge.py's generation stage (`reference` for the base model, `trained` with `--adapter`) draws one ODE
  image per prompt and sample k < `--seeds`, its noise seeded by (--seed, `META.jsonl#k`, prompt row), into
  NAME.reference.jsonl / NAME.trained.jsonl and the folder beside it;
- scores: each image not scored yet goes to the VLM, one line per image appended and flushed to NAME.jsonl.
Then NAME.summary.json: accuracy per tag and the score, the mean of the tags' accuracies (as GenEval reports).
NAME.settings.json records each step's settings; a step with cached results refuses to continue under others.
Without `--base` (and without an omnialign checkpoint as `--adapter`) the model is the glyphs world's, so a run
works on a CPU. docs/judge.md has the details.
"""

import json
from pathlib import Path

from omnialign import judge
from omnialign.data.language import cap_by_modality
from omnialign.data.prompts import load_prompt_set
from omnialign.rewards.base import from_png
from omnialign.rewards.geneval import geneval, requirements
from omnialign.worlds.glyphs.data import ASSETS


def geneval_items(data: str, seeds: int, max_prompts: int | None) -> list[dict]:
    """One item per prompt (in file order; at most `max_prompts`, split evenly across tags) and sample k < seeds,
    keyed as judge.py keys items: (`META.jsonl#k`, prompt row, uid = the prompt's `id` or a hash of its line)."""
    prompts, metadata = load_prompt_set(data)
    rows = []
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        where = f"--data {data} prompt {i} ({prompt!r:.60})"
        if not isinstance(meta.get("tag"), str):
            raise ValueError(f'{where}: no "tag" (single_object, two_object, counting, colors, position, color_attr, '
                             "or your own): GenEval's metadata lines carry one")  # fmt: skip
        requirements(meta, where)
        rows.append({"modality": meta["tag"], "index": i, "prompt": prompt, "meta": meta})
    if max_prompts is not None and max_prompts < 1:
        raise ValueError(f"--max-prompts {max_prompts}: give at least 1")
    rows = sorted(cap_by_modality(rows, max_prompts), key=lambda r: r["index"])
    name = Path(data).name
    uid = lambda r: str(r["meta"].get("id") or judge.digest([r["prompt"], r["meta"]]))
    return [{"file": f"{name}#{k}", "index": r["index"], "uid": uid(r),
             "modality": "image", "prompt": r["prompt"], "question": r["prompt"], "tag": r["modality"], "sample": k,
             "meta": r["meta"]} for r in rows for k in range(seeds)]  # fmt: skip


def summarize(rows: list[dict]) -> dict:
    """Per tag (in order of appearance) and over all images: n, correct, accuracy, mean partial, malformed replies;
    `score`: the mean of the tags' accuracies."""

    def counts(rs: list[dict]) -> dict:
        n, correct = len(rs), sum(r["correct"] for r in rs)
        return {"n": n, "correct": correct, "accuracy": correct / n, "partial": sum(r["partial"] for r in rs) / n,
                "malformed": sum(r["malformed"] for r in rs)}  # fmt: skip

    by_tag = {t: counts([r for r in rows if r["tag"] == t]) for t in dict.fromkeys(r["tag"] for r in rows)}
    return {"score": sum(c["accuracy"] for c in by_tag.values()) / len(by_tag), "overall": counts(rows),
            "by_tag": by_tag}  # fmt: skip


def format_summary(summary: dict) -> str:
    """The summary as a small table: one line per tag, all images, and the score."""
    lines = [f"{'':<16}{'n':>6}{'correct':>9}{'accuracy':>10}{'partial':>9}{'malformed':>11}"]
    for name, c in [*summary["by_tag"].items(), ("all images", summary["overall"])]:
        lines.append(f"{name:<16}{c['n']:>6}{c['correct']:>9}{c['accuracy']:>10.3f}{c['partial']:>9.3f}"
                     f"{c['malformed']:>11}")  # fmt: skip
    return "\n".join([*lines, f"score (mean over tags): {summary['score']:.4f}"])


def run_scores(items: list[dict], files: dict[str, Path], stage: str, url: str | None, model: str | None,
               concurrency: int) -> dict:  # fmt: skip
    """Score every generated image not scored yet (a line per image, appended and flushed), then the summary."""
    path = files["judge"]
    done = judge.read_cache(path)
    todo = [it for it in items if judge.key(it) not in done]
    generation = json.loads(files["settings"].read_text())[stage]
    api, model = judge.judge_endpoint(url, model, files["settings"], "geneval")
    settings = {"judge_model": model, "images": stage, "generation": generation}
    judge.record_settings(files["settings"], "geneval", settings, path, cached=bool(done))
    print(f"geneval: {len(items) - len(todo)} of {len(items)} images scored in {path}")
    if todo:
        if api is None:
            raise ValueError(f"--judge-url: {len(todo)} images wait for scores; give an OpenAI-compatible endpoint")
        images = judge.read_cache(files[stage])

        def score(it: dict) -> dict:
            row = images[judge.key(it)]
            image = from_png((path.parent / row["image"]).read_bytes())
            scores = geneval(image[None], [it["prompt"]], [it["meta"]], url=api, model=model, concurrency=1)
            return {**judge.identity(it), "tag": it["tag"], "sample": it["sample"], "image": row["image"],
                    "correct": scores[0] == 1.0, **scores.info[0], "judge_model": model}  # fmt: skip

        judge.append_in_order(path, todo, score, concurrency, "geneval")
        done = judge.read_cache(path)
    summary = summarize([done[judge.key(it)] for it in items])
    files["summary"].write_text(json.dumps(summary, indent=2))
    return summary


def main(
    data: str,
    out: Path,
    base: str | None = None,
    adapter: str | None = None,
    judge_url: str | None = None,
    judge_model: str | None = None,
    seeds: int = 4,
    seed: int = 0,
    overrides: list[str] = (),
    concurrency: int = 4,
    max_prompts: int | None = None,
) -> dict:
    """Generate the images of a GenEval metadata file (cached), score them (cached) and return the summary."""
    if seeds < 1 or concurrency < 1:
        raise ValueError(f"--seeds {seeds}, --concurrency {concurrency}: give at least 1 for each")
    files = judge.stage_files(out)
    found = judge.find_adapter(adapter) if adapter is not None else None
    if base is None and (found is None or found[0] != "checkpoint"):
        base = str(ASSETS)
    config = judge.build_config(base, found, list(overrides), seed)
    if not judge.is_image(config):
        raise ValueError(f"--base {config.model.path} is a language model ({config.model.arch}); "
                         "eval geneval scores the images of a generator: give its folder")  # fmt: skip
    items = geneval_items(data, seeds, max_prompts)
    stage = "reference" if found is None else "trained"
    judge.run_generation(stage, items, config, found, files)
    return run_scores(items, files, stage, judge_url, judge_model, concurrency)
