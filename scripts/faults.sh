#!/usr/bin/env bash
# Runs the fault suite (crates/faults): every scenario starts its own PostgreSQL and Redis on
# free loopback ports, and the suite its own RabbitMQ node (scenarios that stop the broker start
# one more), so the shared servers are never touched. Each scenario prints one line of figures;
# the exit code is non-zero when any scenario fails.
#   scripts/faults.sh                         every scenario
#   scripts/faults.sh --scenario pg_restart   one (repeat --scenario for several)
#   scripts/faults.sh --seed 7                other buyers' choices
# Needs PostgreSQL 15's server programs (initdb, pg_ctl; FLASHSALE_FAULTS_PG_BIN overrides
# /usr/lib/postgresql/15/bin), redis-server and rabbitmq-server on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT="faults"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

BINS=""

main() {
    # Failpoints exist only in builds with this feature (a release build has none).
    log "cargo build --workspace --bins --features flashsale-platform/failpoints"
    cargo build --workspace --bins --features flashsale-platform/failpoints
    local target="${CARGO_TARGET_DIR:-target}"
    # A private copy of the binaries: another build in a shared target directory cannot
    # replace them while the scenarios run.
    BINS="$(mktemp -d "${TMPDIR:-/tmp}/fs_faults_bins.XXXXXX")"
    trap 'rm -rf "$BINS"' EXIT
    cp "$target"/debug/flashsale-{product-stock,order,outbound,payment-sim,faults} "$BINS"/
    log "flashsale-faults ${*:---scenario all}"
    FLASHSALE_FAULTS_BIN_DIR="$BINS" "$BINS/flashsale-faults" "$@"
}

main "$@"
