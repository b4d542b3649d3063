"""The tracking store: runs built whole (records), written to MLflow or spooled and synced (tracking), read
back (tracking.load_runs, direct), files written whole (files), which store and how long to wait (uri)."""
