"""Toy worlds: small, complete tasks that run on a laptop CPU and prove that the algorithms learn.

Each world is one package holding everything it needs: its data, its pretraining script
(`omnialign prepare <world>`), its reward and judges, its shipped weights (`assets/`) and its
recipes. The rest of the framework reaches a world only through the names the package exports
(a model loader, a reward, prompt sets and recipes), exactly as it would reach a real model.

- `glyphs`: a tiny text-to-image flow model learns to draw the digit it is asked for.
- `choice`: a tiny language model learns to answer multiple-choice questions.
"""
