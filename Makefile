# The two commands a user needs. Both set up what is missing first (scripts/setup.sh).
.PHONY: demo test setup lint

demo:
	bash scripts/demo.sh

test: setup
	bash scripts/test.sh

setup:
	bash scripts/setup.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
