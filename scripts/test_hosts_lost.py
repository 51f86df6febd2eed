#!/usr/bin/env python3
"""make test-hosts, a host lost: the main job on 2 hosts x 4 ranks (scripts/hosts.sh) with
host 1 lost mid-run, in one of two ways (MODE): `kill`, every DistJax process of host 1
killed (mpirun then ends the job: each survivor's account comes from its sentinel, which
asks every process's lifeline on SIGTERM), or `cut`, host 1's link set down (the
survivors' collectives time out). Every rank of host 0 must stop within 10 s with an error
naming the lost host, its ranks and the collective it was in; the last complete checkpoint
must be intact, and a resume on host 0 alone (data-parallel size 1: the checkpoint
reshards) must continue with the losses of the uninterrupted run (REFERENCE, the threads
run of the same steps) within 1e-6. And mpirun must end by itself with a non-zero status:
within 30 s of the survivors after a kill, within 60 s after a cut (its connection to host
1's OpenMPI daemon fails after the launch node's tcp_retries2, scripts/hosts.sh).

  test_hosts_lost.py MODE BUILD OUT REFERENCE_METRICS STEPS
"""
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

MODE, BUILD, OUT, REFERENCE, STEPS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
if MODE not in ("kill", "cut"):
    sys.exit(f"test_hosts_lost.py: MODE is kill or cut, not {MODE}")
HOW = {"kill": "processes killed", "cut": "link cut"}[MODE]
LOST_HOST, LOST_RANKS = "distjax-host1", "devices 4-7"
TIMEOUT_S = 4  # distributed.timeout_s: the survivors' collective timeout
CUT_AFTER = 12  # the step after which host 1 is lost (a checkpoint every 5 steps)
run_dir = os.path.join(OUT, f"lost-{MODE}")


def fail(msg):
    sys.exit(f"[test-hosts] host lost ({HOW}): {msg}")


def host_ranks(ns):
    """The pids of the DistJax processes of namespace ns."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    out = []
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "distjax":
                    out.append(int(p))
        except OSError:
            pass
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


train = [f"./{BUILD}/distjax", "train", "configs/gpt_3d.toml", "--set", f"run.steps={STEPS}",
         "--set", "run.log_every=1", "--set", "run.timeline=false", "--set", "run.checkpoint_every=5",
         "--set", f"distributed.timeout_s={TIMEOUT_S}", "--out", run_dir]
log_path = os.path.join(OUT, f"lost-{MODE}.log")
log = open(log_path, "w")
job = subprocess.Popen(["bash", "scripts/hosts.sh", "mpirun", "4", *train, "--overwrite"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
cut_at = None
survivors = []
errors = {}  # device -> its error line
exits = {}  # pid of a rank of host 0 -> seconds after the cut it was gone
pending = b""
started = time.monotonic()
# Until host 0's ranks are gone (30 s after host 1 was lost at most); then mpirun must end.
while True:
    now = time.monotonic()
    if cut_at is None and now - started > 300:
        fail(f"no step {CUT_AFTER} within 300 s; see {log_path}")
    if cut_at is not None and (now - cut_at > 30 or len(exits) == len(survivors)):
        break
    ready, _, _ = select.select([job.stdout], [], [], 0.05)
    chunk = os.read(job.stdout.fileno(), 65536) if ready else b""
    if ready and not chunk and cut_at is None:
        fail(f"the run ended before step {CUT_AFTER}; see {log_path}")
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for raw in lines:
        line = raw.decode(errors="replace")
        log.write(line + "\n")
        m = re.search(r"\(raised on device (\d+)\)$", line)
        if m:
            errors.setdefault(int(m.group(1)), line)
        m = re.match(r"step (\d+)/", line)
        if cut_at is None and m and int(m.group(1)) >= CUT_AFTER:
            survivors = host_ranks("distjax-host0")
            subprocess.run(["bash", "scripts/hosts.sh", MODE, "1"], check=True)
            cut_at = time.monotonic()
            print(f"[test-hosts] host 1 lost ({HOW}) after step {m.group(1)}")
    log.flush()
    if cut_at is not None:
        for p in survivors:
            if p not in exits and not alive(p):
                exits[p] = time.monotonic() - cut_at
        if not ready and len(exits) == len(survivors):
            break
status = None
MPIRUN_WAIT = {"kill": 30, "cut": 60}[MODE]
try:
    status = job.wait(timeout=MPIRUN_WAIT)
except subprocess.TimeoutExpired:
    pass
ended = time.monotonic() - cut_at if cut_at is not None else 0
# What is left in the pipe, without waiting for its end: a cut host's OpenMPI daemon, which
# holds it too, outlives mpirun. Then whatever of the job is left (that daemon) goes.
while select.select([job.stdout], [], [], 0.5)[0]:
    chunk = os.read(job.stdout.fileno(), 65536)
    if not chunk:
        break
    pending += chunk
try:
    os.killpg(job.pid, signal.SIGKILL)
except ProcessLookupError:
    pass
job.wait()
log.write(pending.decode(errors="replace"))
log.close()
if status is None:
    fail(f"mpirun was still running {MPIRUN_WAIT} s after the survivors stopped; see {log_path}")
if status == 0:
    fail(f"mpirun exited with status 0; see {log_path}")
print(f"[test-hosts] host lost ({HOW}): mpirun ended by itself {ended:.1f} s after it, status {status}")
if len(survivors) != 4:
    fail(f"expected 4 ranks on distjax-host0, found {survivors}")

if len(exits) < len(survivors):
    fail(f"ranks of host 0 still running 30 s after host 1 was lost: {sorted(set(survivors) - set(exits))}")
first, last = min(exits.values()), max(exits.values())
print(f"[test-hosts] host lost ({HOW}): the 4 ranks of host 0 stopped {first:.1f} s to "
      f"{last:.1f} s after it (timeout_s = {TIMEOUT_S})")
if last > 10:
    fail(f"the last rank of host 0 stopped {last:.1f} s after host 1 was lost (more than 10 s)")
# Each process's error, as it keeps it (mpirun may drop the last lines of a job it ends).
print(f"[test-hosts] errors that reached mpirun's output: devices {sorted(errors)}")
for d in range(4):
    path = os.path.join(run_dir, "failures", f"process_{d}.txt")
    if not os.path.exists(path):
        fail(f"device {d} (host 0) kept no error in {path}; see {log_path}")
    with open(path) as f:
        line = f.read().strip()
    errors[d] = line
    if LOST_HOST not in line or LOST_RANKS not in line or not re.search(r"\[\w+\] .*call #\d+ of group", line):
        fail(f"device {d}'s error does not name {LOST_HOST}, {LOST_RANKS} and the collective: {line}")
print(f"[test-hosts] host lost ({HOW}): device 0 said: {errors[0]}")

# The last complete checkpoint, and the resume on the host that is left.
ckpts = os.path.join(run_dir, "checkpoints")
with open(os.path.join(ckpts, "latest")) as f:
    latest = f.read().strip()
step = int(latest.split("_")[-1])
if not os.path.exists(os.path.join(ckpts, latest, "index.json")):
    fail(f"the latest checkpoint {latest} is not complete")
if step < 5 or step >= STEPS:
    fail(f"the latest checkpoint is at step {step}, expected one between 5 and {STEPS - 1}")
resume = subprocess.run(["bash", "scripts/hosts.sh", "mpirun", "--on", "0", "4", *train, "--resume",
                         "--set", "distributed.world_size=4"], capture_output=True, text=True)
with open(os.path.join(OUT, f"resume-{MODE}.log"), "w") as f:
    f.write(resume.stdout + resume.stderr)
if resume.returncode != 0:
    fail(f"the resume on host 0 failed (exit {resume.returncode}); see {OUT}/resume-{MODE}.log")


def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


ref, got = losses(REFERENCE), losses(os.path.join(run_dir, "metrics.jsonl"))
worst = 0.0
for s in range(step + 1, STEPS + 1):
    if s not in got:
        fail(f"the resumed run logged no loss at step {s}")
    worst = max(worst, abs(got[s] - ref[s]) / abs(ref[s]))
print(f"[test-hosts] host lost ({HOW}): resumed from {latest} on host 0 alone (4 ranks, data-parallel 1): steps "
      f"{step + 1}-{STEPS} within {worst:.1e} relative of the uninterrupted run")
if worst > 1e-6:
    fail(f"the resumed losses differ by {worst:.2e} relative (more than 1e-6)")
