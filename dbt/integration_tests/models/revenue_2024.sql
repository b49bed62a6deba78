{{ config(materialized='table') }}
{{ sql_query_engine.nl("What was the total order amount in 2024?") }}
