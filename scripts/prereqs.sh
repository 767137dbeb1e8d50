#!/bin/sh
# What `make demo`, `make test` and `.ci/run` need on this machine, checked before any long work.
#
#   sh scripts/prereqs.sh           check; as root on Debian/Ubuntu also install what is missing
#                                   (one `apt-get update`, one `apt-get install`) and start the
#                                   Docker engine when none answers
#   sh scripts/prereqs.sh --check   check only: one sentence per missing prerequisite, with the
#                                   command that fixes it; changes nothing
#
# Exit 0 when everything is there (and the engine answers `docker info`), else 1 after one
# sentence per problem. POSIX sh: it runs before anything else is installed.
#
# For its tests (tests/unit/test_prereqs.py) a few facts of the machine can be given instead of
# read: NEMOFLEET_PREREQS_UID (the user id), NEMOFLEET_PREREQS_PID1 (the name of PID 1),
# NEMOFLEET_PREREQS_OS_RELEASE (the os-release file), NEMOFLEET_PREREQS_CA (the CA bundle),
# NEMOFLEET_PREREQS_DOCKERD_LOG (where a started dockerd logs), NEMOFLEET_PREREQS_WAIT (seconds
# to wait for the engine, default 60).
set -u

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "prereqs: unknown option '$1': use no option (check and install) or --check (check only)" >&2; exit 2 ;;
esac

uid=${NEMOFLEET_PREREQS_UID:-$(id -u)}
os_release=${NEMOFLEET_PREREQS_OS_RELEASE:-/etc/os-release}
ca_bundle=${NEMOFLEET_PREREQS_CA:-/etc/ssl/certs/ca-certificates.crt}
dockerd_log=${NEMOFLEET_PREREQS_DOCKERD_LOG:-/var/log/nemofleet-dockerd.log}
wait_s=${NEMOFLEET_PREREQS_WAIT:-60}
if [ -n "${NEMOFLEET_PREREQS_PID1:-}" ]; then pid1=$NEMOFLEET_PREREQS_PID1
else pid1=$(cat /proc/1/comm 2>/dev/null || echo unknown); fi

# Debian or Ubuntu (or a derivative that says so): apt can install the packages named below
debian_like=no
if [ -r "$os_release" ] && grep -Eq '^(ID|ID_LIKE)=.*(debian|ubuntu)' "$os_release"; then debian_like=yes; fi

# one line per prerequisite: what it is | how to test for it | the Debian package that provides it
# (systemd only for systemd-analyze, which the unit tests run over the rendered units; dpkg-dev and
# gnupg build and sign the testbed's apt repository; curl and ca-certificates fetch over HTTPS)
PREREQS='docker (the Docker client)|command -v docker|docker.io
dockerd (the Docker engine; a machine may ship the client alone)|command -v dockerd|docker.io
debootstrap (builds the testbed images)|command -v debootstrap|debootstrap
ssh and ssh-keygen|command -v ssh && command -v ssh-keygen|openssh-client
rsync|command -v rsync|rsync
iptables|command -v iptables|iptables
python3 3.11 or newer|python3 -c "import sys; sys.exit(sys.version_info < (3, 11))"|python3
python3 venv and pip (python3-venv)|python3 -c "import ensurepip, venv"|python3-venv
dpkg-scanpackages (dpkg-dev)|command -v dpkg-scanpackages|dpkg-dev
gpg (gnupg)|command -v gpg && command -v gpgconf|gnupg
curl|command -v curl|curl
CA certificates|test -s "$ca_bundle"|ca-certificates
make|command -v make|make
systemd-analyze (systemd)|command -v systemd-analyze|systemd'

missing_names=""
missing_pkgs=""
scan() {
  missing_names=""
  missing_pkgs=""
  nl='
'
  old_ifs=$IFS
  IFS=$nl
  for line in $PREREQS; do
    IFS=$old_ifs
    name=${line%%|*}
    rest=${line#*|}
    test_cmd=${rest%|*}
    pkg=${rest##*|}
    if ! eval "$test_cmd" >/dev/null 2>&1; then
      missing_names="$missing_names$name|$pkg$nl"
      case " $missing_pkgs " in *" $pkg "*) ;; *) missing_pkgs="${missing_pkgs:+$missing_pkgs }$pkg" ;; esac
    fi
    IFS=$nl
  done
  IFS=$old_ifs
}

# why the engine does not answer, in a few words (empty when it answers)
engine_problem() {
  command -v docker >/dev/null 2>&1 || { echo "no docker client"; return; }
  out=$(docker info --format '{{.ServerVersion}}' 2>&1) && [ -n "$out" ] && return
  case "$out" in
    *"permission denied"*) echo "permission denied" ;;
    *) echo "not answering" ;;
  esac
}

say_missing() {  # one sentence per missing prerequisite, with the command that fixes it
  nl='
'
  old_ifs=$IFS
  IFS=$nl
  for entry in $missing_names; do
    name=${entry%|*}
    pkg=${entry##*|}
    if [ "$debian_like" = yes ]; then
      if [ "$uid" = 0 ]; then fix="apt-get install -y $pkg"; else fix="sudo apt-get install -y $pkg"; fi
      echo "prereqs: $name is missing: install it with \`$fix\`." >&2
    else
      echo "prereqs: $name is missing: install it with your system's package manager (Debian's package: $pkg)." >&2
    fi
  done
  IFS=$old_ifs
}

start_hint() {
  if [ "$pid1" = systemd ]; then echo "systemctl start docker"
  else echo "dockerd >$dockerd_log 2>&1 &"; fi
}

# --- the checks, first: nothing long runs before they pass -------------------------------------
scan
engine=$(engine_problem)
problems=0
can_install=no
if [ "$mode" = install ] && [ "$uid" = 0 ] && [ "$debian_like" = yes ] && command -v apt-get >/dev/null 2>&1; then
  can_install=yes
fi

if [ -n "$missing_pkgs" ] && [ "$can_install" = yes ]; then
  echo "prereqs: installing $missing_pkgs (apt-get update, then apt-get install)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get update -q >/dev/null; then
    echo "prereqs: \`apt-get update\` failed (output above): check this machine's apt sources and network, then run make again." >&2
    exit 1
  fi
  # shellcheck disable=SC2086  # the package names are words
  if ! apt-get install -y -q --no-install-recommends $missing_pkgs >/dev/null; then
    echo "prereqs: \`apt-get install $missing_pkgs\` failed (output above)." >&2
    exit 1
  fi
  scan
  engine=$(engine_problem)
fi

if [ -n "$missing_names" ]; then
  say_missing
  problems=1
fi

if [ "$uid" != 0 ]; then
  echo "prereqs: the testbed builds its images with debootstrap and runs privileged containers, which needs root: run this as root (\`sudo make demo\`)." >&2
  problems=1
fi

# the engine: only when its client is there (a missing client was said above)
if [ -n "$engine" ] && [ "$engine" != "no docker client" ]; then
  if [ "$engine" = "permission denied" ]; then
    echo "prereqs: the Docker engine refuses this user (permission denied on its socket): run as root." >&2
    problems=1
  elif [ "$can_install" = yes ] && [ "$problems" = 0 ]; then
    if [ "$pid1" = systemd ]; then
      echo "prereqs: the Docker engine is not answering: starting it (systemctl start docker)"
      systemctl start docker >&2 || true
    else
      # no systemd as PID 1 (a container, WSL): dockerd in the background, its log in a named file,
      # stdin and every descriptor above 2 closed: the engine outlives this run, and a descriptor it
      # inherited (a `flock FILE make test` lock) would stay held for as long as the engine runs
      echo "prereqs: the Docker engine is not answering: starting dockerd in the background (log: $dockerd_log)"
      (dockerd >"$dockerd_log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &)
    fi
    waited=0
    while [ "$(engine_problem)" ] && [ "$waited" -lt "$wait_s" ]; do sleep 1; waited=$((waited + 1)); done
    if [ "$(engine_problem)" ]; then
      if [ "$pid1" = systemd ]; then where="\`journalctl -u docker\`"; else where="$dockerd_log"; fi
      echo "prereqs: the Docker engine did not answer \`docker info\` within ${wait_s} s of being started: its log is in $where." >&2
      [ "$pid1" = systemd ] || tail -n 20 "$dockerd_log" >&2 2>/dev/null
      exit 1
    fi
    echo "prereqs: the Docker engine answers after ${waited} s"
  else
    echo "prereqs: the Docker engine is not answering \`docker info\`: start it with \`$(start_hint)\`." >&2
    problems=1
  fi
fi

if [ "$problems" != 0 ]; then
  [ "$mode" = check ] || [ "$can_install" = yes ] || [ -z "$missing_names" ] || [ "$debian_like" = no ] ||
    echo "prereqs: as root on this machine, \`sh scripts/prereqs.sh\` installs these itself." >&2
  exit 1
fi
echo "prereqs: all present; Docker engine $(docker info --format '{{.ServerVersion}}' 2>/dev/null) answering"
