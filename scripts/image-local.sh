#!/usr/bin/env bash
# Builds the flashsale image on a machine with podman but without a Docker engine or a
# reachable image registry, runs the stack from it and checks it with `flashsale verify`:
#   1. a Debian 12 (bookworm) root made by debootstrap (--variant=minbase, from Debian's
#      mirror), imported with `podman import` as localhost/flashsale-base:bookworm; the root is
#      kept in $FLASHSALE_IMAGE_DIR (default ~/.cache/flashsale-image) and made once,
#   2. cargo build --release --workspace --bins (as deploy/Dockerfile builds them), then
#      `podman build -f deploy/Containerfile.local`: the binaries and config/ copied onto that
#      base, with deploy/Dockerfile's paths, user, ports, labels and health check, tagged
#      localhost/flashsale:local,
#   3. the payment simulator and the three services started from the image, on the host's
#      network, against the PostgreSQL, Redis and RabbitMQ that scripts/dev-infra.sh makes
#      reachable (the services' default configuration, as scripts/up.sh runs them): with
#      `podman run` where this machine lets a container start; where it does not (a sandbox
#      without CAP_SYS_RESOURCE, whose crun cannot set a container's resource limits), from the
#      image's own root filesystem (`podman image mount`) in a mount and PID namespace of their
#      own (unshare, chroot), as the image's user 10001 and with the image's environment,
#   4. `flashsale verify --service all` from the image against them, then stops them.
# Needs root (podman and debootstrap as root; apt installs them where they are missing), and the
# default ports free (50051-50054, 9101-9103: scripts/down.sh first). Not part of .ci/run: the
# first run downloads a Debian base and builds release binaries (minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=image-local
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

IMAGE_DIR="${FLASHSALE_IMAGE_DIR:-$HOME/.cache/flashsale-image}"
BASE=localhost/flashsale-base:bookworm
IMAGE=localhost/flashsale:local
# vfs: the overlay driver cannot stack on an overlay root, as a container's own is
PODMAN=(podman --storage-driver=vfs)
STARTED=()   # pids of what this run started
MOUNTED=""   # the image's root while it is mounted

cleanup() {
    local pid
    # SIGTERM to each server (podman forwards it to its container; `unshare --fork` ignores it
    # itself, so it goes to unshare's child), and a wait for its graceful stop.
    for pid in "${STARTED[@]}"; do
        if [[ -z "$MOUNTED" ]]; then
            kill -TERM "$pid" 2>/dev/null || true
        else
            pkill -TERM -P "$pid" 2>/dev/null || true
        fi
    done
    for pid in "${STARTED[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [[ -n "$MOUNTED" ]]; then "${PODMAN[@]}" image unmount "$IMAGE" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

ensure_tools() {
    local missing=()
    have podman || missing+=(podman)
    have debootstrap || missing+=(debootstrap)
    have unshare || missing+=(util-linux)
    if ((${#missing[@]})); then
        log "installing ${missing[*]} (apt)"
        as_root apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}

base_image() {
    if "${PODMAN[@]}" image exists "$BASE"; then
        log "$BASE exists"
        return 0
    fi
    if [[ ! -x "$IMAGE_DIR/rootfs/bin/sh" ]]; then
        log "debootstrap --variant=minbase bookworm into $IMAGE_DIR/rootfs"
        mkdir -p "$IMAGE_DIR"
        rm -rf "$IMAGE_DIR/rootfs"
        as_root debootstrap --variant=minbase bookworm "$IMAGE_DIR/rootfs" >"$IMAGE_DIR/debootstrap.log" 2>&1 ||
            die "debootstrap failed; see $IMAGE_DIR/debootstrap.log"
    fi
    log "podman import $BASE"
    tar -C "$IMAGE_DIR/rootfs" -c . | "${PODMAN[@]}" import --quiet - "$BASE" >/dev/null
}

build_image() {
    log "cargo build --release --workspace --bins"
    cargo build --release --workspace --bins
    local ctx
    ctx="$(mktemp -d)"
    mkdir -p "$ctx/bin"
    cp "$CARGO_TARGET_DIR"/release/{flashsale,flashsale-product-stock,flashsale-order,flashsale-outbound,flashsale-payment-sim} "$ctx/bin/"
    cp -r config "$ctx/config"
    log "podman build -f deploy/Containerfile.local -t $IMAGE"
    # Docker's image format: OCI's has no HEALTHCHECK
    "${PODMAN[@]}" build --quiet --format docker -f deploy/Containerfile.local -t "$IMAGE" "$ctx" >/dev/null
    rm -rf "$ctx"
    "${PODMAN[@]}" image inspect --format '{{.Config.User}} {{index .Config.Labels "org.opencontainers.image.title"}} {{.Config.Env}} healthcheck {{.HealthCheck.Test}}' "$IMAGE" |
        sed "s/^/$SCRIPT: image: /"
}

# Whether this machine lets a container of the image start.
containers_run() {
    local out
    if out="$("${PODMAN[@]}" run --rm --network host "$IMAGE" flashsale --version 2>&1)"; then
        return 0
    fi
    log "podman run cannot start a container here: $out"
    return 1
}

# Starts `args…` from the image, in the background; its pid goes to STARTED.
start() { # name args...
    local name="$1" log_file
    shift
    log_file="$RUN_DIR/image-$name.log"
    mkdir -p "$RUN_DIR"
    if [[ -z "$MOUNTED" ]]; then
        "${PODMAN[@]}" run --rm --network host --name "flashsale-$name" \
            -e "FLASHSALE_${ENV_PREFIX[$name]}__AUTH__ALLOW_DEVELOPMENT_SECRET=true" \
            "$IMAGE" "$@" >"$log_file" 2>&1 &
    else
        # The image's environment, user and root, without an OCI runtime.
        env -i "${IMAGE_ENV[@]}" \
            "FLASHSALE_${ENV_PREFIX[$name]}__AUTH__ALLOW_DEVELOPMENT_SECRET=true" \
            unshare --mount --pid --fork --kill-child \
            chroot --userspec=10001:10001 "$MOUNTED" "$@" >"$log_file" 2>&1 &
    fi
    STARTED+=("$!")
    log "started $name from the image (pid $!), log $log_file"
}

declare -A ENV_PREFIX=([payment-sim]=PAYMENT_SIM [product-stock]=PRODUCT_STOCK [order]=ORDER [outbound]=OUTBOUND)
IMAGE_ENV=()

main() {
    ensure_tools
    scripts/dev-infra.sh
    for port in 50051 50052 50053 50054 9101 9102 9103; do
        if port_open 127.0.0.1 "$port"; then die "port $port is taken (scripts/down.sh stops what up.sh started)"; fi
    done
    base_image
    build_image
    if ! containers_run; then
        MOUNTED="$("${PODMAN[@]}" image mount "$IMAGE")"
        mapfile -t IMAGE_ENV < <("${PODMAN[@]}" image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
        IMAGE_ENV+=("HOME=/")
        log "running from the image's root filesystem $MOUNTED instead"
    fi
    start payment-sim flashsale-payment-sim --addr "$PAYMENT_SIM_ADDR"
    wait_for 60 port_open 127.0.0.1 "${PAYMENT_SIM_ADDR##*:}" ||
        die "the payment simulator from the image did not listen within 60 s ($RUN_DIR/image-payment-sim.log)"
    local svc
    for svc in "${SERVICES[@]}"; do start "$svc" "flashsale-$svc"; done
    local deadline=$((SECONDS + 90))
    until "$CARGO_TARGET_DIR/release/flashsale" health >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "the services from the image were not SERVING within 90 s (logs in $RUN_DIR/image-*.log)"
        sleep 1
    done
    log "all three services from the image are SERVING; flashsale verify --service all"
    if [[ -z "$MOUNTED" ]]; then
        "${PODMAN[@]}" run --rm --network host "$IMAGE" \
            flashsale verify --service all --payment-sim-url "http://$PAYMENT_SIM_ADDR"
    else
        env -i "${IMAGE_ENV[@]}" unshare --mount --pid --fork --kill-child \
            chroot --userspec=10001:10001 "$MOUNTED" \
            flashsale verify --service all --payment-sim-url "http://$PAYMENT_SIM_ADDR"
    fi
}

main "$@"
