# Sourced by the GPU suites: `step NAME SECONDS COMMAND...` runs one measurement under its own time limit,
# its output in $out/NAME.log (out defaults to ./${suite}_out), and shows the log's last lines.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-${suite}_out}"
mkdir -p "$out"
start=$SECONDS

step() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($((SECONDS - start)) s in): $*"
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - start)) s"
    tail -n "${tail_lines:-25}" "$out/$name.log"
}
