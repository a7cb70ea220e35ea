"""Generate ``alpaca_mini.jsonl``: a small instruction dataset written for Telltale.

Every sample is produced by the templates below from a fixed seed, so the file is
reproducible and free of third-party licences (it is part of this repository, Apache-2.0).
Run ``python projects/fine_tuning/data/generate.py`` to rewrite it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from core.safeio import write_text

WORDS = [
    "river", "stone", "lantern", "orbit", "meadow", "signal", "harbor", "cedar", "prism",
    "velvet", "canyon", "ember", "glacier", "compass", "thistle", "beacon", "falcon", "quartz",
    "willow", "tundra", "cobalt", "saffron", "marble", "horizon", "juniper", "nebula",
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _add(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    return "Add the two numbers.", f"{a} and {b}", f"{a} + {b} = {a + b}."


def _multiply(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return "Multiply the two numbers.", f"{a} and {b}", f"{a} x {b} = {a * b}."


def _reverse(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    return "Write the word backwards.", word, f"Backwards, {word} is {word[::-1]}."


def _sort(rng: random.Random) -> tuple[str, str, str]:
    nums = rng.sample(range(1, 100), rng.randint(3, 7))
    listed = ", ".join(map(str, nums))
    return "Sort the numbers from smallest to largest.", listed, ", ".join(map(str, sorted(nums)))


def _count(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    letter = rng.choice(word)
    n = word.count(letter)
    return (f"How many times does the letter '{letter}' appear?", word,
            f"The letter '{letter}' appears {n} time{'s' if n != 1 else ''} in {word}.")


def _convert(rng: random.Random) -> tuple[str, str, str]:
    km = rng.randint(1, 500)
    return "Convert kilometres to metres.", f"{km} km", f"{km} km is {km * 1000} metres."


def _weekday(rng: random.Random) -> tuple[str, str, str]:
    start, offset = rng.randrange(7), rng.randint(1, 20)
    return (f"What day is it {offset} days after {DAYS[start]}?", "",
            f"{offset} days after {DAYS[start]} it is {DAYS[(start + offset) % 7]}.")


def _upper(rng: random.Random) -> tuple[str, str, str]:
    words = " ".join(rng.sample(WORDS, 3))
    return "Write the phrase in capital letters.", words, words.upper()


def _compare(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.sample(range(1, 10_000), 2)
    big = max(a, b)
    return "Which number is larger?", f"{a} or {b}", f"{big} is larger."


TEMPLATES: list[Callable[[random.Random], tuple[str, str, str]]] = [
    _add, _multiply, _reverse, _sort, _count, _convert, _weekday, _upper, _compare,
]


def generate(count: int = 720, seed: int = 20261121) -> list[dict[str, str]]:
    """Return ``count`` samples, deterministic for a given seed."""
    rng = random.Random(seed)
    samples = []
    for index in range(count):
        instruction, given, output = TEMPLATES[index % len(TEMPLATES)](rng)
        samples.append({"instruction": instruction, "input": given, "output": output})
    return samples


if __name__ == "__main__":
    target = Path(__file__).with_name("alpaca_mini.jsonl")
    write_text(target, "".join(json.dumps(sample) + "\n" for sample in generate()))
    print(f"wrote {target}")
