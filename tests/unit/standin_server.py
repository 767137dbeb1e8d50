"""The testbed's stand-in vLLM served on loopback for a unit test (test_canary_standin, test_status)."""

import sys
import threading
import types
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

from nemofleet import vllm_flags

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def serving(monkeypatch, max_num_seqs: int):
    """(the vllm_standin module, its base URL) while it serves on 127.0.0.1, ready, model /m."""
    monkeypatch.setitem(sys.modules, "vllm_flags", vllm_flags)
    monkeypatch.syspath_prepend(str(ROOT / "testbed" / "src" / "nemofleet_testbed" / "standin"))
    sys.modules.pop("vllm_standin", None)
    import vllm_standin

    vllm_standin.STATE["ready"] = True
    vllm_standin.Handler.args = types.SimpleNamespace(served_model_name=["nemotron"], model_tag="/m",
                                                      max_num_seqs=max_num_seqs, max_model_len=4096)
    vllm_standin.Handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), vllm_standin.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield vllm_standin, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        sys.modules.pop("vllm_standin", None)
