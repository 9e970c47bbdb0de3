#!/usr/bin/env python3
"""Generate the small Alpaca-format data set that ships with zt (examples/data/README.md).

Simple tasks a tiny model can visibly learn in a minute or two on a CPU: reverse a word, upper-case
a phrase, add two small numbers, the next letter of the alphabet, a country's capital, the opposite
of a word, count the letters of a word. Every answer is computed here, so the data is exact.

Writes (deterministically, seed fixed):
  tasks.json     training records (a JSON array, one record per line)
  heldout.json   records whose inputs never occur in tasks.json, for sampling and evaluation
  corpus.txt     the text the tokenizer is trained on (not committed; see README.md)

usage: python3 make_tasks.py [OUT_DIR]
"""
import json
import os
import random
import sys

WORDS = """apple river stone cloud garden window yellow planet forest silver bread candle
market pencil orange rabbit bottle summer winter spring autumn castle dragon island mirror
ocean rocket flower monkey guitar jacket kitten ladder lemon magnet needle object parrot
pepper pillow pirate puzzle rainbow saddle school shadow spider square string sunset table
ticket tiger tomato travel turtle village violin wallet water whale wizard yogurt zebra anchor
basket beacon butter button camera carpet cherry circle copper cotton desert doctor donkey
engine farmer feather finger forest frozen garlic ginger hammer harbor helmet honey hunter
jungle kettle kingdom lantern letter lizard meadow melon mitten muffin museum napkin number
orbit oyster paddle palace panda peanut pebble pepper pickle planet pocket potato powder
prince pumpkin quiet rattle record ribbon rocket salmon sandal season signal singer sister
socket spirit stable sugar tablet teapot thunder timber tunnel velvet wagon walnut weather
whistle window winner yellow""".split()

COUNTRIES = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"),
    ("Brazil", "Brasilia"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Greece", "Athens"),
    ("Turkey", "Ankara"), ("Russia", "Moscow"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
    ("Belgium", "Brussels"), ("Denmark", "Copenhagen"), ("Hungary", "Budapest"),
    ("Australia", "Canberra"), ("Argentina", "Buenos Aires"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Morocco", "Rabat"), ("Cuba", "Havana"), ("Iceland", "Reykjavik"),
    ("Nepal", "Kathmandu"), ("Ghana", "Accra"), ("Colombia", "Bogota"), ("Indonesia", "Jakarta"),
]

OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("happy", "sad"),
    ("light", "dark"), ("open", "closed"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
    ("old", "new"), ("rich", "poor"), ("strong", "weak"), ("wet", "dry"), ("high", "low"),
    ("long", "short"), ("loud", "quiet"), ("clean", "dirty"), ("near", "far"), ("first", "last"),
    ("inside", "outside"), ("push", "pull"), ("win", "lose"), ("buy", "sell"), ("day", "night"),
]

# Several phrasings per task, so the model learns the task and not one sentence.
PHRASES = {
    "reverse": ["Reverse the word.", "Write the word backwards.", "Spell the word in reverse order."],
    "upper": ["Convert the text to uppercase.", "Write the text in capital letters."],
    "add": ["Add the two numbers.", "What is the sum of the two numbers?"],
    "next_letter": ["What letter comes after this one in the alphabet?", "Give the next letter of the alphabet."],
    "capital": ["What is the capital of {x}?", "Name the capital city of {x}."],
    "opposite": ["Give the opposite of the word.", "What is the antonym of this word?"],
    "count": ["How many letters does the word have?", "Count the letters in the word."],
}


def make(kind, rng, x):
    """One record for task `kind` on item x."""
    phrase = rng.choice(PHRASES[kind])
    if kind == "reverse":
        return {"instruction": phrase, "input": x, "output": x[::-1]}
    if kind == "upper":
        return {"instruction": phrase, "input": x, "output": x.upper()}
    if kind == "add":
        a, b = x
        return {"instruction": phrase, "input": f"{a} and {b}", "output": str(a + b)}
    if kind == "next_letter":
        return {"instruction": phrase, "input": x, "output": chr(ord(x) + 1)}
    if kind == "capital":
        country, capital = x
        return {"instruction": phrase.format(x=country), "input": "",
                "output": f"The capital of {country} is {capital}."}
    if kind == "opposite":
        word, opposite = x
        return {"instruction": phrase, "input": word, "output": opposite}
    if kind == "count":
        return {"instruction": phrase, "input": x, "output": str(len(x))}
    raise ValueError(kind)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(20260101)
    words = sorted(set(WORDS))
    rng.shuffle(words)
    held_words, train_words = words[:12], words[12:]
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    held_pairs, train_pairs = pairs[:10], pairs[10:]
    letters = [chr(c) for c in range(ord("a"), ord("z"))] + [chr(c) for c in range(ord("A"), ord("Z"))]
    phrases = [f"{a} {b}" for a, b in zip(train_words[::2], train_words[1::2])]
    opposites = OPPOSITES + [(b, a) for a, b in OPPOSITES]

    train = []
    for _ in range(2):
        train += [make("reverse", rng, w) for w in train_words]
        train += [make("count", rng, w) for w in train_words]
    train += [make("upper", rng, p) for p in phrases] + [make("upper", rng, w) for w in train_words]
    train += [make("add", rng, p) for p in train_pairs for _ in range(3)]
    train += [make("next_letter", rng, c) for c in letters for _ in range(3)]
    train += [make("capital", rng, c) for c in COUNTRIES for _ in range(4)]
    train += [make("opposite", rng, o) for o in opposites for _ in range(3)]
    rng.shuffle(train)

    # Held out: words and number pairs never seen in training, plus seen facts asked again.
    held = [make("reverse", rng, w) for w in held_words]
    held += [make("upper", rng, w) for w in held_words]
    held += [make("count", rng, w) for w in held_words]
    held += [make("add", rng, p) for p in held_pairs]
    held += [make("capital", rng, c) for c in rng.sample(COUNTRIES, 8)]
    held += [make("next_letter", rng, c) for c in rng.sample(letters, 8)]
    held += [make("opposite", rng, o) for o in rng.sample(opposites, 8)]

    def write(name, records):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n]\n")

    write("tasks.json", train)
    write("heldout.json", held)
    # Tokenizer training text: every field of every record, and the Alpaca template's wording
    # (zt-prep's default template puts it in every prompt, so it should tokenize compactly).
    template = ("Below is an instruction that describes a task, paired with an input that provides "
                "further context. Write a response that appropriately completes the request.\n"
                "Below is an instruction that describes a task. Write a response that appropriately "
                "completes the request.\n### Instruction:\n### Input:\n### Response:\n")
    with open(os.path.join(out_dir, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(template * 50)
        for r in train + held:
            f.write("\n".join(v for v in r.values() if v) + "\n")
    print(f"{len(train)} training records, {len(held)} held-out records")


main()
