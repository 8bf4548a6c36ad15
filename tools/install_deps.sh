#!/usr/bin/env bash
# Installs what building and testing concord needs, skipping what is there:
# system packages with apt-get, Python packages with pip.
set -euo pipefail
PYTHON=${PYTHON:-python3}

# libgloo-dev: the gloo and shm+gloo backends (CPU collectives across hosts);
# iproute2: the test hosts of tests_py/test_multihost.py (network namespaces).
apt_packages=(catch2 pkg-config g++ ninja-build patchelf libgloo-dev iproute2)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# module name -> pip requirement
py_packages=(
  "mesonpy:meson-python>=0.15"
  "mesonbuild:meson>=1.3"
  "ninja:ninja"
  "Cython:cython>=3.0"
  "numpy:numpy>=2.0"
  # bfloat16 NumPy arrays in the collective tests
  "ml_dtypes:ml-dtypes>=0.3"
  "pytest:pytest>=7"
  "optree:optree>=0.10"
  "array_api_compat:array-api-compat>=1.4"
  "sklearn:scikit-learn>=1.0"
  # The notebooks' test: a real kernel runs them, and they plot.
  "nbclient:nbclient>=0.7"
  "nbformat:nbformat>=5.7"
  "ipykernel:ipykernel>=6"
  "matplotlib:matplotlib>=3.5"
  # concord.jax's handlers build against jaxlib's FFI headers; the JAX and
  # PyTorch integrations' tests run on the CPU.
  "jax:jax>=0.5"
  "torch:torch>=2.3"
)
need=()
for entry in "${py_packages[@]}"; do
  module=${entry%%:*}
  requirement=${entry#*:}
  "$PYTHON" -c "import $module" >/dev/null 2>&1 || need+=("$requirement")
done
if ((${#need[@]})); then
  echo "installing Python packages: ${need[*]}"
  "$PYTHON" -m pip install -q "${need[@]}"
fi
