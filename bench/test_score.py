"""Unit tests of the comparator (run by the test command: python3 -m unittest discover bench)."""

import datetime
import decimal
import unittest

from score import gold_precision, official_result, same_result


class SameResult(unittest.TestCase):
    def test_rows_are_a_multiset_unless_ordered(self):
        self.assertTrue(same_result([[1], [2], [2]], [[2], [1], [2]]))
        self.assertFalse(same_result([[1], [2]], [[1], [2], [2]]))
        self.assertFalse(same_result([[2], [1]], [[1], [2]], ordered=True))
        self.assertTrue(same_result([[1], [2]], [[1], [2]], ordered=True))

    def test_column_order_matters_names_do_not(self):
        self.assertFalse(same_result([["a", 1]], [[1, "a"]]))
        self.assertFalse(same_result([["a", 1]], [["a"]]))

    def test_numbers_compare_numerically_with_a_tolerance(self):
        self.assertTrue(same_result([[decimal.Decimal("9.50")]], [[9.5]]))
        self.assertTrue(same_result([[21]], [[21.0]]))
        self.assertTrue(same_result([[0.333333333]], [[0.33333]]))
        self.assertFalse(same_result([[3.8852]], [[3.89]]))
        self.assertTrue(same_result([[-0.0]], [[0]]))

    def test_null_equals_null_and_types_stay_apart(self):
        self.assertTrue(same_result([[None, "x"]], [[None, "x"]]))
        self.assertFalse(same_result([[None]], [["None"]]))
        self.assertFalse(same_result([["1"]], [[1]]))
        self.assertFalse(same_result([[True]], [[1]]))

    def test_dates_as_postgresql_renders_them(self):
        self.assertTrue(same_result([[datetime.date(2023, 3, 1)]], [["2023-03-01"]]))
        self.assertTrue(
            same_result([[datetime.datetime(2023, 3, 1, 12, 30)]], [["2023-03-01 12:30:00"]])
        )

    def test_empty_results(self):
        self.assertTrue(same_result([], []))
        self.assertFalse(same_result([], [[1]]))


class Precision(unittest.TestCase):
    def test_the_golds_rounding_is_found(self):
        self.assertEqual(gold_precision("SELECT ROUND(AVG(price), 2) FROM t"), 2)
        self.assertEqual(gold_precision("SELECT round(sum(a) / count(*)::numeric, 1), ROUND(x, 3)"), 1)
        self.assertIsNone(gold_precision("SELECT avg(price) FROM t"))
        self.assertIsNone(gold_precision("SELECT ROUND(x) FROM t"))
        self.assertIsNone(gold_precision("SELECT background_round(1, 2)"))

    def test_an_unrounded_answer_matches_at_the_golds_precision(self):
        self.assertFalse(same_result([[248.3966]], [[248.4]]))
        self.assertTrue(same_result([[248.3966]], [[248.4]], decimals=2))
        self.assertFalse(same_result([[248.3966]], [[248.5]], decimals=1))


if __name__ == "__main__":
    unittest.main()


class OfficialResult(unittest.TestCase):
    def test_spider_takes_columns_in_any_order_and_rows_as_a_multiset(self):
        self.assertTrue(official_result([["a", 1], ["b", 2]], [[2, "b"], [1, "a"]], "spider_dev"))
        self.assertFalse(official_result([["a", 1]], [[1, "a"], [1, "a"]], "spider_dev"))
        self.assertFalse(official_result([["a", 1, 0]], [[1, "a"]], "spider_dev"))
        self.assertFalse(
            official_result([["b", 2], ["a", 1]], [[1, "a"], [2, "b"]], "spider_dev", ordered=True)
        )

    def test_defog_accepts_extra_columns(self):
        self.assertTrue(official_result([[7, "x", 1.5]], [["x", 1.5]], "defog_sqleval"))
        self.assertFalse(official_result([[7, "x"]], [["x", 1.5]], "defog_sqleval"))
        self.assertFalse(official_result([["x"], ["x"]], [["x"]], "defog_sqleval"))

    def test_bird_compares_rows_as_a_set(self):
        self.assertTrue(official_result([[1], [1], [2]], [[2], [1]], "bird_minidev"))
        self.assertFalse(official_result([[1, 2]], [[2, 1]], "bird_minidev"))

    def test_other_suites_stay_strict(self):
        self.assertFalse(official_result([["a", 1]], [[1, "a"]], "sqe_synthetic"))
        self.assertTrue(official_result([[decimal.Decimal("9.50")]], [[9.5]], "sqe_synthetic"))
