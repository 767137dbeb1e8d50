"""The air-gapped path (issue 50, docs/air-gap.md): one signed bundle made from the testbed's plans,
verified, then bare hosts converged from it with the Hub and package mirrors stopped and each
host's outbound packets counted by its firewall; a second run changes nothing and reads no bundle
bytes; a flipped byte, an unknown signer and a bundle missing the model each end in one sentence
with nothing changed on any host."""
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import ROOT, Run, on, pyinfra, mirror_log, clear_mirror_log, stage

pytestmark = pytest.mark.e2e
HOSTS = ["a100-1", "h100-1", "h200-1"]
NF = str(ROOT / ".venv" / "bin" / "nemofleet") if (ROOT / ".venv" / "bin" / "nemofleet").exists() else "nemofleet"
IMAGE = "vllm/vllm-openai:v0.27.1"
# each host's OUTPUT and FORWARD traffic out of its eth0 to anything but the testbed's hosts and the
# controller (the network's gateway) lands on the last rule of NFCOUNT, whose packets are counted
COUNT_SETUP = ("iptables -N NFCOUNT && iptables -A NFCOUNT ! -o eth0 -j RETURN && {allow} "
               "iptables -A NFCOUNT -j RETURN && iptables -I OUTPUT -j NFCOUNT && iptables -I FORWARD -j NFCOUNT")
COUNT_READ = "iptables -L NFCOUNT -v -x -n | tail -1 | awk '{print $1}'"
COUNT_DROP = ("iptables -D OUTPUT -j NFCOUNT; iptables -D FORWARD -j NFCOUNT; iptables -F NFCOUNT; "
              "iptables -X NFCOUNT; true")


def nemofleet(*args) -> subprocess.CompletedProcess:
    return subprocess.run([NF, *args], cwd=ROOT, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
                          env={**os.environ, "NEMOFLEET_TESTBED_HOSTS": ",".join(HOSTS)})


def deploy_reading(bundle: str | None) -> tuple[Run, int]:
    """A converge of HOSTS with --data bundle=FILE (None: without), and the bytes the controller's
    pyinfra process read in all (/proc/self/io rchar at its exit: the bundle's and everything else)."""
    code = ("import atexit, runpy, sys; atexit.register(lambda: sys.stderr.write('\\nRCHAR ' + "
            "open('/proc/self/io').read().split()[1] + '\\n')); sys.argv = ['pyinfra'] + sys.argv[1:]; "
            "runpy.run_module('pyinfra', run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code, "-y", "inventories/testbed.py", "deploys/nemotron.py",
                        *(["--data", f"bundle={bundle}"] if bundle else [])], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL, env={**os.environ, "NEMOFLEET_TESTBED_HOSTS": ",".join(HOSTS)})
    rchar = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("RCHAR ")]
    return Run(p), (rchar[-1] if rchar else -1)


def resign(src: str, dst: str, key: str, keep=lambda part: True) -> None:
    """A copy of the bundle `src`, its manifest keeping only the parts `keep` accepts, signed with `key`."""
    from nemofleet import bundle

    b = bundle.Bundle(src)
    manifest = dict(b.manifest, parts=[p for p in b.manifest["parts"] if keep(p)])
    raw = json.dumps(manifest).encode()
    tmp = dst + ".manifest.json"
    with open(tmp, "wb") as f:
        f.write(raw)
    subprocess.run(["ssh-keygen", "-q", "-Y", "sign", "-n", bundle.NAMESPACE, "-f", key, tmp], check=True)
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as t:
        t.add(tmp, "manifest.json")
        t.add(tmp + ".sig", "manifest.json.sig")
        for p in manifest["parts"]:
            info = tarfile.TarInfo(p["path"])
            info.size = p["size"]
            with b.part(p["path"]) as f:
                t.addfile(info, f)


def untouched(host: str) -> bool:
    """Nothing of the deploy on a bare host: no image, no weights, no release record."""
    r = on(host, f"docker image inspect {IMAGE} >/dev/null 2>&1 || ls /srv/nemofleet/models/*/.nemofleet-complete "
                 ">/dev/null 2>&1 || test -e /var/lib/nemofleet/release.json", check=False)
    return r.returncode != 0


@pytest.fixture(scope="module")
def made(bed, tmp_path_factory):
    """Bare hosts, a bundle made and verified from their plans, the mirrors stopped and the hosts'
    outbound packets counted; the mirrors start again and the counters go after the module."""
    import nemofleet_testbed as testbed

    for h in HOSTS:  # a reinstalled host (new host key): nothing of an earlier converge
        testbed.recreate(h)
        testbed.forget_host_key(bed["hosts"][h]["port"])
    out = str(tmp_path_factory.mktemp("bundle") / "fleet.bundle")
    t = time.monotonic()
    c = nemofleet("bundle", "create", "inventories/testbed.py", "-o", out)
    took = time.monotonic() - t
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr[-3000:]
    stage(f"bundle create: {os.path.getsize(out) / 1024**2:.1f} MiB in {took:.1f} s")
    v = nemofleet("bundle", "verify", out, "inventories/testbed.py")
    assert v.returncode == 0 and "every part matches the signed manifest" in v.stdout, v.stdout + v.stderr
    testbed.stop_mirror()
    testbed.docker("stop", "-t", "1", testbed.PKG_MIRROR, check=False)
    info = json.loads(testbed.docker("network", "inspect", testbed.NETWORK).stdout)[0]
    allowed = {c["IPv4Address"].split("/")[0] for n, c in info["Containers"].items()
               if c["Name"] in {testbed.container(h) for h in bed["hosts"]}}
    allowed |= {cfg["Gateway"] for cfg in info["IPAM"]["Config"] if cfg.get("Gateway")}
    allow = " ".join(f"iptables -A NFCOUNT -d {ip} -j RETURN &&" for ip in sorted(allowed))
    for h in HOSTS:
        on(h, COUNT_SETUP.format(allow=allow))
    clear_mirror_log()
    yield out
    for h in HOSTS:
        on(h, COUNT_DROP, check=False)
    testbed.start_mirrors()


def test_a_bad_bundle_refuses_before_anything_changes(made, tmp_path):
    """A flipped byte in the weights, a bundle signed by an unknown key and a bundle without the
    host's model: each one sentence, nothing changed on any host."""
    from nemofleet import bundle

    b = bundle.Bundle(made)
    shard = next(p for p in b.manifest["parts"] if p["path"].endswith(".safetensors"))
    flipped = str(tmp_path / "flipped.bundle")
    with open(made, "rb") as src, open(flipped, "wb") as dst:
        data = bytearray(src.read())
    data[b.members[shard["path"]][0] + 100] ^= 0x01
    with open(flipped, "wb") as dst:
        dst.write(bytes(data))
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    unknown, no_model = str(tmp_path / "unknown.bundle"), str(tmp_path / "no-model.bundle")
    resign(made, unknown, str(stranger))
    import nemofleet_testbed as testbed
    resign(made, no_model, str(testbed.testbed_dir() / "bundle_ed25519"), keep=lambda p: p["purpose"] != "weights")
    for path, said in ((flipped, "does not match its SHA-256 in the signed manifest"),
                       (unknown, "is signed by a key that"),
                       (no_model, "lacks the weights nvidia/NVIDIA-Nemotron-3.5-Lightning")):
        r = pyinfra(hosts=HOSTS, data={"bundle": path})
        assert r.rc != 0 and said in r.out, (path, r.out[-3000:])
        assert r.changed() == [], (path, r.changed())
        assert all(untouched(h) for h in HOSTS), path
    assert mirror_log() == []


def test_bare_hosts_converge_from_the_bundle_alone(made):
    """Every host serves, nothing was asked of the (stopped) mirror, no packet left the testbed,
    and the controller read the bundle about once for the whole fleet (issue 50: at most 1.05
    times its size): the image and the weights cross the controller's link to one host, the
    others copy them from a peer. The bundle's bytes are what the pyinfra process read (rchar)
    less what a run without the bundle then reads on the same hosts (its modules, keys and the
    hosts' answers); the raw figure is printed beside it."""
    size = os.path.getsize(made)
    t = time.monotonic()
    r, read = deploy_reading(made)
    took = time.monotonic() - t
    assert r.rc == 0, r.out[-6000:]
    plain, baseline = deploy_reading(None)
    assert plain.rc == 0 and baseline > 0, plain.out[-3000:]
    stage(f"converge of {len(HOSTS)} bare hosts from the bundle: {took:.1f} s, controller read "
          f"{read / size:.2f} times the bundle's {size / 1024**2:.1f} MiB, {(read - baseline) / size:.3f} times "
          f"less a run without it ({baseline / 1024**2:.1f} MiB)")
    assert 0 < read - baseline <= 1.05 * size, (read, baseline, size)
    s = nemofleet("smoke", "inventories/testbed.py")
    assert s.returncode == 0, s.stdout + s.stderr
    assert mirror_log() == []
    packets = {h: int(on(h, COUNT_READ).stdout.strip()) for h in HOSTS}
    assert packets == {h: 0 for h in HOSTS}, packets
    for h in HOSTS:  # the weights were verified and marked on the host
        on(h, "ls /srv/nemofleet/models/*/.nemofleet-complete")


def test_second_run_changes_nothing_and_reads_no_bundle_bytes(made):
    """Against a run without the bundle (the same converged hosts: nothing to fetch either), the
    run with it reads the manifest, its signature and the tar headers: well under a MiB."""
    r, read = deploy_reading(made)
    assert r.rc == 0 and r.changed() == [], r.changed() or r.out[-3000:]
    plain, baseline = deploy_reading(None)
    assert plain.rc == 0 and plain.changed() == [], plain.changed() or plain.out[-3000:]
    assert 0 <= baseline and 0 <= read - baseline < 1 << 20, (read, baseline)
    assert mirror_log() == []


def test_a_digest_names_the_image_it_carries(made):
    """The image part is identified by its image ID, the one the host loaded."""
    from nemofleet import bundle

    part = bundle.Bundle(made).find("image", image=IMAGE)[0]
    loaded = on("a100-1", f"docker image inspect -f '{{{{.Id}}}}' {IMAGE}").stdout.strip()
    assert part["image_id"] == loaded
    assert part["sha256"] == hashlib.sha256(bundle.Bundle(made).read(part["path"])).hexdigest()
