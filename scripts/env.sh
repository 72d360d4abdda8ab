# Shared set-up for scripts/*: uv and the project environment, installed on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
  echo "[setup] installing uv"
  python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet --break-system-packages uv
fi
# the machine's python3 is enough; never fetch an interpreter
export UV_PYTHON_DOWNLOADS=never
uv sync --quiet --frozen
export PATH="$PWD/.venv/bin:$PATH"
