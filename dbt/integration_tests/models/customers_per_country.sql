{{ sql_query_engine.nl('How many customers are there per country?') }}
