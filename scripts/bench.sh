#!/usr/bin/env bash
# The benchmark: release builds of the three services (restarted with release binaries), then
# `flashsale bench` for each scenario — the platform back to back with the naive design, the
# raw gate, the raw insert and the no-op gRPC ceilings on this machine — with reports in
# $FLASHSALE_BENCH_DIR (default .run/bench). Each mode is bounded in requests and time.
#   scripts/bench.sh                 all scenarios (flood, big-sale, ticketing)
#   scripts/bench.sh flood           one scenario
#   BENCH_ARGS="--requests 20000" scripts/bench.sh flood     smaller runs
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=bench
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

OUT="${FLASHSALE_BENCH_DIR:-.run/bench}"
CLI="$CARGO_TARGET_DIR/release/flashsale"
scenarios=("$@")
((${#scenarios[@]})) || scenarios=(flood big-sale ticketing)

main() {
    mkdir -p "$OUT"
    # Orders must stay unpaid for the whole run: a long payment timeout, the default warehouse.
    export FLASHSALE_PROFILE=release
    export FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS="${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS:-3600000}"
    export RUST_LOG="${RUST_LOG:-warn}"
    scripts/down.sh >/dev/null 2>&1 || true
    scripts/up.sh
    local s
    for s in "${scenarios[@]}"; do
        log "scenario $s"
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
        "$CLI" bench --scenario "$s" ${BENCH_ARGS:-} --json | tee "$OUT/$s.json"
    done
    log "reports in $OUT; stop the services with scripts/down.sh"
}

main
