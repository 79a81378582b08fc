#!/usr/bin/env bash
# Run HERE (a machine that reaches the package registries): put into .gpu/device (ignored by git) what the
# lent GPU machine needs and lacks, for scripts/gpu/on_device.sh to use there without any index:
#
#   wheels/   CPython 3.12 manylinux x86-64 wheels of the project's runtime dependencies that the device's
#             image does not have (its image has numpy, jinja2, typing-extensions, pyyaml, tqdm, requests,
#             pytest, hypothesis, prometheus-client, scikit-build-core, cmake and ninja; see the device
#             notes), at the versions installed here when they are, else the newest pyproject.toml allows
#   llama_cpp_python-0.3.36.tar.gz   the pinned source distribution, slimmed (scripts/gpu/sdist.py), no patch
#   MANIFEST  what is there, with sizes and sha256
#
# A device call carries the working tree and the carried paths, 64 MiB in all: the script fails when the
# folder and the tracked files together reach that, and prints the sizes.
#
#   scripts/gpu/prepare_device.sh [DIR]       (default .gpu/device; WASINN_DEVICE_PYTHON=3.12)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.gpu/device}
python_version=${WASINN_DEVICE_PYTHON:-3.12}
limit=$((64 << 20))

# name: the pyproject.toml range used when the package is not installed here
requirements=$(python3 - <<'EOF'
import importlib.metadata as md
wanted = {  # what the device lacks; the image's own numpy and jinja2 serve the rest
    "wasmtime": ">=50,<51", "orjson": ">=3.9", "grpcio": ">=1.85,<2", "grpcio-tools": ">=1.85,<2",
    "grpcio-health-checking": ">=1.85,<2", "protobuf": ">=6", "diskcache": ">=5.6",  # grpc's and llama-cpp-python's
    "gguf": ">=0.17",  # the tests and benchmarks write their models with it
}
for name, spec in wanted.items():
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name}{spec}")
EOF
)
rm -rf "$dir" && mkdir -p "$dir/wheels"
# shellcheck disable=SC2086  # one requirement per word
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dir/wheels" $requirements
sdist=$(python3 scripts/gpu/sdist.py fetch .gpu/cache)
python3 scripts/gpu/sdist.py slim "$sdist" "$dir/$(basename "$sdist")"

(cd "$dir" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2 | while read -r size path; do
    echo "$size $(sha256sum "$path" | cut -c1-64) ${path#./}"
done) >"$dir/MANIFEST"
folder=$(du -sb "$dir" | cut -f1)
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
cat "$dir/MANIFEST"
echo "prepare_device: $dir holds $(mib "$folder"); with the tracked files ($(mib "$tree")) a call carries $(mib $((folder + tree))) of $(mib "$limit")"
if ((folder + tree >= limit)); then
    echo "prepare_device: too large for one device call" >&2
    exit 1
fi
