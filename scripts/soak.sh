#!/usr/bin/env bash
# The soak of the fault suite (crates/faults): one sale lasting --seconds, restocked every ten
# seconds, through the suite's faults injected one at a time at moments a seeded RNG chose (the
# same --seed replays the same schedule, which is printed first), on private servers like every
# scenario. Prints one line of figures; the exit code is non-zero when a promise is broken.
#   scripts/soak.sh --seed 3 --seconds 60
#   scripts/soak.sh --seed 3 --seconds 120 --clusters   # on a Redis Cluster and a RabbitMQ cluster
# Needs what scripts/faults.sh needs (PostgreSQL 15's server programs, redis-server,
# rabbitmq-server).
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT="soak"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

BINS=""

main() {
    # Failpoints exist only in builds with this feature (a release build has none).
    log "cargo build --workspace --bins --features flashsale-platform/failpoints"
    cargo build --workspace --bins --features flashsale-platform/failpoints
    local target="${CARGO_TARGET_DIR:-target}"
    # A private copy of the binaries: another build in a shared target directory cannot
    # replace them while the soak runs.
    BINS="$(mktemp -d "${TMPDIR:-/tmp}/fs_soak_bins.XXXXXX")"
    trap 'rm -rf "$BINS"' EXIT
    cp "$target"/debug/flashsale-{product-stock,order,outbound,payment-sim,faults} "$BINS"/
    log "flashsale-faults soak $*"
    FLASHSALE_FAULTS_BIN_DIR="$BINS" "$BINS/flashsale-faults" soak "$@"
}

main "$@"
