#!/usr/bin/env python3
"""make_arith.py: GSM8K-format arithmetic word problems, seeded and deterministic.

Each line of the output JSONL is {"question": ..., "answer": ...}, where the answer is a
worked solution in GSM8K's style: one line per step with a calculator annotation
`<<a op b=c>>` (omit with --no-calc), then a last line `#### N`. This is the format
lm-evaluation-harness's gsm8k task reads (doc_to_text "Question: {q}\\nAnswer:", target =
the whole answer), so `m3 eval gsm8k --data` and a tiny model's training script can use it
like the real data set.

Problems use 1 to 3 steps over small integers (every intermediate result is a non-negative
integer, divisions are exact) so that a small model can learn them. The test split holds
only questions that do not occur in the train split.

    python3 scripts/make_arith.py --out-dir DIR [--n-train 20000] [--n-test 300] [--seed 1]
                                  [--level full|easy]

Determinism: only random.Random(seed) is used (its integer and choice algorithms are stable
across Python 3 versions); the same arguments give byte-identical files.
"""
import argparse
import json
import os
import random
import sys

NAMES = ["Natalia", "James", "Maria", "Tom", "Aisha", "Ken", "Lena", "Omar", "Priya", "Sam",
         "Julia", "Carlos", "Mei", "Noah", "Fatima", "Liam", "Sofia", "Ivan", "Zara", "Ben"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells",
         "coins", "stamps", "eggs", "balloons", "toy cars", "oranges", "beads", "candles"]
BOXES = ["boxes", "bags", "packs", "jars", "baskets", "crates", "trays"]
JOBS = ["babysitting", "mowing lawns", "walking dogs", "tutoring", "washing cars"]


def calc(a, op, b, r, use_calc):
    """One GSM8K-style expression, e.g. '48/2 = <<48/2=24>>24'."""
    e = f"{a}{op}{b}"
    return f"{e} = <<{e}={r}>>{r}" if use_calc else f"{e} = {r}"


def t_add_sub(rng, c):
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(5, 60), rng.randint(2, 40)
    g = rng.randint(1, a + b - 1)
    q = (f"{n} has {a} {it}. {n} buys {b} more {it} and then gives {g} {it} to a friend. "
         f"How many {it} does {n} have now?")
    s1 = a + b
    s2 = s1 - g
    ans = (f"After buying, {n} has {calc(a, '+', b, s1, c)} {it}.\n"
           f"After giving some away, {n} has {calc(s1, '-', g, s2, c)} {it}.\n#### {s2}")
    return q, ans


def t_mul(rng, c):
    n, it, bx = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(BOXES)
    k, m = rng.randint(2, 12), rng.randint(2, 15)
    q = f"{n} has {k} {bx} of {it}. Each of the {bx} holds {m} {it}. How many {it} does {n} have?"
    r = k * m
    return q, f"{n} has {calc(k, '*', m, r, c)} {it}.\n#### {r}"


def t_div(rng, c):
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    p, each = rng.randint(2, 9), rng.randint(2, 20)
    tot = p * each
    q = (f"{n} shares {tot} {it} equally among {p} friends. "
         f"How many {it} does each friend get?")
    return q, f"Each friend gets {calc(tot, '/', p, each, c)} {it}.\n#### {each}"


def t_half_more(rng, c):
    # GSM8K's first training item has this shape.
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    a = 2 * rng.randint(3, 40)
    h = a // 2
    q = (f"{n} sold {it} to {a} of her friends in April, and then she sold half as many "
         f"{it} in May. How many {it} did {n} sell altogether in April and May?")
    ans = (f"{n} sold {calc(a, '/', 2, h, c)} {it} in May.\n"
           f"{n} sold {calc(a, '+', h, a + h, c)} {it} altogether in April and May.\n"
           f"#### {a + h}")
    return q, ans


def t_money(rng, c):
    n, job = rng.choice(NAMES), rng.choice(JOBS)
    rate, hours = rng.randint(5, 25), rng.randint(2, 9)
    spend = rng.randint(1, rate * hours - 1)
    earned = rate * hours
    left = earned - spend
    q = (f"{n} earns ${rate} an hour for {job}. {n} works {hours} hours and then spends "
         f"${spend} on a gift. How much money does {n} have left?")
    ans = (f"{n} earns {calc(rate, '*', hours, earned, c)} dollars.\n"
           f"{n} has {calc(earned, '-', spend, left, c)} dollars left.\n#### {left}")
    return q, ans


def t_three_step(rng, c):
    n, it, bx = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(BOXES)
    k, m, extra = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 30)
    p = rng.choice([2, 3, 4, 5])
    tot = k * m + extra
    # make the final division exact by adjusting extra
    extra += (p - tot % p) % p
    tot = k * m + extra
    km = k * m
    q = (f"{n} buys {k} {bx} of {it} with {m} {it} in each, and finds {extra} more {it}. "
         f"{n} splits all the {it} evenly into {p} groups. How many {it} are in each group?")
    ans = (f"The {bx} hold {calc(k, '*', m, km, c)} {it}.\n"
           f"In total {n} has {calc(km, '+', extra, tot, c)} {it}.\n"
           f"Each group has {calc(tot, '/', p, tot // p, c)} {it}.\n#### {tot // p}")
    return q, ans


def t_diff(rng, c):
    a, b = rng.sample(NAMES, 2)
    it = rng.choice(ITEMS)
    x = rng.randint(10, 90)
    more = rng.randint(1, 40)
    y = x + more
    q = (f"{a} has {x} {it}. {b} has {more} more {it} than {a}. "
         f"How many {it} do they have together?")
    ans = (f"{b} has {calc(x, '+', more, y, c)} {it}.\n"
           f"Together they have {calc(x, '+', y, x + y, c)} {it}.\n#### {x + y}")
    return q, ans


def t_big(rng, c):
    # larger results exercise the comma and digit-grouping paths of the scorer/tokenizer
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    k, m = rng.randint(11, 99), rng.randint(11, 99)
    r = k * m
    q = (f"A factory packs {m} {it} into each crate. {n} orders {k} crates. "
         f"How many {it} does {n} order?")
    return q, f"{n} orders {calc(k, '*', m, r, c)} {it}.\n#### {r}"


TEMPLATES = [t_add_sub, t_mul, t_div, t_half_more, t_money, t_three_step, t_diff, t_big]


# --level easy: what a model of a few MB trained for minutes can learn (scripts/train_tiny.py):
# one fixed sentence shape, sums and differences of small numbers, one or two steps.
def t_easy_add(rng, c):
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 30), rng.randint(1, 20)
    q = f"{n} has {a} {it}. {n} gets {b} more {it}. How many {it} does {n} have now?"
    return q, f"{n} has {calc(a, '+', b, a + b, c)} {it}.\n#### {a + b}"


def t_easy_sub(rng, c):
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    a = rng.randint(5, 40)
    g = rng.randint(1, a - 1)
    q = f"{n} has {a} {it}. {n} gives away {g} {it}. How many {it} does {n} have now?"
    return q, f"{n} has {calc(a, '-', g, a - g, c)} {it}.\n#### {a - g}"


def t_easy_two(rng, c):
    n, it = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 25), rng.randint(1, 15)
    g = rng.randint(1, a + b - 1)
    q = (f"{n} has {a} {it}. {n} gets {b} more {it} and then gives away {g} {it}. "
         f"How many {it} does {n} have now?")
    ans = (f"{n} has {calc(a, '+', b, a + b, c)} {it}.\n"
           f"{n} has {calc(a + b, '-', g, a + b - g, c)} {it} left.\n#### {a + b - g}")
    return q, ans


EASY_TEMPLATES = [t_easy_add, t_easy_sub, t_easy_two]


def generate(rng, n, use_calc, exclude, templates=None):
    templates = templates or TEMPLATES
    out, seen = [], set(exclude)
    while len(out) < n:
        q, a = rng.choice(templates)(rng, use_calc)
        if q in seen:
            continue
        seen.add(q)
        out.append({"question": q, "answer": a})
    return out


def write_jsonl(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--n-train", type=int, default=20000)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-calc", action="store_true", help="omit <<a op b=c>> annotations")
    ap.add_argument("--level", choices=["full", "easy"], default="full",
                    help="full: the eight templates; easy: 1-2 step sums/differences of small "
                         "numbers in one sentence shape (for scripts/train_tiny.py)")
    args = ap.parse_args()
    if args.n_train < 0 or args.n_test < 0:
        sys.exit("make_arith.py: --n-train/--n-test must be >= 0")
    c = not args.no_calc
    # Separate streams: the test set does not change when --n-train changes.
    tpl = EASY_TEMPLATES if args.level == "easy" else TEMPLATES
    # the full level keeps its original stream names, so its files do not change
    tag = "easy-" if args.level == "easy" else ""
    test = generate(random.Random(f"{tag}test-{args.seed}"), args.n_test, c, (), tpl)
    train = generate(random.Random(f"{tag}train-{args.seed}"), args.n_train, c,
                     [r["question"] for r in test], tpl)
    os.makedirs(args.out_dir, exist_ok=True)
    write_jsonl(os.path.join(args.out_dir, "train.jsonl"), train)
    write_jsonl(os.path.join(args.out_dir, "test.jsonl"), test)
    print(f"make_arith.py: {len(train)} train, {len(test)} test items in {args.out_dir} "
          f"(seed {args.seed})")


if __name__ == "__main__":
    main()
