# nemofleet: `make demo` runs the main job against the local testbed; `make test` runs all tests.
VENV ?= .venv
BIN := $(VENV)/bin
export PYINFRA_PROGRESS := off

.PHONY: venv testbed demo test test-unit down status plan bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

testbed: venv
	$(BIN)/nemofleet testbed up

demo: testbed
	$(BIN)/pyinfra -y inventories/testbed.py deploys/nemotron.py
	$(BIN)/nemofleet plan inventories/testbed.py
	$(BIN)/nemofleet status inventories/testbed.py

test: venv
	$(BIN)/pytest -q -rs tests

test-unit: venv
	$(BIN)/pytest -q tests/unit

status: venv
	$(BIN)/nemofleet testbed status

plan: venv
	$(BIN)/nemofleet plan inventories/testbed.py

down: venv
	$(BIN)/nemofleet testbed down

bench: venv
	$(BIN)/python bench/converge.py

clean: down
	rm -rf .testbed $(VENV)
