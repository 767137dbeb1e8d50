"""Testbed reuse: a container of the same name made by another checkout is replaced (or, when it
is not a test host at all, refused with one sentence), never silently reused."""
from nemofleet_testbed import DIR_LABEL, OWNER_LABEL, reuse_decision

PUB = "ssh-ed25519 AAAAC3Nz-mine nemofleet-testbed\n"
NAME = "nf-tb-h200-1"


def test_no_container_is_created():
    assert reuse_decision(NAME, None, "f00d", PUB) == ("create", None)


def test_our_own_host_is_reused():
    assert reuse_decision(NAME, {"nemofleet.testbed": "1", OWNER_LABEL: "f00d"}, "f00d", PUB) == ("reuse", None)


def test_unlabelled_host_that_takes_our_key_is_reused():
    labels = {"nemofleet.testbed": "1"}  # made before the owner label existed
    assert reuse_decision(NAME, labels, "f00d", PUB, authorized=PUB) == ("reuse", None)


def test_another_checkouts_host_is_replaced_with_a_sentence():
    labels = {"nemofleet.testbed": "1", OWNER_LABEL: "beef", DIR_LABEL: "/work/other/.testbed"}
    action, why = reuse_decision(NAME, labels, "f00d", PUB, here="/work/main/.testbed")
    assert action == "replace"
    assert why == ("nf-tb-h200-1 is a test host of another testbed (/work/other/.testbed) that does not accept "
                   "this testbed's SSH key (/work/main/.testbed); replacing it (set NEMOFLEET_TESTBED_NAME to keep both)")
    action, why = reuse_decision(NAME, {"nemofleet.testbed": "1"}, "f00d", PUB, authorized="ssh-ed25519 other x\n")
    assert action == "replace" and "an older checkout" in why


def test_a_foreign_container_of_that_name_is_refused():
    action, why = reuse_decision(NAME, {"maintainer": "someone"}, "f00d", PUB)
    assert action == "refuse"
    assert why == ("a container named nf-tb-h200-1 exists and is not a nemofleet test host; remove it "
                   "(docker rm -f nf-tb-h200-1) or choose another prefix with NEMOFLEET_TESTBED_NAME")
    assert reuse_decision(NAME, {}, "f00d", PUB)[0] == "refuse"


def test_mirror_streams_files_counts_their_bytes_and_bounds_its_uplink(tmp_path):
    """The testbed's Hub mirror: a file download (whole or a Range) is streamed and its bytes
    counted in <log>.bytes (API calls are not); `uplink-rate` beside the log bounds all downloads."""
    import hashlib
    import threading
    import time
    import urllib.request
    from http.server import ThreadingHTTPServer

    from nemofleet_testbed import hfmirror, tinymodel

    sha = tinymodel.build(str(tmp_path / "repos"), "org/m")
    log = tmp_path / "requests.log"
    hfmirror.Handler.root, hfmirror.Handler.log_path = str(tmp_path / "repos"), str(log)
    hfmirror.UPLINK.path = str(tmp_path / "uplink-rate")
    server = ThreadingHTTPServer(("127.0.0.1", 0), hfmirror.Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        shard = "model-00001-of-00002.safetensors"
        tree = {f["path"]: f for f in __import__("json").load(urllib.request.urlopen(f"{base}/api/models/org/m/tree/{sha}"))}
        data = urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        assert hashlib.sha256(data).hexdigest() == tree[shard]["lfs"]["oid"] and len(data) == tree[shard]["size"]
        req = urllib.request.Request(f"{base}/org/m/resolve/{sha}/{shard}", headers={"Range": "bytes=100-"})
        part = urllib.request.urlopen(req)
        assert part.status == 206 and part.read() == data[100:]
        (tmp_path / "uplink-rate").write_text(str(len(data)))  # one shard per second
        hfmirror.UPLINK._read = 0.0
        t0 = time.monotonic()
        urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        urllib.request.urlopen(f"{base}/org/m/resolve/{sha}/{shard}").read()
        assert time.monotonic() - t0 >= 1.5
        # the mirror counts a download after its last byte is sent, so the client may read it all first
        # (and a count may land after the next download's): wait (bounded) for the fourth line, any order
        deadline = time.monotonic() + 5
        while len((tmp_path / "requests.log.bytes").read_text().splitlines()) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        counted = [int(line.split()[0]) for line in (tmp_path / "requests.log.bytes").read_text().splitlines()]
        assert sorted(counted) == sorted([len(data), len(data) - 100, len(data), len(data)])
    finally:
        server.shutdown()
        hfmirror.UPLINK.path = None
