#!/usr/bin/env bash
# Checks the Prometheus configuration and alert rules in deploy/prometheus with promtool:
#   promtool check rules deploy/prometheus/alerts.yml
#   promtool check config deploy/prometheus/prometheus.yml
# (The test suite checks that the rules and the dashboard ask only for metric families the
# services export: crates/test-support/tests/deploy_observability.rs.)
#
# promtool is taken from the PATH, else from Debian's prometheus package, unpacked on first use
# into $FLASHSALE_TOOLS_DIR (default ~/.cache/flashsale-tools) without installing or starting
# a Prometheus server.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=check-deploy
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

TOOLS_DIR="${FLASHSALE_TOOLS_DIR:-$HOME/.cache/flashsale-tools}"
PROMTOOL="$(command -v promtool || true)"
if [[ -z "$PROMTOOL" ]]; then
    PROMTOOL="$TOOLS_DIR/prometheus/usr/bin/promtool"
    if [[ ! -x "$PROMTOOL" ]]; then
        have apt-get || die "promtool is missing and there is no apt-get to fetch Debian's prometheus package"
        log "fetching promtool (Debian's prometheus package) into $TOOLS_DIR/prometheus"
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
            as_root apt-get update -qq
            (cd "$tmp" && apt-get download prometheus >/dev/null)
        fi
        mkdir -p "$TOOLS_DIR/prometheus"
        dpkg-deb -x "$tmp"/prometheus_*.deb "$TOOLS_DIR/prometheus"
        [[ -x "$PROMTOOL" ]] || die "the prometheus package holds no usr/bin/promtool"
    fi
fi
log "$("$PROMTOOL" --version 2>&1 | head -1)"
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
"$PROMTOOL" check config deploy/prometheus/prometheus.yml
