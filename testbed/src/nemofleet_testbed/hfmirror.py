"""A small Hugging Face Hub mirror for the testbed (stdlib only).

Serves repos from a directory through the real Hub endpoints `hf download` uses
(what huggingface_hub needs of an HF_ENDPOINT): revision info (id, sha, siblings), the tree listing, HEAD/GET
resolve with X-Repo-Commit, ETag, Content-Length and Range. Every request is appended to
a log so tests can count exactly what a run asked for, and the bytes of every file download to
`<log>.bytes`; files are streamed through one uplink whose rate a file beside the log may bound
(`uplink-rate`, bytes/s), so a bench can measure origin bytes and a slow mirror.

Layout: ROOT/<org>/<name>/refs.json ({"main": "<sha>", ...}) and ROOT/<org>/<name>/<sha>/<files>.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
_lock = threading.Lock()
_entries: dict = {}  # (path, size, mtime) -> tree entry: a large file is hashed once, not per request
CHUNK = 1 << 20


class Uplink:
    """The mirror's one uplink, shared by every download: at most `rate` bytes/s in all (None:
    unbounded). The rate is read from a file beside the request log (bytes/s; absent: unbounded),
    so a bench can change it without restarting the mirror."""

    def __init__(self):
        self.lock = threading.Lock()
        self.next_free = 0.0
        self.path = None
        self._rate, self._read = None, 0.0

    def rate(self):
        import time

        if self.path and time.monotonic() - self._read > 1:
            self._read = time.monotonic()
            try:
                self._rate = int(open(self.path).read().strip()) or None
            except (OSError, ValueError):
                self._rate = None
        return self._rate

    def take(self, n: int) -> None:
        import time

        rate = self.rate()
        if not rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / rate
        if start + n / rate > now:
            time.sleep(start + n / rate - now)


UPLINK = Uplink()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, root: str, repo_id: str):
        self.dir = os.path.join(root, repo_id)
        self.id = repo_id

    def exists(self) -> bool:
        return os.path.isfile(os.path.join(self.dir, "refs.json"))

    def commit(self, rev: str) -> str | None:
        refs = json.load(open(os.path.join(self.dir, "refs.json")))
        if rev in refs:
            return refs[rev]
        if re.fullmatch(r"[0-9a-f]{40}", rev) and os.path.isdir(os.path.join(self.dir, rev)):
            return rev
        return None

    def files(self, sha: str) -> list[dict]:
        base = os.path.join(self.dir, sha)
        out = []
        for root, _, names in os.walk(base):
            for n in sorted(names):
                p = os.path.join(root, n)
                rel = os.path.relpath(p, base)
                st = os.stat(p)
                k = (p, st.st_size, st.st_mtime_ns)
                if k not in _entries:
                    _entries[k] = _entry(p, rel, st.st_size)
                out.append(_entries[k])
        return sorted(out, key=lambda e: e["path"])


def _entry(path: str, rel: str, size: int) -> dict:
    """A file's tree entry, hashed in chunks (a generated model of several GB is never in memory)."""
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha1.update(chunk)
            sha256.update(chunk)
    entry = {"type": "file", "oid": sha1.hexdigest(), "size": size, "path": rel}
    if rel.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": sha256.hexdigest(), "size": size, "pointerSize": 134}
    return entry


class Handler(BaseHTTPRequestHandler):
    root = "."
    log_path = None
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _log(self):
        if self.log_path:
            with _lock, open(self.log_path, "a") as f:
                f.write(f"{self.command} {self.path} {self.headers.get('Range', '-')}\n")

    def _send(self, code, body=b"", headers=None, head=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _file(self, code, path, start, end, headers):
        """Stream bytes [start, end) of a file through the uplink; the bytes sent are counted in
        `<log>.bytes` (one line per download: bytes, path), what the fan-out bench adds up."""
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        try:
            with open(path, "rb") as f:
                f.seek(start)
                while sent < end - start:
                    chunk = f.read(min(CHUNK, end - start - sent))
                    if not chunk:
                        break
                    UPLINK.take(len(chunk))
                    self.wfile.write(chunk)
                    sent += len(chunk)
        finally:
            if self.log_path:
                with _lock, open(self.log_path + ".bytes", "a") as out:
                    out.write(f"{sent} {self.path}\n")

    def _error(self, code, err, msg, head=False):
        self._send(code, {"error": msg}, {"X-Error-Code": err, "X-Error-Message": msg}, head=head)

    def _resolve(self, org, name, rev, head=False):
        """(repo, commit) or None after answering 404 with the Hub's error code."""
        repo = Repo(self.root, f"{unquote(org)}/{unquote(name)}")
        if not repo.exists():
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        sha = repo.commit(unquote(rev))
        if not sha:
            self._error(404, "RevisionNotFound", "Invalid rev id", head)
            return None
        return repo, sha

    def do_HEAD(self):
        self._handle(head=True)

    def do_GET(self):
        self._handle(head=False)

    def do_POST(self):
        self._log()
        m = re.fullmatch(r"/api/models/([^/]+)/([^/]+)/paths-info/([^/]+)", urlparse(self.path).path)
        if not m:
            return self._error(404, "EntryNotFound", "not found")
        found = self._resolve(m.group(1), m.group(2), m.group(3))
        if not found:
            return None
        repo, sha = found
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        try:
            paths = json.loads(body).get("paths", [])
        except ValueError:
            from urllib.parse import parse_qs
            paths = parse_qs(body).get("paths", [])
        return self._send(200, [f for f in repo.files(sha) if f["path"] in paths])

    def _handle(self, head):
        self._log()
        url = urlparse(self.path)
        path = url.path
        m = re.fullmatch(r"/api/models/([^/]+)/([^/]+)/revision/(.+)", path)
        if m:
            found = self._resolve(m.group(1), m.group(2), m.group(3), head)
            if not found:
                return None
            repo, sha = found
            files = repo.files(sha)
            return self._send(200, {"id": repo.id, "modelId": repo.id, "sha": sha, "private": False,
                                    "siblings": [{"rfilename": f["path"]} for f in files],
                                    "lastModified": "2026-11-01T00:00:00.000Z"}, head=head)
        m = re.fullmatch(r"/api/models/([^/]+)/([^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            found = self._resolve(m.group(1), m.group(2), m.group(3), head)
            if not found:
                return None
            repo, sha = found
            prefix = (m.group(4) or "").strip("/")
            files = [f for f in repo.files(sha) if not prefix or f["path"].startswith(prefix + "/")]
            return self._send(200, files, head=head)
        m = re.fullmatch(r"/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            found = self._resolve(m.group(1), m.group(2), m.group(3), head)
            if not found:
                return None
            repo, sha = found
            rel = unquote(m.group(4))
            entry = next((f for f in repo.files(sha) if f["path"] == rel), None)
            if entry is None:
                return self._error(404, "EntryNotFound", f"{rel} does not exist", head)
            path = os.path.join(repo.dir, sha, rel)
            size = entry["size"]
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            if "lfs" in entry:
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
            rng = self.headers.get("Range")
            if rng and not head:
                mm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                if mm:
                    start = int(mm.group(1))
                    end = min(int(mm.group(2)) if mm.group(2) else size - 1, size - 1)
                    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
                    headers["Content-Length"] = str(max(0, end + 1 - start))
                    return self._file(206, path, start, end + 1, headers)
            headers["Content-Length"] = str(size)
            if head:
                return self._send(200, b"", headers, head=True)
            return self._file(200, path, 0, size, headers)
        return self._error(404, "EntryNotFound", "not found", head)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--log")
    a = ap.parse_args(argv)
    Handler.root = a.root
    Handler.log_path = a.log
    if a.log:
        UPLINK.path = os.path.join(os.path.dirname(a.log), "uplink-rate")  # bytes/s; absent: unbounded
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
