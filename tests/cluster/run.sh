#!/usr/bin/env bash
# The cluster paths for real, after the unit tests (it runs `ray stop`, so nothing else may
# use Ray on this machine meanwhile):
#   1. `ray start --head`, then `ray job submit --working-dir .` of the DROD job and of a
#      DROD θ sweep (Ray Tune) in --smoke mode; wait for SUCCEEDED; check their outputs.
#   2. a fake multi-node autoscaling cluster built from cluster.yaml's node types: a run
#      that needs a tier resource gets a node added, which is removed when idle.
#   3. chaos: a two-node cluster loses its worker node mid-round; the run finishes on the
#      head, bitwise as the undisturbed run (tests/cluster/chaos.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
export RAY_AUTH_MODE=token            # the head enforces the token; clients present it
T=$(mktemp -d /tmp/fedray-cluster.XXXXXX)
trap 'ray stop --force >/dev/null 2>&1 || true' EXIT

wait_job() {  # JOB_ID -> 0 when it succeeded (`ray job status` ends "Job 'ID' succeeded")
  for _ in $(seq 300); do
    status=$(ray job status --address http://127.0.0.1:8266 "$1" 2>&1 || true)
    if grep -qi "succeeded" <<<"$status"; then return 0; fi
    if grep -qiE "' (failed|stopped)" <<<"$status"; then
      echo "$status" | tail -3
      ray job logs --address http://127.0.0.1:8266 "$1" | tail -30
      return 1
    fi
    sleep 2
  done
  echo "job $1 timed out"; return 1
}

echo "== ray job submit against ray start --head"
ray start --head --port=6391 --dashboard-port=8266 --num-cpus=2 --disable-usage-stats >/dev/null
echo "== a submission without the token is refused"
if RAY_AUTH_MODE=disabled ray job submit --address http://127.0.0.1:8266 -- python -c "print(1)" \
    >"$T/noauth.log" 2>&1; then
  echo "a job was accepted without the token"; exit 1
fi
grep -q "Missing authentication token" "$T/noauth.log"
python -c "import urllib.request as u, urllib.error as e
try: u.urlopen('http://127.0.0.1:8266/api/jobs/'); raise SystemExit('job API open without token')
except e.HTTPError as x: assert x.code == 401, x.code; print('job API without token:', x.code)"
submit() {
  ray job submit --address http://127.0.0.1:8266 --working-dir . --no-wait -- "$@" \
    | grep -o "raysubmit_[A-Za-z0-9]*" | head -1
}
drod=$(submit python jobs/drod_split_cifar100.py --smoke --run-dir "$T/drod")
wait_job "$drod"
python -c "import json,sys; s=json.load(open('$T/drod/summary.json')); \
assert s['rounds']==5 and set(s['continual'])=={'t100','t025','t006','fleet'}, s; \
print('drod job:', s['continual']['fleet'])"
sweep=$(submit python jobs/sweep_drod.py --smoke --space algorithm.theta=grid:0.25,0.75 \
  --storage "$T/sweeps" --name ci)
wait_job "$sweep"
test -s "$T/sweeps/ci/SWEEP.md" && test -s "$T/sweeps/ci/sweep.parquet"
python -c "import pyarrow.parquet as pq; t=pq.read_table('$T/sweeps/ci/sweep.parquet'); \
assert t.num_rows==2, t.num_rows; print('sweep job:', t.num_rows, 'trials')"
ray stop >/dev/null

echo "== fake multi-node autoscaling from cluster.yaml's node types"
python tests/cluster/fake_autoscaler.py config "$T/fake.json"
RAY_FAKE_CLUSTER=1 AUTOSCALER_UPDATE_INTERVAL_S=1 ray start --head --port=6379 \
  --autoscaling-config="$T/fake.json" --num-cpus=0 --dashboard-port=8267 \
  --disable-usage-stats >/dev/null
python tests/cluster/fake_autoscaler.py run "$T/auto"
ray stop >/dev/null

echo "== chaos: a worker node removed mid-round (two-node ray.cluster_utils.Cluster)"
RAY_AUTH_MODE=disabled timeout 600 python tests/cluster/chaos.py
echo "cluster paths OK"
