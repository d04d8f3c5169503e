#!/usr/bin/env bash
# Starts the whole platform on this machine:
#   1. scripts/dev-infra.sh (PostgreSQL, Redis, RabbitMQ reachable),
#   2. cargo build --workspace --bins (into $CARGO_TARGET_DIR, default ~/.cache/flashsale-target),
#   3. flashsale-payment-sim (the payment provider simulator, on $FLASHSALE_PAYMENT_SIM_ADDR,
#      default 127.0.0.1:50054, with the options in $FLASHSALE_PAYMENT_SIM_ARGS), then
#      flashsale-product-stock, flashsale-order, flashsale-outbound in the background from the
#      repository root (so ./config is found), pid files and logs in .run/ ($FLASHSALE_RUN_DIR),
#   4. waits until `flashsale health` reports all three SERVING ($FLASHSALE_UP_TIMEOUT s, 60).
# FLASHSALE_PROFILE=release builds and runs release binaries (what scripts/bench.sh measures).
# FLASHSALE_UP_FEATURES adds cargo features to the debug build (.ci/run gives the test build's,
# flashsale-platform/failpoints, so that it starts the binaries the tests ran: no failpoint
# fires unless FLASHSALE_FAILPOINTS arms it); a release build never takes any.
# A development start: each service may use the public development secret for the token keys
# it is not given (FLASHSALE_<SVC>__AUTH__ALLOW_DEVELOPMENT_SECRET=false to refuse it).
# Idempotent: a service whose pid file names a live process is not started again.
# Stop with scripts/down.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=up
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

UP_TIMEOUT="${FLASHSALE_UP_TIMEOUT:-60}"
PROFILE="${FLASHSALE_PROFILE:-debug}"
case "$PROFILE" in
debug | release) ;;
*) die "FLASHSALE_PROFILE must be debug or release, not '$PROFILE'" ;;
esac
BIN_DIR="$CARGO_TARGET_DIR/$PROFILE"
for svc_key in PRODUCT_STOCK ORDER OUTBOUND; do
    var="FLASHSALE_${svc_key}__AUTH__ALLOW_DEVELOPMENT_SECRET"
    export "$var=${!var:-true}"
done
CLI="$BIN_DIR/flashsale"
STARTED=() # services started by this run

build() {
    log "cargo build --workspace --bins ($PROFILE) (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    local features=()
    if [[ -n "${FLASHSALE_UP_FEATURES:-}" ]]; then features=(--features "$FLASHSALE_UP_FEATURES"); fi
    if [[ "$PROFILE" == release ]]; then
        cargo build --workspace --bins --release
    else
        cargo build --workspace --bins "${features[@]}"
    fi
}

start_service() { # service
    local svc="$1" bin="$BIN_DIR/flashsale-$1" pidf="$RUN_DIR/$1.pid" logf="$RUN_DIR/$1.log"
    local pid port
    if pid="$(live_pid "$pidf" "flashsale-$svc")"; then
        if [[ "$bin" -nt "$pidf" ]]; then
            log "$svc already running (pid $pid) on an older build: scripts/down.sh && scripts/up.sh restarts it"
        else
            log "$svc already running (pid $pid)"
        fi
        return 0
    fi
    rm -f "$pidf"
    [[ -x "$bin" ]] || die "$bin is missing after the build"
    for port in "$(svc_grpc_port "$svc")" "$(svc_metrics_port "$svc")"; do
        if port_open 127.0.0.1 "$port"; then
            die "port $port (for $svc) is taken by a process up.sh did not start; 'ss -ltnp' shows which"
        fi
    done
    if [[ -f "$logf" ]]; then mv -f "$logf" "$logf.1"; fi
    nohup "$bin" >"$logf" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pidf"
    STARTED+=("$svc")
    log "started $svc (pid $pid), log $logf"
}

# The payment provider simulator the order service pays through (not a flashsale service: no
# database, no metrics; `flashsale health` does not ask it).
start_payment_sim() {
    local bin="$BIN_DIR/flashsale-$PAYMENT_SIM" pidf="$RUN_DIR/$PAYMENT_SIM.pid" logf="$RUN_DIR/$PAYMENT_SIM.log"
    local pid args=()
    if pid="$(live_pid "$pidf" "flashsale-$PAYMENT_SIM")"; then
        log "$PAYMENT_SIM already running (pid $pid)"
        return 0
    fi
    rm -f "$pidf"
    [[ -x "$bin" ]] || die "$bin is missing after the build"
    if port_open 127.0.0.1 "${PAYMENT_SIM_ADDR##*:}"; then
        die "port ${PAYMENT_SIM_ADDR##*:} (for $PAYMENT_SIM) is taken by a process up.sh did not start"
    fi
    # shellcheck disable=SC2206 # options are words on purpose
    args=(${FLASHSALE_PAYMENT_SIM_ARGS:-})
    if [[ -f "$logf" ]]; then mv -f "$logf" "$logf.1"; fi
    nohup "$bin" --addr "$PAYMENT_SIM_ADDR" "${args[@]}" >"$logf" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pidf"
    log "started $PAYMENT_SIM on $PAYMENT_SIM_ADDR (pid $pid${args[*]:+, ${args[*]}}), log $logf"
    local deadline=$((SECONDS + UP_TIMEOUT))
    until port_open 127.0.0.1 "${PAYMENT_SIM_ADDR##*:}"; do
        if ! pid_alive "$pid"; then
            tail -n 20 "$logf" | sed 's/^/    /' >&2
            rm -f "$pidf"
            die "$PAYMENT_SIM exited during start"
        fi
        ((SECONDS < deadline)) || die "$PAYMENT_SIM did not listen within $UP_TIMEOUT s"
        sleep 0.2
    done
}

# Prints the end of a service's log, indented.
show_log_tail() { # service
    local logf="$RUN_DIR/$1.log"
    if [[ -s "$logf" ]]; then
        printf '%s: --- last lines of %s ---\n' "$SCRIPT" "$logf" >&2
        tail -n 40 "$logf" | sed 's/^/    /' >&2
        explain_port_taken "$1" "$logf"
    else
        printf '%s: (%s is empty)\n' "$SCRIPT" "$logf" >&2
    fi
}

# When a service could not bind its port, shows who holds it. The default ports (50051–50053)
# lie inside Linux's ephemeral range, so an outgoing connection of any program can hold one
# for as long as it stays open (seen once here, right after a benchmark).
explain_port_taken() { # service log
    local port
    port="$(grep -aoE 'bind gRPC listener on [^ ]+:[0-9]+' "$2" | tail -n 1 | sed -E 's/.*:([0-9]+)$/\1/')" || true
    [[ -n "$port" ]] && grep -aq 'Address already in use' "$2" || return 0
    printf '%s: port %s is taken; its sockets now:\n' "$SCRIPT" "$port" >&2
    if have ss; then
        ss -tanp "( sport = :$port )" 2>/dev/null | sed 's/^/    /' >&2 || true
    fi
    printf '%s: if that is an outgoing connection (ephemeral range: %s), wait for it to close or give %s another port (FLASHSALE_%s__GRPC__ADDR)\n' \
        "$SCRIPT" "$(tr '\t' '-' </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo '?')" \
        "$1" "$(tr 'a-z-' 'A-Z_' <<<"$1")" >&2
}

# The CLI finds the services through these (only set when the caller did not).
export_health_urls() {
    local svc var
    for svc in "${SERVICES[@]}"; do
        var="FLASHSALE_$(svc_env "$svc")_URL"
        if [[ -z "${!var:-}" ]]; then
            export "$var=http://127.0.0.1:$(svc_grpc_port "$svc")"
        fi
    done
}

# Waits until `flashsale health` exits 0; fails as soon as a service process is gone.
wait_healthy() {
    local deadline=$((SECONDS + UP_TIMEOUT)) svc out
    log "waiting up to ${UP_TIMEOUT} s for all services to be SERVING"
    while :; do
        for svc in "${SERVICES[@]}"; do
            # Whether the process is alive, not whether it already shows its binary's name: a
            # service started a moment ago may still be the shell forked to exec it (a loaded
            # machine once reported a live service as exited, and left it running).
            if ! pid_alive "$(cat "$RUN_DIR/$svc.pid" 2>/dev/null)"; then
                printf '%s: error: %s exited during start\n' "$SCRIPT" "$svc" >&2
                show_log_tail "$svc"
                rm -f "$RUN_DIR/$svc.pid"
                die "$svc did not start (the others are left running; scripts/down.sh stops them)"
            fi
        done
        if out="$("$CLI" health 2>&1)"; then
            return 0
        fi
        if ((SECONDS >= deadline)); then
            printf '%s: error: not all services SERVING after %s s; flashsale health said:\n' "$SCRIPT" "$UP_TIMEOUT" >&2
            printf '%s\n' "$out" | sed 's/^/    /' >&2
            for svc in "${SERVICES[@]}"; do show_log_tail "$svc"; done
            die "start-up timed out (the services are left running; scripts/down.sh stops them)"
        fi
        sleep 1
    done
}

print_endpoints() {
    local svc
    log "all services SERVING"
    for svc in "${SERVICES[@]}"; do
        printf '  %-14s gRPC 127.0.0.1:%s   metrics http://127.0.0.1:%s/metrics   log %s\n' \
            "$svc" "$(svc_grpc_port "$svc")" "$(svc_metrics_port "$svc")" "$RUN_DIR/$svc.log"
    done
    printf '  %-14s gRPC %s (payment provider simulator)   log %s\n' \
        "$PAYMENT_SIM" "$PAYMENT_SIM_ADDR" "$RUN_DIR/$PAYMENT_SIM.log"
    printf '  CLI: %s (e.g. "%s health")\n' "$CLI" "$CLI"
    printf '  stop: scripts/down.sh\n'
}

main() {
    scripts/dev-infra.sh
    build
    mkdir -p "$RUN_DIR"
    start_payment_sim
    local svc
    for svc in "${SERVICES[@]}"; do start_service "$svc"; done
    export_health_urls
    wait_healthy
    print_endpoints
}

main "$@"
