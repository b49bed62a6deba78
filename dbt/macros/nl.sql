{#-
  {{ sql_query_engine.nl('question') }}: the SQL sql_query_engine wrote for a question, as the
  model's SQL. At compile time it comes from the project's cache (the macro
  sql_query_engine_cache in macros/sql_query_engine_cache.sql, which
  `dbt run-operation sql_query_engine.nl_cache` writes and the project commits), so compile and
  run are reproducible and the SQL is reviewed like any other. The extension's nl_generate is
  asked only when the question is not in the cache (then a warning says to update it) or with
  --vars '{nl_refresh: true}'. The question must be a string literal, so that nl_cache finds it.
-#}
{% macro nl(question) -%}
  {%- if not execute -%}
    {{- return('select 1 as sql_query_engine_placeholder') -}}
  {%- endif -%}
  {{- return(sql_query_engine.nl_sql(question)) -}}
{%- endmacro %}

{#- The cache key of a question: its words, without the blank space around them. -#}
{% macro nl_key(question) -%}
  {{- return(local_md5(question.split() | join(' '))) -}}
{%- endmacro %}

{#- The project's cache: {key: {question, sql}}, or nothing before the first nl_cache. -#}
{% macro nl_cached() -%}
  {%- if sql_query_engine_cache is defined -%}
    {{- return(sql_query_engine_cache()) -}}
  {%- endif -%}
  {{- return({}) -}}
{%- endmacro %}

{#- The schema the extension is installed in, quoted. -#}
{% macro nl_schema() -%}
  {%- set found = run_query(
      "select pg_catalog.quote_ident(n.nspname) from pg_catalog.pg_extension e"
      ~ " join pg_catalog.pg_namespace n on n.oid = e.extnamespace"
      ~ " where e.extname = 'sql_query_engine'") -%}
  {%- if found.rows | length == 0 -%}
    {{- exceptions.raise_compiler_error(
        "sql_query_engine is not installed in the target database (CREATE EXTENSION sql_query_engine)") -}}
  {%- endif -%}
  {{- return(found.columns[0].values()[0]) -}}
{%- endmacro %}

{#- A string as an SQL literal, the same whatever standard_conforming_strings says (a
    backslash in the model's SQL would otherwise end a plain literal early). -#}
{% macro nl_literal(text) -%}
  {{- return("E'" ~ (text | replace("\\", "\\\\") | replace("'", "''")) ~ "'") -}}
{%- endmacro %}

{#- The SQL for `question`: cached, or (not cached, or refreshing) written by nl_generate. -#}
{% macro nl_sql(question) -%}
  {%- set key = sql_query_engine.nl_key(question) -%}
  {%- set cache = sql_query_engine.nl_cached() -%}
  {%- if not var('nl_refresh', false) and key in cache -%}
    {{- return(cache[key]['sql']) -}}
  {%- endif -%}
  {%- set result = run_query("select " ~ sql_query_engine.nl_schema() ~ ".nl_generate("
                             ~ sql_query_engine.nl_literal(question) ~ ")") -%}
  {%- set sql = result.columns[0].values()[0] -%}
  {%- if key not in cache -%}
    {{- log("sql_query_engine: " ~ tojson(question) ~ " is not in the cache; run "
            ~ "dbt run-operation sql_query_engine.nl_cache (see the package's README) and commit "
            ~ "the file, or every compile asks the model again", info=True) -}}
  {%- endif -%}
  {{- return(sql) -}}
{%- endmacro %}

{#- The questions of a node's SQL: every sql_query_engine.nl('...') with a string literal. -#}
{% macro nl_questions(code) -%}
  {%- set found = [] -%}
  {%- for quote, text in modules.re.findall("sql_query_engine\\.nl\\(\\s*(['\"])((?:(?!\\1).)*)\\1\\s*\\)", code, modules.re.S) -%}
    {%- if text not in found -%}{%- do found.append(text) -%}{%- endif -%}
  {%- endfor -%}
  {{- return(found) -}}
{%- endmacro %}
