#!/usr/bin/env bash
# The README's Slurm recipe on a real Slurm: starts a one-node cluster on this
# machine (Debian's slurm-wlm and munge, installed if missing), then
#   1. submits the tiny-pair experiment as a 2-task job array (`bastion run
#      --shard i/2`) and the merge as a job that waits for it
#      (`--dependency=afterok`), and checks that the merged records and the τ
#      table equal an unsharded run's exactly;
#   2. submits it again, requeues one task (`scontrol requeue`: Slurm kills
#      it) once its shard has stored some records but not all, and checks that
#      the requeued task resumed and that the merge again equals the
#      unsharded run: no record lost, none doubled.
# Usage: scripts/slurm-check.sh path/to/bastion      (CI: .ci/run)
# Everything it writes goes to a temporary folder; the daemons it starts are
# stopped when it exits.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BIN="$(realpath "${1:?usage: scripts/slurm-check.sh path/to/bastion}")"
[ -x "$BIN" ] || { echo "slurm-check: $BIN is not an executable" >&2; exit 1; }

if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi
as_root() { "${SUDO[@]}" env SLURM_CONF="$SLURM_CONF" "$@"; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "== installing slurm-wlm and munge (Debian)"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

WORK="$(mktemp -d /tmp/bastion-slurm.XXXXXX)"
chmod 755 "$WORK"
export SLURM_CONF="$WORK/slurm.conf"
HOST="$(hostname -s)"
STARTED_MUNGE=0
cleanup() {
  as_root scontrol shutdown >/dev/null 2>&1 || true
  sleep 1
  [ -f "$WORK/slurmd.pid" ] && as_root kill "$(cat "$WORK/slurmd.pid")" 2>/dev/null || true
  [ -f "$WORK/slurmctld.pid" ] && as_root kill "$(cat "$WORK/slurmctld.pid")" 2>/dev/null || true
  [ "$STARTED_MUNGE" = 1 ] && as_root pkill -x munged 2>/dev/null || true
}
trap cleanup EXIT
fail() {
  echo "slurm-check: $*" >&2
  for f in "$WORK"/*.log "$WORK"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; } >&2; done
  exit 1
}

echo "== munge"
if ! pgrep -x munged >/dev/null; then
  "${SUDO[@]}" mkdir -p /run/munge /var/log/munge /var/lib/munge
  "${SUDO[@]}" chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || "${SUDO[@]}" runuser -u munge -- mungekey --create
  "${SUDO[@]}" runuser -u munge -- /usr/sbin/munged
  STARTED_MUNGE=1
fi
munge -n | unmunge >/dev/null || fail "munge does not round-trip a credential"

echo "== one-node Slurm cluster ($HOST, $(nproc) CPUs)"
mkdir -p "$WORK/state" "$WORK/spool"
cat >"$SLURM_CONF" <<EOF
ClusterName=bastion-check
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=600
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=check Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
as_root slurmctld -c -f "$SLURM_CONF"
as_root slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && break
  sleep 1
done
sinfo -h -o '%T' | grep -qE '^(idle|mixed|allocated)' || fail "the node did not come up: $(sinfo 2>&1)"

# The experiment: the tiny pair, two sets, the methods whose trees do not
# depend on measured times (the cost-aware ones choose budgets from timings,
# so their τ may differ between any two runs, sharded or not).
exp() { # name, prompts per set, new tokens
  cat >"$WORK/$1.toml" <<EOF
name = "$1"
max_new_tokens = $3
methods = ["dflash", "ddtree:4", "ddtree:16"]

[[models]]
name = "tiny"
target = "tests/fixtures/tiny-qwen3"
drafter = "tests/fixtures/tiny-dflash"

[datasets]
names = ["gsm8k", "humaneval"]
max_samples = $2
EOF
}

# Waits for job $1 (all its tasks) to leave the queue; fails past $2 seconds.
wait_job() {
  for _ in $(seq "$2"); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 1
  done
  fail "job $1 still queued after $2 s: $(squeue -j "$1" 2>&1)"
}

# Compares the merged records and τ table of experiment $1 (sharded run in
# results/) with the unsharded run (whole/).
compare() {
  python3 - "$WORK/results/$1/samples.jsonl" "$WORK/whole/$1/samples.jsonl" \
    "$WORK/tables/$1.md" "$WORK/whole-tables/$1.md" <<'EOF' || fail "experiment $1: the merged run differs from the unsharded one (above)"
import json, sys
def records(path):
    rows = [json.loads(l) for l in open(path)]
    keys = [r["key"] for r in rows]
    assert len(keys) == len(set(keys)), f"{path}: a record is doubled"
    return {r["key"]: (r["output"], r["tau"], [x["accepted"] for x in r["rounds"]]) for r in rows}
merged, whole = records(sys.argv[1]), records(sys.argv[2])
assert merged.keys() == whole.keys(), f"records lost or extra: {sorted(merged.keys() ^ whole.keys())}"
for k in whole:
    assert merged[k] == whole[k], f"{k}: the sharded record differs from the unsharded one"
def tau_columns(path):
    """Every τ cell (and n) of the Markdown tables, by table, method and column;
    speedups, TPOT and the timing-picked oracle row are left out."""
    out, header, table = {}, None, 0
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            header = None
        elif cells[0] == "method":
            header, table = cells, table + 1
        elif header and not cells[0].startswith(("---", "ddtree-oracle")):
            keep = [i for i, h in enumerate(header) if h.endswith("τ") or h == "n"]
            out[(table, cells[0])] = [(header[i], cells[i]) for i in keep]
    assert out, f"{path}: no τ table"
    return out
assert tau_columns(sys.argv[3]) == tau_columns(sys.argv[4]), "the τ tables differ"
print(f"{len(merged)} records and the τ table equal the unsharded run's")
EOF
}

echo "== 1. job array of 2 shards, then the merge (afterok)"
exp slurm-tiny 3 16
"$BIN" run "$WORK/slurm-tiny.toml" --results "$WORK/whole" --tables "$WORK/whole-tables" >"$WORK/whole.out" 2>&1 ||
  fail "the unsharded run failed"
run_shard="\"$BIN\" run \"$WORK/slurm-tiny.toml\" --shard \${SLURM_ARRAY_TASK_ID}/2 --results \"$WORK/results\" --tables \"$WORK/shard-tables\""
array=$(sbatch --parsable --array=0-1 --chdir="$ROOT" -o "$WORK/tiny-%a.out" --wrap "$run_shard")
merge="\"$BIN\" merge \"$WORK/slurm-tiny.toml\" --results \"$WORK/results\" && \"$BIN\" tables \"$WORK/slurm-tiny.toml\" --results \"$WORK/results\" --out \"$WORK/tables\""
merged=$(sbatch --parsable --dependency=afterok:"$array" --chdir="$ROOT" -o "$WORK/merge-tiny.out" --wrap "$merge")
echo "array job $array, merge job $merged"
wait_job "$merged" 300
scontrol show job "$merged" | grep -q 'JobState=COMPLETED' || fail "merge job $merged: $(scontrol show job "$merged" | grep -o 'JobState=[A-Z_]*')"
compare slurm-tiny

echo "== 2. a task killed and requeued mid-shard resumes"
exp slurm-requeue 12 48
"$BIN" run "$WORK/slurm-requeue.toml" --results "$WORK/whole" --tables "$WORK/whole-tables" >"$WORK/whole-requeue.out" 2>&1 ||
  fail "the unsharded run failed"
total=$(wc -l <"$WORK/whole/slurm-requeue/samples.jsonl")
run_shard="${run_shard//slurm-tiny/slurm-requeue}"
array=$(sbatch --parsable --requeue --array=0-1 --chdir="$ROOT" -o "$WORK/requeue-%a.out" --open-mode=append --wrap "$run_shard")
shard0="$WORK/results/slurm-requeue/shard-0-of-2/samples.jsonl"
for _ in $(seq 600); do
  [ -f "$shard0" ] && [ "$(wc -l <"$shard0")" -ge 2 ] && break
  sleep 0.1
done
before=$(wc -l <"$shard0" 2>/dev/null || echo 0)
[ "$before" -ge 2 ] && [ "$before" -lt $((total / 2)) ] ||
  fail "task 0 had $before of ~$((total / 2)) records when it was to be requeued (too fast or never started)"
scontrol requeue "${array}_0"
echo "requeued task ${array}_0 with $before records stored"
# Slurm holds a requeued job back for two minutes (Reason=BeginTime); let it start now.
for _ in $(seq 60); do # until the killed task is pending again
  [ "$(squeue -h -j "${array}_0" -o %r 2>/dev/null)" = BeginTime ] && break
  sleep 0.5
done
scontrol update JobId="${array}_0" StartTime=now || true
merge="${merge//slurm-tiny/slurm-requeue}"
merged=$(sbatch --parsable --dependency=afterok:"$array" --chdir="$ROOT" -o "$WORK/merge-requeue.out" --wrap "$merge")
wait_job "$merged" 600
scontrol show job "$merged" | grep -q 'JobState=COMPLETED' || fail "merge job $merged did not complete"
grep -qE '[1-9][0-9]* already done' "$WORK/requeue-0.out" || fail "the requeued task did not resume its shard"
scontrol show job "${array}_0" | grep -qE 'Restarts=[1-9]' || fail "task ${array}_0 was not restarted"
compare slurm-requeue
echo "slurm-check: passed"
