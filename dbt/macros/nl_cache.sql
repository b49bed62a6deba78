{#-
  dbt run-operation sql_query_engine.nl_cache: prints the project's cache file, the SQL of every
  question of its models (kept from the current cache, asked for the new ones, all asked again
  with --vars '{nl_refresh: true}'). Write it to macros/sql_query_engine_cache.sql through a
  temporary file (dbt reads the old one while it runs):

    dbt --quiet run-operation sql_query_engine.nl_cache > cache.tmp \
      && mv cache.tmp macros/sql_query_engine_cache.sql
-#}
{% macro nl_cache() %}
  {%- set entries = [] -%}
  {%- set seen = [] -%}
  {%- for node in graph.nodes.values() | sort(attribute='unique_id')
        if node.resource_type in ['model', 'analysis', 'snapshot'] -%}
    {%- for question in sql_query_engine.nl_questions(node.raw_code) -%}
      {%- set key = sql_query_engine.nl_key(question) -%}
      {%- if key not in seen -%}
        {%- do seen.append(key) -%}
        {%- set sql = sql_query_engine.nl_sql(question) -%}
        {#- The SQL goes into the file inside a raw block, which any tag ends ({%endraw%},
            {%- endraw %}...): SQL that holds a tag's opening would be rendered as the
            file's own code at every compile, run as the dbt role. -#}
        {%- if '{%' in sql -%}
          {{- exceptions.raise_compiler_error("the SQL for " ~ tojson(question)
              ~ " cannot be cached: it holds '{%', which would end the cache file's raw block") -}}
        {%- endif -%}
        {%- do entries.append({'key': key, 'question': question, 'sql': sql, 'model': node.name}) -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endfor -%}
  {%- set out = [] -%}
  {%- do out.append("{#- Written by `dbt run-operation sql_query_engine.nl_cache`: the SQL sql_query_engine wrote\n    for each question of this project's models. Review it like code, and commit it. -#}") -%}
  {%- do out.append("{% macro sql_query_engine_cache() %}\n{%- set cache = {} -%}") -%}
  {%- for e in entries -%}
    {%- do out.append("\n{#- model " ~ e.model ~ " -#}\n{%- set sql -%}{% raw %}\n" ~ e.sql.strip()
                      ~ "\n{% endraw %}{%- endset -%}\n{%- do cache.update({" ~ tojson(e.key) ~ ": {'question': "
                      ~ tojson(e.question) ~ ", 'sql': sql.strip()}}) -%}") -%}
  {%- endfor -%}
  {%- do out.append("\n{{- return(cache) -}}\n{% endmacro %}") -%}
  {{- print(out | join("\n")) -}}
{% endmacro %}
