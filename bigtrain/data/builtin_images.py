"""The built-in image conversations (``data.path: builtin:image_chat``): questions about the built-in shapes
(``synthetic_images.py``), no download.

Most conversations show one picture and ask what is drawn ("A checkerboard."); some show two and ask for both in
order ("First a disk, then vertical stripes."). The answer depends only on the pictures, so a model must look at
them: its loss falls below what the text alone allows only when the images reach the language model.
"""

from __future__ import annotations

import numpy as np

from bigtrain.data.synthetic_images import CLASSES, shapes
from bigtrain.errors import ConfigError

BUILTIN_IMAGE_SETS = ("image_chat",)
COUNT = 600
_ARTICLES = {"horizontal_stripes": "", "vertical_stripes": "", "diagonal_stripes": ""}


def _name(label: int) -> str:
    kind = CLASSES[label]
    article = _ARTICLES.get(kind, "a ")
    return f"{article}{kind.replace('_', ' ')}"


def image_chat_records(name: str, seed: int = 1234, count: int = COUNT) -> list[tuple[str, dict]]:
    """``count`` conversations as (where, record): a user turn with one or two images and a question, and the
    assistant's answer; deterministic for a seed. Images are [32, 32, 3] uint8 arrays inside the records."""
    if name not in BUILTIN_IMAGE_SETS:
        raise ConfigError(f"data.path=builtin:{name} is not a built-in image set; use builtin:image_chat")
    rng = np.random.default_rng(seed)
    pictures, labels = shapes(count=2 * count, seed=seed)
    records = []
    for i in range(count):
        two = rng.random() < 0.3
        shown = [2 * i, 2 * i + 1] if two else [2 * i]
        if two:
            question = "What are these two pictures?"
            answer = f"First {_name(labels[shown[0]])}, then {_name(labels[shown[1]])}."
        else:
            question = "What is drawn in this picture?"
            answer = f"{_name(labels[shown[0]]).capitalize()}."
        content = [*({"type": "image", "image": pictures[k]} for k in shown), {"type": "text", "text": question}]
        messages = [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ]
        records.append((f"conversation {i}", {"messages": messages}))
    return records
