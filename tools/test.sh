#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the whole test suite, the slow end-to-end tests on
# the real vLLM engine and server included. Extra arguments go to pytest (one run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# nginx, for the two-engine proxy test (tests/e2e/test_e2e_proxy.py): Debian's package,
# installed only when missing, as root or with a password-less sudo.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" -eq 0 ]; then as_root=(); else as_root=(sudo -n); fi
  if command -v apt-get >/dev/null 2>&1 && "${as_root[@]}" true 2>/dev/null; then
    echo "[test] installing nginx (apt-get) for the proxy test"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx
  else
    echo "[test] nginx is missing and cannot be installed here (needs apt-get and root):" \
      "the proxy test will fail" >&2
  fi
fi
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=30)
set +e
if [ "$#" -gt 0 ]; then
  # what the caller names, in one process (two real engines never run at once)
  "${pytest[@]}" "$@"
  rc=$?
else
  # the fast tests on every core (pytest-xdist); the slow ones that start no engine
  # (simulations) on every core too, a file per worker so that a module's fixture is
  # built once; the slow engine tests that check states only (marked parallel) two at
  # a time, each worker's engines on a core of their own (tests/conftest.py); then the
  # rest, whose figures or deadlines depend on the host's speed, one at a time
  "${pytest[@]}" -m "not slow" -n auto
  fast=$?
  "${pytest[@]}" -m "slow and simulation" -n auto --dist loadfile
  sim=$?
  "${pytest[@]}" -m "slow and not simulation and parallel" -n 2 --dist loadfile
  par=$?
  "${pytest[@]}" -m "slow and not simulation and not parallel"
  rc=$?
  if [ "$par" -ne 0 ]; then rc=$par; fi
  if [ "$sim" -ne 0 ]; then rc=$sim; fi
  if [ "$fast" -ne 0 ]; then rc=$fast; fi
fi
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
