"""What psycopg (the driver Superset, Grafana's Python tooling and most Python BI code use) sees of
a relation: each column's name, PostgreSQL type and the Python type of its first value.
Usage: view_columns.py CONNINFO RELATION"""
import sys

import psycopg

with psycopg.connect(sys.argv[1]) as conn:
    cur = conn.execute(f"SELECT * FROM {sys.argv[2]}")
    row = cur.fetchone()
    for i, column in enumerate(cur.description):
        type_name = conn.adapters.types.get(column.type_code)
        print("column", column.name, type_name.name if type_name else column.type_code,
              type(row[i]).__name__ if row else None)
