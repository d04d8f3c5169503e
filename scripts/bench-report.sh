#!/usr/bin/env bash
# Keeps a benchmark run's reports and regenerates docs/benchmarks.md's tables and charts from
# them (the part between its two "generated" markers; the charts go to docs/bench/*.svg) and
# the README's headline (between its two "headline" markers). It fails when a figure quoted in
# the prose of either does not trace to the kept run its section names
# (`<!-- figures from docs/bench/runs/<run> -->`); the test suite runs the same check.
#   scripts/bench-report.sh .run/bench/latest   keep that run (its JSON reports replace those in
#                                               docs/bench/results, and a copy stays for good in
#                                               docs/bench/runs/<UTC time>-<commit>, failing or
#                                               not), then regenerate
#   scripts/bench-report.sh                     regenerate from docs/bench/results as it is
#   scripts/bench-report.sh --check             exit non-zero when the document, the headline
#                                               or a chart is not what docs/bench/results
#                                               makes, or a figure does not trace
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=bench-report
# shellcheck shell=bash source=scripts/lib.sh
. scripts/lib.sh

KEPT=docs/bench/results
RUNS=docs/bench/runs
check=()
case "${1:-}" in
    --check) check=(--check) ;;
    "") ;;
    -*) die "unknown option '$1' (usage: scripts/bench-report.sh [RUN_DIR | --check])" ;;
    *)
        run="$1"
        [[ -d "$run" ]] || die "'$run' is not a directory of benchmark reports"
        compgen -G "$run/*.json" >/dev/null || die "'$run' holds no JSON report"
        mkdir -p "$KEPT"
        rm -f "$KEPT"/*.json
        cp "$run"/*.json "$KEPT"/
        log "kept $(find "$KEPT" -name '*.json' | wc -l) report(s) of $run in $KEPT"
        # Every kept run stays: the page lists them all, the ones that failed included.
        name="$(basename "$(cd "$run" && pwd -P)")"
        if [[ -e "$RUNS/$name" ]]; then
            log "$RUNS/$name is already kept"
        else
            mkdir -p "$RUNS/$name"
            cp "$run"/*.json "$RUNS/$name"/
            log "kept a copy in $RUNS/$name"
        fi
        ;;
esac
cargo build -q -p flashsale-cli --bin flashsale
"$CARGO_TARGET_DIR/debug/flashsale" bench-report --results "$KEPT" --doc docs/benchmarks.md \
    --charts docs/bench --runs "$RUNS" ${check[@]+"${check[@]}"}
