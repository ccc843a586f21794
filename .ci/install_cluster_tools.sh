#!/usr/bin/env bash
# Makes sure the tools of the scale-out tests are here: `ip` (iproute2) for the network
# namespaces of tests/acceptance/test_multihost.py, and PostgreSQL's server binaries
# (initdb, pg_ctl, postgres, pg_basebackup) for the throwaway clusters and the streaming
# replica of tests/support/clusters.py. Installs Debian's packages where one is missing
# (as root, or through sudo); does nothing when everything is there.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
server_bin=""
for dir in /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ] \
        && [ -x "$dir/pg_basebackup" ]; then
        server_bin="$dir"
    fi
done
if [ -z "$server_bin" ] && ! command -v initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install_cluster_tools: ip and PostgreSQL's server binaries (${server_bin:-on PATH}) are here"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_cluster_tools: installed ${missing[*]}"
