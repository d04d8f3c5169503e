#!/usr/bin/env bash
# Dependency hygiene, run by CI:
#   1. cargo machete: no crate declares a dependency it does not use;
#   2. cargo deny check licenses bans sources: every dependency's licence is one deny.toml
#      allows, no banned crate or duplicate that deny.toml forbids, every crate from crates.io.
# Both tools are installed from crates.io (into ~/.cargo/bin) when missing. The advisory
# database is not checked here: it is fetched from outside the package registries.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT="check-deps"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

install_tool() {
    local bin="$1" crate="$2" version="$3"
    if have "$bin"; then
        return 0
    fi
    log "installing $crate $version from crates.io (once)"
    # its own target directory: the tool's build never locks or bloats the workspace's
    cargo install --locked "$crate" --version "$version" \
        --target-dir "${TMPDIR:-/tmp}/flashsale-tools-target"
}

main() {
    export PATH="$HOME/.cargo/bin:$PATH"
    install_tool cargo-machete cargo-machete 0.9.2
    install_tool cargo-deny cargo-deny 0.20.2
    log "cargo machete"
    cargo machete
    log "cargo deny check licenses bans sources"
    cargo deny --log-level error check licenses bans sources
}

main "$@"
