"""The built-in corpora: short, grammatical stories generated from a seeded template grammar, and chats about them.

It exists so that ``bigtrain train recipes/quickstart.yaml`` works on a fresh machine with no download. The text has
real structure (recurring names, pronouns that agree with an earlier character, fixed phrase shapes) so a tiny
model's loss falls quickly and visibly, yet it is produced in about a second and takes no space in the package.
"""

from __future__ import annotations

import random

NAMES = [
    ("Mia", "she"),
    ("Leo", "he"),
    ("Ada", "she"),
    ("Tom", "he"),
    ("Zoe", "she"),
    ("Sam", "he"),
    ("Lily", "she"),
    ("Max", "he"),
    ("Nora", "she"),
    ("Ben", "he"),
    ("Ivy", "she"),
    ("Jack", "he"),
]
ANIMALS = ["cat", "dog", "bird", "fox", "frog", "rabbit", "duck", "bear", "mouse", "fish"]
COLORS = ["red", "blue", "green", "yellow", "small", "big", "happy", "sleepy", "brave", "little"]
PLACES = ["the park", "the garden", "the forest", "the beach", "the hill", "the river", "the town", "the farm"]
THINGS = ["a ball", "a kite", "a box", "a hat", "a cake", "a book", "a boat", "a flower", "a stick", "a shell"]
FEELINGS = ["happy", "sad", "surprised", "excited", "scared", "proud", "tired", "curious"]
VERBS = ["found", "saw", "lost", "made", "gave away", "painted", "carried", "hid"]


def _story_parts(rng: random.Random) -> tuple[list[str], dict[str, str]]:
    """A story's sentences and the facts it states (for questions about it)."""
    name, pronoun = rng.choice(NAMES)
    friend, _ = rng.choice([n for n in NAMES if n[0] != name])
    animal, color, place = rng.choice(ANIMALS), rng.choice(COLORS), rng.choice(PLACES)
    thing, feeling, verb = rng.choice(THINGS), rng.choice(FEELINGS), rng.choice(VERBS)
    cap = pronoun.capitalize()
    sentences = [
        f"Once upon a time, there was a {color} {animal} named {name}.",
        f"One day, {name} went to {place} with {friend}.",
        f"At {place.removeprefix('the ')}, {pronoun} {verb} {thing}.",
        f"{cap} felt {feeling}.",
        rng.choice(
            [
                f'{friend} said, "Let us play with {thing.replace("a ", "the ", 1)}!"',
                f'"Look at {thing.replace("a ", "the ", 1)}!" said {name}.',
                f"{name} and {friend} sat down and laughed.",
            ]
        ),
        rng.choice(
            [
                f"In the end, {name} went home and slept well.",
                f"From that day on, {name} and {friend} were best friends.",
                f"The {animal} was {rng.choice(FEELINGS)} and the sun was warm.",
            ]
        ),
    ]
    facts = {"name": name, "friend": friend, "animal": animal, "place": place, "thing": thing, "feeling": feeling}
    return sentences, facts


def _story(rng: random.Random) -> str:
    return " ".join(_story_parts(rng)[0])


def _conversation(rng: random.Random) -> list[dict[str, str]]:
    """A story, then one or two questions about it whose answers are in the story (a model learns to look back)."""
    sentences, f = _story_parts(rng)
    questions = [
        (f"Who went to {f['place']} with {f['name']}?", f"{f['friend']} did."),
        (f"Where did {f['name']} go?", f"{f['name']} went to {f['place']}."),
        (f"What kind of animal is {f['name']}?", f"{f['name']} is a {f['animal']}."),
        (f"How did {f['name']} feel?", f"{f['name']} felt {f['feeling']}."),
    ]
    first, second = rng.sample(questions, 2)
    messages = [
        {"role": "user", "content": " ".join(sentences) + " " + first[0]},
        {"role": "assistant", "content": first[1]},
    ]
    if rng.random() < 0.5:
        messages += [{"role": "user", "content": second[0]}, {"role": "assistant", "content": second[1]}]
    return messages


def _preference(rng: random.Random) -> dict[str, list[dict[str, str]]]:
    """A story and one question about it (the prompt), the story's answer (chosen) and a worse one (rejected): half
    the time a wrong answer of the same kind (a model must read the story back to prefer the right one), else an
    unhelpful reply (what a small model learns to avoid within a few steps)."""
    sentences, f = _story_parts(rng)
    pools = {"friend": [n for n, _ in NAMES if n != f["name"]], "place": PLACES, "animal": ANIMALS, "feeling": FEELINGS}
    key, question, answer = rng.choice(
        [
            ("friend", f"Who went to {f['place']} with {f['name']}?", "{} did."),
            ("place", f"Where did {f['name']} go?", f"{f['name']} went to {{}}."),
            ("animal", f"What kind of animal is {f['name']}?", f"{f['name']} is a {{}}."),
            ("feeling", f"How did {f['name']} feel?", f"{f['name']} felt {{}}."),
        ]
    )
    if rng.random() < 0.5:
        rejected = answer.format(rng.choice([v for v in pools[key] if v != f[key]]))
    else:
        rejected = rng.choice(UNHELPFUL)
    return {
        "prompt": [{"role": "user", "content": " ".join(sentences) + " " + question}],
        "chosen": [{"role": "assistant", "content": answer.format(f[key])}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


UNHELPFUL = ["I do not know.", "Why do you ask?", "That is not a good question.", "Read the story yourself."]


BUILTIN = ("stories", "chat", "preferences", "sums", "retrieval")


def _retrieval(rng: random.Random) -> dict[str, str]:
    """A question that one story answers (the anchor) and that story (its positive): an embedding model's toy
    retrieval task, whose other stories of a batch are the negatives."""
    sentences, f = _story_parts(rng)
    anchor = rng.choice(
        [
            f"Who went to {f['place']} with {f['name']}?",
            f"What did {f['name']} the {f['animal']} do at {f['place']}?",
            f"Which story has {f['name']} and {f['friend']} with {f['thing']}?",
            f"Why did {f['name']} feel {f['feeling']}?",
        ]
    )
    return {"anchor": anchor, "positive": " ".join(sentences)}


def _sum(rng: random.Random) -> dict[str, str]:
    """A prompt whose answer a reward function can check exactly (grpo's toy task): "3+7=" and its ``answer`` "10";
    the same as the completion of an instruction record (a supervised start)."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return {"prompt": f"{a}+{b}=", "completion": str(a + b), "answer": str(a + b)}


def builtin_records(name: str, num_records: int = 20000, seed: int = 1234) -> list[dict]:
    """The records of built-in corpus ``name``, deterministic for a given seed: 'stories' (text), 'chat' (a story
    and questions about it, as ``messages``) or 'preferences' (a story and a question, its right and a wrong answer:
    chat preference pairs) or 'sums' (prompts "a+b=" with their ``answer``: grpo's verifiable toy task) or
    'retrieval' (a question and the story that answers it: an embedding model's anchor and positive)."""
    if name not in BUILTIN:
        from bigtrain.errors import ConfigError

        raise ConfigError(
            f"data.path=builtin:{name} is not a built-in corpus; use builtin:stories, builtin:chat, "
            "builtin:preferences, builtin:sums or builtin:retrieval"
        )
    rng = random.Random(seed)
    if name == "sums":
        return [_sum(rng) for _ in range(num_records)]
    if name == "retrieval":
        return [_retrieval(rng) for _ in range(num_records)]
    if name == "preferences":
        return [_preference(rng) for _ in range(num_records)]
    if name == "chat":
        return [{"messages": _conversation(rng)} for _ in range(num_records)]
    return [{"text": _story(rng)} for _ in range(num_records)]
