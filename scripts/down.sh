#!/usr/bin/env bash
# Stops the services and the payment provider simulator scripts/up.sh started (their pid files in
# .run/ or $FLASHSALE_RUN_DIR):
# SIGTERM, up to 10 s for a graceful shutdown ($FLASHSALE_STOP_TIMEOUT), then SIGKILL.
# Leaves PostgreSQL, Redis and RabbitMQ alone.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=down
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

STOP_TIMEOUT="${FLASHSALE_STOP_TIMEOUT:-10}"

any_alive() {
    local pid
    for pid in "$@"; do
        if pid_alive "$pid"; then return 0; fi
    done
    return 1
}

main() {
    local svc pid pids=() names=()
    for svc in "${SERVICES[@]}" "$PAYMENT_SIM"; do
        if pid="$(live_pid "$RUN_DIR/$svc.pid" "flashsale-$svc")"; then
            log "stopping $svc (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            names+=("$svc")
        elif [[ -f "$RUN_DIR/$svc.pid" ]]; then
            log "$svc was not running (removing its stale pid file)"
            rm -f "$RUN_DIR/$svc.pid"
        fi
    done
    if ((${#pids[@]} == 0)); then
        log "nothing to stop"
        return 0
    fi

    local deadline=$((SECONDS + STOP_TIMEOUT)) i
    while any_alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.2; done
    for i in "${!pids[@]}"; do
        if pid_alive "${pids[$i]}"; then
            warn "${names[$i]} (pid ${pids[$i]}) did not stop within ${STOP_TIMEOUT} s; sending SIGKILL"
            kill -KILL "${pids[$i]}" 2>/dev/null || true
        fi
    done
    deadline=$((SECONDS + 5))
    while any_alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.1; done
    any_alive "${pids[@]}" && die "some services are still alive: ${pids[*]}"

    for svc in "${names[@]}"; do rm -f "$RUN_DIR/$svc.pid"; done
    log "stopped ${names[*]} (infra servers left running)"
}

main "$@"
