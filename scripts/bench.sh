#!/usr/bin/env bash
# The benchmark: release builds of the three services (restarted with release binaries), then
# `flashsale bench` for each scenario — the platform back to back with the naive design, the
# raw gate, the raw insert and the no-op gRPC ceilings on this machine — with reports in
# $FLASHSALE_BENCH_DIR (default .run/bench). Each mode is bounded in requests and time.
#   scripts/bench.sh                 all scenarios (flood, big-sale, ticketing)
#   scripts/bench.sh flood           one scenario
#   scripts/bench.sh sale sustained  the sales end to end through `flashsale sale`, with the
#                    services restarted on their default payment deadline: `sale` is 40,000
#                    buyers for 4 products of 8,000 units, every winner paying at once;
#                    `sustained` is BENCH_SUSTAIN_RATE buyers a second (default 500) for
#                    BENCH_SUSTAIN_SECS (default 60), every winner paying as soon as confirmed,
#                    with the order service's admission bounds at BENCH_SUSTAIN_MAX_BACKLOG
#                    (default 1000) orders waiting for the saga and as many waiting to ship;
#                    BENCH_SUSTAIN_ROUNDS (default 1) sales of their own one after the other,
#                    reported in sustained.json, sustained-2.json, …
#   scripts/bench.sh tracing         what tracing costs: the big sale's platform mode with the
#                    services restarted with tracing off (OTEL_SDK_DISABLED=true), then with
#                    spans sampled at BENCH_TRACE_SAMPLE (default 0.01) and exported to a
#                    `flashsale trace-sink` on a free loopback port, the two in turn for
#                    BENCH_TRACING_ROUNDS (default 3) rounds: tracing-off.json,
#                    tracing-sampled.json, tracing-off-2.json, …, and tracing.json, the CPU per
#                    accepted order of each and what tracing adds (`flashsale bench-report
#                    --tracing-cost <run>`)
#   BENCH_ARGS="--requests 20000" scripts/bench.sh flood     smaller runs
#   BENCH_MODES=naive,platform scripts/bench.sh big-sale     some modes only
# Each run keeps its reports in a directory of its own, $FLASHSALE_BENCH_DIR/<UTC time>-<commit>
# (default .run/bench/…, with .run/bench/latest pointing at it): one JSON report per scenario,
# each with the commit, the machine, the servers' versions and settings and the options.
# `scripts/bench-report.sh .run/bench/latest` keeps them in docs/bench/results and regenerates
# docs/benchmarks.md's tables and charts from them. Every mode checks the invariants after it;
# the script exits non-zero when one broke or a mode had errors (after running every scenario).
# The flood scenario also runs the refusals mode (all calls refused on a sold-out product, with
# PostgreSQL's and Redis's own counters read around them) unless BENCH_MODES says otherwise.
# Every run starts and ends clean: the services get flashsale_bench_* databases, fs_bench:
# Redis keys and fs_bench_<run>.* queues of their own, dropped before the run and again after
# it (the services are stopped at the end); only the reports stay.
# PostgreSQL allows 100 connections here: the services start with smaller pools (16/16/8, set
# FLASHSALE_<SERVICE>__DATABASE__MAX_CONNECTIONS to change them) so that they and the bench's own
# pool (--db-pool, default 32) fit with room to spare. The bench reads the services' pids from
# $FLASHSALE_RUN_DIR to wait for them to idle between modes and to report their memory.
# Scaling out on one machine (docs/benchmarks.md#scaling-out-on-one-machine); the defaults are
# the usual run (one process per service, the service's default buckets, the one Redis):
#   BENCH_REPLICAS=2 scripts/bench.sh big-sale   a second product-stock, order and outbound on
#                    free loopback ports; the bench spreads its connections over both order
#                    replicas, order and outbound balance over both product-stock replicas and
#                    product-stock over both order replicas; CPU is reported per process
#   BENCH_BUCKETS=8 scripts/bench.sh big-sale    the platform mode's product gets 8 stock buckets
#   BENCH_REDIS=cluster scripts/bench.sh big-sale   product-stock's gate on a Redis Cluster of 3
#                    masters and 3 replicas that the script starts on free loopback ports (data
#                    in a temporary directory, nothing on disk) and stops at the end; the raw
#                    gate mode is left out (it measures one Redis server)
# PostgreSQL: where initdb, pg_ctl and pg_stat_statements (postgresql-contrib) are installed, the
# run starts a PostgreSQL of its own on a free loopback port (a fresh cluster's settings, as the
# shared server has them, plus pg_stat_statements) and the report gives the statements and
# commits per order, database by database; BENCH_PG=shared (or FLASHSALE_BENCH_POSTGRES_URL)
# runs on the shared server instead, without those counts.
# Whatever happens, the script stops on exit what it started: the services, the replicas and
# the cluster's nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=bench
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

BENCH_ROOT="${FLASHSALE_BENCH_DIR:-.run/bench}"
OUT=""             # this run's directory under BENCH_ROOT
# The bare hot row runs beside the naive design so that the report shows both.
MODES="${BENCH_MODES:-noop,naive-sweep,naive-bare,gate,insert,insert-batch,platform}"
MODES_GIVEN="${BENCH_MODES:+yes}"
CLI="$CARGO_TARGET_DIR/release/flashsale"
REPLICAS="${BENCH_REPLICAS:-1}"
BUCKETS="${BENCH_BUCKETS:-}"
REDIS_MODE="${BENCH_REDIS:-single}"
PG_MODE="${BENCH_PG:-}"
PG_DIR=""         # the private PostgreSQL's directory, while it runs
PG_PORT=""
REPLICA_PIDS=()    # second replicas this run started
CLUSTER_PIDS=()    # Redis Cluster nodes this run started
CLUSTER_DIR=""     # their working directory
SERVICES_UP=false  # scripts/up.sh ran
BENCH_PID=""       # the bench, while it runs
SINK_PID=""        # the trace sink, while it runs
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

# A TCP port on loopback that nothing listens on, below Linux's ephemeral range (so that no
# outgoing connection holds it) and not in `taken`.
free_port() { # taken ports...
    local port try
    for ((try = 0; try < 200; try++)); do
        port=$((20000 + RANDOM % 10000))
        [[ " $* " == *" $port "* ]] && continue
        if ! port_open 127.0.0.1 "$port"; then
            echo "$port"
            return 0
        fi
    done
    die "no free loopback port found in 20000-29999"
}

# Stops the processes given by pid: SIGTERM, up to 10 s, then SIGKILL.
stop_pids() { # pids...
    local pid deadline=$((SECONDS + 10))
    (($# > 0)) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for pid in "$@"; do
        while pid_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        if pid_alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
}

# Starts six nodes with --cluster-enabled on free loopback ports (no RDB, no AOF, files in a
# temporary directory), joins them as 3 masters with one replica each, and waits until every
# node says cluster_state:ok. Prints nothing; sets CLUSTER_PIDS, CLUSTER_DIR and CLUSTER_URLS.
CLUSTER_URLS=""
# Runs a PostgreSQL program as the postgres user (initdb and the server refuse root).
pg_as_owner() { # program args...
    local program="$PG_BIN/$1"
    shift
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$program" "$@"
    else
        "$program" "$@"
    fi
}

# Whether a private PostgreSQL with pg_stat_statements can be started here.
private_pg_possible() {
    PG_BIN="${FLASHSALE_BENCH_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
    [[ -x "$PG_BIN/initdb" && -x "$PG_BIN/pg_ctl" ]] || return 1
    [[ $(id -u) -ne 0 ]] || id postgres >/dev/null 2>&1 || return 1
    local lib
    lib="$("$PG_BIN/pg_config" --pkglibdir 2>/dev/null || true)"
    [[ -n "$lib" && -e "$lib/pg_stat_statements.so" ]]
}

# Starts a PostgreSQL of the bench's own on a free loopback port, with the settings of a fresh
# cluster (as the shared server here has them) plus pg_stat_statements, so that the report can
# count the statements each service ran per order (top-level ones, transaction control such as
# BEGIN and COMMIT left out: commits are counted apart). A role of its own,
# flashsale_bench_probe, runs the bench's own reads, which the counts leave out.
start_private_pg() {
    PG_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flashsale-bench-pg.XXXXXX")"
    [[ $(id -u) -ne 0 ]] || chown postgres "$PG_DIR"
    PG_PORT="$(free_port)"
    pg_as_owner initdb -D "$PG_DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
    pg_as_owner pg_ctl -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 start -o \
        "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=10000 -c pg_stat_statements.track_utility=off" \
        >/dev/null || { cat "$PG_DIR/server.log" >&2; die "the private PostgreSQL did not start"; }
    local url="postgres://postgres@127.0.0.1:$PG_PORT"
    psql "$url/postgres" -w -qc "create extension if not exists pg_stat_statements" >/dev/null
    psql "$url/postgres" -w -qc "create role flashsale_bench_probe login superuser" >/dev/null
    export FLASHSALE_BENCH_POSTGRES_URL="$url"
    export FLASHSALE_BENCH_PROBE_POSTGRES_URL="postgres://flashsale_bench_probe@127.0.0.1:$PG_PORT"
    log "a private PostgreSQL with pg_stat_statements on 127.0.0.1:$PG_PORT ($PG_DIR)"
}

stop_private_pg() {
    [[ -n "$PG_DIR" ]] || return 0
    pg_as_owner pg_ctl -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR"
    PG_DIR=""
}

start_redis_cluster() {
    have redis-server && have redis-cli || die "BENCH_REDIS=cluster needs redis-server and redis-cli"
    CLUSTER_DIR="$(mktemp -d "${TMPDIR:-/tmp}/flashsale-bench-cluster.XXXXXX")"
    local taken=() ports=() port bus i addrs=() node_dir
    for i in 1 2 3 4 5 6; do
        port="$(free_port "${taken[@]}")"
        taken+=("$port")
        bus="$(free_port "${taken[@]}")"
        taken+=("$bus")
        ports+=("$port")
        node_dir="$CLUSTER_DIR/$port"
        mkdir -p "$node_dir"
        redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-port "$bus" \
            --cluster-node-timeout 5000 --cluster-config-file nodes.conf --save "" --appendonly no \
            --dir "$node_dir" --logfile "$node_dir/redis.log" 9>&- >/dev/null 2>&1 </dev/null &
        CLUSTER_PIDS+=("$!")
        addrs+=("127.0.0.1:$port")
    done
    for port in "${ports[@]}"; do
        wait_for 15 port_open 127.0.0.1 "$port" || die "Redis Cluster node on $port did not listen"
    done
    timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$CLUSTER_DIR/create.log" 2>&1 || {
        sed 's/^/    /' "$CLUSTER_DIR/create.log" >&2
        die "redis-cli --cluster create failed"
    }
    # Every node sees the cluster ok and three replicas (each master has its own).
    cluster_ok() {
        local p
        for p in "${ports[@]}"; do
            redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
            (($(redis-cli -p "$p" cluster nodes 2>/dev/null | grep -c 'slave ') == 3)) || return 1
        done
    }
    wait_for 60 cluster_ok || die "the Redis Cluster did not settle (cluster_state:ok, a replica per master) within 60 s"
    CLUSTER_URLS="$(printf 'redis://127.0.0.1:%s,' "${ports[@]}")"
    CLUSTER_URLS="${CLUSTER_URLS%,}"
    log "Redis Cluster of 3 masters + 3 replicas on ports ${ports[*]} (pids ${CLUSTER_PIDS[*]})"
}

# Ports of the second replicas (gRPC and metrics of product-stock, order, outbound), chosen
# before any service starts so that each first replica can already name its peers.
declare -A REPLICA_GRPC REPLICA_METRICS
pick_replica_ports() {
    local svc taken=() p
    for svc in "${SERVICES[@]}"; do
        p="$(free_port "${taken[@]}")"
        taken+=("$p")
        REPLICA_GRPC[$svc]="$p"
        p="$(free_port "${taken[@]}")"
        taken+=("$p")
        REPLICA_METRICS[$svc]="$p"
    done
}

# Starts the second replica of every service (pid file <service>-2.pid, log <service>-2.log in
# the run directory) and waits until `flashsale health` finds all three SERVING.
start_replicas() {
    local svc env pid logf dev
    for svc in "${SERVICES[@]}"; do
        env="$(svc_env "$svc")"
        logf="$RUN_DIR/$svc-2.log"
        # As scripts/up.sh starts the first ones (a development start).
        dev="FLASHSALE_${env}__AUTH__ALLOW_DEVELOPMENT_SECRET"
        env "$dev=${!dev:-true}" \
            "FLASHSALE_${env}__GRPC__ADDR=127.0.0.1:${REPLICA_GRPC[$svc]}" \
            "FLASHSALE_${env}__METRICS__ADDR=127.0.0.1:${REPLICA_METRICS[$svc]}" \
            nohup "$CARGO_TARGET_DIR/release/flashsale-$svc" >"$logf" 2>&1 </dev/null 9>&- &
        pid=$!
        echo "$pid" >"$RUN_DIR/$svc-2.pid"
        REPLICA_PIDS+=("$pid")
        log "started the second $svc replica (pid $pid) on gRPC ${REPLICA_GRPC[$svc]}, metrics ${REPLICA_METRICS[$svc]}, log $logf"
    done
    replicas_healthy() {
        FLASHSALE_PRODUCT_STOCK_URL="http://127.0.0.1:${REPLICA_GRPC[product-stock]}" \
            FLASHSALE_ORDER_URL="http://127.0.0.1:${REPLICA_GRPC[order]}" \
            FLASHSALE_OUTBOUND_URL="http://127.0.0.1:${REPLICA_GRPC[outbound]}" \
            "$CLI" health >/dev/null 2>&1
    }
    wait_for 60 replicas_healthy || die "the second replicas were not all SERVING within 60 s (logs $RUN_DIR/*-2.log)"
}

# On exit, whatever the outcome: stops what this run started.
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [[ -z "$BENCH_PID" ]] || stop_pids "$BENCH_PID"
    [[ -z "$SINK_PID" ]] || stop_pids "$SINK_PID"
    if ((${#REPLICA_PIDS[@]})); then
        stop_pids "${REPLICA_PIDS[@]}"
        rm -f "$RUN_DIR"/*-2.pid
    fi
    if $SERVICES_UP; then scripts/down.sh >/dev/null 2>&1 || true; fi
    if ((${#CLUSTER_PIDS[@]})); then
        stop_pids "${CLUSTER_PIDS[@]}"
        log "stopped the Redis Cluster"
    fi
    [[ -z "$CLUSTER_DIR" ]] || rm -rf "$CLUSTER_DIR"
    stop_private_pg
    exit "$rc"
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

# The tracing scenario (see the top): the platform mode of the big sale, tracing off and sampled
# in turn, each after a restart of the services; then the comparison. Leaves the services
# running without tracing settings.
bench_tracing() { # bench options...
    local rounds="${BENCH_TRACING_ROUNDS:-3}" sample="${BENCH_TRACE_SAMPLE:-0.01}" port round variant report
    [[ "$rounds" =~ ^[1-9][0-9]?$ ]] || die "BENCH_TRACING_ROUNDS must be 1..99 (got '$rounds')"
    [[ "$sample" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] || die "BENCH_TRACE_SAMPLE must be a fraction from 0 to 1 (got '$sample')"
    port="$(free_port)"
    "$CLI" trace-sink --addr "127.0.0.1:$port" >"$OUT/trace-sink.json" &
    SINK_PID=$!
    local status=0
    for ((round = 1; round <= rounds; round++)); do
        for variant in off sampled; do
            scripts/down.sh >/dev/null 2>&1 || true
            if [[ "$variant" == off ]]; then
                export OTEL_SDK_DISABLED=true
                unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_TRACES_SAMPLER OTEL_TRACES_SAMPLER_ARG
            else
                unset OTEL_SDK_DISABLED
                export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$port"
                export OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG="$sample"
            fi
            log "tracing: round $round of $rounds, tracing $variant"
            scripts/up.sh 9>&-
            report="$OUT/tracing-$variant.json"
            ((round == 1)) || report="$OUT/tracing-$variant-$round.json"
            # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
            "$CLI" bench --scenario big-sale --modes platform "$@" ${BENCH_ARGS:-} --json >"$report" &
            BENCH_PID=$!
            wait "$BENCH_PID" || status=1
            BENCH_PID=""
        done
    done
    unset OTEL_SDK_DISABLED OTEL_EXPORTER_OTLP_ENDPOINT OTEL_TRACES_SAMPLER OTEL_TRACES_SAMPLER_ARG
    scripts/down.sh >/dev/null 2>&1 || true
    stop_pids "$SINK_PID"
    SINK_PID=""
    cat "$OUT/trace-sink.json"
    "$CLI" bench-report --tracing-cost "$OUT" | tee "$OUT/tracing.json" || status=1
    scripts/up.sh 9>&-
    return "$status"
}

main() {
    [[ " ${BENCH_ARGS:-} " != *" --modes"* ]] || die "set the modes with BENCH_MODES, not --modes in BENCH_ARGS"
    [[ "$REPLICAS" == 1 || "$REPLICAS" == 2 ]] || die "BENCH_REPLICAS must be 1 or 2, not '$REPLICAS'"
    [[ -z "$BUCKETS" || ("$BUCKETS" =~ ^[0-9]+$ && "$BUCKETS" -ge 1 && "$BUCKETS" -le 64) ]] ||
        die "BENCH_BUCKETS must be 1..=64, not '$BUCKETS'"
    [[ "$REDIS_MODE" == single || "$REDIS_MODE" == cluster ]] || die "BENCH_REDIS must be single or cluster, not '$REDIS_MODE'"
    local extra=()
    [[ -z "$BUCKETS" ]] || extra+=(--stock-buckets "$BUCKETS")
    if [[ "$REDIS_MODE" == cluster ]]; then
        local m kept=()
        IFS=, read -ra m <<<"$MODES"
        for m in "${m[@]}"; do [[ "$m" == gate ]] || kept+=("$m"); done
        ((${#kept[@]})) || die "BENCH_REDIS=cluster leaves no mode to run (the raw gate measures one Redis server)"
        MODES="$(IFS=,; echo "${kept[*]}")"
    fi
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
    local commit dirty=0
    commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
    [[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || dirty=1
    export FLASHSALE_BENCH_COMMIT="$commit" FLASHSALE_BENCH_DIRTY="$dirty"
    OUT="$BENCH_ROOT/$(date -u +%Y%m%dT%H%M%SZ)-${commit:0:12}"
    mkdir -p "$OUT"
    ln -sfn "$(basename "$OUT")" "$BENCH_ROOT/latest"
    # Orders must stay unpaid for the whole run: a long payment timeout, the default warehouse.
    export FLASHSALE_PROFILE=release
    # (The sales end to end run on the default deadline: the services restart for them.)
    local own_deadline=""
    [[ -n "${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS:-}" ]] || own_deadline=yes
    export FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS="${FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS:-3600000}"
    export RUST_LOG="${RUST_LOG:-warn}"
    export FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS="${FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS:-16}"
    export FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS="${FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS:-16}"
    export FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS="${FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS:-8}"
    export FLASHSALE_RUN_DIR="$RUN_DIR"
    # The services get databases of their own for the benchmark, dropped before each run (as
    # are the baselines'): every run starts from empty tables and indexes, not from what the
    # runs before it left behind (which makes each run slower than the last).
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    # PostgreSQL: a private server with pg_stat_statements where one can be started (BENCH_PG
    # unset or "private"), else the server at FLASHSALE_BENCH_POSTGRES_URL ("shared").
    if [[ -z "$PG_MODE" && -z "${FLASHSALE_BENCH_POSTGRES_URL:-}" ]] && private_pg_possible; then
        PG_MODE=private
    fi
    case "${PG_MODE:-shared}" in
        private)
            private_pg_possible || die "BENCH_PG=private needs initdb, pg_ctl and pg_stat_statements (postgresql-contrib)"
            start_private_pg
            ;;
        shared) ;;
        *) die "BENCH_PG must be private or shared, not '$PG_MODE'" ;;
    esac
    local pg="${FLASHSALE_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432}"
    # The bench's own reads of the services' databases run as this role where it exists.
    local probe="${FLASHSALE_BENCH_PROBE_POSTGRES_URL:-$pg}"
    export FLASHSALE_PRODUCT_STOCK__DATABASE__URL="${FLASHSALE_PRODUCT_STOCK__DATABASE__URL:-$pg/flashsale_bench_product}"
    export FLASHSALE_ORDER__DATABASE__URL="${FLASHSALE_ORDER__DATABASE__URL:-$pg/flashsale_bench_svc_orders}"
    export FLASHSALE_OUTBOUND__DATABASE__URL="${FLASHSALE_OUTBOUND__DATABASE__URL:-$pg/flashsale_bench_outbound}"
    # The saga follower reads order states from the order service's database (one query per
    # poll) rather than through GetOrder per order, which would load the service being timed.
    export FLASHSALE_BENCH_ORDERS_DB_URL="${FLASHSALE_BENCH_ORDERS_DB_URL:-$probe/flashsale_bench_svc_orders}"
    # The refusals mode sums the table counters of the services' own databases.
    export FLASHSALE_BENCH_STATS_DBS="${FLASHSALE_BENCH_STATS_DBS:-flashsale_bench_product,flashsale_bench_svc_orders,flashsale_bench_outbound}"
    export FLASHSALE_PRODUCT_STOCK__REDIS__KEY_PREFIX="${FLASHSALE_PRODUCT_STOCK__REDIS__KEY_PREFIX:-fs_bench:}"
    local redis="${FLASHSALE_BENCH_REDIS_URL:-redis://127.0.0.1:6379}"
    local run_tag svc
    run_tag="fs_bench_$(date +%s)_$$"
    for svc in PRODUCT_STOCK ORDER OUTBOUND; do
        export "FLASHSALE_${svc}__AMQP__EXCHANGE=$run_tag.events"
        export "FLASHSALE_${svc}__AMQP__QUEUE_PREFIX=$run_tag."
        export "FLASHSALE_${svc}__AMQP__QUEUE_EXPIRES_MS=3600000"
    done
    if [[ "$REDIS_MODE" == cluster ]]; then
        start_redis_cluster
        export FLASHSALE_PRODUCT_STOCK__REDIS__MODE=cluster
        export FLASHSALE_PRODUCT_STOCK__REDIS__CLUSTER_NODES="$CLUSTER_URLS"
    fi
    local metrics=() pid_args=()
    if ((REPLICAS == 2)); then
        for svc in "${SERVICES[@]}"; do metrics+=("http://127.0.0.1:$(svc_metrics_port "$svc")/metrics"); done
        pick_replica_ports
        # Each service's callers name both replicas of it (platform::balance spreads the calls).
        export FLASHSALE_ORDER__UPSTREAM__PRODUCT_STOCK_URL="http://127.0.0.1:$(svc_grpc_port product-stock),http://127.0.0.1:${REPLICA_GRPC[product-stock]}"
        export FLASHSALE_OUTBOUND__UPSTREAM__PRODUCT_STOCK_URL="$FLASHSALE_ORDER__UPSTREAM__PRODUCT_STOCK_URL"
        export FLASHSALE_PRODUCT_STOCK__ORDER_SERVICE__URL="http://127.0.0.1:$(svc_grpc_port order),http://127.0.0.1:${REPLICA_GRPC[order]}"
        extra+=(--order-url "http://127.0.0.1:$(svc_grpc_port order),http://127.0.0.1:${REPLICA_GRPC[order]}")
        for svc in "${SERVICES[@]}"; do metrics+=("http://127.0.0.1:${REPLICA_METRICS[$svc]}/metrics"); done
        export FLASHSALE_BENCH_METRICS_URLS="${FLASHSALE_BENCH_METRICS_URLS:-$(IFS=,; echo "${metrics[*]}")}"
    fi
    log "replicas per service: $REPLICAS; stock buckets: ${BUCKETS:-service default}; Redis: $REDIS_MODE"
    log "service pools: product-stock $FLASHSALE_PRODUCT_STOCK__DATABASE__MAX_CONNECTIONS, order $FLASHSALE_ORDER__DATABASE__MAX_CONNECTIONS, outbound $FLASHSALE_OUTBOUND__DATABASE__MAX_CONNECTIONS connections"
    scripts/down.sh >/dev/null 2>&1 || true
    drop_bench_databases "$pg"
    drop_bench_keys "$redis"
    drop_bench_queues
    # The services must not inherit the lock: services left running by a killed benchmark
    # would otherwise hold it until they stop.
    SERVICES_UP=true
    scripts/up.sh 9>&-
    if ((REPLICAS == 2)); then
        start_replicas
        # Every process by name, so that the report gives each one's CPU and memory.
        for svc in "${SERVICES[@]}"; do
            pid_args+=(--service-pid "$svc=$(<"$RUN_DIR/$svc.pid")" --service-pid "$svc-2=$(<"$RUN_DIR/$svc-2.pid")")
        done
    fi
    local s modes failed=() sale_services=false sustain_bounds=false sale_args=() rounds round report
    for s in "${scenarios[@]}"; do
        log "scenario $s"
        case "$s" in
            sale | sustained)
                ((REPLICAS == 1)) || die "the sale scenarios run with one replica per service"
                if [[ "$s" == sustained ]]; then
                    # Arrivals past what the machine completes: admission control bounds the
                    # backlog at BENCH_SUSTAIN_MAX_BACKLOG orders waiting for the saga and as
                    # many waiting to ship (a few seconds of completions here).
                    export FLASHSALE_ORDER__ADMISSION__MAX_UNCONFIRMED="${BENCH_SUSTAIN_MAX_BACKLOG:-1000}"
                    export FLASHSALE_ORDER__ADMISSION__MAX_UNSHIPPED="${BENCH_SUSTAIN_MAX_BACKLOG:-1000}"
                    sale_services=false
                    sustain_bounds=true
                elif $sustain_bounds; then
                    # The burst sale runs on the default bounds.
                    unset FLASHSALE_ORDER__ADMISSION__MAX_UNCONFIRMED FLASHSALE_ORDER__ADMISSION__MAX_UNSHIPPED
                    sale_services=false
                    sustain_bounds=false
                fi
                if ! $sale_services; then
                    log "restarting the services on their default payment deadline for the $s scenario"
                    scripts/down.sh >/dev/null 2>&1 || true
                    [[ -z "$own_deadline" ]] || unset FLASHSALE_ORDER__SAGA__PAYMENT_TIMEOUT_MS
                    scripts/up.sh 9>&-
                    sale_services=true
                fi
                sale_args=(--products 4 --pay 1 --never-pay 0 --pay-late 0 --quiet --json)
                rounds=1
                if [[ "$s" == sale ]]; then
                    sale_args+=(--buyers 40000 --stock 8000 --per-user-limit 1 --max-duration-secs 900)
                else
                    rounds="${BENCH_SUSTAIN_ROUNDS:-1}"
                    [[ "$rounds" =~ ^[1-9][0-9]?$ ]] || die "BENCH_SUSTAIN_ROUNDS must be 1..99 (got '$rounds')"
                    # One unit per buyer, as in a real sale: the per-user check then has a limit
                    # to hold.
                    sale_args+=(--arrival-rate "${BENCH_SUSTAIN_RATE:-500}" --sustain-secs "${BENCH_SUSTAIN_SECS:-60}"
                        --stock 10000000 --per-user-limit 1 --max-duration-secs 900
                        --order-database-url "$probe/flashsale_bench_svc_orders"
                        --product-database-url "$probe/flashsale_bench_product"
                        --outbound-database-url "$probe/flashsale_bench_outbound"
                        --amqp-url "${FLASHSALE_BENCH_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
                        --queue-prefix "$run_tag.")
                fi
                for ((round = 1; round <= rounds; round++)); do
                    report="$OUT/$s.json"
                    ((round == 1)) || report="$OUT/$s-$round.json"
                    ((rounds == 1)) || log "$s: round $round of $rounds"
                    # shellcheck disable=SC2086 # SALE_ARGS is a list of options
                    "$CLI" sale "${sale_args[@]}" ${SALE_ARGS:-} >"$report" &
                    BENCH_PID=$!
                    wait "$BENCH_PID" || failed+=("$s round $round")
                    BENCH_PID=""
                    cat "$report"
                done
                continue
                ;;
            tracing)
                ((REPLICAS == 1)) || die "the tracing scenario runs with one replica per service"
                bench_tracing "${pid_args[@]+"${pid_args[@]}"}" || failed+=("$s")
                continue
                ;;
        esac
        modes="$MODES"
        [[ -n "$MODES_GIVEN" || "$s" != flood ]] || modes="$MODES,refusals"
        # In the background, waited for: a signal to the script then stops it at once (the
        # shell runs its traps only between commands, and `wait` is where it waits).
        # shellcheck disable=SC2086 # BENCH_ARGS is a list of options
        "$CLI" bench --scenario "$s" --modes "$modes" \
            ${extra[@]+"${extra[@]}"} ${pid_args[@]+"${pid_args[@]}"} ${BENCH_ARGS:-} --json >"$OUT/$s.json" &
        BENCH_PID=$!
        # A broken invariant or a mode with errors fails the run, once every scenario ran.
        wait "$BENCH_PID" || failed+=("$s")
        BENCH_PID=""
        cat "$OUT/$s.json"
    done
    # Nothing is left behind but the reports: the services stop, their databases and keys go.
    if ((${#REPLICA_PIDS[@]})); then
        stop_pids "${REPLICA_PIDS[@]}"
        REPLICA_PIDS=()
        rm -f "$RUN_DIR"/*-2.pid
    fi
    scripts/down.sh >/dev/null 2>&1 || true
    SERVICES_UP=false
    drop_bench_databases "$pg"
    drop_bench_keys "$redis"
    drop_bench_queues "$run_tag"
    log "reports in $OUT"
    ((${#failed[@]} == 0)) || die "an invariant broke or a mode had errors in: ${failed[*]} (see the checks in $OUT)"
}

main
