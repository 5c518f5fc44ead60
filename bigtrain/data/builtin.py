"""The built-in corpus: short, grammatical stories generated from a seeded template grammar.

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


def _story(rng: random.Random) -> str:
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
    return " ".join(sentences)


def builtin_documents(name: str, num_documents: int = 20000, seed: int = 1234) -> list[str]:
    """The documents of built-in corpus ``name`` (only 'stories' exists); deterministic for a given seed."""
    if name != "stories":
        from bigtrain.errors import ConfigError

        raise ConfigError(f"data.path=builtin:{name} is not a built-in corpus; use builtin:stories")
    rng = random.Random(seed)
    return [_story(rng) for _ in range(num_documents)]
