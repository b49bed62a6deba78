# The two commands a user needs (demo, test), the production install, and the test tiers. All
# set up what is missing first (scripts/setup.sh). PG=NN picks the PostgreSQL major version
# (default 15, Debian's); `make pg PG=17` makes that server ready first (scripts/pg.sh).
.PHONY: demo test test-unit test-pg test-regress test-e2e test-gateway install setup lint lint-pg pg

PG ?= 15
PG_CONFIG ?= $(shell bash scripts/pg.sh config $(PG) 2>/dev/null)
export PG_CONFIG
# Another version than Debian's must be made ready first: the tiers, the install and its lints
# would run on 15 otherwise.
ifeq ($(PG_CONFIG),)
ifneq ($(PG),15)
ifneq ($(filter test test-unit test-pg test-regress test-e2e test-gateway install lint-pg,$(MAKECMDGOALS)),)
$(error PostgreSQL $(PG) is not ready: run make setup pg PG=$(PG) first)
endif
endif
endif
SUDO_FLAG := $(if $(filter 0,$(shell id -u)),,--sudo)

demo:
	bash scripts/demo.sh

# Every tier, as CI runs them (README, "Development").
test: setup
	bash scripts/test.sh

test-unit: setup
	bash scripts/test.sh unit

test-pg: setup
	bash scripts/test.sh pg

test-regress: setup
	bash scripts/test.sh regress

# One area: AREA=guard runs tests/tests/guard.rs; without AREA, every end-to-end test.
test-e2e: setup
	bash scripts/test.sh e2e $(AREA)

test-gateway: setup
	bash scripts/test.sh gateway

# A release build into the server's directories (lib and extension); then, in each database,
# CREATE EXTENSION sql_query_engine (or ALTER EXTENSION sql_query_engine UPDATE).
install:
	bash scripts/setup.sh build
	PATH="$$HOME/.cargo/bin:$$PATH" cargo pgrx install --release --pg-config $(PG_CONFIG) \
	    --no-default-features --features pg$$($(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/') \
	    $(SUDO_FLAG)

# Makes PostgreSQL $(PG) ready (Debian's package, or built once from Debian's sources into the
# project's cache) and prints its pg_config as the last line.
pg:
	bash scripts/pg.sh ready $(PG)

setup:
	bash scripts/setup.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings -D clippy::undocumented_unsafe_blocks
	python3 scripts/check-modules.py src gateway/src

# The lints of the code only PostgreSQL $(PG) builds (compat.rs), once it is ready (make pg).
lint-pg:
	cargo clippy --all-targets --no-default-features --features pg$(PG) -- -D warnings
