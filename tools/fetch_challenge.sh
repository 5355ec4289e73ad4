#!/usr/bin/env bash
# Download and unpack the official Sparse DNN Graph Challenge data for some N.
#
# Fetches, from graphchallenge.s3.amazonaws.com/synthetic/sparsechallenge_2019/:
#   dnn/neuron{N}.tar.gz                  -> DEST/neuron{N}/n{N}-l{k}.tsv (all 1920 layers)
#   dnn/neuron{N}-l{L}-categories.tsv     -> DEST/ (truth for L in --layers)
#   mnist/sparse-images-{N}.tsv.gz        -> DEST/ (kept gzipped: spdnn reads .gz)
# then `spdnn prepare --tree DEST --out-dir STORES` makes the stores. Downloads go
# to a .part name and are renamed when complete; re-running resumes them.
set -euo pipefail

BASE_URL="${SPDNN_CHALLENGE_URL:-https://graphchallenge.s3.amazonaws.com/synthetic/sparsechallenge_2019}"

usage() {
    cat <<EOF
usage: $(basename "$0") [-d DEST] [-l "120 480 1920"] [--no-images] [--keep-archive] N [N ...]

Download the official Graph Challenge network(s) with N neurons (1024, 4096,
16384 or 65536) into DEST (default: ./data/graphchallenge), with the truth
categories for each layer count in -l and the MNIST input images.

  -d, --dest DIR      where to put the data (default: ./data/graphchallenge)
  -l, --layers LIST   layer counts whose truth files to fetch (default: "120 480 1920")
      --no-images     skip sparse-images-{N}.tsv.gz
      --keep-archive  keep neuron{N}.tar.gz after unpacking
  -h, --help          this text

The unpacked 65536-neuron network is about 80 GB of text; check free space.
Environment: SPDNN_CHALLENGE_URL overrides the base URL (a mirror).
EOF
}

die() { echo "fetch_challenge: error: $*" >&2; exit 1; }

dest="data/graphchallenge"
layers="120 480 1920"
images=1
keep=0
neurons=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -d|--dest) [[ $# -ge 2 ]] || die "$1 needs a value"; dest="$2"; shift 2 ;;
        -l|--layers) [[ $# -ge 2 ]] || die "$1 needs a value"; layers="$2"; shift 2 ;;
        --no-images) images=0; shift ;;
        --keep-archive) keep=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) neurons+=("$1"); shift ;;
    esac
done
[[ ${#neurons[@]} -gt 0 ]] || { usage >&2; die "give at least one N"; }
for n in "${neurons[@]}"; do
    case "$n" in
        1024|4096|16384|65536) ;;
        *) die "N must be 1024, 4096, 16384 or 65536, got '$n'" ;;
    esac
done
for l in $layers; do
    case "$l" in
        120|480|1920) ;;
        *) die "layer counts must be 120, 480 or 1920, got '$l'" ;;
    esac
done

if command -v curl >/dev/null 2>&1; then
    fetch() { curl -fL --retry 3 --connect-timeout 20 -C - -o "$2" "$1"; }
    probe() { curl -fsSI --connect-timeout 20 -o /dev/null "$1"; }
elif command -v wget >/dev/null 2>&1; then
    fetch() { wget -q --show-progress --tries=3 --timeout=20 -c -O "$2" "$1"; }
    probe() { wget -q --spider --timeout=20 "$1"; }
else
    die "neither curl nor wget is installed"
fi

# download URL to FILE via FILE.part, unless FILE is already complete
download() {
    local url="$1" file="$2"
    if [[ -s "$file" ]]; then
        echo "fetch_challenge: have $file"
        return 0
    fi
    echo "fetch_challenge: $url"
    fetch "$url" "$file.part" || die "download of $url failed (see above); re-run to resume"
    mv -f "$file.part" "$file"
}

probe "$BASE_URL/dnn/neuron1024-l120-categories.tsv" ||
    die "cannot reach $BASE_URL (no network access from here?); download elsewhere and copy"
mkdir -p "$dest"

for n in "${neurons[@]}"; do
    for l in $layers; do
        download "$BASE_URL/dnn/neuron$n-l$l-categories.tsv" "$dest/neuron$n-l$l-categories.tsv"
    done
    if [[ $images -eq 1 ]]; then
        download "$BASE_URL/mnist/sparse-images-$n.tsv.gz" "$dest/sparse-images-$n.tsv.gz"
        gzip -t "$dest/sparse-images-$n.tsv.gz" ||
            die "$dest/sparse-images-$n.tsv.gz is corrupt; delete it and re-run"
    fi
    if [[ -s "$dest/neuron$n/n$n-l1920.tsv" ]]; then
        echo "fetch_challenge: have $dest/neuron$n"
        continue
    fi
    archive="$dest/neuron$n.tar.gz"
    download "$BASE_URL/dnn/neuron$n.tar.gz" "$archive"
    echo "fetch_challenge: unpacking $archive"
    tar -xzf "$archive" -C "$dest" || die "could not unpack $archive (corrupt? delete it and re-run)"
    if [[ ! -d "$dest/neuron$n" ]]; then
        found=$(find "$dest" -name "n$n-l1.tsv*" -print -quit)
        die "unpacked $archive but found no $dest/neuron$n/ folder${found:+ (layer 1 is at $found)}"
    fi
    count=$(find "$dest/neuron$n" -name "n$n-l*.tsv*" | wc -l)
    echo "fetch_challenge: $dest/neuron$n holds $count layer files"
    [[ $keep -eq 1 ]] || rm -f "$archive"
done
echo "fetch_challenge: done; next: spdnn prepare --tree $dest --out-dir STORE_DIR"
