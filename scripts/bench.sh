#!/usr/bin/env bash
# The benchmark: release builds of the three services (restarted with release binaries), then
# `flashsale bench` for each scenario — the platform back to back with the naive design, the
# raw gate, the raw insert and the no-op gRPC ceilings on this machine — with reports in
# $FLASHSALE_BENCH_DIR (default .run/bench). Each mode is bounded in requests and time.
#   scripts/bench.sh                 all scenarios (flood, big-sale, ticketing)
#   scripts/bench.sh flood           one scenario
#   BENCH_ARGS="--requests 20000" scripts/bench.sh flood     smaller runs
#   BENCH_MODES=naive,platform scripts/bench.sh big-sale     some modes only
# Every run starts and ends clean: the services get flashsale_bench_* databases, fs_bench:
# Redis keys and fs_bench_<run>.* queues of their own, dropped before the run and again after
# it (the services are stopped at the end); only the reports stay.
# PostgreSQL allows 100 connections here: the services start with smaller pools (16/16/8, set
# FLASHSALE_<SERVICE>__DATABASE__MAX_CONNECTIONS to change them) so that they and the bench's own
# pool (--db-pool, default 32) fit with room to spare. The bench reads the services' pids from
# $FLASHSALE_RUN_DIR to wait for them to idle between modes and to report their memory.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=bench
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

OUT="${FLASHSALE_BENCH_DIR:-.run/bench}"
# The bare hot row runs beside the naive design so that the report shows both.
MODES="${BENCH_MODES:-noop,naive,naive-bare,gate,insert,platform}"
CLI="$CARGO_TARGET_DIR/release/flashsale"
scenarios=("$@")
((${#scenarios[@]})) || scenarios=(flood big-sale ticketing)

# Unlinks the bench's Redis keys: the services' (prefix fs_bench:) and the raw-gate baseline's
# (prefix fs_bench_gate_<tag>:). A benchmark leaves hundreds of thousands of order records behind, which
# would slow down everything that scans the keyspace afterwards.
drop_bench_keys() { # redis url
    if ! have redis-cli; then
        warn "redis-cli not found: the bench's Redis keys are left in place"
        return 0
    fi
    redis-cli -u "$1" --scan --pattern 'fs_bench*' 2>/dev/null |
        xargs -r -n 500 redis-cli -u "$1" unlink >/dev/null 2>&1 || true
}

# Deletes the bench's RabbitMQ queues (named fs_bench_<run>.…): a run stopped mid-saga leaves
# its services' queues holding messages that the next run's services would otherwise consume
# (for orders and products their fresh databases never had). Each run also uses queue names and
# an exchange of its own and lets the broker expire its queues an hour after it stopped
# (amqp.queue_expires_ms), for brokers rabbitmqctl cannot reach.
drop_bench_queues() { # [run tag: only that run's queues; default: every earlier run's]
    if ! have rabbitmqctl; then
        warn "rabbitmqctl not found: the bench's queues expire an hour after the run instead"
        return 0
    fi
    local pattern='^fs_bench_[0-9_]+\.' q n=0 failed=0 listed queues=()
    [[ -z "${1:-}" ]] || pattern="^${1}\."
    if ! listed="$(rabbitmqctl -q list_queues name 2>&1)"; then
        warn "rabbitmqctl cannot list queues (${listed%%$'\n'*}); the bench's queues expire an hour after the run instead"
        return 0
    fi
    mapfile -t queues < <(grep -E "$pattern" <<<"$listed" || true)
    for q in "${queues[@]}"; do
        if rabbitmqctl -q delete_queue "$q" >/dev/null 2>&1; then
            n=$((n + 1))
        else
            failed=$((failed + 1))
        fi
    done
    ((n == 0)) || log "deleted $n bench queue(s)"
    ((failed == 0)) || warn "could not delete $failed bench queue(s); they expire an hour after the run"
}

# Drops the flashsale_bench_* databases (the services are stopped by then).
drop_bench_databases() { # server url
    if ! have psql; then
        warn "psql not found: the bench databases of earlier runs are reused"
        return 0
    fi
    local db dbs=()
    mapfile -t dbs < <(psql "$1/postgres" -w -Atqc \
        "select datname from pg_database where datname like 'flashsale\\_bench\\_%' order by 1")
    for db in "${dbs[@]}"; do
        [[ "$db" =~ ^flashsale_bench_[a-z_]+$ ]] || continue
        psql "$1/postgres" -w -qc "drop database if exists \"$db\" with (force)" >/dev/null
    done
    ((${#dbs[@]} == 0)) || log "dropped ${#dbs[@]} bench database(s) of earlier runs"
}

main() {
    [[ " ${BENCH_ARGS:-} " != *" --modes"* ]] || die "set the modes with BENCH_MODES, not --modes in BENCH_ARGS"
    # One benchmark at a time on a machine: each drops the flashsale_bench_* databases, fs_bench
    # keys and earlier runs' queues on the shared servers, which would pull them from under
    # another run (from another clone too, hence a machine-wide lock).
    local lock="${FLASHSALE_BENCH_LOCK:-${TMPDIR:-/tmp}/flashsale-bench.lock}"
    if have flock; then
        exec 9>"$lock"
        flock -n 9 || die "another benchmark is running on this machine (lock $lock); wait for it to end"
    else
        warn "flock not found: nothing stops two benchmarks from dropping each other's databases"
    fi
    mkdir -p "$OUT"
    # Orders must stay unpaid for the whole run: a long payment timeout, the default warehouse.
    export FLASHSALE_PROFILE=release
    export FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS="${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS:-3600000}"
    export RUST_LOG="${RUST_LOG:-warn}"
    export FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS="${FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS:-16}"
    export FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS="${FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS:-16}"
    export FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS="${FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS:-8}"
    export FLASHSALE_RUN_DIR="$RUN_DIR"
    # The services get databases of their own for the benchmark, dropped before each run (as
    # are the baselines'): every run starts from empty tables and indexes, not from what the
    # runs before it left behind (which makes each run slower than the last).
    local pg="${FLASHSALE_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}"
    export FLASHSALE_PRODUCT_STOCK__DATABASE__URL="${FLASHSALE_PRODUCT_STOCK__DATABASE__URL:-$pg/flashsale_bench_product}"
    export FLASHSALE_ORDER__DATABASE__URL="${FLASHSALE_ORDER__DATABASE__URL:-$pg/flashsale_bench_svc_orders}"
    export FLASHSALE_OUTBOUND__DATABASE__URL="${FLASHSALE_OUTBOUND__DATABASE__URL:-$pg/flashsale_bench_outbound}"
    # The saga follower reads order states from the order service's database (one query per
    # poll) rather than through GetOrder per order, which would load the service being timed.
    export FLASHSALE_BENCH_ORDERS_DB_URL="${FLASHSALE_BENCH_ORDERS_DB_URL:-$FLASHSALE_ORDER__DATABASE__URL}"
    export FLASHSALE_PRODUCT_STOCK__REDIS__KEY_PREFIX="${FLASHSALE_PRODUCT_STOCK__REDIS__KEY_PREFIX:-fs_bench:}"
    local redis="${FLASHSALE_BENCH_REDIS_URL:-redis://127.0.0.1:6379}"
    local run_tag svc
    run_tag="fs_bench_$(date +%s)_$$"
    for svc in PRODUCT_STOCK ORDER OUTBOUND; do
        export "FLASHSALE_${svc}__AMQP__EXCHANGE=$run_tag.events"
        export "FLASHSALE_${svc}__AMQP__QUEUE_PREFIX=$run_tag."
        export "FLASHSALE_${svc}__AMQP__QUEUE_EXPIRES_MS=3600000"
    done
    log "service pools: product-stock $FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS, order $FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS, outbound $FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS connections"
    scripts/down.sh >/dev/null 2>&1 || true
    drop_bench_databases "$pg"
    drop_bench_keys "$redis"
    drop_bench_queues
    # The services must not inherit the lock: services left running by a killed benchmark
    # would otherwise hold it until they stop.
    scripts/up.sh 9>&-
    local s
    for s in "${scenarios[@]}"; do
        log "scenario $s"
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
        "$CLI" bench --scenario "$s" --modes "$MODES" ${BENCH_ARGS:-} --json | tee "$OUT/$s.json"
    done
    # Nothing is left behind but the reports: the services stop, their databases and keys go.
    scripts/down.sh >/dev/null 2>&1 || true
    drop_bench_databases "$pg"
    drop_bench_keys "$redis"
    drop_bench_queues "$run_tag"
    log "reports in $OUT"
}

main
