#!/bin/bash
# Installs the Debian packages the course needs, when they are missing.
# As root it runs apt-get; otherwise it prints the one line to run.
set -e
PACKAGES="make gcc gdb libc6-dev openmpi-bin libopenmpi-dev libopenblas-openmp-dev libxxhash-dev libzstd-dev gnuplot-nox fortunes python3 xxhash"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "set-up: every package is installed"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "set-up: missing packages:$missing"
    echo "run:    sudo apt-get install -y$missing"
    exit 1
fi
echo "set-up: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "set-up: done"
