#!/usr/bin/env bash
# Wheels quantrack needs on the H200 node that its image lacks (mlflow for a local store, and their needs),
# resolved for Python 3.12 / x86-64 against the image's package list, downloaded to OUTDIR (default .whl).
#   scripts/gpu/build-node-wheels.sh [OUTDIR] [IMAGE_PACKAGES_TXT]
set -euo pipefail
out=${1:-.whl}; image=${2:-../shared/gpu/device-image-packages.txt}
work=$(mktemp -d); mkdir -p "$out"
plat=""; for n in 17 24 26 27 28 31 34 35; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
plat="$plat --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any"
python3 -m pip install --dry-run --ignore-installed --quiet --report "$work/report.json" --only-binary=:all: \
  --python-version 3.12 --implementation cp $plat --target "$work/t" \
  mlflow==3.17.2 click httpx tabulate pandas nvidia-ml-py scipy matplotlib
python3 - "$work/report.json" "$image" > "$work/reqs.txt" <<'PY'
import json, sys
have = {l.strip() for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")}
for it in json.load(open(sys.argv[1]))["install"]:
    n = it["metadata"]["name"].lower().replace("_", "-")
    if n not in have:
        print(f"{n}=={it['metadata']['version']}")
PY
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
  -d "$out" -r "$work/reqs.txt"
du -sh "$out"; rm -rf "$work"
