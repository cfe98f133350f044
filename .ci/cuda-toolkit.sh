# Sourced by .ci/run: a CUDA 13.0 toolkit for building the candle adapter
# on a machine without one, from PyPI and Debian only.
#
# * nvcc, its headers and the CUDA libraries: NVIDIA's wheels on PyPI, into
#   the Python environment that already holds PyTorch (its CUDA runtime,
#   cuBLAS, cuRAND and NVRTC wheels are the ones candle links).
# * libcuda.so, which the linker needs for candle's `dynamic-linking`:
#   Debian's libcuda1 (non-free), unpacked, never installed. The program
#   runs against the machine's own driver; this copy only satisfies the
#   link, and lets the tests that need no GPU start here.
#
# Expects TORCH_VENV; exports CUDA_HOME, PATH, CUDA_COMPUTE_CAP,
# CUDAFORGE_THREADS, RUSTFLAGS and LD_LIBRARY_PATH for the build and the
# tests.

CUDA_PY_VERSION=13.0.88
CUDA_HOME="$("$TORCH_VENV/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  "$TORCH_VENV/bin/pip" install --quiet \
    "nvidia-cuda-nvcc==$CUDA_PY_VERSION" "nvidia-cuda-crt==$CUDA_PY_VERSION" \
    "nvidia-nvvm==$CUDA_PY_VERSION" "nvidia-cuda-cccl==13.0.*"
fi

CUDA_LINK_DIR="${CHORUS_CUDA_LINK_DIR:-$HOME/.cache/chorus-ci/cuda-link}"
if [ ! -e "$CUDA_LINK_DIR/libcuda.so" ]; then
  apt_dir="$(mktemp -d)"
  mkdir -p "$apt_dir/etc" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  cat > "$apt_dir/etc/non-free.sources" <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$apt_dir/etc"
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libcuda1 2>/dev/null)
  dpkg -x "$apt_dir"/libcuda1_*.deb "$apt_dir/x"
  mkdir -p "$CUDA_LINK_DIR"
  cp -a "$apt_dir"/x/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so* "$CUDA_LINK_DIR/"
  rm -rf "$apt_dir"
fi
# Unversioned names for the linker, pointing at the wheels' libraries.
for lib in cublas cublasLt curand nvrtc cudart; do
  for real in "$CUDA_HOME/lib/lib$lib.so."*; do
    case "$real" in *.alt.*) continue ;; esac
    ln -sf "$real" "$CUDA_LINK_DIR/lib$lib.so"
    break
  done
done

export CUDA_HOME
export PATH="$CUDA_HOME/bin:$PATH"
# The H200's compute capability; there is no GPU here to ask.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# candle's build compiles its kernels on half the cores by default; they
# are most of the adapter's build time, and nothing else builds meanwhile.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
export RUSTFLAGS="${RUSTFLAGS:-} -L $CUDA_LINK_DIR"
export LD_LIBRARY_PATH="$CUDA_LINK_DIR:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
