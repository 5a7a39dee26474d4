#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: the end-to-end figures (3 runs each, both
# durabilities, about 9 minutes on a 2-core machine, of which about 4 for the
# on-time modes: lateness, wait, lease-unrunnable, idle-cpu) into
# benches/results/, then the criterion micro-benchmarks (about a minute).
#
#   benches/run.sh            # everything
#   benches/run.sh --runs 5   # extra arguments go to `bench all`
#
# The on-time modes alone (section "On time (SQLite)"):
#   cargo run --release --example bench -- on-time --out benches/results-on-time
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benches/results

cargo run --release --example bench -- all --out benches/results "$@"
cargo bench --bench queue
