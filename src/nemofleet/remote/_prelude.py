# nemofleet's host prelude (remote/_prelude.py): remote.source() sends it before a program's own
# text, which follows below it (its second part only to a program that speaks HTTP; remote/__init__.py
# says why one prelude). The host's files and the servers a program asks are input that may be
# hostile: a link a peer's seed copy planted, a FIFO where a file should be, a server that redirects
# elsewhere or trickles a byte at a time. These are the only ways in which the programs read, write
# and remove such files and speak HTTP.
import os
import stat
import time

# never through a link at the last part of a path; opening a FIFO never waits for its other end
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def is_inside(name):
    """A relative path that stays inside its directory by its text (no absolute path, no `..`,
    no empty part, no NUL)."""
    if not isinstance(name, str) or not name or "\x00" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def open_dir(root, rel=""):
    """A descriptor of the directory root/rel with each part of rel opened without following a
    link, or None (rel leaves root, or a part of it is a link or no directory). root itself, an
    argument from the controller, may be a link."""
    if rel and not is_inside(rel):
        return None
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    for part in rel.split("/") if rel else ():
        try:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
        except (OSError, ValueError):
            sub = None
        os.close(fd)
        if sub is None:
            return None
        fd = sub
    return fd


def below(root, name, fn, *args):
    """fn(last part of name, *args, dir_fd=its directory) for a path `name` (text from a file)
    inside root whose directories are no links (open_dir); None when it is not one."""
    if not is_inside(name):
        return None
    head, _, base = name.rpartition("/")
    fd = open_dir(root, head)
    if fd is None:
        return None
    try:
        return fn(base, *args, dir_fd=fd)
    finally:
        os.close(fd)


def open_regular(path, flags=os.O_RDONLY, dir_fd=None):
    """A descriptor of the regular file at path, or None: a link, a FIFO, a device or a directory
    is not one (and is never waited on). flags may add O_WRONLY, O_APPEND, O_CREAT (mode 0644)."""
    try:
        fd = os.open(path, flags | NOFOLLOW, 0o644, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def file_size(path, dir_fd=None):
    """The size of the regular file at path (a link is not one), or None."""
    try:
        st = os.lstat(path, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def read_file(path, limit, dir_fd=None):
    """At most `limit` bytes of the regular file at path (open_regular), or None."""
    fd = open_regular(path, dir_fd=dir_fd)
    if fd is None:
        return None
    chunks = []
    try:
        while limit > 0:
            data = os.read(fd, min(limit, 1 << 24))
            if not data:
                break
            chunks.append(data)
            limit -= len(data)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_json(path, limit=64 << 20, dir_fd=None):
    """The JSON value of a regular file of at most `limit` bytes, or None."""
    data = read_file(path, limit + 1, dir_fd)
    if data is None or len(data) > limit:
        return None
    import json
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def write_file(path, data, dir_fd=None):
    """path's new content (bytes, mode 0644), whole or not at all: written to path.tmp, created
    anew (a leftover or a link there is removed, never written through), then renamed over path
    (which replaces a link at path rather than following it). One writer of a path at a time."""
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def append_file(path, data):
    """data appended to the regular file at path (made, 0644, when there is none); OSError when
    path is a link, a FIFO or anything but a regular file."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    if fd is None:
        raise OSError("%s is not a regular file" % path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def remove_tree(path, dir_fd=None):
    """The file, link or directory tree at path removed, each directory walked by its descriptor:
    a link is removed itself, never followed. What cannot be removed stays (no error)."""
    try:
        if not stat.S_ISDIR(os.lstat(path, dir_fd=dir_fd).st_mode):
            os.unlink(path, dir_fd=dir_fd)
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=dir_fd)
        try:
            for name in os.listdir(fd):
                remove_tree(name, fd)
        finally:
            os.close(fd)
        os.rmdir(path, dir_fd=dir_fd)
    except (OSError, ValueError, RecursionError):
        pass


# ---- a model directory as huggingface_hub's `hf download --local-dir` leaves it, and the weights
# check's completion marker in it (weights_check writes it; it and models_on_disk trust it alike)

INDEX = "model.safetensors.index.json"
CACHE = ".cache/huggingface/download"
# a size or an offset no file system holds: anything larger (or negative) is not a size
SIZE_LIMIT = 2 ** 63


def is_size(n):
    return type(n) is int and 0 <= n < SIZE_LIMIT


def incomplete_files(d):
    """How many *.incomplete files huggingface_hub left in d's cache (a linked cache: none)."""
    cache = open_dir(d, CACHE)
    if cache is None:
        return 0
    try:
        return sum(1 for _, _, names, _ in os.fwalk(".", dir_fd=cache) for n in names if n.endswith(".incomplete"))
    finally:
        os.close(cache)


def marker_files(d, marker):
    """The {file: size} a completion marker (its JSON value) lists when each is still a regular
    file of that size inside d (below(): no link on the way is followed), else None."""
    listed = marker.get("files") if isinstance(marker, dict) else None
    if isinstance(listed, dict) and all(is_size(n) and below(d, f, file_size) == n for f, n in listed.items()):
        return listed
    return None

# ---- the run's deadline and HTTP (remote.source sends this part to the programs that call http_request)

# The run's deadline: deadline(seconds) arms an alarm that interrupts whatever waits when it comes
# (TimeoutError, an OSError: a server trickling a byte a second keeps no read going past it), and
# each socket's timeout is the time left. A per-read timeout alone bounds nothing.
END = None  # type: float | None


def _expired(*_):
    raise TimeoutError("the deadline passed")


def _alarm(end):
    import _signal
    _signal.signal(_signal.SIGALRM, _expired)
    _signal.setitimer(_signal.ITIMER_REAL, max(0.0, end - time.monotonic()))  # 0: none (passed)


def deadline(seconds):
    """The run ends within `seconds` from now (TimeoutError where it waits then)."""
    global END
    END = time.monotonic() + seconds
    _alarm(END)


def time_left(end=None):
    """Seconds left before `end` (the run's deadline by default); TimeoutError once it passed."""
    left = (end or END or 0.0) - time.monotonic()  # no deadline set: no time left (fails closed)
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


def _origin(url):
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is not a number
        port = None
    return parts.scheme, (parts.hostname or "").lower(), port


def http_request(url, headers=None, data=None, limit=1 << 20, hops=0, seconds=None):
    """(status, body, headers) of one HTTP(S) request, within the run's deadline (and within
    `seconds` of now, when given). The one rule of every program that speaks HTTP: http and https
    only; at most `hops` redirects followed (an instance's answer is its own: 0), each to http(s)
    only, and `Authorization` dropped for good once one leaves the origin (scheme, host, port), as
    `requests` does; a redirect not followed is the answer (its 3xx); a body over `limit` bytes is
    no answer (ValueError). OSError when no answer came (refused, unreachable, the deadline)."""
    import urllib.error
    import urllib.request

    class Redirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, hdrs, newurl):
            n = getattr(req, "hops", 0) + 1
            if n > hops or _origin(newurl)[0] not in ("http", "https"):
                return None
            new = super().redirect_request(req, fp, code, msg, hdrs, newurl)
            if new is not None:
                setattr(new, "hops", n)
                if _origin(newurl) != _origin(req.full_url):  # each hop copies the one before
                    for name in [k for k in new.headers if k.lower() == "authorization"]:
                        del new.headers[name]
            return new

    if _origin(url)[0] not in ("http", "https"):
        raise ValueError("not an http(s) URL")
    end = END if seconds is None else min(END, time.monotonic() + seconds)
    req = urllib.request.Request(url, data=data, headers=headers or {})
    timeout = time_left(end)
    _alarm(end)
    try:
        try:
            answer = urllib.request.build_opener(Redirect).open(req, timeout=timeout)
        except urllib.error.HTTPError as exc:  # 4xx, 5xx, a redirect not followed
            answer = exc
        with answer:
            status, got, body = answer.status, answer.headers, answer.read(limit + 1)
    finally:
        _alarm(END)
    if len(body) > limit:
        raise ValueError("an answer over %d bytes" % limit)
    return status, body, got

# ---- the program
