"""Execution-accuracy scoring, the way the text-to-SQL benchmarks define it.

Results are compared as multisets of rows (as lists when the gold answer is ordered); column
order matters, column names do not; numbers compare numerically after rounding to a tolerance;
NULL equals NULL. Beside this strict EX, `gold_precision` gives the decimals a gold query rounds
its numbers to, so that an unrounded but otherwise right answer can be counted too, and
`official_result` compares under each benchmark's own published rule, so that scores can be
set beside published ones.
"""

import datetime
import decimal
import json
import math
import itertools
from collections import Counter

#: Decimal places numbers are rounded to before comparing (a tolerance of about 1e-4).
DECIMALS = 4


def canonical(value, decimals=DECIMALS):
    """One value in a form where equal answers compare equal, whatever driver produced it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float, decimal.Decimal)):
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return ("n", str(number))
        rounded = round(number, decimals)
        return ("n", rounded + 0.0)  # -0.0 and 0.0 are the same answer
    if isinstance(value, datetime.datetime):
        return ("s", value.isoformat(sep=" "))
    if isinstance(value, (datetime.date, datetime.time)):
        return ("s", value.isoformat())
    if isinstance(value, datetime.timedelta):
        return ("s", str(value))
    if isinstance(value, (list, dict)):
        return ("j", json.dumps(value, sort_keys=True, default=str))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("s", bytes(value).hex())
    return ("s", str(value))


def canonical_rows(rows, decimals=DECIMALS):
    return [tuple(canonical(v, decimals) for v in row) for row in rows]


def same_result(predicted, gold, ordered=False, decimals=DECIMALS):
    """Whether two results (lists of rows) are the same answer, numbers compared to `decimals`."""
    predicted, gold = canonical_rows(predicted, decimals), canonical_rows(gold, decimals)
    if predicted and gold and len(predicted[0]) != len(gold[0]):
        return False
    if ordered:
        return predicted == gold
    return Counter(predicted) == Counter(gold)


def gold_precision(sql):
    """The fewest decimals the gold query rounds a number to with ROUND(x, n), or None."""
    found = []
    lower = sql.lower()
    start = 0
    while True:
        at = lower.find("round", start)
        if at < 0:
            break
        start = at + 5
        rest = lower[start:].lstrip()
        if not rest.startswith("(") or (at > 0 and (lower[at - 1].isalnum() or lower[at - 1] == "_")):
            continue
        depth, last_comma, i = 0, None, lower.index("(", start)
        for j in range(i, len(lower)):
            c = lower[j]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    if last_comma is not None:
                        digits = lower[last_comma + 1 : j].strip()
                        if digits.isdigit():
                            found.append(int(digits))
                    break
            elif c == "," and depth == 1:
                last_comma = j
    return min(found) if found else None


#: Widest result whose column permutations the Spider rule tries (its own evaluator bounds
#: the search the same way: beyond this, only the identity is tried).
MAX_PERMUTED_COLUMNS = 6


def _columns(rows):
    return list(zip(*rows)) if rows else []


def official_result(predicted, gold, suite, ordered=False, decimals=DECIMALS):
    """Whether `predicted` answers like `gold` under the benchmark's own rule:

    - spider (test-suite-sql-eval's `result_eq`): the same number of columns in any order, rows
      as a multiset unless the gold query orders them;
    - defog (sql-eval's `subset_df`): every gold column appears among the predicted columns
      (extra columns are accepted), rows in any order;
    - bird (its evaluator's `set(predicted) == set(gold)`): rows as a set, column order kept;
    - anything else: the strict rule (`same_result`).
    """
    if not suite.startswith(("bird", "spider", "defog")):
        return same_result(predicted, gold, ordered, decimals)
    predicted, gold = canonical_rows(predicted, decimals), canonical_rows(gold, decimals)
    if suite.startswith("bird"):
        return set(predicted) == set(gold)
    if suite.startswith("spider"):
        if len(predicted) != len(gold):
            return False
        if not gold:
            return True
        width = len(gold[0])
        if len(predicted[0]) != width:
            return False
        orders = (
            itertools.permutations(range(width))
            if width <= MAX_PERMUTED_COLUMNS
            else [tuple(range(width))]
        )
        for order in orders:
            moved = [tuple(row[i] for i in order) for row in predicted]
            if (moved == gold) if ordered else (Counter(moved) == Counter(gold)):
                return True
        return False
    # defog
    if len(predicted) != len(gold):
        return False
    if not gold:
        return True
    # Each gold column, as a sorted list of values, must be one of the predicted columns (rows
    # in any order: sql-eval sorts both frames before comparing).
    key = lambda v: (v is None, repr(v))
    available = [sorted(c, key=key) for c in _columns(predicted)]
    for column in _columns(gold):
        wanted = sorted(column, key=key)
        if wanted not in available:
            return False
        available.remove(wanted)
    return True
