# `make demo` and `make check` do all their own set-up on a fresh machine.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
RUST_SOURCES := $(shell find csrc_rs -name '*.rs' -o -name 'Cargo.toml') Cargo.toml
STAMP := .make/installed

.PHONY: demo check install lint types test-rust test-python corpus clean

$(STAMP): pyproject.toml $(RUST_SOURCES)
	$(PIP) install --quiet -e ".[dev]"
	@mkdir -p .make && touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	tensortorrent demo

lint: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

types: $(STAMP)
	$(PYTHON) -m mypy
	$(PYTHON) -m mypy.stubtest tensortorrent_dynamo._planner --allowlist csrc_rs/binding/stubtest-allowlist.txt

test-rust:
	cargo test --workspace --quiet

test-python: $(STAMP)
	$(PYTHON) -m pytest -q

check: lint types test-rust test-python

# the whole third-party model corpus (CI runs its quick subset); prints pass/xfail per budget
corpus: $(STAMP)
	$(PYTHON) -m pytest -q -m corpus tests/integration/corpus

clean:
	rm -rf .make target build dist
