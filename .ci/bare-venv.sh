#!/bin/sh
# The core install, checked for real: a fresh venv with `pip install .` (cltrace and its core
# dependencies, no extras) writes and reads .json/.pftrace, and --otlp, --plot and --store each
# stop with the one line naming their extra (exit 2). Run by hand (a minute or two: it builds the
# C extension and installs pyopencl); tests/test_extras.py checks the same in-process, fast.
# Usage: sh .ci/bare-venv.sh [VENV_DIR]   (default: a temporary folder, removed after)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$(mktemp -d)/bare}
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$here"
echo "bare-venv: installed: $("$venv/bin/pip" list --format=freeze | tr '\n' ' ')"
for m in grpc opentelemetry.exporter matplotlib chdb clickhouse_connect mako; do
    if "$venv/bin/python" -c "import $m" 2>/dev/null; then echo "bare-venv: FAIL: $m is installed" >&2; exit 1; fi
done
work=$(mktemp -d)
cd "$work"
"$venv/bin/cltrace" demo --steps 4 --format json,pftrace --out t >/dev/null
"$venv/bin/cltrace" summary t/demo.pftrace >/dev/null
"$venv/bin/cltrace" summary t/demo.json >/dev/null
expect() {  # expect EXTRA ARGS...: exit 2 and one line naming the extra
    extra=$1; shift
    set +e; err=$("$venv/bin/cltrace" "$@" 2>&1 >/dev/null); rc=$?; set -e
    want="needs the [$extra] extra: pip install 'cltrace[$extra]'"
    case "$err" in *"$want"*) ;; *) echo "bare-venv: FAIL: cltrace $*: $err" >&2; exit 1;; esac
    [ "$rc" = 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] || { echo "bare-venv: FAIL: cltrace $*: rc $rc: $err" >&2; exit 1; }
    echo "bare-venv: cltrace $*: $err (exit $rc)"
}
expect otlp demo --steps 2 --out t2 --otlp http://127.0.0.1:4318
expect plot analyze t/demo.pftrace --plot p.png
expect clickhouse load t/demo.pftrace --store st
[ ! -e st ] || { echo "bare-venv: FAIL: --store made a folder" >&2; exit 1; }
cat > prog.py <<'PY'
import numpy as np
import pyopencl as cl
ctx = cl.create_some_context(interactive=False)
q = cl.CommandQueue(ctx)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1024)
cl.enqueue_fill_buffer(q, buf, np.float32(0), 0, 1024)
q.finish()
PY
err=$(CLTRACE=1 CLTRACE_OUT=env.json OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 "$venv/bin/python" prog.py 2>&1)
case "$err" in *"needs the [otlp] extra"*) ;; *) echo "bare-venv: FAIL: CLTRACE=1 with OTEL_EXPORTER_OTLP_ENDPOINT: $err" >&2; exit 1;; esac
grep -q '"fill"' env.json || { echo "bare-venv: FAIL: CLTRACE=1 wrote no trace of the fill" >&2; exit 1; }
echo "bare-venv: CLTRACE=1 with OTEL_EXPORTER_OTLP_ENDPOINT: $err (the trace written)"
echo "bare-venv: OK: demo and summary of .json/.pftrace in a core-only venv ($venv)"
