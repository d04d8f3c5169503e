#!/usr/bin/env bash
# Runs the whole test suite against real servers:
#   1. scripts/dev-infra.sh (PostgreSQL, Redis, RabbitMQ reachable at FLASHSALE_TEST_*_URL),
#   2. drops fs_test_* databases and old fs_test_*/fs_cli_*/fs_e2e_* Redis keys that earlier runs
#      left behind (ones still in use are kept),
#   3. cargo build --workspace --bins --tests --features flashsale-platform/failpoints: one build
#      for everything below (the end-to-end and fault tests start the service binaries, and the
#      fault scenarios arm failpoints, which only builds with that feature have),
#   4. cargo nextest run --workspace --features flashsale-platform/failpoints "$@"
#      (cargo test … without nextest), which finds that build up to date,
#   5. the failpoint tests of flashsale-platform built without the feature, as a release build
#      of a service is: nothing fires, and FLASHSALE_FAILPOINTS is refused.
# Extra arguments go to the test runner (e.g. a filter: scripts/test.sh reserve_fails).
# The exit code is the test runner's (non-zero when either run failed).
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT="test"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

drop_leftover_test_databases() {
    if ! have psql; then
        warn "psql not found: leftover fs_test_* databases are not dropped"
        return 0
    fi
    local admin db dropped=0 busy=0 dbs=()
    admin="$(url_base "$FLASHSALE_TEST_POSTGRES_URL")/postgres"
    mapfile -t dbs < <(psql "$admin" -w -Atqc \
        "select datname from pg_database where datname like 'fs\\_test\\_%' order by 1")
    for db in "${dbs[@]}"; do
        [[ "$db" =~ ^fs_test_[A-Za-z0-9_]+$ ]] || continue
        # without FORCE: a database a running test still uses is kept
        if psql "$admin" -w -qc "drop database if exists \"$db\"" >/dev/null 2>&1; then
            dropped=$((dropped + 1))
        else
            busy=$((busy + 1))
        fi
    done
    if ((dropped + busy > 0)); then
        log "dropped $dropped leftover test database(s); kept $busy in use"
    fi
}

# Tests give every run its own Redis key prefix (fs_test_*, fs_cli_*, fs_e2e_*); what runs that
# ended long ago left behind (a gate's counters have no TTL) is removed here. Keys younger than
# an hour may belong to a test running right now and are kept.
drop_leftover_test_keys() {
    if ! have redis-cli; then
        warn "redis-cli not found: leftover test keys are not removed"
        return 0
    fi
    local url="$FLASHSALE_TEST_REDIS_URL" pattern removed=0 n
    # Unlinks, of the keys given, those idle for over an hour (one round trip per 500 keys).
    local script="local n = 0 for _, k in ipairs(ARGV) do local i = redis.call('OBJECT', 'IDLETIME', k)
        if i and i > 3600 then redis.call('UNLINK', k) n = n + 1 end end return n"
    for pattern in 'fs_test_*' 'fs_cli_*' 'fs_e2e_*'; do
        while IFS= read -r n; do
            [[ "$n" =~ ^[0-9]+$ ]] && removed=$((removed + n))
        done < <(redis-cli -u "$url" --scan --pattern "$pattern" 2>/dev/null |
            xargs -r -n 500 redis-cli -u "$url" eval "$script" 0 2>/dev/null)
    done
    if ((removed > 0)); then
        log "removed $removed leftover test key(s) from Redis"
    fi
}

main() {
    scripts/dev-infra.sh
    drop_leftover_test_databases
    drop_leftover_test_keys
    # The end-to-end tests (crates/e2e) and the fault scenarios (crates/faults) run the service
    # binaries as separate processes. Building them with the tests, with the same features,
    # makes one build serve both: the test run below compiles nothing more.
    local features=(--features flashsale-platform/failpoints) status=0
    # One failing test never stops the run (.config/nextest.toml says so too); the flag is
    # added unless the caller passed it already (the runners refuse it twice).
    local args=("$@")
    if [[ " $* " != *" --no-fail-fast "* ]]; then
        args=(--no-fail-fast "${args[@]}")
    fi
    log "cargo build --workspace --bins --tests ${features[*]}"
    cargo build --workspace --bins --tests "${features[@]}"
    if cargo nextest --version >/dev/null 2>&1; then
        log "cargo nextest run --workspace ${features[*]} ${args[*]}"
        # .config/nextest.toml prints the failed tests' names again last.
        cargo nextest run --workspace "${features[@]}" "${args[@]}" || status=$?
        log "cargo nextest run -p flashsale-platform --lib failpoint (built without failpoints)"
        cargo nextest run -p flashsale-platform --lib failpoint || status=$?
    else
        warn "cargo-nextest is not installed; falling back to cargo test"
        log "cargo test --workspace ${features[*]} ${args[*]}"
        cargo test --workspace "${features[@]}" "${args[@]}" || status=$?
        log "cargo test -p flashsale-platform --lib failpoint (built without failpoints)"
        cargo test -p flashsale-platform --lib failpoint || status=$?
    fi
    return "$status"
}

main "$@"
