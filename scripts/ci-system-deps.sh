#!/usr/bin/env bash
# System packages the test suite needs (Debian): PostgreSQL for the fleet-load test.
set -euo pipefail
need=()
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
