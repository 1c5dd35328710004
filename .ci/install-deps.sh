#!/bin/bash
# Installs the Debian packages the course needs, when they are missing
# (an argument site, site-check, portability or all: below; SETUP_QUIET=1:
# silent when nothing is missing).
# As root it runs apt-get; otherwise it prints the one line to run.
set -e
PACKAGES="make gcc gdb libc6-dev openmpi-bin libopenmpi-dev libhwloc-dev libopenblas-openmp-dev libxxhash-dev libzstd-dev gnuplot-nox fortunes python3 xxhash"
# The course as a website (make site: pandoc, Pygments) and its check in a
# real browser (make site-check: headless Chromium driven over the DevTools
# protocol, fonts for its screenshots): only when asked, so that make setup
# and make demo stay light. CI asks for all.
SITE_PACKAGES="python3 pandoc python3-pygments"
SITE_CHECK_PACKAGES="$SITE_PACKAGES chromium python3-websocket fonts-dejavu-core"
# make portability's clang leg (the course built by clang, the cc of macOS):
# also only when asked; without them that leg is a SKIP line.
PORTABILITY_PACKAGES="clang libomp-dev"
case "${1:-}" in
    "") ;;
    site) PACKAGES="$SITE_PACKAGES" ;;
    site-check) PACKAGES="$SITE_CHECK_PACKAGES" ;;
    portability) PACKAGES="$PORTABILITY_PACKAGES" ;;
    all) PACKAGES="$PACKAGES $SITE_CHECK_PACKAGES $PORTABILITY_PACKAGES" ;;
    *) echo "usage: $0 [site|site-check|portability|all]" >&2; exit 2 ;;
esac
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    [ -n "${SETUP_QUIET:-}" ] || echo "set-up: every package is installed"
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
