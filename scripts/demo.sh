#!/usr/bin/env bash
# Brings the platform up (scripts/up.sh) and shows its health.
# (A later step makes it run a flash sale end to end.)
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=demo
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

main() {
    scripts/up.sh
    log "flashsale health"
    "$CARGO_TARGET_DIR/debug/flashsale" health
    log "the services keep running; stop them with scripts/down.sh"
}

main "$@"
