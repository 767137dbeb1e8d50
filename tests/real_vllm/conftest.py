"""Opt-in tests against the real vLLM CPU build: a testbed of their own (names, ports and
state apart from `make demo` and `make test`), and the end-to-end helpers of tests/e2e."""
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("NEMOFLEET_TESTBED_NAME", "nf-real")
os.environ.setdefault("NEMOFLEET_TESTBED_DIR", str(ROOT / ".testbed-real"))
os.environ.setdefault("NEMOFLEET_TESTBED_PORT_BASE", "22401")

_spec = importlib.util.spec_from_file_location("e2e_helpers", ROOT / "tests" / "e2e" / "conftest.py")
helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(helpers)
