#!/usr/bin/env bash
# Run ON THE GPU NODE (an NVIDIA GPU, Python 3.12, no network; a compiler only needed for the fallback build),
# in a copy of the checkout with the folder scripts/gpu/prepare_device.sh made on another machine
# (.gpu/device, or WASINN_DEVICE_DIR): scripts/gpu/on_device.sh. Nothing is fetched there:
#
#   1. the folder's wheels, and the project itself, installed without an index (pip --no-index --no-deps --target)
#   2. llama-cpp-python 0.3.36 for CUDA: the prebuilt package llama_cpp_cuda.tar.xz when the folder has one
#      (scripts/gpu/build_cuda_wheel.sh built it on the other machine), unpacked into the same --target folder
#      with LD_LIBRARY_PATH naming the CUDA runtime and cuBLAS of the node's Python (nvidia/cu13/lib), and
#      checked to load with GPU offload; else, or if that check fails, or with WASINN_BUILD_ON_DEVICE=1,
#      built from the sdist in the folder with -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 on every core
#      (the node's scikit-build-core, CMake, ninja and nvcc; no build isolation)
#   3. wasinn info --json; the GPU tests (tests/gpu, pytest -m gpu) and the CPU-build checks beside them
#   4. the benchmarks, GPU against native llama.cpp on the same GPU: `wasinn bench` first (what a user
#      runs: 1/8/32/64 guests computing and streaming on the fast-step model, against llama.cpp alone;
#      its JSON and chart land in $OUT as bench.json and bench.svg), then single stream (bench_host.py),
#      8/32/64 guests against batched decoding and prefix reuse (bench_concurrency.py), wasinn serve over
#      a unix socket against in-process (bench_rpc.py), serving with default settings: computing once,
#      prompt first, streaming, with the worker's phases per step (bench_serving.py), 7 streams while a
#      long prompt arrives (bench_mixed_load.py), a model that does not fit (device_bench.py fit)
#
# Everything lands under $OUT (default .gpu/out): on_device.log (all output), figures.json (each step's
# seconds, exit status and output, the build time, the devices; rewritten after every step, so a run cut
# off, by a batch job's time limit for example, keeps what was done), info.json, gpu-tests.xml, and
# wasinn bench's bench.json and chart bench.svg. A step
# that fails is recorded and the next one still runs; each has a time limit (the build 9 minutes, the
# tests 5, each benchmark 4 or 5), so a run takes about 10 minutes after the install; the script's status
# is that of the GPU tests. A build is cached in /tmp/wasinn-build: run again, it is reused. The installed
# packages stay in /tmp/wasinn-site; to run the host there afterwards, put the checkout and that folder on
# PYTHONPATH, and the Python's nvidia/cu13/lib on LD_LIBRARY_PATH (as the log's first lines show).
#
#   scripts/gpu/on_device.sh --dry-run    on the machine that prepared the folder, without a GPU: a fresh
#       Python 3.12 virtual environment with the packages the node is expected to have
#       (scripts/gpu/device_image.txt, fetched from the index: they stand for the node's, not part of the
#       recipe), the folder's wheels installed exactly as on the node, llama-cpp-python built for the CPU
#       from the folder's sdist (or, where prepare_device.sh left it out beside the prebuilt CUDA package,
#       the one it fetched into .gpu/cache; cached in .gpu/dry-run by the sdist's hash; the CUDA package
#       cannot load without a GPU driver and is not used), then steps 3 and 4 in small sizes. $OUT
#       defaults to .gpu/out.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dir=${WASINN_DEVICE_DIR:-.gpu/device}
dry=0
[[ ${1:-} == --dry-run ]] && dry=1
out=${OUT:-$root/.gpu/out}
mkdir -p "$out"
exec > >(tee "$out/on_device.log") 2>&1
started=$(date +%s)

# step NAME TIMEOUT CMD...: run, time, record in $steps (figures.json under $OUT)
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
    echo "== $name: $*"
    t0=$(date +%s.%N)
    timeout "$limit" "$@" >"$logs/$name.txt" 2>&1
    rc=$?
    cat "$logs/$name.txt"
    python3 scripts/gpu/record_step.py "$steps" "$out" "$name" "$rc" "$t0" "$logs/$name.txt" "$started" "$dry"
    echo "== $name: exit $rc"
    return "$rc"
}

[[ -f $dir/MANIFEST ]] || { echo "no $dir/MANIFEST: run scripts/gpu/prepare_device.sh here first"; exit 2; }
sdist=$(find "$dir" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -1)
prebuilt=$dir/llama_cpp_cuda.tar.xz
if ((dry)); then
    [[ -n $sdist ]] || sdist=$(find "$root/.gpu/cache" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' 2>/dev/null | head -1)
    [[ -n $sdist ]] || { echo "on_device --dry-run: no sdist in $dir nor .gpu/cache"; exit 2; }
    # the node's Python: python3.12 on the PATH, else pyenv's (WASINN_DRY_RUN_PYTHON overrides)
    python=${WASINN_DRY_RUN_PYTHON:-}
    for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
        [[ -z $python ]] && "$candidate" --version >/dev/null 2>&1 && python=$candidate
    done
    [[ -n $python ]] || { echo "on_device --dry-run: no python3.12 here"; exit 2; }
    cache=$root/.gpu/dry-run
    site=$cache/site
    venv=$cache/venv
    rm -rf "$venv" "$site"
    "$python" -m venv "$venv" || exit 2
    py=$venv/bin/python
    # the packages the node is expected to have (not part of the recipe): from the index, here only
    "$py" -m pip install --quiet -r scripts/gpu/device_image.txt || exit 2
    cmake_args=""
    sizes=(--tokens 8 --runs 1)
    concurrency=(--n 2,4 --prefix-tokens 64 --ttft-runs 1)
    fit_args=(--over 0.25 --n-parallel 4 --tokens 8)
    serving=(--n 1,2 --runs 1 --tokens 8)
    mixed=(--runs 1 --streams 2 --stream-tokens 16 --long-tokens 300)
    wasinn_bench=(--guests 1,2 --tokens 8 --runs 1)
    model_size=small
    build_limit=3600  # 2 shared cores: the CPU build takes 7 minutes alone, far longer under load
else
    py=python3
    site=/tmp/wasinn-site
    cache=/tmp/wasinn-build
    cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90"
    sizes=(--tokens 256 --runs 3 --threads 8)
    concurrency=(--n 1,8,32,64 --threads 8)
    fit_args=(--tokens 64)
    serving=(--n 1,8,32,64 --runs 3 --threads 8)
    mixed=(--runs 3 --threads 8)
    wasinn_bench=(--runs 3)
    model_size=1b
    build_limit=540
    nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv || true
fi
mkdir -p "$site" "$cache"
logs=$cache/steps
rm -rf "$logs" && mkdir -p "$logs"
steps=$logs/steps.jsonl

step install_wheels 120 "$py" -m pip install --no-index --no-deps --no-compile --target "$site" "$dir"/wheels/*.whl
# the project itself, for its metadata (version, the pytest plugin's entry point); the code runs from the tree
step install_project 120 "$py" -m pip install --no-index --no-deps --no-build-isolation --no-compile --target "$site" .
export PYTHONPATH=$root:$site

# the prebuilt CUDA package (scripts/gpu/build_cuda_wheel.sh): its libraries name no path to the CUDA
# runtime and cuBLAS, which the node's Python has under nvidia/cu13/lib; the driver's libcuda.so.1 is the system's
prebuilt_ok=0
if ((!dry)) && [[ -f $prebuilt && -z ${WASINN_BUILD_ON_DEVICE:-} ]]; then
    cuda_lib=$("$py" -c 'import pathlib, sys
print(next((str(d) for d in (pathlib.Path(p or ".", "nvidia", "cu13", "lib") for p in sys.path)
            if (d / "libcudart.so.13").exists()), ""))')
    if [[ -n $cuda_lib ]]; then
        export LD_LIBRARY_PATH=$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "on_device: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    else
        echo "on_device: no nvidia/cu13/lib/libcudart.so.13 on the Python's path; the loader's own search must find it"
    fi
    # shellcheck disable=SC2016  # the inner shell's arguments
    step install_llama_cpp 120 bash -c 'tar -xJf "$1" -C "$2" && cat "$2"/llama_cpp_python-*.dist-info/WASINN_BUILD' \
        install "$prebuilt" "$site" &&
        step check_llama_cpp 120 "$py" -c 'import llama_cpp
print("llama_cpp", llama_cpp.__version__, "from", llama_cpp.__file__, "gpu offload:", llama_cpp.llama_supports_gpu_offload())
assert llama_cpp.llama_supports_gpu_offload(), "no GPU device: see ggml_cuda_init above"' &&
        prebuilt_ok=1
    if ((!prebuilt_ok)); then
        echo "on_device: the prebuilt package does not load or finds no GPU; building from the sdist instead"
        rm -rf "$site"/llama_cpp "$site"/llama_cpp_python-*.dist-info
    fi
fi

# the build: cached by the sdist's hash and the CMake arguments (in /tmp: a fresh node has no cache)
if ((!prebuilt_ok)); then
    [[ -n $sdist ]] || { echo "on_device: no sdist in $dir to build from (prepare_device.sh left it out)"; exit 3; }
    key=$(cat "$sdist" <(echo "$cmake_args") | sha256sum | cut -c1-16)
    wheel=$(ls "$cache/$key"/llama_cpp_python-*.whl 2>/dev/null | head -1)
    if [[ -z $wheel ]]; then
        mkdir -p "$cache/$key"
        step build_llama_cpp "$build_limit" env CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
            "$py" -m pip wheel --no-index --no-deps --no-build-isolation -w "$cache/$key" "$sdist"
        wheel=$(ls "$cache/$key"/llama_cpp_python-*.whl 2>/dev/null | head -1)
    fi
    [[ -n $wheel ]] || { echo "on_device: the llama-cpp-python build failed"; exit 3; }
    step install_llama_cpp 120 "$py" -m pip install --no-index --no-deps --no-compile --target "$site" "$wheel"
fi

step info 120 bash -c '"$1" -m wasinn_host info --json >"$2" && cat "$2"' info "$py" "$out/info.json"
step gpu_tests 300 "$py" -m pytest -q -rs -p no:cacheprovider --junitxml="$out/gpu-tests.xml" \
    --ignore=tests/gpu/test_device_recipe.py tests/gpu tests/llama/test_gpu.py tests/llama/test_offload.py
tests_rc=$?

bench=$cache/bench
mkdir -p "$bench"
# shellcheck disable=SC2016  # the inner shell's arguments
step bench 300 bash -c '"$1" -m wasinn_host bench "${@:4}" --json --plot "$2" >"$3" && cat "$3"' bench "$py" \
    "$out/bench.svg" "$out/bench.json" "${wasinn_bench[@]}"
step bench_model 300 "$py" scripts/gpu/device_bench.py model "$bench/model.gguf" --size "$model_size"
step bench_single_stream 240 "$py" scripts/benchmarks/bench_host.py --model "$bench/model.gguf" --no-grammar \
    --calls 2000 "${sizes[@]}"
step bench_concurrency 300 "$py" scripts/benchmarks/bench_concurrency.py --model "$bench/model.gguf" \
    "${concurrency[@]}" "${sizes[@]:0:2}"
step bench_rpc 240 "$py" scripts/benchmarks/bench_rpc.py --model "$bench/model.gguf" --calls 500 "${sizes[@]}"
step bench_serving 300 "$py" scripts/benchmarks/bench_serving.py --model "$bench/model.gguf" "${serving[@]}"
step bench_mixed_load 240 "$py" scripts/benchmarks/bench_mixed_load.py "${mixed[@]}"
step bench_does_not_fit 240 "$py" scripts/gpu/device_bench.py fit "$bench/model.gguf" "${fit_args[@]}"

echo "on_device: done in $(($(date +%s) - started)) s; figures in $out/figures.json"
exit "$tests_rc"
