#!/usr/bin/env bash
# Makes PostgreSQL, Redis and RabbitMQ reachable at the URLs the tests and services use:
#
#   FLASHSALE_TEST_POSTGRES_URL  (default postgres://postgres@127.0.0.1:5432)
#   FLASHSALE_TEST_REDIS_URL     (default redis://127.0.0.1:6379)
#   FLASHSALE_TEST_AMQP_URL      (default amqp://guest:guest@127.0.0.1:5672/%2f)
#
# For each server, in this order of preference:
#   1. something already answers there: use it, touch nothing;
#   2. a Docker engine answers: `docker compose -f deploy/docker-compose.yml up -d <svc>`;
#   3. install Debian's package if missing (apt-get, sudo when not root) and start it as a
#      local process on the URL's port (PostgreSQL through pg_ctlcluster, a cluster of its own
#      for a non-default port; Redis daemonized without persistence; RabbitMQ detached, as node
#      rabbit_<port> for a non-default port so it can run beside a broker on 5672).
# Idempotent: when all three answer it only probes them (a second or so).
# Set FLASHSALE_INFRA_NO_DOCKER=1 to skip step 2.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=dev-infra
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

COMPOSE_FILE=deploy/docker-compose.yml
INFRA_DIR="$RUN_DIR/infra" # logs of servers this script starts as local processes
APT_UPDATED=0
DOCKER_STATE="" # "", yes or no: probed once
RABBIT_NODE=""  # Erlang node name of a broker started on a non-default port (for messages)

# ---------------------------------------------------------------------------------------------
# probes

pg_answers() { # host port
    if have pg_isready; then
        pg_isready -q -h "$1" -p "$2" -t 2
    else
        port_open "$1" "$2"
    fi
}

# Prints psql's error and fails when the URL's user cannot log in without a prompt.
pg_login_error() { # url
    have psql || return 0
    local out
    if out="$(PGCONNECT_TIMEOUT=3 psql "$(url_base "$1")/postgres" -w -Atqc 'select 1' 2>&1)"; then
        return 0
    fi
    printf '%s\n' "$out"
    return 1
}

redis_answers() { # url host port
    if have redis-cli; then
        [[ "$(timeout 3 redis-cli -u "$1" ping 2>/dev/null)" == PONG ]]
    else
        # shellcheck disable=SC2016 # expanded by the inner bash
        timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
            printf "PING\r\n" >&3
            IFS= read -r line <&3 && [[ $line == +PONG* ]]' "$2" "$3" 2>/dev/null
    fi
}

# Sends the AMQP 0-9-1 protocol header; a broker answers with a method frame (type 1).
amqp_answers() { # host port
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" || exit 1
        printf "AMQP\x00\x00\x09\x01" >&3
        printf -v one "\001"
        IFS= read -r -N 1 -t 2 b <&3 && [[ $b == "$one" ]]' "$1" "$2" 2>/dev/null
}

# ---------------------------------------------------------------------------------------------
# ways of starting a server

docker_usable() {
    if [[ -z "$DOCKER_STATE" ]]; then
        DOCKER_STATE=no
        if [[ "${FLASHSALE_INFRA_NO_DOCKER:-0}" != 1 ]] && have docker &&
            timeout 10 docker info >/dev/null 2>&1 && compose version >/dev/null 2>&1; then
            DOCKER_STATE=yes
        fi
    fi
    [[ "$DOCKER_STATE" == yes ]]
}

compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose -f "$COMPOSE_FILE" "$@"
    elif have docker-compose; then
        docker-compose -f "$COMPOSE_FILE" "$@"
    else
        return 1
    fi
}

# Starts one infra service of the compose file, publishing it on `port`.
compose_up() { # service port
    log "starting $1 with docker compose"
    case "$1" in
        postgres) FLASHSALE_POSTGRES_PORT="$2" compose up -d postgres ;;
        redis) FLASHSALE_REDIS_PORT="$2" compose up -d redis ;;
        rabbitmq) FLASHSALE_AMQP_PORT="$2" compose up -d rabbitmq ;;
    esac
}

apt_install() {
    have apt-get || die "cannot install $*: no apt-get on this machine; install it yourself or point the URL at a running server"
    if ((APT_UPDATED == 0)); then
        log "apt-get update"
        as_root apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

sbin_have() { have "$1" || [[ -x "/usr/sbin/$1" ]]; }

# Puts trust lines for loopback first in a cluster's pg_hba.conf (only for clusters this
# script installed or created, never for one a developer configured).
pg_trust_loopback() { # version cluster
    local hba="/etc/postgresql/$1/$2/pg_hba.conf" tmp
    if as_root grep -q 'flashsale dev-infra' "$hba"; then return 0; fi
    log "allowing password-less loopback logins in $hba (development cluster)"
    tmp="$(mktemp)"
    {
        echo '# flashsale dev-infra: password-less loopback access for a development cluster'
        echo 'host    all             all             127.0.0.1/32            trust'
        echo 'host    all             all             ::1/128                 trust'
        as_root cat "$hba"
    } >"$tmp"
    as_root install -m 640 -o postgres -g postgres "$tmp" "$hba"
    rm -f "$tmp"
}

start_local_postgres() { # port
    local port="$1" fresh=0 line ver name
    if ! have pg_ctlcluster; then
        apt_install postgresql
        fresh=1
    fi
    line="$(pg_lsclusters --no-header 2>/dev/null | awk -v p="$port" '$3 == p { print $1, $2; exit }')"
    if [[ -z "$line" ]]; then
        ver="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)"
        [[ -n "$ver" ]] || die "PostgreSQL is installed but /usr/lib/postgresql has no version"
        name=main
        if pg_lsclusters --no-header 2>/dev/null | grep -q .; then name=flashsale; fi
        log "creating PostgreSQL cluster $ver/$name on port $port"
        as_root pg_createcluster -p "$port" "$ver" "$name" >/dev/null
        fresh=1
    else
        read -r ver name <<<"$line"
    fi
    if ((fresh)); then pg_trust_loopback "$ver" "$name"; fi
    log "starting PostgreSQL cluster $ver/$name"
    # pg_ctlcluster runs the server as the cluster owner (postgres); "already running" is fine.
    as_root pg_ctlcluster "$ver" "$name" start 2>/dev/null || true
    if ((fresh)); then as_root pg_ctlcluster "$ver" "$name" reload 2>/dev/null || true; fi
    STARTED_HOW="local cluster $ver/$name"
}

# One log per port: a second local Redis (non-default port) must not share the first one's log.
redis_log() { # port
    if [[ "$1" == 6379 ]]; then echo "$INFRA_DIR/redis.log"; else echo "$INFRA_DIR/redis-$1.log"; fi
}

start_local_redis() { # port
    local port="$1"
    if ! have redis-server; then
        apt_install redis-server
        # the package may have started its own server on the default port
        if redis_answers "$FLASHSALE_TEST_REDIS_URL" 127.0.0.1 "$port"; then
            STARTED_HOW="installed redis-server"
            return 0
        fi
    fi
    mkdir -p "$INFRA_DIR"
    log "starting redis-server on 127.0.0.1:$port (no persistence), log $(redis_log "$port")"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$port" --save "" --appendonly no \
        --dir "$INFRA_DIR" --logfile "$(redis_log "$port")" >/dev/null
    STARTED_HOW="local redis-server"
}

start_local_rabbitmq() { # port
    local port="$1"
    if ! sbin_have rabbitmq-server; then
        apt_install rabbitmq-server
        if amqp_answers 127.0.0.1 "$port"; then
            STARTED_HOW="installed rabbitmq-server"
            return 0
        fi
    fi
    local cmd=rabbitmq-server
    have rabbitmq-server || cmd=/usr/sbin/rabbitmq-server
    log "starting rabbitmq-server (detached; it takes ~10 s to accept connections)"
    if [[ "$port" == 5672 ]]; then
        as_root "$cmd" -detached >/dev/null 2>&1 || true
    else
        # Another broker (the package's own, on 5672) may already run here as Erlang node
        # rabbit@<host>: a second node with that name exits at once with duplicate_node_name.
        # Give this one its own node name (RabbitMQ appends @<host>; its data and log files are
        # named after it) and a valid Erlang distribution port (default: AMQP port + 20000).
        local dist=$((port + 20000))
        ((dist <= 65535)) || dist=$((port - 20000))
        RABBIT_NODE="rabbit_$port"
        log "rabbitmq node $RABBIT_NODE, AMQP port $port, distribution port $dist"
        as_root env RABBITMQ_NODENAME="$RABBIT_NODE" RABBITMQ_NODE_PORT="$port" \
            RABBITMQ_DIST_PORT="$dist" "$cmd" -detached >/dev/null 2>&1 || true
    fi
    STARTED_HOW="local rabbitmq-server"
}

# ---------------------------------------------------------------------------------------------
# one server: check, else docker, else local

# ensure NAME URL DEFAULT_PORT CHECK_FN START_FN COMPOSE_SVC WAIT_SECS
# CHECK_FN gets "host port"; START_FN gets "port" and sets STARTED_HOW.
ensure() {
    local name="$1" url="$2" default_port="$3" check="$4" start="$5" svc="$6" wait_secs="$7"
    local host port shown
    read -r host port < <(url_host_port "$url" "$default_port")
    shown="$(url_redact "$url")"

    if "$check" "$host" "$port"; then
        log "$(printf '%-9s' "$name") ok   $shown (already running)"
        return 0
    fi
    is_local_host "$host" ||
        die "$name does not answer at $shown and $host is not this machine: start it there or change the URL"
    if port_open "$host" "$port"; then
        # something listens: maybe a server still starting; never start a second one
        if wait_for 15 "$check" "$host" "$port"; then
            log "$(printf '%-9s' "$name") ok   $shown (was starting)"
            return 0
        fi
        die "something listens at $host:$port but does not answer as $name; free the port or point the URL elsewhere"
    fi

    STARTED_HOW=""
    if docker_usable; then
        if compose_up "$svc" "$port"; then
            STARTED_HOW="docker compose service $svc"
        else
            warn "docker compose could not start $svc; trying a local $name instead"
        fi
    fi
    [[ -n "$STARTED_HOW" ]] || "$start" "$port"

    if ! wait_for "$wait_secs" "$check" "$host" "$port"; then
        die "$name still does not answer at $shown after ${wait_secs} s ($STARTED_HOW); see $(hint_for "$name")"
    fi
    log "$(printf '%-9s' "$name") ok   $shown (started: $STARTED_HOW)"
}

hint_for() {
    case "$1" in
        postgres) echo "pg_lsclusters and /var/log/postgresql/" ;;
        redis) echo "$INFRA_DIR/redis*.log" ;;
        rabbitmq) echo "/var/log/rabbitmq/ and 'rabbitmq-diagnostics${RABBIT_NODE:+ -n $RABBIT_NODE} check_running'" ;;
    esac
}

check_postgres() { pg_answers "$1" "$2"; }
check_redis() { redis_answers "$FLASHSALE_TEST_REDIS_URL" "$1" "$2"; }
check_rabbitmq() { amqp_answers "$1" "$2"; }

main() {
    ensure postgres "$FLASHSALE_TEST_POSTGRES_URL" 5432 check_postgres start_local_postgres postgres 30
    local err
    if ! err="$(pg_login_error "$FLASHSALE_TEST_POSTGRES_URL")"; then
        die "PostgreSQL answers, but logging in as $(url_redact "$FLASHSALE_TEST_POSTGRES_URL") fails:
  $err
  Put 'host all all 127.0.0.1/32 trust' (and ::1/128) first in its pg_hba.conf and reload it,
  or set FLASHSALE_TEST_POSTGRES_URL to a URL with a password."
    fi
    ensure redis "$FLASHSALE_TEST_REDIS_URL" 6379 check_redis start_local_redis redis 15
    ensure rabbitmq "$FLASHSALE_TEST_AMQP_URL" 5672 check_rabbitmq start_local_rabbitmq rabbitmq 90
}

main "$@"
