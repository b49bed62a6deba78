"""Execution-accuracy scoring, the way the text-to-SQL benchmarks define it.

Results are compared as multisets of rows (as lists when the gold answer is ordered); column
order matters, column names do not; numbers compare numerically after rounding to a tolerance;
NULL equals NULL. Beside this strict EX, `gold_precision` gives the decimals a gold query rounds
its numbers to, so that an unrounded but otherwise right answer can be counted too.
"""

import datetime
import decimal
import json
import math
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
