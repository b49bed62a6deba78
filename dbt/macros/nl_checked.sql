{#-
  A generic test: the SQL of every sql_query_engine.nl('...') question of the model still passes
  the extension's guard (nl_check), as the role dbt runs as, against the database as it is now
  (after DDL, or with a hand-edited cache). A refusal fails the test with nl_check's error.

    models:
      - name: top_customers
        data_tests: [sql_query_engine.nl_checked]
-#}
{% test nl_checked(model) %}
  {%- set questions = [] -%}
  {%- if execute -%}
    {%- for node in graph.nodes.values()
          if node.resource_type == 'model' and node.alias == model.identifier
             and node.schema == model.schema -%}
      {%- for q in sql_query_engine.nl_questions(node.raw_code) -%}{%- do questions.append(q) -%}{%- endfor -%}
    {%- endfor -%}
  {%- endif -%}
  select 0 as refusals where false
  {%- for q in questions %}
  union all
  select 1 from (select {{ sql_query_engine.nl_schema() }}.nl_check({{ sql_query_engine.nl_literal(sql_query_engine.nl_sql(q)) }})::text as verdict) as checked
  where checked.verdict is distinct from ''
  {%- endfor %}
{% endtest %}
