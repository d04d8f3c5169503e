#!/usr/bin/env bash
# Runs a flash sale end to end on this machine:
#   1. exports demo settings for the services — a short payment timeout (5 s, swept every
#      500 ms) so unpaid and late-paid orders play out within the demo, a flaky warehouse
#      that fails 5 % of shipments so the refund path shows, and a payment provider simulator
#      as unreliable as a real provider (notifications up to 300 ms late, 20 % delivered twice,
#      20 % after a declined attempt, reordered, each refund declined once before it is paid,
#      FLASHSALE_PAYMENT_SIM_ARGS); each may be overridden by setting it before calling this
#      script,
#   2. restarts the services if an earlier scripts/up.sh left them running (they would keep
#      their old settings), then starts them with scripts/up.sh,
#   3. runs `flashsale sale --buyers 300 --stock 100 --opens-in-secs 5 --price-cents 2499
#      --sale-price-cents 1999` (extra arguments are passed on to it, e.g. `scripts/demo.sh
#      --json` or `scripts/demo.sh --quiet --buyers 2000`), which creates the product with a
#      sale window opening 5 s later and floods it at once (every buyer refused
#      SALE_NOT_STARTED presses buy again until the opening, and the report counts those
#      refusals and checks that nothing was sold before the opening), sells at the sale price,
#      pays through the provider (PayOrder starts the payment, the buyer pays on
#      the simulator's checkout, its signed notification pays the order), never pays, pays late
#      (refunded through the provider) and cancels, waits for quiescence, and checks the
#      invariants.
# Exits with the sale's status. The services keep running; stop them with scripts/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=demo
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# The CLI up.sh built (FLASHSALE_PROFILE picks debug or release binaries, as in up.sh).
CLI="$CARGO_TARGET_DIR/${FLASHSALE_PROFILE:-debug}/flashsale"

# Read by the services at start-up (up.sh starts them with this environment).
export FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS="${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS:-5000}"
export FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS="${FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS:-500}"
export FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_FRACTION="${FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_FRACTION:-0.05}"
export FLASHSALE_ORDER__PAYMENT__REFUND_RETRY_BASE_MS="${FLASHSALE_ORDER__PAYMENT__REFUND_RETRY_BASE_MS:-200}"
export FLASHSALE_PAYMENT_SIM_ARGS="${FLASHSALE_PAYMENT_SIM_ARGS:---notify-jitter-ms 300 --duplicate-fraction 0.2 --attempt-failed-fraction 0.2 --reorder --refund-failures 1}"

# The services (and the simulator) up.sh started that are still running.
running_services() {
    local svc
    for svc in "${SERVICES[@]}" "$PAYMENT_SIM"; do
        if live_pid "$RUN_DIR/$svc.pid" "flashsale-$svc" >/dev/null; then
            printf '%s\n' "$svc"
        fi
    done
}

# True when the arguments after the first name the flag $1 (as "--flag value" or "--flag=value").
has_flag() {
    local flag="$1" arg
    shift
    for arg in "$@"; do
        [[ "$arg" == "$flag" || "$arg" == "$flag="* ]] && return 0
    done
    return 1
}

main() {
    local running
    running="$(running_services)"
    if [[ -n "$running" ]]; then
        log "services already running ($(echo "$running" | paste -sd ' ' -)) keep the settings they" \
            "were started with: restarting them (scripts/down.sh, then scripts/up.sh) so the demo's apply"
        scripts/down.sh
    fi
    log "service settings: payment timeout ${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS} ms" \
        "(swept every ${FLASHSALE_ORDER__SAGA__SWEEP_INTERVAL_MS} ms)," \
        "warehouse fails a fraction ${FLASHSALE_OUTBOUND__WAREHOUSE__FAIL_FRACTION} of shipments," \
        "payment provider simulator: ${FLASHSALE_PAYMENT_SIM_ARGS}"
    scripts/up.sh

    # The demo's sale, unless the caller's arguments say otherwise.
    local args=("$@")
    has_flag --stock "$@" || args=(--stock 100 "${args[@]}")
    has_flag --buyers "$@" || args=(--buyers 300 "${args[@]}")
    has_flag --opens-in-secs "$@" || args=(--opens-in-secs 5 "${args[@]}")
    if ! has_flag --price-cents "$@" && ! has_flag --sale-price-cents "$@"; then
        args=(--price-cents 2499 --sale-price-cents 1999 "${args[@]}")
    fi
    log "$CLI sale ${args[*]}"
    local rc=0
    "$CLI" sale "${args[@]}" || rc=$?
    if ((rc == 0)); then
        log "the sale passed every invariant check"
    else
        warn "the sale failed (exit status $rc): see the report above and the logs in $RUN_DIR"
    fi
    log "the services keep running; stop them with scripts/down.sh"
    return "$rc"
}

main "$@"
