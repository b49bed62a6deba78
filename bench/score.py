"""Execution-accuracy scoring, the way the text-to-SQL benchmarks define it.

Results are compared as multisets of rows (as lists when the gold answer is ordered); column
order matters, column names do not; numbers compare numerically after rounding to a tolerance;
NULL equals NULL.
"""

import datetime
import decimal
import json
import math
from collections import Counter

#: Decimal places numbers are rounded to before comparing (a tolerance of about 1e-4).
DECIMALS = 4


def canonical(value):
    """One value in a form where equal answers compare equal, whatever driver produced it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float, decimal.Decimal)):
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            return ("n", str(number))
        rounded = round(number, DECIMALS)
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


def canonical_rows(rows):
    return [tuple(canonical(v) for v in row) for row in rows]


def same_result(predicted, gold, ordered=False):
    """Whether two results (lists of rows) are the same answer."""
    predicted, gold = canonical_rows(predicted), canonical_rows(gold)
    if predicted and gold and len(predicted[0]) != len(gold[0]):
        return False
    if ordered:
        return predicted == gold
    return Counter(predicted) == Counter(gold)
