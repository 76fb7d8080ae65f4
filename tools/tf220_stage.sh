#!/usr/bin/env bash
# CI's second stage: a representative part of the suite on TensorFlow 2.20, the last TensorFlow with TPU wheels
# (tensorflow-tpu 2.20.0), in its own venv. pyproject.toml allows exactly what CI proves: TensorFlow 2.20 and 2.21.
#
#     bash tools/tf220_stage.sh [pytest options]        e.g. -x, -k name
#
# The venv (.venv-tf220, or $TF220_VENV) is created when missing and reused when present. It gets tfgen (editable),
# TensorFlow, tf-keras, tensorflow-text and tensorflow-serving-api held to 2.20 by tools/tf220-constraints.txt, and only the test
# dependencies the chosen tests need, at the versions pyproject.toml's `test` extra pins (not the whole extra: it
# is the slow part of the install and nothing here uses the rest). The tests are the node ids in
# tools/tf220-tests.txt. The exit status is pip's when the install fails, else pytest's (0 when every test passed).
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
venv=${TF220_VENV:-.venv-tf220}
export PIP_DISABLE_PIP_VERSION_CHECK=1 TF_CPP_MIN_LOG_LEVEL=2

# What the chosen tests import beyond tfgen's own dependencies: pytest; transformers and torch (tests/conftest.py
# builds the tiny checkpoint with them; the parity tests compare with HF PyTorch); keras-hub and tensorflow-text (the
# export's generate_text signature); tensorflow-serving-api (`tfgen serve --port`'s gRPC API).
needed="pytest transformers torch keras-hub tensorflow-text tensorflow-serving-api"
pins=$(python3 - "$needed" <<'EOF'
import re
import sys
import tomllib

needed = set(sys.argv[1].split())
with open("pyproject.toml", "rb") as file:
    extra = tomllib.load(file)["project"]["optional-dependencies"]["test"]
found = {re.match(r"[A-Za-z0-9._-]+", spec).group(0).lower(): spec for spec in extra}
missing = needed - set(found)
if missing:
    sys.exit(f"tf220_stage.sh: pyproject.toml's test extra lacks {sorted(missing)}")
print("\n".join(found[name] for name in sorted(needed)))
EOF
)
mapfile -t requirements <<< "$pins"

echo "=== TensorFlow 2.20 stage: venv $venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install --quiet --prefer-binary -c tools/tf220-constraints.txt -e . "${requirements[@]}"
python -c "import tensorflow as tf, tf_keras; print('=== tensorflow', tf.__version__, '| tf-keras', tf_keras.__version__)"
installed=$SECONDS

mapfile -t tests < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tools/tf220-tests.txt | grep -v '^$')
status=0
python -m pytest -q -p no:cacheprovider "${tests[@]}" "$@" || status=$?
echo "=== TensorFlow 2.20 stage: $([ "$status" = 0 ] && echo passed || echo "failed (exit $status)");" \
     "install $((installed - began)) s, tests $((SECONDS - installed)) s"
exit "$status"
