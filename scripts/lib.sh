# shellcheck shell=bash
# Shared helpers for scripts/*.sh. Source it after `cd` to the repository root:
#   . scripts/lib.sh
# It sets nothing global besides the functions below and SCRIPT (the caller's name, for messages).

SCRIPT="${SCRIPT:-$(basename "${0:-flashsale}" .sh)}"

# Default URLs of the development servers. Tests read the same variables.
: "${FLASHSALE_TEST_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432}"
: "${FLASHSALE_TEST_REDIS_URL:=redis://127.0.0.1:6379}"
: "${FLASHSALE_TEST_AMQP_URL:=amqp://guest:guest@127.0.0.1:5672/%2f}"
export FLASHSALE_TEST_POSTGRES_URL FLASHSALE_TEST_REDIS_URL FLASHSALE_TEST_AMQP_URL

# Where cargo builds: shared between checkouts so a second clone does not rebuild the world.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flashsale-target}"

# Where up.sh keeps pid files and logs.
# shellcheck disable=SC2034 # used by the scripts that source this file
RUN_DIR="${FLASHSALE_RUN_DIR:-$PWD/.run}"

# The services up.sh runs, in start order (binary flashsale-NAME).
# shellcheck disable=SC2034
SERVICES=(product-stock order outbound)

# The payment provider simulator up.sh runs beside them (binary flashsale-payment-sim), its
# address (the order service's default payment.provider_url points there) and extra options.
# shellcheck disable=SC2034
PAYMENT_SIM=payment-sim
PAYMENT_SIM_ADDR="${FLASHSALE_PAYMENT_SIM_ADDR:-127.0.0.1:50054}"

log() { printf '%s: %s\n' "$SCRIPT" "$*"; }
warn() { printf '%s: warning: %s\n' "$SCRIPT" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$SCRIPT" "$*" >&2
    exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif have sudo; then
        sudo "$@"
    else
        die "need root for: $* (and sudo is not installed)"
    fi
}

# Env prefix of a service: product-stock -> PRODUCT_STOCK.
svc_env() {
    local s="${1//-/_}"
    printf '%s' "${s^^}"
}

# Default gRPC / metrics port of a service.
svc_default_grpc_port() {
    case "$1" in
        product-stock) echo 50051 ;;
        order) echo 50052 ;;
        outbound) echo 50053 ;;
        *) die "unknown service $1" ;;
    esac
}
svc_default_metrics_port() {
    case "$1" in
        product-stock) echo 9101 ;;
        order) echo 9102 ;;
        outbound) echo 9103 ;;
        *) die "unknown service $1" ;;
    esac
}

# Port a service listens on for gRPC / metrics, honouring FLASHSALE_<SVC>__GRPC__ADDR and
# FLASHSALE_<SVC>__METRICS__ADDR overrides (ip:port).
svc_grpc_port() {
    local var
    var="FLASHSALE_$(svc_env "$1")__GRPC__ADDR"
    if [[ -n "${!var:-}" ]]; then echo "${!var##*:}"; else svc_default_grpc_port "$1"; fi
}
svc_metrics_port() {
    local var
    var="FLASHSALE_$(svc_env "$1")__METRICS__ADDR"
    if [[ -n "${!var:-}" ]]; then echo "${!var##*:}"; else svc_default_metrics_port "$1"; fi
}

# Splits scheme://[user[:pass]@]host[:port][/path][?query] and prints "host port".
# IPv6 hosts may be bracketed ([::1]). The port defaults to $2.
url_host_port() {
    local url="$1" default_port="$2" rest host port
    rest="${url#*://}"
    rest="${rest%%/*}"
    rest="${rest%%\?*}"
    rest="${rest##*@}"
    if [[ "$rest" == \[* ]]; then
        host="${rest%%]*}"
        host="${host#[}"
        port="${rest#*]}"
        port="${port#:}"
    elif [[ "$rest" == *:* ]]; then
        host="${rest%%:*}"
        port="${rest##*:}"
    else
        host="$rest"
        port=""
    fi
    printf '%s %s\n' "${host:-127.0.0.1}" "${port:-$default_port}"
}

# scheme://authority of a URL (no path, no query): postgres://u@h:5432/db -> postgres://u@h:5432
url_base() {
    local url="$1" scheme rest
    scheme="${url%%://*}"
    rest="${url#*://}"
    rest="${rest%%/*}"
    rest="${rest%%\?*}"
    printf '%s://%s\n' "$scheme" "$rest"
}

# The URL with any password replaced by ***, for messages.
url_redact() {
    local url="$1"
    if [[ "$url" =~ ^([a-z0-9+.-]+://[^:/@]*):[^@/]*@(.*)$ ]]; then
        printf '%s:***@%s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    else
        printf '%s\n' "$url"
    fi
}

# True when host names this machine.
is_local_host() {
    case "$1" in
        127.* | localhost | ::1 | 0.0.0.0 | "") return 0 ;;
        *) return 1 ;;
    esac
}

# True when something accepts TCP connections at host:port (bash /dev/tcp, 2 s limit).
port_open() {
    local host="$1" port="$2"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null
}

# Polls `"$@"` once every half second until it succeeds or `secs` pass.
wait_for() {
    local secs="$1"
    shift
    local deadline=$((SECONDS + secs))
    until "$@"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# True when pid is a live process (a zombie, exited but not yet reaped by init, is not).
pid_alive() {
    local pid="$1" stat
    kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r /proc/$pid/stat ]] && stat="$(<"/proc/$pid/stat")" 2>/dev/null; then
        stat="${stat##*) }"
        [[ "${stat%% *}" != Z ]] || return 1
    fi
    return 0
}

# True when pid is alive and its command line mentions `needle` (guards against pid reuse).
pid_is() {
    local pid="$1" needle="$2"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    pid_alive "$pid" || return 1
    [[ -r /proc/$pid/cmdline ]] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$needle"
}

# Pid recorded in a pid file if that process is alive and is `needle`; else nothing.
live_pid() {
    local file="$1" needle="$2" pid
    [[ -f "$file" ]] || return 1
    pid="$(<"$file")"
    pid_is "$pid" "$needle" || return 1
    printf '%s\n' "$pid"
}
