#!/usr/bin/env python3
"""Random cases of CPython's `set(range(D)) - set(counted)` iteration order for the C emulation
(strategies/eagle3/vocab.c, tests/strategies/test_eagle3_vocab.c), taken from real Python sets and checked equal to
tools/reference/eagle3_vocab.missing_fill_order. Writes tests/fixtures/eagle3_set_order/cases.json:

    /usr/bin/python3 tools/reference/make_eagle3_set_order_cases.py"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import eagle3_vocab  # noqa: E402

OUT = os.path.join(HERE, "..", "..", "tests", "fixtures", "eagle3_set_order", "cases.json")


def main() -> int:
    rng = random.Random(20260808)
    cases = []
    for n in range(200):
        D = rng.choice([rng.randint(1, 40), rng.randint(40, 400), rng.randint(400, 700)])
        k = rng.randint(0, 2 * D)
        counted = sorted(set(rng.randrange(0, 3 * D + 7) for _ in range(k)), key=lambda _: rng.random())
        order = list(set(range(D)) - set(counted))
        assert order == eagle3_vocab.missing_fill_order(counted, D), (D, counted)
        cases.append({"D": D, "counted": counted, "order": order})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"python": sys.version.split()[0], "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
