#!/usr/bin/env bash
# Checks the gRPC/event contract in proto/ with buf (configuration: buf.yaml):
#   1. `buf lint` (STANDARD rules),
#   2. `buf breaking` (FILE rules) of the working tree against the previous commit's proto/,
#      or against HEAD itself when the clone has no previous commit (a fresh or shallow clone).
# Exits non-zero on any finding.
#
#   scripts/check-proto.sh [--descriptor-set FILE]
#
# --descriptor-set FILE also writes the contract, with every import (google.rpc error details,
# google.protobuf well-known types), as an encoded google.protobuf.FileDescriptorSet to FILE.
#
# buf comes from npm (@bufbuild/buf, version $BUF_VERSION) and is installed on first use into
# $FLASHSALE_TOOLS_DIR (default ~/.cache/flashsale-tools), never into the repository.
# FLASHSALE_PROTO_AGAINST overrides what `buf breaking` compares with (any buf input, e.g.
# '.git#branch=main,subdir=proto').
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=check-proto
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

BUF_VERSION="${BUF_VERSION:-1.75.0}"
TOOLS_DIR="${FLASHSALE_TOOLS_DIR:-$HOME/.cache/flashsale-tools}"
BUF_PREFIX="$TOOLS_DIR/buf-$BUF_VERSION"
BUF="$BUF_PREFIX/node_modules/.bin/buf"

descriptor_set=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --descriptor-set)
        [[ $# -ge 2 ]] || die "--descriptor-set needs a file"
        descriptor_set="$2"
        shift 2
        ;;
    -h | --help)
        sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument: $1 (see --help)" ;;
    esac
done

if [[ ! -x "$BUF" ]] || [[ "$("$BUF" --version 2>/dev/null)" != "$BUF_VERSION" ]]; then
    have npm || die "buf is not installed and npm is missing (install Node.js, or put buf $BUF_VERSION at $BUF)"
    log "installing buf $BUF_VERSION into $BUF_PREFIX"
    mkdir -p "$BUF_PREFIX"
    npm install --prefix "$BUF_PREFIX" --no-audit --no-fund --loglevel=error \
        "@bufbuild/buf@$BUF_VERSION" >&2
    [[ -x "$BUF" ]] || die "npm did not install $BUF"
fi

log "buf lint"
"$BUF" lint

if [[ -n "${FLASHSALE_PROTO_AGAINST:-}" ]]; then
    against="$FLASHSALE_PROTO_AGAINST"
elif git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null; then
    against='.git#ref=HEAD~1,subdir=proto'
else
    warn "no previous commit in this clone: comparing proto/ with HEAD, which only catches uncommitted breaking changes"
    against='.git#ref=HEAD,subdir=proto'
fi
log "buf breaking --against '$against'"
"$BUF" breaking --against "$against"

if [[ -n "$descriptor_set" ]]; then
    mkdir -p "$(dirname "$descriptor_set")"
    "$BUF" build --as-file-descriptor-set -o "$descriptor_set"
    log "descriptor set written to $descriptor_set"
fi
log "ok"
