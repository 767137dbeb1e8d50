"""Stand-in for the `vllm serve` OpenAI-compatible server, for the nemofleet testbed.

It parses the command line with the pinned version's flag table (unknown flags fail with
argparse's "vllm: error: unrecognized arguments" like vLLM), needs the GPUs the container
toolkit granted and the model directory, then serves /health, /ping, /version, /metrics,
/v1/models and /v1/chat/completions (reasoning + content), honouring VLLM_API_KEY on /v1.

Knobs (environment): STANDIN_STARTUP_SECONDS (default 2), STANDIN_FAIL=start|health,
STANDIN_LATENCY_SECONDS (default 0.2: every completion takes that long, its first token at half of
it; the `-slow` release sets 1.0, five times slower), STANDIN_FAIL_EVERY (default 0 = never: every
Nth completion answers HTTP 500 as an engine error; the `-flaky` release sets 20, 5 %: a counted
event, not chance, so a test knows exactly which request fails).
The port opens only once the engine is ready, as real vLLM's API server starts uvicorn only after
the engine initialised: while starting, a connection is refused; a 503 from /health means a server
that is up but unhealthy (draining, its engine dead), never one still starting.
/metrics exports what the canary gate reads under real vLLM's names and types (0.27.1 and 0.32.0
export the same ones): vllm:request_success_total{finished_reason} (counter),
vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds (histograms with vLLM's
buckets), and prometheus-fastapi-instrumentator's http_requests_total{handler,method,status}
(status grouped as 2xx/4xx/5xx; /metrics, /health, /ping, /version not counted, as vLLM excludes
them). Every completion counts, a health probe's too, like vLLM: the gate leaves its own probes out
of its figures by its window (it starts after the health gate's last probe and only reads /metrics).
Per request (stand-in only; a real vLLM ignores an unknown request field with a warning):
"standin_hold_seconds": N (at most 60) keeps the completion in flight that long, so /metrics shows
it in vllm:num_requests_running (beyond --max-num-seqs in vllm:num_requests_waiting) and in the
KV-cache usage, which grows with the running requests like a real server's.
"stream": true answers as vLLM does, in server-sent events (one chunk per piece of the answer, the
hold spread over them, then `data: [DONE]`).
GPU fault drills (`nemofleet testbed gpu-fault`, /etc/nemofleet-sim/gpu-faults.json): on a GPU with
xid79, xid48 or ecc-uncorrectable every inference request fails with 500, as vLLM's does once its
engine died on a lost GPU, while /health stays 200 (vLLM's /health runs no forward pass).
SIGTERM (docker stop) drains like vLLM's --shutdown-timeout: /health answers 503 and new requests
are refused at once, requests in flight finish (up to --shutdown-timeout seconds), then it exits.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_flags  # noqa: E402

VERSION = os.environ.get("STANDIN_VLLM_VERSION", "0.27.1")
STATE = {"ready": False, "requests": 0, "running": 0, "started": time.time(), "dead": False, "draining": False}
LOCK = threading.Lock()
KV_PER_REQUEST = 0.0125  # share of the KV cache one short chat request holds (prompt + answer blocks)
MAX_HOLD_SECONDS = 60
LATENCY = max(0.0, float(os.environ.get("STANDIN_LATENCY_SECONDS", "0.2")))
FAIL_EVERY = max(0, int(os.environ.get("STANDIN_FAIL_EVERY", "0")))
# vLLM's own bucket bounds for these two histograms (vllm/v1/metrics/loggers.py in 0.27.1 and 0.32.0)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0]
# what /metrics counts: completions by finish reason, HTTP answers by (handler, method, status class),
# the two latency histograms as per-bucket counts (+Inf last), their sums and counts
COUNTS = {"completions": 0, "success": {}, "http": {}, "ttft": [0] * (len(TTFT_BUCKETS) + 1),
          "e2e": [0] * (len(E2E_BUCKETS) + 1), "ttft_sum": 0.0, "e2e_sum": 0.0}
NOT_COUNTED = ("/metrics", "/health", "/ping", "/version", "/load", "/server_info")  # vLLM's excluded handlers


def observe(name, buckets, value):
    with LOCK:
        COUNTS[name][next((i for i, b in enumerate(buckets) if value <= b), len(buckets))] += 1
        COUNTS[name + "_sum"] += value


def histogram_lines(metric, help_text, name, buckets, labels):
    out = [f"# HELP {metric} {help_text}", f"# TYPE {metric} histogram"]
    with LOCK:
        counts, total = list(COUNTS[name]), COUNTS[name + "_sum"]
    running = 0
    for bound, n in zip(buckets + ["+Inf"], counts):
        running += n
        out.append(f'{metric}_bucket{{{labels},le="{float(bound) if bound != "+Inf" else bound}"}} {float(running)}')
    out.append(f"{metric}_count{{{labels}}} {float(running)}")
    out.append(f"{metric}_sum{{{labels}}} {total}")
    return out


def load_figures(max_num_seqs):
    """(running, waiting, KV-cache usage 0..1) of the requests now in flight."""
    with LOCK:
        inflight = STATE["running"]
    cap = max_num_seqs or 256  # vLLM's scheduler runs at most --max-num-seqs at once; the rest wait
    running, waiting = min(inflight, cap), max(0, inflight - cap)
    return running, waiting, round(min(1.0, running * KV_PER_REQUEST), 4)


GPU_FAULTS = "/etc/nemofleet-sim/gpu-faults.json"
FATAL_FAULTS = ("xid79", "xid48", "ecc-uncorrectable")  # the GPU cannot compute any more


def gpu_fault():
    """The drill's fault on one of this server's GPUs that breaks inference, or None."""
    try:
        with open(GPU_FAULTS) as f:
            faults = json.load(f)
    except (OSError, ValueError):
        return None
    return next((faults[u] for u in STATE.get("gpus", []) if faults.get(u) in FATAL_FAULTS), None)


def fail(msg, code=1):
    print(msg, file=sys.stderr, flush=True)
    sys.exit(code)


def check_gpus(tp):
    # GPUs granted by the toolkit's legacy hook, or injected as CDI devices
    if not (os.path.exists("/etc/nemofleet-sim/visible") or os.path.exists("/run/nemofleet-sim/cdi")):
        fail("RuntimeError: Failed to infer device type: no CUDA GPUs are available "
             "(was the container started with --gpus or a CDI device?)")
    r = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    if r.returncode != 0:
        fail("RuntimeError: " + (r.stdout.strip() or "nvidia-smi failed"))
    n = len([x for x in r.stdout.split() if x.strip()])
    u = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True)
    STATE["gpus"] = u.stdout.split() if u.returncode == 0 else []
    if tp > n:
        fail(f"ValueError: World size ({tp}) is larger than the number of available GPUs ({n}) in this node.")
    return n


def nvml_ok():
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    args = None

    def log_message(self, fmt, *a):
        sys.stderr.write("INFO:     %s - %s\n" % (self.address_string(), fmt % a))

    def count(self, code):
        p = self.path.split("?")[0]
        if p in NOT_COUNTED:
            return
        key = (p, self.command, f"{code // 100}xx")
        with LOCK:
            COUNTS["http"][key] = COUNTS["http"].get(key, 0) + 1

    def send(self, code, body, ctype="application/json"):
        self.count(code)
        data = body if isinstance(body, bytes) else (json.dumps(body) if not isinstance(body, str) else body).encode()
        try:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a health checker (HAProxy) that hung up once it had the status line, as uvicorn ignores it

    def authorised(self):
        key = os.environ.get("VLLM_API_KEY")
        if not key:
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send(401, {"error": "Unauthorized"})
        return False

    def names(self):
        return self.args.served_model_name or [self.args.model_tag]

    def do_GET(self):
        p = self.path.split("?")[0]
        if p == "/health":
            healthy = (STATE["ready"] and not STATE["dead"] and not STATE["draining"]
                       and os.environ.get("STANDIN_FAIL") != "health")
            if healthy and not nvml_ok():
                STATE["dead"] = True
                healthy = False
            return self.send(200 if healthy else 503, b"", "text/plain")
        if not STATE["ready"]:
            return self.send(503, {"error": "server is starting"})
        if p == "/ping":
            return self.send(200, b"", "text/plain")
        if p == "/version":
            return self.send(200, {"version": VERSION})
        if p == "/metrics":
            name = self.names()[0]
            running, waiting, kv = load_figures(getattr(self.args, "max_num_seqs", None))
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{engine="0",model_name="{name}"}} {float(running)}',
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{engine="0",model_name="{name}"}} {float(waiting)}',
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} {float(kv)}',
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
            ]
            labels = f'engine="0",model_name="{name}"'
            with LOCK:
                success, http = dict(COUNTS["success"]), dict(COUNTS["http"])
            for reason in sorted(set(success) | {"stop"}):
                lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(success.get(reason, 0))}')
            lines += histogram_lines("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                     "ttft", TTFT_BUCKETS, labels)
            lines += histogram_lines("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                                     "e2e", E2E_BUCKETS, labels)
            lines += ["# HELP http_requests_total Total number of requests by method, status and handler.",
                      "# TYPE http_requests_total counter"]
            for (handler, method, status), n in sorted(http.items()):
                lines.append(f'http_requests_total{{handler="{handler}",method="{method}",status="{status}"}} {float(n)}')
            return self.send(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4")
        if p == "/v1/models":
            if not self.authorised():
                return
            data = [{"id": n, "object": "model", "created": int(STATE["started"]), "owned_by": "vllm",
                     "root": self.args.model_tag, "parent": None, "max_model_len": self.args.max_model_len}
                    for n in self.names()]
            return self.send(200, {"object": "list", "data": data})
        return self.send(404, {"detail": "Not Found"})

    def stream(self, req, hold, reasoning, content, finish):
        """Server-sent events as vLLM's OpenAI server sends them (the connection closes after [DONE])."""
        self.count(200)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.end_headers()
        base = {"id": f"chatcmpl-{STATE['requests']}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": req["model"]}
        pieces = [{"role": "assistant", "content": ""}]
        if reasoning:
            pieces.append({"reasoning": reasoning, "reasoning_content": reasoning})
        pieces += [{"content": w + " "} for w in (content or "").split(" ")]
        for k, delta in enumerate(pieces):
            time.sleep(hold / len(pieces))
            last = k == len(pieces) - 1
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish if last else None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def do_POST(self):
        p = self.path.split("?")[0]
        if not STATE["ready"]:
            return self.send(503, {"error": "server is starting"})
        if STATE["draining"]:
            return self.send(503, {"error": "server is shutting down"})
        if p in ("/v1/chat/completions", "/invocations"):
            if p.startswith("/v1") and not self.authorised():
                return
            length = int(self.headers.get("content-length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.send(400, {"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}})
            if req.get("model") not in self.names():
                return self.send(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                                 "type": "NotFoundError", "code": 404}})
            fault = gpu_fault()
            if fault:
                return self.send(500, {"error": {"message": f"EngineCore encountered an issue: CUDA error on its GPU "
                                                            f"({fault}); see the server log", "type": "InternalServerError",
                                                 "code": 500}})
            try:
                hold = min(MAX_HOLD_SECONDS, max(0.0, float(req.get("standin_hold_seconds") or 0)))
            except (TypeError, ValueError):
                hold = 0.0
            t0 = time.time()
            with LOCK:
                STATE["running"] += 1
                COUNTS["completions"] += 1
                nth = COUNTS["completions"]
            try:
                # the first token after half the fixed latency, the answer after all of it (plus any hold)
                time.sleep(LATENCY / 2)
                if FAIL_EVERY and nth % FAIL_EVERY == 0:
                    return self.send(500, {"error": {"message": f"EngineCore encountered an issue (stand-in: completion "
                                                                f"{nth}, every {FAIL_EVERY}th fails)",
                                                     "type": "InternalServerError", "code": 500}})
                observe("ttft", TTFT_BUCKETS, time.time() - t0)
                time.sleep(LATENCY / 2)
                thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
                max_tokens = int(req.get("max_tokens") or 1024)
                reasoning = "The user asks a question; I compute the answer step by step." if thinking else None
                r_tokens = 48 if thinking else 0
                content, finish = "391. The product is (17 x 20) + (17 x 3) = 391.", "stop"
                if thinking and max_tokens <= r_tokens:
                    content, finish = None, "length"  # reasoning starved the answer (docs/recipes.md, max_tokens)
                with LOCK:
                    COUNTS["success"][finish] = COUNTS["success"].get(finish, 0) + 1
                if req.get("stream"):
                    try:
                        return self.stream(req, hold, reasoning, content, finish)
                    finally:
                        observe("e2e", E2E_BUCKETS, time.time() - t0)
                time.sleep(hold)  # generating: in flight for /metrics meanwhile
                observe("e2e", E2E_BUCKETS, time.time() - t0)
                msg = {"role": "assistant", "content": content, "reasoning": reasoning,
                       "reasoning_content": reasoning, "tool_calls": []}
                return self.send(200, {
                    "id": f"chatcmpl-{STATE['requests']}", "object": "chat.completion", "created": int(time.time()),
                    "model": req["model"], "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": r_tokens + 20, "total_tokens": r_tokens + 32},
                })
            finally:
                with LOCK:
                    STATE["running"] -= 1
                    STATE["requests"] += 1
        return self.send(404, {"detail": "Not Found"})


def group_of(args):
    """(port, nodes, rank) of a multi-node launch, or None: vLLM's multiprocessing executor across
    nodes (--nnodes/--node-rank/--master-addr/--master-port) or data parallel across nodes
    (--data-parallel-size > --data-parallel-size-local, --data-parallel-address/-rpc-port)."""
    if (args.nnodes or 1) > 1:
        if args.node_rank is None or not 0 <= args.node_rank < args.nnodes:
            fail(f"ValueError: node_rank {args.node_rank} is not in [0, {args.nnodes})")
        if args.node_rank > 0 and not args.headless:
            fail("ValueError: only the node of rank 0 serves the API; start the others with --headless")
        return args.master_addr or "127.0.0.1", args.master_port or 29501, args.nnodes, args.node_rank
    dp, local = args.data_parallel_size or 1, args.data_parallel_size_local
    if local and dp > local:
        if dp % local:
            fail(f"ValueError: data_parallel_size {dp} is not a multiple of data_parallel_size_local {local}")
        start = args.data_parallel_start_rank or 0
        if start and not args.headless:
            fail("ValueError: --data-parallel-start-rank is for the headless nodes")
        return args.data_parallel_address or "127.0.0.1", args.data_parallel_rpc_port or 13345, dp // local, start // local
    return None


def group_shape(args):
    """What every member must agree on (vLLM would hang or fail on a mismatch)."""
    return {"tp": args.tensor_parallel_size or 1, "pp": args.pipeline_parallel_size or 1,
            "dp": args.data_parallel_size or 1, "model": (args.served_model_name or [""])[0],
            "max_model_len": args.max_model_len}


def head_rendezvous(port, nodes, shape):
    """Rank 0: listen on the rendezvous port (every address, like torch's TCPStore), take one
    'hello' line per other node, check it, answer 'ok'; ready once all joined. A member that
    drops after that kills the server (vLLM's engine dies with a lost worker)."""
    import socket

    srv = socket.socket(socket.AF_INET6 if ":" in os.environ.get("VLLM_HOST_IP", "") else socket.AF_INET)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("", port))
    srv.listen(64)
    print(f"INFO rendezvous: waiting for {nodes - 1} node(s) on port {port}", flush=True)
    joined = {}

    def watch(conn, rank):
        conn.settimeout(None)
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        print(f"RuntimeError: node {rank} left the group (connection lost); the engine is dead", file=sys.stderr, flush=True)
        os._exit(1)

    while len(joined) < nodes - 1:
        conn, peer = srv.accept()
        conn.settimeout(10)
        try:
            line = conn.makefile("r").readline()
            hello = json.loads(line) if line.strip() else None
        except (OSError, ValueError):
            hello = None
        if not hello:  # a port check (the worker's unit waiting for us, a health check): not a node
            conn.close()
            continue
        rank = hello.get("rank")
        if hello.get("shape") != shape or rank in joined or not isinstance(rank, int) or not 0 < rank < nodes:
            why = f"node {rank} from {peer[0]} does not match the head ({hello.get('shape')} vs {shape}, nodes {nodes})"
            conn.sendall((json.dumps({"error": why}) + "\n").encode())
            conn.close()
            fail(f"RuntimeError: {why}")
        conn.sendall(b'{"ok": true}\n')
        joined[rank] = (conn, peer[0])
        print(f"INFO rendezvous: node {rank} joined from {peer[0]} ({len(joined)}/{nodes - 1})", flush=True)
    for rank, (conn, _) in joined.items():
        threading.Thread(target=watch, args=(conn, rank), daemon=True).start()
    # later connections (port checks) are accepted and closed, so the port keeps answering
    threading.Thread(target=lambda: [c.close() for c, _ in iter(srv.accept, None)], daemon=True).start()


def worker_rendezvous(addr, port, rank, shape, timeout=600):
    """A headless node: connect to the head's rendezvous port (retrying), say hello, wait for the
    answer, then stay connected; losing the head ends this process (systemd restarts it)."""
    import socket

    deadline = time.time() + timeout
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            conn.sendall((json.dumps({"rank": rank, "shape": shape}) + "\n").encode())
            answer = json.loads(conn.makefile("r").readline() or "{}")
            break
        except (OSError, ValueError) as exc:
            if time.time() > deadline:
                fail(f"RuntimeError: could not reach the head at {addr}:{port} within {timeout}s ({exc})")
            time.sleep(1)
    if not answer.get("ok"):
        fail(f"RuntimeError: the head at {addr}:{port} refused node {rank}: {answer.get('error')}")
    print(f"INFO rendezvous: node {rank} joined the head at {addr}:{port}", flush=True)
    conn.settimeout(None)
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    fail(f"RuntimeError: lost the head at {addr}:{port}; this node stops")


def main(argv):
    if argv[:1] != ["serve"]:
        fail(f"vllm: error: argument subparser: invalid choice: {argv[:1]}", 2)
    parser = vllm_flags.build_argparser(VERSION)
    parser.prog = "vllm"
    args = parser.parse_args(argv[1:])
    if not args.model_tag:
        fail("vllm: error: the following arguments are required: model_tag", 2)
    Handler.args = args
    print(f"INFO vLLM API server version {VERSION} (nemofleet stand-in)", flush=True)
    print(f"INFO non-default args: {json.dumps({k: v for k, v in vars(args).items() if v not in (None, False)})}", flush=True)
    if not os.path.exists(os.path.join(args.model_tag, "config.json")):
        fail(f"OSError: {args.model_tag} does not appear to have a file named config.json.")
    if args.reasoning_parser_plugin and not os.path.exists(args.reasoning_parser_plugin):
        fail(f"FileNotFoundError: reasoning parser plugin {args.reasoning_parser_plugin} not found")
    group = group_of(args)
    # the GPUs this node runs: the world (TP x PP) spread evenly over the nodes
    world = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)
    check_gpus(world // group[2] if group and (args.nnodes or 1) > 1 else (args.tensor_parallel_size or 1))
    if group and group[3] > 0:  # a headless node: no API; it lives as long as its link to the head
        # docker stop: leave at once (PID 1 in the container ignores SIGTERM without a handler)
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        worker_rendezvous(group[0], group[1], group[3], group_shape(args))
        return
    # docker stop while loading: leave at once (PID 1 ignores SIGTERM without a handler)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    release = os.environ.get("STANDIN_RELEASE", "base")
    try:
        host_fail = json.load(open("/etc/nemofleet-sim/profile.json")).get("standin_fail_release")
    except (OSError, ValueError):
        host_fail = None
    # the engine loads before the API listens: connections are refused until then, as with vLLM
    if group:  # the API is ready once every node has joined (vLLM's engine needs them all)
        head_rendezvous(group[1], group[2], group_shape(args))
    time.sleep(float(os.environ.get("STANDIN_STARTUP_SECONDS", "2")))
    if os.environ.get("STANDIN_FAIL") == "start" or (host_fail and host_fail == release):
        print("RuntimeError: Engine core initialization failed (STANDIN_FAIL=start)", file=sys.stderr, flush=True)
        os._exit(1)
    server = ThreadingHTTPServer((args.host or "0.0.0.0", args.port or 8000), Handler)
    STATE["ready"] = True

    def drain_then_stop():
        # like vLLM's --shutdown-timeout: no new requests, those in flight finish, then exit
        STATE["draining"] = True
        deadline = time.time() + (getattr(args, "shutdown_timeout", None) or 0)
        while time.time() < deadline:
            with LOCK:
                if STATE["running"] == 0:
                    break
            time.sleep(0.1)
        with LOCK:
            left = STATE["running"]
        print(f"INFO:     Shutting down ({left} request(s) still in flight)", flush=True)
        server.shutdown()

    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=drain_then_stop).start())
    print("INFO:     Application startup complete.", flush=True)
    print(f"INFO:     Uvicorn running on http://{args.host or '0.0.0.0'}:{args.port or 8000}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
