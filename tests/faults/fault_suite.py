#!/usr/bin/env python3
"""dscpp's fault suite: does to whole `dscpp launch` jobs what production does to them, counts
the outcomes and checks the bounds (docs/reliability.md says what each case promises).

Each trial runs a real job of 2-4 processes (`dscpp train` on a tiny built-in GPT, or
tests/faults/fault_trainer, a user-style program on the public API) with one fault placed in it,
then checks: the job ended (never a hang), within the case's bound, with a report naming the
cause; no process, shared-memory segment, temporary file or listening port was left behind;
and every checkpoint published before the fault is still whole and, where the case says so,
training resumes from it.

Faults are placed deterministically with DSCPP_FAULT_INJECT (src/util/fault_inject.h): a
calibration run with `count` says how often each rank reaches each phase, then every trial
picks a rank and a visit at random, from a stream of its own case seeded by the suite's seed
and the case's name, so a failure reproduces from its seed whatever other cases ran with it.

  fault_suite.py --build build --quick            a few trials per case (CI)
  fault_suite.py --build build --report docs/reliability.md   the full suite
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

PHASES = ["forward", "backward", "optimizer", "all_gather", "save", "offload_io"]
KILL_BOUND_S = 10.0   # every other process gone this long after a rank is killed
COMM_TIMEOUT_S = 4    # DSCPP_COMM_TIMEOUT for the stall cases
STALL_BOUND_S = COMM_TIMEOUT_S + 10.0
JOB_LIMIT_S = 90.0    # a job still running after this is a hang: killed, and the trial fails
API_BOUND_S = COMM_TIMEOUT_S + 11.0  # a misused engine API: the whole job, start-up included
HOST_LOST_BOUND_S = 30.0  # a host's death to the first step done on the hosts left, plus the load
STRANGER_DELAY_S = 10.0  # a job with strangers at its master port takes at most this much longer


def check_ending(res, rc, hung, t_fault, t_end, bound):
    """The job failed (not exit 0), did not hang, the fault fired (at t_fault, wall clock), and
    the last process exited within `bound` seconds of it."""
    if hung:
        res["why"].append("the job was still running after %.0f s" % JOB_LIMIT_S)
    if t_fault is None:
        res["why"].append("the fault did not fire")
    else:
        res["exit_s"] = t_end - t_fault
        if res["exit_s"] > bound:
            res["why"].append("the job ended %.1f s after the fault (bound %.0f s)" %
                              (res["exit_s"], bound))
    if rc == 0:
        res["why"].append("dscpp launch exited 0")


ALL_CASES = ["kill_" + p for p in PHASES] + ["kill_save_background"] + [
    "stop", "skip", "skip_tcp", "skip_tcp_debug", "save", "save_tcp", "save_tcp_debug", "wider",
    "double", "nan_fp32", "nan_fp16", "corrupt", "disk", "eio", "nvme", "net_cut", "net_no_master", "net_host_lost", "stranger", "fuzz_configs",
    "libfuzzer"]


def case_title(case):
    """(the report's name of a case, its bound)."""
    if case == "kill_save_background":
        return "SIGKILL in a background save", "%.0f s" % KILL_BOUND_S
    if case.startswith("kill_"):
        return "SIGKILL at " + case[len("kill_"):], "%.0f s" % KILL_BOUND_S
    if case == "stop":
        return "SIGSTOP > timeout", "timeout + 10 s"
    if case == "corrupt":
        return "damaged checkpoint, --resume", "job %.0f s" % API_BOUND_S
    if case == "disk":
        return "checkpoint disk full or read-only", "job %.0f s" % API_BOUND_S
    if case == "eio":
        return "EIO writing a checkpoint or the swap", "%.0f s" % KILL_BOUND_S
    if case == "nvme":
        return "nvme_path full or read-only", "job %.0f s" % API_BOUND_S
    if case == "fuzz_configs":
        return "config fuzz: generated configs (ASan, UBSan)", "no crash"
    if case == "libfuzzer":
        return "libFuzzer: config, manifest, safetensors header (ASan, UBSan)", "no crash"
    if case == "net_cut":
        return "network cut between 2 hosts", "timeout + 10 s"
    if case == "net_no_master":
        return "MASTER_ADDR never answers", "timeout + 10 s"
    if case == "net_host_lost":
        return "a host of 2 lost, the job goes on", "%.0f s + load" % HOST_LOST_BOUND_S
    if case == "stranger":
        return "a stranger at the master port", "job +%.0f s" % STRANGER_DELAY_S
    if case.startswith("nan_"):
        return "NaN gradient, " + case[len("nan_"):], "job %.0f s" % API_BOUND_S
    mode = case.split("_")[0]
    title = {"skip": "API: a rank skips a micro-step",
             "save": "API: save_checkpoint on one rank only",
             "wider": "API: a wider model", "double": "API: a float64 model"}[mode]
    title += " (TCP, DSCPP_DEBUG_SYNC=1)" if case.endswith("_debug") else \
        " (TCP)" if "_tcp" in case else ""
    return title, "job %.0f s" % API_BOUND_S


CASE_ORDER = [case_title(c)[0] for c in ALL_CASES]
CASE_KEY = {case_title(c)[0]: c for c in ALL_CASES}  # the report's name -> the --cases key


def need_root(why):
    if os.geteuid() != 0:
        raise SystemExit("%s: run the suite as root, or leave it out with --except" % why)


def check_refused(res, rc, hung, out, expected, folder):
    """A job that had to stop on a disk fault: it did, within API_BOUND_S, with an error
    matching `expected` and naming `folder`."""
    if hung:
        res["why"].append("the job was still running after %.0f s" % JOB_LIMIT_S)
    if rc == 0:
        res["why"].append("the job exited 0")
    if not re.search(expected, out) or folder not in out:
        res["why"].append("the error does not name /%s/ and the folder" % expected)
    if res["exit_s"] > API_BOUND_S:
        res["why"].append("the job took %.1f s (bound %.0f s)" % (res["exit_s"], API_BOUND_S))


class NetPair:
    """Two "hosts" on this machine: network namespaces joined by a veth pair, each address
    reachable from the other (tests/launch/multinode_netns.sh builds the same). Needs root."""

    def __init__(self):
        pid = os.getpid()
        self.hosts = ["dscpp_f1_%d" % pid, "dscpp_f2_%d" % pid]
        self.links = ["dsfa%d" % pid, "dsfb%d" % pid]  # interface names: 15 characters at most
        x = pid % 200 + 20
        self.addrs = ["10.232.%d.1" % x, "10.232.%d.2" % x]
        # An address on the link that nobody holds, whose frames go out and are never answered
        # (a permanent neighbour entry, so not even ARP fails): a master that never answers.
        self.silent = "10.232.%d.9" % x
        self.ip("netns", "add", self.hosts[0])
        try:
            self.ip("netns", "add", self.hosts[1])
            self.ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for h, l, a in zip(self.hosts, self.links, self.addrs):
                self.ip("link", "set", l, "netns", h)
                self.ip("-n", h, "addr", "add", a + "/24", "dev", l)
                self.ip("-n", h, "link", "set", "lo", "up")
                self.ip("-n", h, "link", "set", l, "up")
                self.ip("-n", h, "neigh", "add", self.silent, "lladdr", "02:00:00:00:00:09",
                        "dev", l, "nud", "permanent")
            # Inside the namespaces the host names resolve to their addresses (`ip netns exec`
            # bind-mounts /etc/netns/NAME/hosts over /etc/hosts), as a cluster's DNS would: a job
            # without --master_addr uses the first host's name.
            for h in self.hosts:
                os.makedirs("/etc/netns/" + h, exist_ok=True)
                with open("/etc/netns/%s/hosts" % h, "w") as f:
                    f.write("127.0.0.1 localhost\n" + "".join(
                        "%s %s\n" % (a, n) for a, n in zip(self.addrs, self.hosts)))
        except Exception:
            self.close()
            raise

    @staticmethod
    def ip(*args):
        r = subprocess.run(["ip"] + list(args), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("the network cases need root and iproute2 ('ip %s' failed: %s); "
                             "leave them out with --except" % (" ".join(args), r.stderr.strip()))

    def set_link(self, host, up):
        self.ip("-n", self.hosts[host], "link", "set", self.links[host], "up" if up else "down")

    def hostfile(self, path, slots):
        with open(path, "w") as f:
            f.write("".join("%s slots=%d\n" % (h, slots) for h in self.hosts))

    def launch(self, dscpp, hostfile, master, port, program):
        return [dscpp, "launch", "--hostfile", hostfile, "--launcher", "ssh", "--remote_cmd",
                "ip netns exec {host} {command}", "--master_addr", master, "--master_port",
                str(port)] + program

    def close(self):
        for h in self.hosts:
            subprocess.run(["ip", "netns", "del", h], capture_output=True)
            shutil.rmtree("/etc/netns/" + h, ignore_errors=True)


class Suite:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.dscpp = os.path.join(self.build, "dscpp")
        self.rng = None         # the current case's random stream (run_all seeds one per case)
        self.work = tempfile.mkdtemp(prefix="dscpp_faults_")
        self.rows = []          # one per case: its summary
        self.failures = []      # (case, trial, why, output tail)
        self.calibration = {}   # (config key, world) -> {rank: {phase: visits}}
        self.clean = {}         # seed -> folder of a finished run with checkpoints
        self.jobs = 0
        self.failing_jobs = 0   # jobs that ended non-zero (the leak check counts them)
        self.shm_before = set(os.listdir("/dev/shm"))
        self.net = None         # the two network namespaces of the network cases, made once

    # ----------------------------------------------------------------------------------------
    # Running a job

    def next_port(self):
        """A port nothing holds now, at random below the kernel's ephemeral range: a port from
        that range can be taken as the local end of an outgoing connection (a rank's Gloo
        connections, a test running beside the suite) between this choice and the rank 0's
        bind. The kernel's choice where the range leaves no room below it."""
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                low = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            low = 32768
        for _ in range(1000 if low > 11000 else 0):
            port = random.randrange(10000, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("0.0.0.0", port))
                    return port
                except OSError:
                    continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def run(self, argv, env_extra, limit=JOB_LIMIT_S, watch=None):
        """Runs argv in a session of its own; returns (rc, output, t_end, hung). `watch(text,
        now)` is called every 50 ms with the output so far."""
        env = dict(os.environ)
        env.update({"OMP_NUM_THREADS": "1"})
        env.update(env_extra)
        out_path = os.path.join(self.work, "job_%d.out" % self.jobs)
        self.jobs += 1
        with open(out_path, "w+b") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, cwd=self.work)
            t0 = time.time()
            hung = False
            while p.poll() is None:
                now = time.time()
                if now - t0 > limit:
                    hung = True
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    break
                if watch:
                    out.flush()
                    with open(out_path, "r", errors="replace") as f:
                        watch(f.read(), now)
                time.sleep(0.05)
            t_end = time.time()
        with open(out_path, "r", errors="replace") as f:
            text = f.read()
        os.unlink(out_path)
        self.failing_jobs += p.returncode != 0
        return p.returncode, text, t_end, hung

    def launch(self, world, program, port):
        return [self.dscpp, "launch", "--num_procs", str(world), "--master_port", str(port)] + \
            program

    # ----------------------------------------------------------------------------------------
    # What a job leaves behind

    def leftovers(self, trial_dir, port, hosts=()):
        """Processes, /dev/shm segments, temporary files and listening ports (here, or in the
        network namespaces `hosts`) left behind."""
        left = []
        time.sleep(0.05)
        ps = subprocess.run(["pgrep", "-f", trial_dir], capture_output=True, text=True).stdout
        pids = [p for p in ps.split() if int(p) != os.getpid()]
        if pids:
            left.append("processes %s" % ",".join(pids))
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shm = self.new_shm_segments()
        if shm:
            left.append("shared memory %s" % ",".join(sorted(shm)))
            for s in shm:
                os.unlink(os.path.join("/dev/shm", s))
            self.shm_before |= shm
        tmp = [f for f in glob.glob(trial_dir + "/**/*", recursive=True) if ".tmp." in f]
        if tmp:
            left.append("temporary files %s" % ",".join(os.path.relpath(t, trial_dir)
                                                        for t in tmp))
        for ns in hosts or [None]:
            ss = subprocess.run((["ip", "netns", "exec", ns] if ns else []) +
                                ["ss", "-Hltn", "sport = :%d" % port], capture_output=True,
                                text=True).stdout.strip()
            if ss:
                left.append("listening port %d%s" % (port, " on " + ns if ns else ""))
        return left

    def new_shm_segments(self):
        """dscpp's /dev/shm names that appeared since the suite began and stay. A segment is
        named only while its job sets up (milliseconds), so one that is gone 0.3 s later is
        another test's, running beside the suite (ctest -j), not a leak."""
        def now():
            return {s for s in set(os.listdir("/dev/shm")) - self.shm_before
                    if s.startswith("dscpp")}
        first = now()
        if not first:
            return first
        time.sleep(0.3)
        return first & now()

    def checkpoint_state(self, save_dir):
        """(tag latest names or None, whether `dscpp checkpoint verify` accepts it)."""
        latest = os.path.join(save_dir, "latest")
        if not os.path.exists(latest):
            return None, True
        tag = open(latest).read().strip()
        r = subprocess.run([self.dscpp, "checkpoint", "verify", save_dir], capture_output=True,
                           text=True)
        return tag, r.returncode == 0

    # ----------------------------------------------------------------------------------------
    # The jobs the cases run

    def train_config(self, trial_dir, stage, offload, print_every=1000, background=False):
        cfg = {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2,
               "steps_per_print": print_every,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000,
                                     "allgather_bucket_size": 20000}}
        if stage == 3:
            cfg["zero_optimization"].update({"stage3_prefetch_bucket_size": 10000,
                                             "stage3_max_live_parameters": 20000,
                                             "stage3_max_reuse_distance": 0,
                                             "stage3_param_persistence_threshold": 100})
        if offload:
            swap = os.path.join(trial_dir, "swap")
            os.makedirs(swap, exist_ok=True)
            cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": swap}
            if stage == 3:
                cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": swap,
                                                             "max_in_cpu": 0}
        if background:  # checkpoint.writer.decoupled: the rank files are written by a thread
            cfg["checkpoint"] = {"writer": {"decoupled": True}}
        path = os.path.join(trial_dir, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def train_program(self, trial_dir, stage, offload, steps=6, resume=False, print_every=1000,
                      background=False):
        config = self.train_config(trial_dir, stage, offload, print_every, background)
        argv = [self.dscpp, "train", "--config", config, "--steps", str(steps), "--eval_problems",
                "0", "--save_dir", os.path.join(trial_dir, "ckpt"), "--save_interval", "2"]
        return argv + (["--resume"] if resume else [])

    def calibrate(self, stage, offload, world, background=False):
        key = (stage, offload, world, background)
        if key in self.calibration:
            return self.calibration[key]
        trial_dir = tempfile.mkdtemp(prefix="calib_", dir=self.work)
        rc, out, _, hung = self.run(self.launch(world, self.train_program(
                                                    trial_dir, stage, offload,
                                                    background=background),
                                                self.next_port()),
                                    {"DSCPP_FAULT_INJECT": "count"})
        if rc != 0 or hung:
            raise SystemExit("calibration run failed (stage %d, offload %s, world %d):\n%s" %
                             (stage, offload, world, out[-3000:]))
        counts = {}
        for m in re.finditer(r"dscpp fault points: rank (\d+) (.*)", out):
            counts[int(m.group(1))] = {k: int(v) for k, v in
                                       (kv.split("=") for kv in m.group(2).split())}
        if len(counts) != world:
            raise SystemExit("calibration: expected %d count lines:\n%s" % (world, out[-3000:]))
        shutil.rmtree(trial_dir)
        self.calibration[key] = counts
        return counts

    # ----------------------------------------------------------------------------------------
    # Cases

    def kill_case(self, phase, trials, action="kill", background=False):
        """A rank sends itself SIGKILL at a random visit of `phase` (action "kill"), or the
        write or read it is about to do at that visit fails with EIO (action "eio", phase
        "save" or "offload_io"; "io" alternates them). `background`: the saves are written
        by a thread of their own (checkpoint.writer.decoupled), where the save points are."""
        results = []
        phases = ["save", "offload_io"] if phase == "io" else [phase]
        for t in range(trials):
            phase = phases[t % len(phases)]
            stages = {"all_gather": [1, 2, 3], "offload_io": [2, 3]}.get(phase, [0, 1, 2, 3])
            stage = stages[(t // len(phases)) % len(stages)]
            offload = phase == "offload_io" or (phase == "save" and t % 4 == 3 and stage > 0 and
                                                not background)
            world = [2, 3, 2, 4][t % 4] if not self.args.quick else 2
            counts = self.calibrate(stage, offload, world, background)
            ranks = [r for r in range(world) if counts[r][phase] > 0]
            rank = self.rng.choice(ranks)
            hit = self.rng.randint(1, counts[rank][phase])
            what = "stage %d%s%s, %d ranks, rank %d %s at %s visit %d of %d" % (
                stage, " + nvme offload" if offload else "",
                " (background save)" if background else "", world, rank,
                "killed" if action == "kill" else "fails with EIO", phase, hit,
                counts[rank][phase])
            results.append(self.kill_trial(phase, t, stage, offload, world, rank, hit, what,
                                           action, background))
        if action == "eio" and self.args.quick:
            # Pinned: the trial of the full run (seed 1403) where a stage-3 rank's backward failed
            # on a swap read of parameters and the mismatch that followed hid the I/O error (4
            # ranks, rank 1's 33rd swap request; a change to the swap's request pattern moves
            # it, so the calibration must still reach it).
            counts = self.calibrate(3, True, 4)
            if counts[1]["offload_io"] < 33:
                raise SystemExit("the pinned eio trial needs rank 1 to make 33 swap requests; it "
                                 "makes %d now: pin another" % counts[1]["offload_io"])
            results.append(self.kill_trial("offload_io", trials, 3, True, 4, 1, 33,
                                           "pinned: stage 3 + nvme offload, 4 ranks, rank 1 "
                                           "fails with EIO at its 33rd swap request", action))
        return results

    def kill_trial(self, phase, t, stage, offload, world, rank, hit, what, action,
                   background=False):
        trial_dir = tempfile.mkdtemp(prefix="%s_%s_" % (action, phase), dir=self.work)
        port = self.next_port()
        save_dir = os.path.join(trial_dir, "ckpt")
        rc, out, t_end, hung = self.run(
            self.launch(world, self.train_program(trial_dir, stage, offload,
                                                  background=background), port),
            {"DSCPP_FAULT_INJECT": "%s:phase=%s:rank=%d:hit=%d" % (action, phase, rank, hit)})
        res = {"what": what, "ok": True, "why": [], "exit_s": None, "left": [], "lost": 0}
        m = re.search(r"dscpp fault injection: rank %d \(pid \d+\) %s at %s \(hit %d\) at "
                      r"([0-9.]+)" % (rank, "SIGKILL" if action == "kill" else "EIO", phase,
                                      hit), out)
        check_ending(res, rc, hung, float(m.group(1)) if m else None, t_end, KILL_BOUND_S)
        if action == "kill":
            if "cause: rank %d on localhost killed by signal 9 (SIGKILL)" % rank not in out:
                res["why"].append("the report does not name rank %d on localhost as the cause" %
                                  rank)
        else:
            # Every rank learns of a failed save or swap together: any may exit first.
            if not re.search(r"rank %d\]? .*Input/output error" % rank, out):
                res["why"].append("rank %d's error does not say 'Input/output error'" % rank)
            if not re.search(r"cause: rank \d+ on localhost exited with status", out):
                res["why"].append("the launcher's report names no rank as the cause")
        # Every checkpoint announced before the kill must still be whole.
        # (A background save announces a checkpoint when it publishes it.)
        saved = re.findall(r"(?:saved|published) checkpoint (\S+) at optimizer step", out)
        tag, whole = self.checkpoint_state(save_dir)
        if saved and (tag is None or not whole or
                      int(tag.replace("global_step", "")) <
                      int(os.path.basename(saved[-1]).replace("global_step", ""))):
            res["lost"] = 1
            res["why"].append("checkpoint %s was announced, but latest is %s (whole: %s)" %
                              (saved[-1], tag, whole))
        elif tag is not None and not whole:
            res["lost"] = 1
            res["why"].append("latest names %s, which verify refuses" % tag)
        # A kill inside a save (at its points, or in the offload reads a save streams) must leave
        # a run that resumes from the last checkpoint (or starts afresh when there was none),
        # saves again and clears the partial file the killed writer left.
        partial = [f for f in glob.glob(trial_dir + "/**/*", recursive=True) if ".tmp." in f]
        if (phase == "save" or partial) and whole and not hung:
            rc2, out2, _, hung2 = self.run(
                self.launch(world, self.train_program(trial_dir, stage, offload, resume=True,
                                                      background=background),
                            self.next_port()), {})
            if rc2 != 0 or hung2 or (tag is not None and "resumed from" not in out2):
                res["why"].append("resuming from %s failed: %s" % (tag, out2[-1500:]))
        res["left"] = self.leftovers(trial_dir, port)
        if res["left"]:
            res["why"].append("left behind: " + "; ".join(res["left"]))
        res["ok"] = not res["why"]
        if not res["ok"]:
            self.failures.append(("%s at %s" % (action, phase), t, "; ".join(res["why"]),
                                  out[-3000:]))
        shutil.rmtree(trial_dir, ignore_errors=True)
        return res

    def stop_case(self, trials):
        """A rank sends itself SIGSTOP inside a backward; the driver sends SIGCONT after the
        others have reported. Bound: DSCPP_COMM_TIMEOUT + 10 s."""
        results = []
        for t in range(trials):
            stage = [0, 2, 3, 1][t % 4]
            world = 2 if self.args.quick else [2, 3][t % 2]
            counts = self.calibrate(stage, False, world)
            rank = self.rng.randrange(world)
            hit = self.rng.randint(1, counts[rank]["backward"])
            trial_dir = tempfile.mkdtemp(prefix="stop_", dir=self.work)
            port = self.next_port()
            stopped = {}

            def watch(text, now):
                m = re.search(r"dscpp fault injection: rank \d+ \(pid (\d+)\) SIGSTOP .* at "
                              r"([0-9.]+)", text)
                if m and "pid" not in stopped:
                    stopped["pid"], stopped["t"] = int(m.group(1)), float(m.group(2))
                # SIGCONT once another rank has reported: it must change nothing.
                if "pid" in stopped and "cont" not in stopped and \
                        "did not complete within" in text:
                    stopped["cont"] = now
                    try:
                        os.kill(stopped["pid"], signal.SIGCONT)
                    except ProcessLookupError:
                        pass

            rc, out, t_end, hung = self.run(
                self.launch(world, self.train_program(trial_dir, stage, False), port),
                {"DSCPP_FAULT_INJECT": "stop:phase=backward:rank=%d:hit=%d" % (rank, hit),
                 "DSCPP_COMM_TIMEOUT": str(COMM_TIMEOUT_S)}, watch=watch)
            what = "stage %d, %d ranks, rank %d stopped at backward visit %d" % (stage, world,
                                                                              rank, hit)
            res = {"what": what, "ok": True, "why": [], "exit_s": None, "left": [], "lost": 0}
            check_ending(res, rc, hung, stopped.get("t"), t_end, STALL_BOUND_S)
            if "did not complete within %.1f s" % COMM_TIMEOUT_S not in out:
                res["why"].append("no rank reported a collective that did not complete in time")
            if not re.search(r"rank\(s\) ([0-9,]+,)?%d(,[0-9,]+)? did not answer|rank %d is behind|"
                             r"rank %d did not answer" % (rank, rank, rank), out):
                res["why"].append("the report does not name rank %d" % rank)
            res["left"] = self.leftovers(trial_dir, port)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            res["ok"] = not res["why"]
            if not res["ok"]:
                self.failures.append(("SIGSTOP", t, "; ".join(res["why"]), out[-3000:]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(res)
        return results

    def trainer_trial(self, case, t, mode, stage, world, rank, step, env, fp16=False):
        """Runs tests/faults/fault_trainer with one fault; returns (result, output, seconds)."""
        trial_dir = tempfile.mkdtemp(prefix="api_%s_" % mode, dir=self.work)
        port = self.next_port()
        cfg = {"train_batch_size": 8 * world, "train_micro_batch_size_per_gpu": 4,
               "steps_per_print": 1000, "gradient_clipping": 1.0,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
               "zero_optimization": {"stage": stage}}
        if fp16:
            cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
        config = os.path.join(trial_dir, "config.json")
        with open(config, "w") as f:
            json.dump(cfg, f)
        trainer = os.path.join(self.build, "tests", "fault_trainer")
        t0 = time.time()
        rc, out, t_end, hung = self.run(
            self.launch(world, [trainer, config, mode, str(rank), str(step), "6"], port), env)
        res = {"what": "%s, stage %d, %d ranks, rank %d, step %d%s" % (
                   mode, stage, world, rank, step, ", fp16" if fp16 else ""),
               "ok": True, "why": [], "exit_s": t_end - t0, "left": [], "lost": 0, "rc": rc}
        if hung:
            res["why"].append("the job was still running after %.0f s" % JOB_LIMIT_S)
        res["left"] = self.leftovers(trial_dir, port)
        if res["left"]:
            res["why"].append("left behind: " + "; ".join(res["left"]))
        shutil.rmtree(trial_dir, ignore_errors=True)
        return res, out

    def clean_checkpoints(self, seed):
        """A folder of a finished 2-rank run (stage 2, checkpoints global_step2 and 4), made once
        per seed and copied by each corruption trial."""
        if seed not in self.clean:
            trial_dir = tempfile.mkdtemp(prefix="clean_", dir=self.work)
            argv = self.train_program(trial_dir, 2, False, steps=4) + ["--seed", str(seed)]
            rc, out, _, hung = self.run(self.launch(2, argv, self.next_port()), {})
            if rc != 0 or hung:
                raise SystemExit("the clean run for the corruption cases failed:\n" + out[-3000:])
            self.clean[seed] = trial_dir
        return self.clean[seed]

    def corrupt_case(self, trials):
        """A damaged checkpoint: a flipped byte in a rank's file, a truncated manifest, `latest`
        naming a tag that does not exist, a rank's file from another run. `--resume` must refuse
        it naming the file, load nothing, and leave the other checkpoint whole."""
        kinds = ["flip", "latest", "truncate", "foreign"]
        results = []
        for t in range(trials):
            kind = kinds[t % len(kinds)]
            rank = self.rng.randrange(2)
            trial_dir = tempfile.mkdtemp(prefix="corrupt_%s_" % kind, dir=self.work)
            ckpt = os.path.join(trial_dir, "ckpt")
            shutil.copytree(os.path.join(self.clean_checkpoints(1234), "ckpt"), ckpt)
            shard = "rank%05d-of-00002.safetensors" % rank
            target = os.path.join(ckpt, "global_step4", shard)
            if kind == "flip":
                size = os.path.getsize(target)
                at = self.rng.randrange(size // 2, size)
                with open(target, "r+b") as f:
                    f.seek(at)
                    byte = f.read(1)
                    f.seek(at)
                    f.write(bytes([byte[0] ^ 0x10]))
                expected = re.escape(shard) + r": CRC-32C .*\(corrupted\)"
            elif kind == "truncate":
                target = os.path.join(ckpt, "global_step4", "manifest.json")
                with open(target, "r+b") as f:
                    f.truncate(os.path.getsize(target) // 2)
                expected = re.escape(target)
            elif kind == "latest":
                with open(os.path.join(ckpt, "latest"), "w") as f:
                    f.write("global_step9\n")
                expected = r"names tag 'global_step9', but '.*global_step9' does not exist"
            else:
                other = os.path.join(self.clean_checkpoints(4321), "ckpt", "global_step4", shard)
                shutil.copyfile(other, target)
                expected = re.escape(shard) + r": CRC-32C"
            port = self.next_port()
            t0 = time.time()
            rc, out, t_end, hung = self.run(
                self.launch(2, self.train_program(trial_dir, 2, False, steps=6, resume=True),
                            port), {})
            res = {"what": "%s (rank %d's file)" % (kind, rank), "ok": True, "why": [],
                   "exit_s": t_end - t0, "left": [], "lost": 0}
            if hung:
                res["why"].append("the job was still running after %.0f s" % JOB_LIMIT_S)
            if rc == 0 or "resumed from" in out:
                res["why"].append("the damaged checkpoint was loaded")
            if not re.search(expected, out):
                res["why"].append("the damage is not named (expected /%s/)" % expected)
            if res["exit_s"] > API_BOUND_S:
                res["why"].append("the job took %.1f s (bound %.0f s)" % (res["exit_s"],
                                                                         API_BOUND_S))
            v = subprocess.run([self.dscpp, "checkpoint", "verify", ckpt, "--tag", "global_step2"],
                               capture_output=True, text=True)
            if v.returncode != 0:
                res["lost"] = 1
                res["why"].append("global_step2 no longer verifies: " + v.stdout + v.stderr)
            res["left"] = self.leftovers(trial_dir, port)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("corrupt", t, res, out))
        return results

    def disk_case(self, trials):
        """The checkpoint folder on a small file system of its own (tmpfs, mounted by the
        suite; needs root): full after the first checkpoint, or made read-only after it. The
        run must stop with the file system's error and the path named, and the checkpoint
        before must stay whole and resume."""
        need_root("the disk case mounts file systems")
        results = []
        for t in range(trials):
            kind = ["full", "readonly"][t % 2]
            stage = [0, 1, 2, 3][t % 4]
            trial_dir = tempfile.mkdtemp(prefix="disk_%s_" % kind, dir=self.work)
            ckpt = os.path.join(trial_dir, "ckpt")
            os.makedirs(ckpt)
            # A checkpoint of the 2-layer GPT is about 1.2 MiB: 2 MiB holds one, not two.
            size = "2m" if kind == "full" else "16m"
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", ckpt],
                           check=True)
            port = self.next_port()
            try:
                if kind == "readonly":
                    rc0, out0, _, _ = self.run(
                        self.launch(2, self.train_program(trial_dir, stage, False, steps=2),
                                    self.next_port()), {})
                    if rc0 != 0:
                        raise SystemExit("disk case: the first run failed:\n" + out0[-3000:])
                    subprocess.run(["mount", "-o", "remount,ro", ckpt], check=True)
                t0 = time.time()
                rc, out, t_end, hung = self.run(
                    self.launch(2, self.train_program(trial_dir, stage, False, steps=6,
                                                      resume=kind == "readonly"), port), {})
                res = {"what": "%s, stage %d" % (kind, stage), "ok": True, "why": [],
                       "exit_s": t_end - t0, "left": [], "lost": 0}
                check_refused(res, rc, hung, out, r"No space left on device" if kind == "full"
                              else r"Read-only file system", ckpt)
                tag, whole = self.checkpoint_state(ckpt)
                if tag != "global_step2" or not whole:
                    res["lost"] = 1
                    res["why"].append("latest is %s (whole: %s), not global_step2" % (tag, whole))
                res["left"] = self.leftovers(trial_dir, port)
            finally:
                # Resume from a copy on a roomy disk: the checkpoint before the fault must load.
                saved = os.path.join(trial_dir, "saved")
                shutil.copytree(ckpt, saved)
                subprocess.run(["umount", ckpt], check=True)
            shutil.rmtree(ckpt)
            shutil.move(saved, ckpt)
            rc2, out2, _, _ = self.run(
                self.launch(2, self.train_program(trial_dir, stage, False, steps=4, resume=True),
                            self.next_port()), {})
            if rc2 != 0 or "resumed from %s/global_step2" % ckpt not in out2:
                res["lost"] = 1
                res["why"].append("resuming from global_step2 failed: " + out2[-1500:])
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("disk " + kind, t, res, out))
        return results

    def nvme_case(self, trials):
        """nvme_path on a small ext4 file system of its own (a loop device; tmpfs cannot do the
        direct I/O the swap needs), full or read-only when a run resumes with nvme offload: the
        run must stop with the file system's error and the swap folder named, the checkpoint it
        resumed from must stay whole, and once there is room again the resume must work."""
        need_root("the nvme case mounts a file system")
        results = []
        for t in range(trials):
            kind = ["full", "readonly"][t % 2]
            stage = [2, 3][(t // 2) % 2]
            trial_dir = tempfile.mkdtemp(prefix="nvme_%s_" % kind, dir=self.work)
            swap = os.path.join(trial_dir, "swap")
            ckpt = os.path.join(trial_dir, "ckpt")
            image = os.path.join(trial_dir, "swap.img")
            os.makedirs(swap)
            subprocess.run(["truncate", "-s", "32m", image], check=True)
            subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
            subprocess.run(["mount", "-o", "loop", image, swap], check=True)
            port = self.next_port()
            try:
                rc0, out0, _, _ = self.run(
                    self.launch(2, self.train_program(trial_dir, stage, True, steps=2),
                                self.next_port()), {})
                if rc0 != 0:
                    raise SystemExit("nvme case: the first run failed:\n" + out0[-3000:])
                if kind == "full":
                    # Leave 64 KiB free: less than any rank's swap file.
                    st = os.statvfs(swap)
                    free = st.f_bavail * st.f_frsize - 65536
                    subprocess.run(["fallocate", "-l", str(free), os.path.join(swap, "filler")],
                                   check=True)
                else:
                    subprocess.run(["mount", "-o", "remount,ro", swap], check=True)
                t0 = time.time()
                rc, out, t_end, hung = self.run(
                    self.launch(2, self.train_program(trial_dir, stage, True, steps=4,
                                                      resume=True), port), {})
                res = {"what": "%s, stage %d" % (kind, stage), "ok": True, "why": [],
                       "exit_s": t_end - t0, "left": [], "lost": 0}
                # dscpp checks the room the swap files need before it reserves them (and
                # reserves them whole, so a disk that fills later cannot fail a swap write).
                check_refused(res, rc, hung, out,
                              r"No space left on device|need .* which has [0-9.]+ MiB free"
                              if kind == "full" else r"Read-only file system", swap)
                # Room again: the checkpoint must still be whole and resume.
                if kind == "full":
                    os.unlink(os.path.join(swap, "filler"))
                else:
                    subprocess.run(["mount", "-o", "remount,rw", swap], check=True)
                tag, whole = self.checkpoint_state(ckpt)
                rc2, out2, _, _ = self.run(
                    self.launch(2, self.train_program(trial_dir, stage, True, steps=4,
                                                      resume=True), self.next_port()), {})
                if tag != "global_step2" or not whole or rc2 != 0 or \
                        "resumed from %s/global_step2" % ckpt not in out2:
                    res["lost"] = 1
                    res["why"].append("latest is %s (whole: %s); resuming from it: %s" %
                                      (tag, whole, out2[-1500:]))
                res["left"] = self.leftovers(trial_dir, port)
            finally:
                subprocess.run(["umount", swap], capture_output=True)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("nvme " + kind, t, res, out))
        return results

    def net_case(self, kind, trials):
        """Two hosts (network namespaces joined by a veth pair), Gloo over TCP between them.
        cut: the link goes down in the middle of training; every process must exit, with the
        collective that did not complete reported, within DSCPP_COMM_TIMEOUT + 10 s of the cut.
        no_master: MASTER_ADDR is an address whose packets are never answered; every process
        must exit, naming the master address (not its own for rank 0, or not reachable for the
        others), within DSCPP_RENDEZVOUS_TIMEOUT + 10 s of the start."""
        if self.net is None:
            self.net = NetPair()
        results = []
        for t in range(trials):
            stage = [0, 1, 2, 3][t % 4]
            slots = 1 if self.args.quick or t % 2 == 0 else 2
            trial_dir = tempfile.mkdtemp(prefix="net_%s_" % kind, dir=self.work)
            hostfile = os.path.join(trial_dir, "hostfile")
            self.net.hostfile(hostfile, slots)
            port = self.next_port()
            env = {"DSCPP_COMM_SHM": "off", "DSCPP_COMM_TIMEOUT": str(COMM_TIMEOUT_S),
                   "DSCPP_RENDEZVOUS_TIMEOUT": str(COMM_TIMEOUT_S)}
            fault = {}
            if kind == "cut":
                after = self.rng.randint(1, 4)  # the cut follows the line of this step ...
                delay = self.rng.uniform(0, 0.3)  # ... by this many seconds
                what = "stage %d, %d ranks on 2 hosts, link cut %.2f s after step %d" % (
                    stage, 2 * slots, delay, after)

                def watch(text, now):
                    if "t" in fault or len(re.findall(r"\] step +\d+/\d+ \| loss", text)) < after:
                        return
                    fault.setdefault("seen", now)
                    if now - fault["seen"] >= delay:
                        self.net.set_link(1, False)
                        fault["t"] = time.time()

                program = self.train_program(trial_dir, stage, False, steps=1000, print_every=1)
                master = self.net.addrs[0]
            else:
                what = "stage %d, %d ranks on 2 hosts, MASTER_ADDR %s" % (stage, 2 * slots,
                                                                          self.net.silent)
                watch = None
                program = self.train_program(trial_dir, stage, False)
                master = self.net.silent
                fault["t"] = time.time()
            try:
                rc, out, t_end, hung = self.run(
                    self.net.launch(self.dscpp, hostfile, master, port, program), env,
                    watch=watch)
            finally:
                if kind == "cut":
                    self.net.set_link(1, True)
            res = {"what": what, "ok": True, "why": [], "exit_s": None, "left": [], "lost": 0}
            check_ending(res, rc, hung, fault.get("t"), t_end, STALL_BOUND_S)
            if kind == "cut":
                expected = r"did not complete within %.1f s" % COMM_TIMEOUT_S
            else:
                # Rank 0 finds at once that MASTER_ADDR is not its own (the rendezvous listens
                # there only); a rank elsewhere that is faster to report names the master it
                # could not reach.
                expected = r"(could not reach the master at %s:%d after trying for|could not " \
                    r"start the rendezvous server on port %d \(MASTER_ADDR=%s\): MASTER_ADDR " \
                    r"is not an address of this host)" % (re.escape(self.net.silent), port, port,
                                                          re.escape(self.net.silent))
            if not re.search(expected, out):
                res["why"].append("no process reported /%s/" % expected)
            if not re.search(r"cause: rank \d+ on dscpp_f[12]_\d+ ", out):
                res["why"].append("the launcher's report names no rank and host as the cause")
            res["left"] = self.leftovers(trial_dir, port, self.net.hosts)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("network " + kind, t, res, out))
        return results

    def host_lost_case(self, trials):
        """Two network-namespace hosts, `dscpp launch --nnodes 1:2 --max_restarts 1`, `dscpp
        train --resume` with a checkpoint every 2 steps. After a random step, every process of
        one host (the first, rank 0's and the master's, in trials 0-1 of every 4, without
        --master_addr, so the first host's name is the master and the host left becomes it;
        the second in trials 2-3) is killed (SIGKILL to all of its namespace's processes, node agent
        included) and the host is gone: from then on the remote-command template exits 255 for
        it, as ssh does for a host it cannot reach (the namespace itself stays, for the next
        trial). The launcher must drop that host and start the job again on the first, which
        resumes from the last checkpoint at the smaller world size and finishes. Checked: the
        time from the kill to the first step done after the restart (within HOST_LOST_BOUND_S
        plus the checkpoint's load time), the lost steps reported, and the final weights
        byte-identical to resuming that checkpoint by hand on the first host alone."""
        if self.net is None:
            self.net = NetPair()
        results = []
        steps = 80  # long enough that the kill lands while the job trains
        for t in range(trials):
            stage = [0, 1, 2, 3][t % 4]
            slots = 1 if self.args.quick or t % 2 == 0 else 2
            trial_dir = tempfile.mkdtemp(prefix="host_lost_", dir=self.work)
            hostfile = os.path.join(trial_dir, "hostfile")
            self.net.hostfile(hostfile, slots)
            port = self.next_port()
            env = {"DSCPP_COMM_SHM": "off", "DSCPP_COMM_TIMEOUT": str(COMM_TIMEOUT_S),
                   "DSCPP_RENDEZVOUS_TIMEOUT": str(COMM_TIMEOUT_S)}
            after = self.rng.randint(3, 10)  # the kill follows the line of this step ...
            delay = self.rng.uniform(0, 0.3)  # ... by this many seconds
            lose = (t // 2) % 2  # the host killed: 0 is rank 0's (and the master's)
            gone, kept = self.net.hosts[lose], self.net.hosts[1 - lose]
            what = "stage %d, %d ranks on each of 2 hosts, %s killed %.2f s after step %d" % (
                stage, slots, "the first (the master's)" if lose == 0 else "the second", delay,
                after)
            fault = {}

            def watch(text, now):
                if "t" not in fault:
                    if len(re.findall(r"\] step +\d+/\d+ \| loss", text)) < after:
                        return
                    fault.setdefault("seen", now)
                    if now - fault["seen"] >= delay:
                        pids = subprocess.run(["ip", "netns", "pids", gone],
                                              capture_output=True, text=True).stdout.split()
                        open(os.path.join(trial_dir, "gone_" + gone), "w").close()
                        fault["t"] = time.time()
                        for pid in pids:
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                elif "again" not in fault:
                    at = text.find("starting it again")
                    if at >= 0 and re.search(r"\] step +\d+/\d+ \| loss", text[at:]):
                        fault["again"] = now

            program = self.train_program(trial_dir, stage, False, steps=steps, resume=True,
                                         print_every=1)
            argv = self.net.launch(self.dscpp, hostfile, self.net.addrs[0], port, program)
            if lose == 0:  # the master is the first host's name, so it can move
                at = argv.index("--master_addr")
                del argv[at:at + 2]
            # A host that is gone answers nothing: its template exits 255, as ssh would.
            argv[argv.index("--remote_cmd") + 1] = \
                "sh -c 'test -e %s/gone_{host} && exit 255; exec ip netns exec {host} \"$@\"' " \
                "agent {command}" % trial_dir
            at = len(argv) - len(program)
            argv[at:at] = ["--nnodes", "1:2", "--max_restarts", "1"]
            rc, out, t_end, hung = self.run(argv, env, watch=watch)
            res = {"what": what, "ok": True, "why": [], "exit_s": None, "left": [], "lost": 0}
            if hung or rc != 0:
                res["why"].append("the job did not finish (exit %s%s)" % (rc, ", hung" if hung
                                                                          else ""))
            if "t" not in fault:
                res["why"].append("the fault did not fire")
            if not re.search(r"host %s \(ranks? [\d-]+\) is lost: (its node agent was killed|a "
                             r"probe of it, .* exited with status 255)" %
                             re.escape(gone), out):
                res["why"].append("the launcher did not report %s lost" % gone)
            resumed = re.search(r"resumed from (\S+) at step (\d+)(; steps \d+\.\.\d+ are "
                                r"trained again: (\d+) step\(s\))?", out)
            load = re.search(r"loaded checkpoint .* in ([\d.]+) s", out)
            if not resumed:
                res["why"].append("the restart did not resume from a checkpoint")
            elif "again" in fault and "t" in fault:
                res["exit_s"] = fault["again"] - fault["t"]
                bound = HOST_LOST_BOUND_S + (float(load.group(1)) if load else 0)
                if res["exit_s"] > bound:
                    res["why"].append("training went on %.1f s after the host died (bound "
                                      "%.1f s)" % (res["exit_s"], bound))
                res["lost"] = 0  # steps trained again are expected; the table counts damage
                what += "; %s step(s) trained again" % (resumed.group(4) or "0")
            elif "t" in fault:
                res["why"].append("no step was done after the restart")
            if resumed and rc == 0 and not hung:
                # The same checkpoint resumed by hand on the host left alone must end the same.
                hand = os.path.join(trial_dir, "hand")
                tag = os.path.basename(resumed.group(1).rstrip("/"))
                os.makedirs(os.path.join(hand, "ckpt"))
                shutil.copytree(resumed.group(1), os.path.join(hand, "ckpt", tag))
                with open(os.path.join(hand, "ckpt", "latest"), "w") as f:
                    f.write(tag + "\n")
                one = os.path.join(hand, "hostfile")
                with open(one, "w") as f:
                    f.write("%s slots=%d\n" % (kept, slots))
                by_hand = self.train_program(hand, stage, False, steps=steps, resume=True)
                rc2, out2, _, hung2 = self.run(self.net.launch(
                    self.dscpp, one, self.net.addrs[1 - lose], self.next_port(), by_hand), env)
                if rc2 != 0 or hung2:
                    res["why"].append("resuming by hand failed: " + out2[-500:])
                elif self.final_weights(os.path.join(hand, "ckpt")) != \
                        self.final_weights(os.path.join(trial_dir, "ckpt")):
                    res["why"].append("the final weights differ from resuming %s by hand" % tag)
            res["left"] = self.leftovers(trial_dir, port, self.net.hosts)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            res["what"] = what
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("net_host_lost", t, res, out))
        return results

    def final_weights(self, save_dir):
        """(the tag `latest` names, a digest of every tensor of its rank files but the random
        generators' states): the weights and optimizer states. The global CPU generator is
        seeded at random in every process (libtorch 2.x), so its saved state differs between
        two launches of the same job."""
        tag = open(os.path.join(save_dir, "latest")).read().strip()
        h = hashlib.sha256()
        for path in sorted(glob.glob(os.path.join(save_dir, tag, "*.safetensors"))):
            with open(path, "rb") as f:
                data = f.read()
            n = int.from_bytes(data[:8], "little")
            header = json.loads(data[8:8 + n])
            for name in sorted(k for k in header if k != "__metadata__"):
                if name.startswith("rng/"):
                    continue
                begin, end = header[name]["data_offsets"]
                h.update(name.encode() + b"\0" + data[8 + n + begin:8 + n + end])
        return tag, h.hexdigest()

    def stranger_case(self, trials):
        """Processes without the job's secret connect to the master port at random moments
        of a 2-rank job: some send garbage, some the right greeting with a wrong proof, some
        say nothing and hold the connection, some connect and leave. The job must finish with
        the weights of the same job run alone, within STRANGER_DELAY_S of its time, and rank 0
        must log the strangers with their address."""
        results = []
        alone = {}  # stage -> (seconds, final tag and weights) of the job run without strangers
        for t in range(trials):
            stage = [0, 1, 2, 3][t % 4]
            if stage not in alone:
                trial_dir = tempfile.mkdtemp(prefix="alone_", dir=self.work)
                t0 = time.time()
                rc, out, _, hung = self.run(self.launch(2, self.train_program(
                    trial_dir, stage, False, steps=40), self.next_port()), {})
                if rc != 0 or hung:
                    raise SystemExit("stranger: the job alone failed (stage %d):\n%s" %
                                     (stage, out[-3000:]))
                alone[stage] = (time.time() - t0, self.final_weights(
                    os.path.join(trial_dir, "ckpt")))
                shutil.rmtree(trial_dir)
            trial_dir = tempfile.mkdtemp(prefix="stranger_", dir=self.work)
            port = self.next_port()
            stop = threading.Event()
            tried = {"garbage": 0, "wrong proof": 0, "silent": 0, "scan": 0}
            rng = random.Random(self.rng.random())

            def strangers():
                held = []
                while not stop.is_set():
                    kind = rng.choice(sorted(tried))
                    try:
                        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                    except OSError:
                        time.sleep(0.05)  # rank 0 is not listening yet
                        continue
                    tried[kind] += 1
                    try:
                        if kind == "garbage":
                            sock.sendall(bytes(rng.getrandbits(8) for _ in range(
                                rng.randint(1, 200))))
                        elif kind == "wrong proof":
                            sock.recv(41)
                            sock.sendall(b"DSCPP-C1" + bytes(rng.getrandbits(8)
                                                             for _ in range(64)))
                    except OSError:
                        pass
                    if kind == "silent":
                        held.append(sock)
                    else:
                        sock.close()
                    time.sleep(rng.uniform(0, 0.3))
                for sock in held:
                    sock.close()

            thread = threading.Thread(target=strangers, daemon=True)
            thread.start()
            t0 = time.time()
            try:
                rc, out, t_end, hung = self.run(self.launch(2, self.train_program(
                    trial_dir, stage, False, steps=40), port), {})
            finally:
                stop.set()
                thread.join()
            what = "stage %d, 2 ranks, %s" % (stage, ", ".join(
                "%d %s" % (n, k) for k, n in sorted(tried.items())))
            res = {"what": what, "ok": True, "why": [], "exit_s": None, "left": [], "lost": 0}
            if hung or rc != 0:
                res["why"].append("the job failed (exit %s%s)" % (rc, ", hung" if hung else ""))
            else:
                res["exit_s"] = (t_end - t0) - alone[stage][0]
                if res["exit_s"] > STRANGER_DELAY_S:
                    res["why"].append("the job took %.1f s longer than alone (bound %.0f s)" %
                                      (res["exit_s"], STRANGER_DELAY_S))
                if self.final_weights(os.path.join(trial_dir, "ckpt")) != alone[stage][1]:
                    res["why"].append("the final checkpoint differs from the job run alone")
            if sum(tried.values()) and not re.search(
                    r"rendezvous: refused a connection from 127\.0\.0\.1:\d+", out):
                res["why"].append("rank 0 logged no refused stranger")
            res["left"] = self.leftovers(trial_dir, port)
            if res["left"]:
                res["why"].append("left behind: " + "; ".join(res["left"]))
            shutil.rmtree(trial_dir, ignore_errors=True)
            results.append(self.finish("stranger", t, res, out))
        return results

    def sanitized_parsers(self):
        """tests/faults/sanitize_parsers.sh's programs (built once, into the build folder)."""
        out = os.path.join(self.build, "sanitize")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sanitize_parsers.sh")
        r = subprocess.run([script, out], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("building the parsers under the sanitizers failed:\n" +
                             (r.stdout + r.stderr)[-3000:])
        return os.path.join(out, "parsers_replay"), os.path.join(out, "parsers_fuzzer")

    def parser_run(self, case, argv, count_re, note):
        """Runs a sanitized parser program; one result standing for the inputs it parsed."""
        t0 = time.time()
        rc, out, _, hung = self.run(argv, {"ASAN_OPTIONS": "detect_leaks=1",
                                           "UBSAN_OPTIONS": "print_stacktrace=1"},
                                    limit=JOB_LIMIT_S * 10)
        m = re.search(count_re, out)
        res = {"what": note, "ok": rc == 0 and not hung and m is not None, "why": [],
               "exit_s": None, "left": [], "lost": 0, "count": int(m.group(1)) if m else 0}
        if not res["ok"]:
            res["why"].append("exit status %s%s after %.0f s" % (rc, " (hung)" if hung else "",
                                                                time.time() - t0))
        return [self.finish(case, 0, res, out)]

    def fuzz_configs_case(self):
        """Configs from ConfigFuzz's seeded generator through Config::parse, resolve_batch and
        describe, under ASan and UBSan: only a Config or a ConfigError may come out."""
        replay, _ = self.sanitized_parsers()
        n = 2000 if self.args.quick else 100000
        return self.parser_run("config fuzz", [replay, "--configs", str(n), "--seed",
                                               str(self.args.seed)],
                               r"parsers_replay: (\d+) generated configs", "%d configs" % n)

    def libfuzzer_case(self):
        """libFuzzer over the config, checkpoint-manifest and safetensors-header parsers under
        ASan and UBSan, from seeds of each (a real manifest of a 2-rank run): any crash, hang
        (10 s), leak or undefined behaviour fails, with the input kept in the output."""
        replay, fuzzer = self.sanitized_parsers()
        corpus = tempfile.mkdtemp(prefix="corpus_", dir=self.work)
        r = subprocess.run([replay, "--write_seeds", corpus], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("parsers_replay --write_seeds failed:\n" + r.stdout + r.stderr)
        ckpt = os.path.join(self.clean_checkpoints(self.args.seed), "ckpt", "global_step2")
        with open(os.path.join(ckpt, "manifest.json"), "rb") as f:
            manifest = f.read()
        with open(os.path.join(corpus, "manifest"), "wb") as f:
            f.write(b"\x01" + manifest)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "examples", "ds_config.json"), "rb") as f:
            example = f.read()
        with open(os.path.join(corpus, "example_config"), "wb") as f:
            f.write(b"\x00" + example)
        budget = ["-runs=20000"] if self.args.quick else ["-max_total_time=300"]
        return self.parser_run(
            "libFuzzer", [fuzzer, corpus, "-seed=%d" % self.args.seed, "-timeout=10",
                          "-rss_limit_mb=2048", "-print_final_stats=1"] + budget,
            r"Done (\d+) runs in", "libFuzzer " + " ".join(budget))

    def trainer_draw(self, t, first_step):
        """Trial t's stage (0-3 in turn), world size, faulty rank and step (first_step..4)."""
        world = 2 if self.args.quick else [2, 3, 4][t % 3]
        return t % 4, world, self.rng.randrange(world), self.rng.randrange(first_step, 5)

    def finish(self, case, t, res, out):
        if self.args.show:
            print("--- %s, trial %d (%s): output ---\n%s" % (case, t, res["what"], out[-3000:]))
        res["ok"] = not res["why"]
        if not res["ok"]:
            self.failures.append((case, t, "; ".join(res["why"]), out[-3000:]))
        return res

    def api_case(self, mode, debug_sync, tcp, trials):
        """Misuse through the engine API on one rank: a skipped micro-step, or a model of another
        size or dtype. The job must fail with the rank or the cause named, within the bound of
        the whole job's wall time; a model that differs must stop every rank before training."""
        results = []
        for t in range(trials):
            stage, world, rank, step = self.trainer_draw(t, first_step=0)
            env = {"DSCPP_COMM_TIMEOUT": str(COMM_TIMEOUT_S)}
            if debug_sync:
                env["DSCPP_DEBUG_SYNC"] = "1"
            if tcp:
                env["DSCPP_COMM_SHM"] = "off"
            res, out = self.trainer_trial("api", t, mode, stage, world, rank, step, env)
            if res["rc"] == 0:
                res["why"].append("the job exited 0")
            if mode != "skip" and "done, skipped_steps" in out:
                res["why"].append("a rank trained")
            # skip: the rank one micro-step behind is named, whichever way it shows: it exited
            # while another waited, it is behind, it entered another collective, or it did not
            # answer.
            expected = {"skip": r"rank %d \(pid \d+\) exited while|rank %d is behind|rank %d "
                                r"entered|rank\(s\) ([0-9,]*,)?%d(,[0-9,]*)? did not answer"
                                % (rank, rank, rank, rank),
                        "save": r"collective mismatch|entered different operations|"
                                r"rank %d is behind|rank\(s\) ([0-9,]*,)?%d"
                                r"(,[0-9,]*)? did not answer|rank %d \(pid \d+\) exited while"
                                % (rank, rank, rank),
                        "wider": r"differs across ranks",
                        "double": r"differs across ranks"}[mode]
            if not re.search(expected, out):
                res["why"].append("the cause is not named (expected /%s/)" % expected)
            if res["exit_s"] > API_BOUND_S:
                res["why"].append("the job took %.1f s (bound %.0f s)" % (res["exit_s"],
                                                                         API_BOUND_S))
            results.append(self.finish("API " + mode, t, res, out))
        return results

    def nan_case(self, fp16, trials):
        """A rank's gradient turns NaN while its loss stays finite. fp16: the step is skipped on
        every rank, the loss scale halves, training goes on. fp32: every rank stops, naming the
        step, the rank and the first parameter, with nothing applied."""
        results = []
        for t in range(trials):
            stage, world, rank, step = self.trainer_draw(t, first_step=1)
            res, out = self.trainer_trial("nan", t, "nan", stage, world, rank, step, {},
                                          fp16=fp16)
            if fp16:
                if res["rc"] != 0:
                    res["why"].append("the job failed")
                done = re.findall(r"rank \d+: done, skipped_steps (\d+)", out)
                if len(done) != world or any(int(k) < 1 for k in done):
                    res["why"].append("not every rank finished with the step skipped")
                scales = {int(m.group(1)): float(m.group(2)) for m in
                          re.finditer(r"step (\d+) loss \S+ scale (\S+) skipped", out)}
                if scales.get(step + 1) != 2 * scales.get(step + 2, -1):
                    res["why"].append("the loss scale did not halve after step %d" % (step + 1))
            else:
                if res["rc"] == 0 or "done, skipped_steps" in out:
                    res["why"].append("a rank went on training")
                if not re.search(r"gradient norm is nan at optimizer step %d although every "
                                 r"loss was finite; the gradients were non-finite before "
                                 r"averaging on rank %d \(first in 'w2'\)" % (step + 1, rank), out):
                    res["why"].append("the error does not name step %d, rank %d and 'w2'" %
                                      (step + 1, rank))
            results.append(self.finish("NaN " + ("fp16" if fp16 else "fp32"), t, res, out))
        return results

    # ----------------------------------------------------------------------------------------

    def record(self, case, bound, results, note=""):
        exits = [r["exit_s"] for r in results if r["exit_s"] is not None]
        # A result stands for r["count"] trials where it has one (the parser runs).
        row = {"case": case, "trials": sum(r.get("count", 1) for r in results),
               "within": sum(r.get("count", 1) for r in results if r["ok"]),
               "worst_s": max(exits) if exits else None, "bound": bound,
               "left": sum(len(r["left"]) for r in results),
               "lost": sum(r["lost"] for r in results), "note": note}
        self.rows.append(row)
        worst = "%.1f s" % row["worst_s"] if row["worst_s"] is not None else "-"
        print("%-28s %3d/%-3d passed  worst exit %-7s left %d  lost %d" %
              (case, row["within"], row["trials"], worst, row["left"], row["lost"]), flush=True)

    def run_all(self):
        trials = self.args.trials or (2 if self.args.quick else 20)
        # The user-program cases are deterministic apart from the rank and step drawn: one trial
        # each in the quick mode.
        api_trials = self.args.trials or (1 if self.args.quick else 20)
        cases = self.args.cases.split(",") if self.args.cases else ALL_CASES
        skip = self.args.skip.split(",") if self.args.skip else []
        for case in cases + skip:
            if case not in ALL_CASES:
                raise SystemExit("unknown case '%s' (cases: %s)" % (case, ",".join(ALL_CASES)))
        for case in [c for c in cases if c not in skip]:
            title, bound = case_title(case)
            # A stream per case: its trials do not depend on which cases ran before it.
            self.rng = random.Random("%d/%s" % (self.args.seed, case))
            if case == "kill_save_background":
                results = self.kill_case("save", trials, background=True)
            elif case.startswith("kill_"):
                results = self.kill_case(case[len("kill_"):], trials)
            elif case == "nvme":
                n = trials if self.args.trials or not self.args.quick else 2
                results = self.nvme_case(n)
            elif case == "eio":
                results = self.kill_case("io", trials, action="eio")
            elif case == "stop":
                results = self.stop_case(trials)
            elif case.startswith("nan_"):
                results = self.nan_case(case == "nan_fp16", api_trials)
            elif case == "fuzz_configs":
                results = self.fuzz_configs_case()
            elif case == "libfuzzer":
                results = self.libfuzzer_case()
            elif case == "net_host_lost":  # one trial in the quick mode, as the issue asks
                results = self.host_lost_case(api_trials)
            elif case == "stranger":
                results = self.stranger_case(api_trials)
            elif case.startswith("net_"):
                results = self.net_case(case[len("net_"):], trials)
            elif case in ("corrupt", "disk"):
                n = trials if self.args.trials or not self.args.quick else 2
                results = self.corrupt_case(n) if case == "corrupt" else self.disk_case(n)
            else:
                results = self.api_case(case.split("_")[0], case.endswith("_debug"),
                                        "_tcp" in case, api_trials)
            self.record(title, bound, results)
        # Leaks over the whole suite: anything of any trial still running, or a segment the
        # per-trial checks missed.
        stray = subprocess.run(["pgrep", "-f", self.work], capture_output=True,
                               text=True).stdout.split()
        shm = self.new_shm_segments()
        if stray or shm:
            self.failures.append(("the whole suite", 0, "left behind: processes %s, shared "
                                  "memory %s" % (stray, sorted(shm)), ""))
        print("%d jobs run, %d of them failing jobs; after all of them: %d processes and %d "
              "shared-memory segments left" % (self.jobs, self.failing_jobs, len(stray),
                                                len(shm)))
        for case, t, why, tail in self.failures:
            print("\nFAILED %s, trial %d: %s\n--- last output ---\n%s" % (case, t, why, tail))
        shutil.rmtree(self.work, ignore_errors=True)
        return 0 if not self.failures else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the build folder (dscpp, fault_trainer)")
    ap.add_argument("--quick", action="store_true",
                    help="2 trials per kill/stop case, 1 per user-program case, 2 ranks (CI)")
    ap.add_argument("--trials", type=int, default=0, help="trials per case (default 20)")
    ap.add_argument("--cases", default="", help="comma-separated cases (default: all)")
    ap.add_argument("--except", dest="skip", default="",
                    help="comma-separated cases to leave out of the others")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--show", action="store_true",
                    help="print the end of every trial's output (of the cases that keep it)")
    ap.add_argument("--report", default="", help="write the table (markdown) here")
    args = ap.parse_args()
    print("fault suite: seed %d%s" % (args.seed, " (quick)" if args.quick else ""), flush=True)
    suite = Suite(args)
    try:
        rc = suite.run_all()
    finally:
        if suite.net:
            suite.net.close()
    if args.report:
        write_report(args, suite)
    sys.exit(rc)


# What had to change in dscpp for each case to pass, for the report.
FIXES = {
    "SIGKILL at backward": "a rank seen to exit in a shared-memory collective no longer makes the "
                           "report wait 5 s for its answer (0.7 s instead of 5.5 s)",
    "SIGKILL at save": "an atomic write clears the temporary files killed writers of the same "
                       "path left (they piled up in checkpoint folders)",
    "SIGKILL at offload_io": "(suite) a kill in the reads a save streams from the swap file "
                             "leaves a partial file too: the suite resumes after any trial that "
                             "left one, and the resumed run's save clears it",
    "SIGSTOP > timeout": "the sync report no longer blocks in the store when rank 0 is stopped "
                         "(the job hung until killed); the launcher sends SIGCONT after SIGTERM",
    "EIO writing a checkpoint or the swap": "a stage-3 rank whose backward failed on a swap read "
                                            "reported the collective mismatch that followed "
                                            "instead of the I/O error; it now throws its own "
                                            "error (1 of 20 before)",
    "network cut between 2 hosts": "the sync report names a network that cannot be reached as "
                                   "a reason a rank does not answer",
    "MASTER_ADDR never answers": "rank 0 blamed a port in use; it now says MASTER_ADDR is not "
                                 "an address of its host (the rendezvous listens there only)",
}


def write_report(args, suite):
    """Rewrites the rows of the cases this run had in the table between the markers of
    args.report, keeping the other rows (each row says the seed that reproduces it)."""
    begin, end = "<!-- fault suite: begin -->", "<!-- fault suite: end -->"
    text = open(args.report).read() if os.path.exists(args.report) else "%s\n%s\n" % (begin, end)
    if begin not in text or end not in text:
        raise SystemExit("%s has no '%s' ... '%s' markers" % (args.report, begin, end))
    old = text[text.index(begin) + len(begin):text.index(end)]
    rows = {}
    for line in old.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 9 and cells[0] != "case":
            rows[cells[0]] = line
    day = time.strftime("%Y-%m-%d")
    for r in suite.rows:
        worst = "%.1f s" % r["worst_s"] if r["worst_s"] is not None else "-"
        rows[r["case"]] = "| %s | %s | %d | %d | %s | %d | %d | %s, %s | %s |" % (
            r["case"], r["bound"], r["trials"], r["within"], worst, r["left"], r["lost"],
            "%d (--cases %s)" % (args.seed, CASE_KEY.get(r["case"], "?")), day,
            FIXES.get(r["case"], ""))
    order = [c for c in CASE_ORDER if c in rows] + sorted(c for c in rows if c not in CASE_ORDER)
    lines = [
        "Rows written by `scripts/fault_suite.sh` (`tests/faults/fault_suite.py --report`), each "
        "by the run its seed cell names: `scripts/fault_suite.sh --seed S --cases CASE` with the "
        "seed and case it names draws the same trials again (each case has a random stream of "
        "its own). Rows dated "
        "2026-12-02 were drawn from one stream over the whole run: they reproduce with the "
        "suite of commit d67e66d and the `--cases` they name. Each trial is a real `dscpp "
        "launch` job of 2-4 processes on this 2-core machine.",
        "",
        "| case | bound | trials | passed | worst time to exit | left behind | checkpoints lost "
        "| seed, date | fixed to get there |",
        "|---|---|---|---|---|---|---|---|---|",
    ] + [rows[c] for c in order]
    text = text[:text.index(begin) + len(begin)] + "\n" + "\n".join(lines) + "\n" + \
        text[text.index(end):]
    with open(args.report, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
