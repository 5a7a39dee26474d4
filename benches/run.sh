#!/usr/bin/env bash
# Reproduces BENCHMARKS.md: the end-to-end figures (3 runs each, both
# durabilities, about 9 minutes on a 2-core machine, of which about 4 for the
# on-time modes: lateness, wait, lease-unrunnable, idle-cpu) into
# benches/results/, then the criterion micro-benchmarks (about a minute), then,
# when a server's URL is set, the PostgreSQL and MariaDB figures (about 20
# minutes on a loaded machine) into benches/results/server-*.
#
#   benches/run.sh                 # everything
#   benches/run.sh --runs 5        # extra arguments go to `bench all`
#   benches/run.sh server [ARGS]   # only the servers; ARGS go to `bench server`
#
# The on-time modes alone (section "On time (SQLite)"):
#   cargo run --release --example bench -- on-time --out benches/results-on-time
#
# The servers are named by BACKLOG_TEST_POSTGRES_URL and BACKLOG_TEST_MYSQL_URL
# (as for the tests), e.g.
#   BACKLOG_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
#   BACKLOG_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test benches/run.sh server
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benches/results

server() {
    cargo run --release --example bench --features postgres,mysql -- \
        server --out benches/results "$@"
}

if [[ "${1:-}" == server ]]; then
    shift
    server "$@"
    exit
fi

cargo run --release --example bench -- all --out benches/results "$@"
cargo bench --bench queue
if [[ -n "${BACKLOG_TEST_POSTGRES_URL:-}${BACKLOG_TEST_MYSQL_URL:-}" ]]; then
    server
else
    echo "SKIPPED: the server benchmark (set BACKLOG_TEST_POSTGRES_URL and/or BACKLOG_TEST_MYSQL_URL)"
fi
