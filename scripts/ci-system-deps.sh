#!/usr/bin/env bash
# System packages the test suite needs (Debian):
# - PostgreSQL server binaries (initdb, pg_ctl, createdb under /usr/lib/postgresql/*/bin) for the fleet-load
#   test, which starts a private cluster as the `postgres` user via `runuser` (util-linux) when run as root.
# - Chromium, for tests/integration/test_report_browser.py: the decision report opened by a real headless browser
#   (that test fails, not skips, when $CI is set and no Chromium is found). Also used by
#   scripts/mlflow-ui-screenshot.sh to make docs/mlflow-ui.png.
set -euo pipefail
need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || command -v google-chrome >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Debian package creates the `postgres` system user the fixture runs the cluster as.
id postgres >/dev/null 2>&1 || { echo "ci-system-deps: no postgres user after installing postgresql" >&2; exit 1; }
