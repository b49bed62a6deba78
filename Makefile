# The two commands a user needs (demo, test), and the production install. All set up what is
# missing first (scripts/setup.sh).
.PHONY: demo test install setup lint

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
SUDO_FLAG := $(if $(filter 0,$(shell id -u)),,--sudo)

demo:
	bash scripts/demo.sh

test: setup
	bash scripts/test.sh

# A release build into the server's directories (lib and extension); then, in each database,
# CREATE EXTENSION sql_query_engine (or ALTER EXTENSION sql_query_engine UPDATE).
install: setup
	PATH="$$HOME/.cargo/bin:$$PATH" cargo pgrx install --release --pg-config $(PG_CONFIG) $(SUDO_FLAG)

setup:
	bash scripts/setup.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
