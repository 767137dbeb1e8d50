"""Questions to the Hugging Face Hub (or its mirror), asked from the host (stdlib only).

The host, not the controller, reaches the mirror; the token is read on the host from its 0600
file (TOKEN_FILE: a path, never the token itself on a command line).

    python3 -I -S hub.py commit ENDPOINT REPO REVISION TOKEN_FILE DEADLINE
        The 40-hex commit REVISION names: prints {"sha": ...} or {"error": sentence}; exit 0.
    python3 -I -S hub.py precheck DIR REPO REVISION ENDPOINT TOKEN_FILE PRESENT_BYTES DEADLINE
        Before any byte is fetched: is the mirror up, does REPO@REVISION exist, is there disk in
        DIR for what is still missing (PRESENT_BYTES are there)? Prints {"sha", "total", "need",
        "free"}, or one sentence on stderr and exit 1.

DEADLINE: the seconds the whole run may take (below the controller's `timeout`). The token goes
only where it was meant to, by the prelude's rule (http_request): on a redirect to another scheme,
host or port the `Authorization` header is dropped (and stays dropped for the hops after it), as
`requests` does; a redirect to anything but http(s) is not followed. The mirror's answers are input
that may be wrong or hostile (not JSON, not UTF-8, of the wrong type, numbers of any size, a
redirect loop, a trickle): every one ends in a sentence, never a traceback, and never in a fetch
of the weights.
"""

import json
import os
import shutil
import sys
import urllib.parse

TYPE_CHECKING = False
if TYPE_CHECKING:  # the prelude (remote/_prelude.py), sent before this text, defines these
    from ._prelude import *  # noqa: F403

# the revision answer is a few KB; the file list of a 232 GB checkpoint is well under 1 MB
ANSWER_LIMIT = 64 * 1024 * 1024
TOKEN_LIMIT = 4096
MAX_REDIRECTS = 5


class Refused(Exception):
    """A sentence for the operator (never holding the token)."""


class Status(Exception):
    """An answer that is not a 2xx: its status and the Hub's X-Error-Code."""

    def __init__(self, code, headers):
        super().__init__(code)
        self.code, self.error_code = code, (headers.get("X-Error-Code", "") if headers else "")[:80]


def read_token(token_file):
    """The HF_TOKEN of the env file, or None when there is no file (or it sets none)."""
    if not token_file or not os.path.lexists(token_file):
        return None
    data = read_file(token_file, 1 << 16)
    if data is None:
        raise Refused("the token file %s is not a regular file (or is unreadable)" % token_file)
    token = None
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("HF_TOKEN="):
            token = line.split("=", 1)[1].strip()
    if token is None or token == "":
        return None
    # one visible ASCII word: anything else would end the header (CR, LF) or is not a token
    if len(token) > TOKEN_LIMIT or not all("!" <= c <= "~" for c in token):
        raise Refused("the HF_TOKEN in %s is not a token (one word of visible ASCII characters)" % token_file)
    return token


def get_json(url, token):
    headers = {"User-Agent": "nemofleet"}
    if token:
        headers["Authorization"] = "Bearer " + token
    status, data, got = http_request(url, headers, limit=ANSWER_LIMIT, hops=MAX_REDIRECTS)
    if not 200 <= status < 300:
        raise Status(status, got)
    return json.loads(data)


def revision_sha(endpoint, repo, rev, token):
    """The 40-hex commit the mirror says REVISION is, or None when its answer names none."""
    info = get_json("%s/api/models/%s/revision/%s" % (endpoint.rstrip("/"), urllib.parse.quote(repo, safe="/"),
                                                      urllib.parse.quote(rev, safe="")), token)
    sha = info.get("sha") if isinstance(info, dict) else None
    return sha if isinstance(sha, str) and len(sha) == 40 and all(c in "0123456789abcdef" for c in sha) else None


def reason(exc):
    why = getattr(exc, "reason", None) or exc
    return str(why)[:200] or exc.__class__.__name__


def commit(endpoint, repo, rev, token_file):
    try:
        token = read_token(token_file)
        sha = revision_sha(endpoint, repo, rev, token)
        if sha is None:
            return {"error": "%s answered no commit for %s at revision %s" % (endpoint, repo, rev)}
        return {"sha": sha}
    except Refused as exc:
        return {"error": str(exc)}
    except Status as exc:
        return {"error": "%s has no revision %s on %s (HTTP %d)" % (repo, rev, endpoint, exc.code)}
    except (ValueError, RecursionError):
        return {"error": "%s answered something that is not the Hub's JSON for %s" % (endpoint, repo)}
    except Exception as exc:  # OSError, http.client's errors, the deadline: the host cannot reach it
        return {"error": "%s is unreachable from the host (%s)" % (endpoint, reason(exc))}


def precheck(d, repo, rev, endpoint, token_file, present):
    try:
        present = int(present)
    except ValueError:
        raise Refused("the bytes present (%r) are not a number" % present[:40])
    token = read_token(token_file)
    try:
        sha = revision_sha(endpoint, repo, rev, token)
        if sha is None:
            raise Refused("%s answered no commit for %s at revision %s; check the mirror" % (endpoint, repo, rev))
        tree = get_json("%s/api/models/%s/tree/%s?recursive=true&expand=false" % (
            endpoint.rstrip("/"), urllib.parse.quote(repo, safe="/"), sha), token)
    except Status as exc:
        if exc.code in (401, 403):
            raise Refused("%s on %s needs a Hugging Face token (HTTP %d %s): set hf_token for this host"
                          % (repo, endpoint, exc.code, exc.error_code))
        raise Refused("%s at revision %s is not on %s (HTTP %d %s); check the model repo and revision"
                      % (repo, rev, endpoint, exc.code, exc.error_code))
    except (ValueError, RecursionError):
        raise Refused("%s answered something that is not the Hub's JSON for %s; the weights in %s were "
                      "left as they are" % (endpoint, repo, d))
    except Refused:
        raise
    except Exception as exc:
        raise Refused("Hugging Face mirror %s is unreachable (%s); the weights in %s were left as they are"
                      % (endpoint, reason(exc), d))
    if not isinstance(tree, list):
        raise Refused("%s answered a file list for %s that is not a list; the weights in %s were left as "
                      "they are" % (endpoint, repo, d))
    total = 0
    for f in tree:
        if not isinstance(f, dict) or f.get("type") != "file":
            continue
        size = f.get("size") or 0
        if not is_size(size):
            raise Refused("%s gave a file of %s a size that is not one (%.40r); the weights in %s were left "
                          "as they are" % (endpoint, repo, size, d))
        total += size
    need = int(max(0, total - present) * 1.1)
    p = d
    while p and not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    try:
        free = shutil.disk_usage(p or "/").free
    except OSError as exc:
        raise Refused("the free disk of %s cannot be read (%s)" % (d, exc.strerror or exc))
    if free < need:
        raise Refused("not enough disk for %s in %s: %.1f GB free, %.1f GB needed (model + 10%%)"
                      % (repo, d, free / 1e9, need / 1e9))
    return {"sha": sha, "total": total, "need": need, "free": free}


def main(argv):
    try:
        seconds = float(argv[-1])
    except (IndexError, ValueError):
        seconds = 0
    seconds = seconds if 0 < seconds < 86400 else 0
    if argv[:1] == ["commit"] and len(argv) == 6 and seconds:
        deadline(seconds)
        sys.stdout.write(json.dumps(commit(*argv[1:5])) + "\n")
        return
    if argv[:1] == ["precheck"] and len(argv) == 8 and seconds:
        deadline(seconds)
        try:
            sys.stdout.write(json.dumps(precheck(*argv[1:7])) + "\n")
        except Refused as exc:
            sys.stderr.write(str(exc) + "\n")
            sys.exit(1)
        return
    sys.stderr.write("usage: hub.py commit ENDPOINT REPO REVISION TOKEN_FILE DEADLINE | "
                     "precheck DIR REPO REVISION ENDPOINT TOKEN_FILE PRESENT_BYTES DEADLINE\n")
    sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
