#!/usr/bin/env bash
# Installs PgBouncer for the tests that run through it (tests/integration/test_pgbouncer.py
# and the "through PgBouncer" section of .ci/run): Debian's pgbouncer. Idempotent: does
# nothing when pgbouncer is already on PATH. The tests start their own pgbouncer process,
# with their own configuration, on a free loopback port; the distribution's service is
# neither needed nor left running (its default port, 6432, may belong to someone else).
set -euo pipefail

find_pgbouncer() {
    command -v pgbouncer 2>/dev/null || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; }
}

if found="$(find_pgbouncer)" && [ -n "$found" ]; then
    echo "install_pgbouncer: pgbouncer is already installed ($found)"
    "$found" --version | head -n 1
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d exit code 101: the package's maintainer scripts do not start the service.
POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    CREATED_POLICY=1
fi
status=0
$SUDO apt-get install -y -qq --no-install-recommends pgbouncer || status=$?
if [ -n "$CREATED_POLICY" ]; then
    $SUDO rm -f "$POLICY"
fi
if [ "$status" -ne 0 ]; then
    exit "$status"
fi
# The distribution's service is not wanted: disable it (systemctl does that without a
# running systemd too), and stop it should it have started anyway.
if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable pgbouncer >/dev/null 2>&1 || true
    if [ -d /run/systemd/system ]; then
        $SUDO systemctl stop pgbouncer >/dev/null 2>&1 || true
    fi
fi
if [ -x /etc/init.d/pgbouncer ]; then
    $SUDO /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
fi
"$(find_pgbouncer)" --version | head -n 1
