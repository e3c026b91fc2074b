#!/usr/bin/env python3
"""A throwaway single-node SLURM on this machine, to run the workflow's SLURM profile for real.

What the SLURM test (tests/test_slurm.py) runs against, and a way to try ``profiles/slurm``
without a cluster::

    sudo python tests/slurm_local.py start /tmp/slurm   # prints the L1_SLURM_* settings
    sudo python tests/slurm_local.py stop /tmp/slurm
    sudo python tests/slurm_local.py install /tmp/slurm # only the packages (CI, ahead of the test)

As root it installs what is missing from Debian's packages (``slurm-wlm``, ``slurmdbd``,
``munge``, ``mariadb-server``; services are not started by the packages), then starts:

* ``munged`` (unless one runs already), with the key the package made;
* a private MariaDB (data, socket and log in the work folder, TCP on 127.0.0.1) and
  ``slurmdbd`` on it, so ``sacct`` lists every job as on a real cluster;
* ``slurmctld`` and one ``slurmd`` whose node has this machine's CPUs and memory as
  ``slurmd -C`` reports them, in two partitions over that node, ``cpu`` (default) and ``gpu``,
  and ``gpu:fake`` GRES backed by character devices such as /dev/null (one per CPU, at most
  four), so jobs asking for ``--gpus=fake:1 --cpus-per-gpu=N`` are scheduled as on a GPU
  node; nothing is a real GPU (the demo runs its check and time jobs on the CPU backend).

The node's ``slurmd`` runs in its own PID and UTS namespaces (``unshare``; hostname
``l1node``) where the machine allows it, so jobs run as on another host: they see neither the
submitting processes in /proc nor the submit host's name.

Configuration goes to /etc/slurm (the plugin's job steps drop ``SLURM_CONF``, so the default
place is the only one every command finds); a slurm.conf that this module did not write is
never replaced. ``stop`` shuts the daemons down and removes those files; state, logs and
the database stay in the work folder. Ports are picked free at start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONF_DIR = Path("/etc/slurm")
#: First line of every file this module writes (how a stale one of ours is recognised).
MARKER = "# written by tests/slurm_local.py (a throwaway single-node test cluster); work folder: "
PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server")
#: Commands the cluster needs, by the package that brings them.
COMMANDS = {
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sbatch": "slurm-wlm",
    "sacct": "slurm-wlm",
    "sacctmgr": "slurm-wlm",
    "slurmdbd": "slurmdbd",
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
}
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
CLUSTER = "l1bench"
NODE = "l1node"
PARTITIONS = ("cpu", "gpu")
GPU_TYPE = "fake"
#: Character devices that stand in for GPUs (GRES needs a device file per unit).
FAKE_GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")
DB_USER, DB_PASSWORD = "slurm", "slurm"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be set up here; the message is one line saying why."""


# ------------------------------------------------------------------------ configuration


def parse_slurmd_c(text: str) -> dict[str, str]:
    """The hardware line of ``slurmd -C`` ("NodeName=vm CPUs=2 ... RealMemory=24105") as a dict."""
    for line in text.splitlines():
        if line.startswith("NodeName="):
            return dict(item.split("=", 1) for item in line.split() if "=" in item)
    raise SlurmUnavailable(f"slurmd -C printed no NodeName= line: {text.strip()[:200]!r}")


def fake_gpu_count(cpus: int, files=FAKE_GPU_FILES) -> int:
    """Fake GPUs of the node: one per CPU (GPU jobs of one CPU each fill it), at most one per
    device file that exists."""
    return max(1, min(cpus, sum(1 for f in files if Path(f).exists())))


def node_line(hardware: dict[str, str], gpus: int, name: str = NODE) -> str:
    """slurm.conf's NodeName line: the hardware ``slurmd -C`` found, under ``name``, with
    ``gpus`` fake GPUs."""
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    hw = " ".join(f"{k}={hardware[k]}" for k in keys if k in hardware)
    return f"NodeName={name} NodeAddr=127.0.0.1 {hw} Gres=gpu:{GPU_TYPE}:{gpus} State=UNKNOWN"


@dataclass
class Layout:
    """Where a cluster keeps its files and which ports it listens on."""

    workdir: Path
    controller: str  # short hostname of this machine (slurmctld checks it)
    node: str = NODE
    ports: dict[str, int] = field(default_factory=dict)  # slurmctld, slurmd, slurmdbd, mysql

    def path(self, name: str) -> Path:
        return Path(self.workdir) / name


def slurm_conf(lay: Layout, hardware: dict[str, str], gpus: int) -> str:
    """slurm.conf of the single-node cluster."""
    w = lay.path
    lines = [
        f"{MARKER}{lay.workdir}",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={lay.controller}(127.0.0.1)",
        f"SlurmctldPort={lay.ports['slurmctld']}",
        f"SlurmdPort={lay.ports['slurmd']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # a requeued (preempted) job may start again after cred_expire seconds (default 120)
        "AuthInfo=cred_expire=5",
        "CredType=cred/munge",
        f"StateSaveLocation={w('state')}",
        f"SlurmdSpoolDir={w('spool')}",
        f"SlurmctldPidFile={w('slurmctld.pid')}",
        f"SlurmdPidFile={w('slurmd.pid')}",
        f"SlurmctldLogFile={w('log/slurmctld.log')}",
        f"SlurmdLogFile={w('log/slurmd.log')}",
        "MailProg=/bin/true",
        # no cgroups (containers rarely allow them): processes are tracked through their
        # parents, so scancel ends every process of a job, also those in other process groups
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=1000",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "MpiDefault=none",
        "KillWait=5",
        # what sacct reads: slurmdbd on a private MariaDB; GPUs and the plugin's comment
        # (rule and wildcards of each job) are recorded
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={lay.ports['slurmdbd']}",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStoreFlags=job_comment",
        "JobAcctGatherType=jobacct_gather/none",
        "GresTypes=gpu",
        node_line(hardware, gpus, lay.node),
        f"PartitionName={PARTITIONS[0]} Nodes={lay.node} Default=YES MaxTime=INFINITE State=UP",
        f"PartitionName={PARTITIONS[1]} Nodes={lay.node} MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(lay: Layout, gpus: int, files=FAKE_GPU_FILES) -> str:
    existing = [f for f in files if Path(f).exists()][:gpus]
    lines = [f"{MARKER}{lay.workdir}"]
    lines += [f"NodeName={lay.node} Name=gpu Type={GPU_TYPE} File={f}" for f in existing]
    return "\n".join(lines) + "\n"


def slurmdbd_conf(lay: Layout) -> str:
    w = lay.path
    return "\n".join([
        f"{MARKER}{lay.workdir}",
        "AuthType=auth/munge",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={lay.ports['slurmdbd']}",
        "SlurmUser=root",
        f"PidFile={w('slurmdbd.pid')}",
        f"LogFile={w('log/slurmdbd.log')}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={lay.ports['mysql']}",
        f"StorageUser={DB_USER}",
        f"StoragePass={DB_PASSWORD}",
        "StorageLoc=slurm_acct_db",
    ]) + "\n"


def written_by_us(path: Path) -> Path | None:
    """The work folder named in a config file this module wrote; None for anyone else's."""
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return Path(first[len(MARKER):]) if first.startswith(MARKER) else None


# ------------------------------------------------------------------------- processes


def which(cmd: str) -> str | None:
    return shutil.which(cmd) or shutil.which(cmd, path=os.pathsep.join(SBIN))


def _run(cmd, timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str, step: float = 0.5):
    """Poll ``check()`` until it returns a true value; SlurmUnavailable naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"{what} (waited {timeout:.0f} s)")
        time.sleep(step)


def missing_commands() -> list[str]:
    return [cmd for cmd in COMMANDS if not which(cmd)]


def install_packages(log: Path) -> None:
    """apt-get install what is missing (as root), without starting the packages' services."""
    missing = missing_commands()
    if not missing:
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"not root, and {', '.join(missing)} not installed")
    if not which("apt-get"):
        raise SlurmUnavailable(f"no apt-get to install {', '.join(missing)}")
    packages = sorted({COMMANDS[c] for c in missing})
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # policy-rc.d 101: the packages' services (mariadb, munge, slurm) are not started
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        with open(log, "a") as fh:
            for cmd in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
                proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=900, check=False)
                if proc.returncode:
                    raise SlurmUnavailable(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}; see {log})")
    except (OSError, subprocess.SubprocessError) as err:
        raise SlurmUnavailable(f"apt-get failed: {err}") from None
    finally:
        if ours:
            policy.unlink(missing_ok=True)
    still = missing_commands()
    if still:
        raise SlurmUnavailable(f"{', '.join(still)} still missing after apt-get install {' '.join(packages)}")


def munge_works() -> bool:
    try:
        cred = _run([which("munge") or "munge", "-n"], timeout=10)
        if cred.returncode:
            return False
        return _run([which("unmunge") or "unmunge"], input=cred.stdout, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def namespaces_work() -> bool:
    """Whether ``unshare`` can give a process its own PID and UTS namespaces here."""
    if not which("unshare"):
        return False
    try:
        cmd = ["unshare", "--pid", "--uts", "--fork", "--mount-proc", "sh", "-c", f"hostname {NODE} && echo $$"]
        proc = _run(cmd, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "1"


@dataclass
class Cluster:
    """A running single-node cluster (what :func:`start` returns; :meth:`stop` ends it)."""

    workdir: Path
    node: str
    cpus: int
    memory_mb: int
    gpus: int
    separate_node: bool  # slurmd in its own PID/UTS namespaces ("another host")
    pids: dict[str, int] = field(default_factory=dict)  # daemons this module started
    conf_files: list[str] = field(default_factory=list)

    @property
    def cpu_partition(self) -> str:
        return PARTITIONS[0]

    @property
    def gpu_partition(self) -> str:
        return PARTITIONS[1]

    def profile_env(self, mem_mb: int = 1500) -> dict[str, str]:
        """L1_SLURM_* settings of profiles/slurm for this cluster: its partitions, one fake GPU
        and one CPU per check/time job, one CPU per build (a node this small runs as many jobs
        at once as it has CPUs, as the local demo does)."""
        return {
            "L1_SLURM_CPU_PARTITION": self.cpu_partition,
            "L1_SLURM_GPU_PARTITION": self.gpu_partition,
            "L1_SLURM_GPU_MODEL": GPU_TYPE,
            "L1_SLURM_GPUS": "1",
            "L1_SLURM_CPUS_PER_GPU": "1",
            "L1_SLURM_CPUS": "1",
            "L1_SLURM_GPU_MEM_MB": str(mem_mb),
            "L1_SLURM_CPU_MEM_MB": str(mem_mb),
        }

    def sacct(self, fields=("JobIDRaw", "JobName", "Partition", "State", "ExitCode", "AllocTRES", "Comment"),
              jobs: str | None = None, all_records: bool = False) -> list[dict[str, str]]:
        """sacct's job records (allocations, not steps) as dicts; ``all_records`` adds the
        earlier runs of requeued jobs (``--duplicates``)."""
        cmd = ["sacct", "-X", "-n", "--parsable2", "--starttime", "2000-01-01",
               "--format=" + ",".join(f"{f}%-300" for f in fields)]
        if jobs:
            cmd += ["-j", jobs]
        if all_records:
            cmd.append("--duplicates")
        out = _run(cmd, timeout=60)
        if out.returncode:
            raise SlurmUnavailable(f"sacct failed: {_last_line(out.stderr)}")
        return [dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines() if line.strip()]

    def sacct_lines(self, fmt="JobIDRaw,Partition%9,State%12,ExitCode,Start,End,AllocTRES%45,Comment%60",
                    duplicates: bool = False) -> str:
        """sacct's table of every job (as a person reads it); ``duplicates``: with the earlier
        runs of requeued jobs."""
        cmd = ["sacct", "-X", "--starttime", "2000-01-01", f"--format={fmt}"] + (["--duplicates"] if duplicates else [])
        return _run(cmd, timeout=60).stdout

    def stop(self) -> None:
        """Shut the daemons down (those this module started) and remove its config files."""
        for cmd in (["scancel", "--full", "--user", "root"], ["scontrol", "shutdown"]):
            if which(cmd[0]) and written_by_us(CONF_DIR / "slurm.conf") == Path(self.workdir):
                try:
                    _run([which(cmd[0]), *cmd[1:]], timeout=30)
                except (OSError, subprocess.SubprocessError):
                    pass
        order = ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged")
        for name in order:
            pid = self.pids.get(name)
            if pid:
                _stop_pid(pid)
        for path in self.conf_files:
            if written_by_us(Path(path)) is not None:
                Path(path).unlink(missing_ok=True)
        state = Path(self.workdir) / "cluster.json"
        state.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _reap(pid: int) -> None:
    """Collect a child that has exited (none of ours is left a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child, or already collected
        pass


def _stop_pid(pid: int, wait: float = 15.0) -> None:
    """SIGTERM, then SIGKILL, one process this module started (by its id)."""
    import signal

    for sig, grace in ((signal.SIGTERM, wait), (signal.SIGKILL, 5.0)):
        _reap(pid)
        if not _alive(pid):
            break
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            _reap(pid)
            if not _alive(pid):
                break
            time.sleep(0.1)
    _reap(pid)


def _daemon(cmd, log: Path, **kw) -> subprocess.Popen:
    """A daemon in the foreground, in a session of its own, its output appended to ``log``."""
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, **kw)


def _stop_stale(conf_dir: Path) -> None:
    """A cluster of ours that an earlier run left running (its record in its work folder)."""
    stale = written_by_us(conf_dir / "slurm.conf")
    if stale is None:
        return
    record = Path(stale) / "cluster.json"
    if record.exists():
        try:
            data = json.loads(record.read_text())
            Cluster(**{**data, "workdir": Path(data["workdir"])}).stop()
        except (OSError, ValueError, TypeError):
            pass
    for name in ("slurm.conf", "slurmdbd.conf", "gres.conf"):
        if written_by_us(conf_dir / name) is not None:
            (conf_dir / name).unlink(missing_ok=True)


def start(workdir, install: bool = True, separate_node: bool | None = None, conf_dir: Path = CONF_DIR,
          timeout: float = 90.0) -> Cluster:
    """Install (if needed) and start the cluster; returns it once its node is idle.

    Raises SlurmUnavailable (one line) where it cannot: not root, no packages, a SLURM of
    someone else's configured here, a daemon that does not come up.
    """
    workdir = Path(workdir).resolve()
    if os.geteuid() != 0:
        raise SlurmUnavailable("needs root (installs slurm-wlm, slurmdbd, munge and mariadb-server; writes /etc/slurm)")
    for sub in ("state", "spool", "log", "db"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    if install:
        install_packages(workdir / "log" / "apt.log")
    elif missing_commands():
        raise SlurmUnavailable(f"not installed: {', '.join(missing_commands())}")
    conf_dir.mkdir(parents=True, exist_ok=True)
    _stop_stale(conf_dir)
    if (conf_dir / "slurm.conf").exists():
        raise SlurmUnavailable(
            f"a SLURM is already configured on this machine ({conf_dir / 'slurm.conf'}); not replacing it"
        )
    if separate_node is None:
        separate_node = namespaces_work()
    hardware = parse_slurmd_c(_run([which("slurmd"), "-C"], timeout=30).stdout)
    cpus = int(hardware.get("CPUs", os.cpu_count() or 1))
    gpus = fake_gpu_count(cpus)
    lay = Layout(workdir, socket.gethostname().split(".")[0], NODE,
                 {k: free_port() for k in ("slurmctld", "slurmd", "slurmdbd", "mysql")})
    cluster = Cluster(workdir, NODE, cpus, int(hardware.get("RealMemory", 0)), gpus, separate_node)
    log = workdir / "log"
    try:
        _start_munge(cluster, log)
        _start_database(cluster, lay, log)
        files = {"slurm.conf": slurm_conf(lay, hardware, gpus), "gres.conf": gres_conf(lay, gpus),
                 "slurmdbd.conf": slurmdbd_conf(lay)}
        for name, text in files.items():
            path = conf_dir / name
            path.write_text(text)
            path.chmod(0o600 if name == "slurmdbd.conf" else 0o644)
            cluster.conf_files.append(str(path))
        (workdir / "cluster.json").write_text(json.dumps(asdict(cluster), default=str, indent=1))
        _start_slurm(cluster, lay, log, timeout)
        (workdir / "cluster.json").write_text(json.dumps(asdict(cluster), default=str, indent=1))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_munge(cluster: Cluster, log: Path) -> None:
    if munge_works():
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        made = _run([which("mungekey") or "mungekey", "--create"], timeout=30)
        if made.returncode:
            raise SlurmUnavailable(f"cannot create {key}: {_last_line(made.stderr)}")
        shutil.chown(key, "munge", "munge")
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    proc = _daemon([which("munged"), "--foreground"], log / "munged.log", user="munge", group="munge", extra_groups=[])
    cluster.pids["munged"] = proc.pid
    wait_until(munge_works, 20, f"munged does not answer (see {log / 'munged.log'})")


def _mariadb(sock: Path, sql: str) -> subprocess.CompletedProcess:
    return _run([which("mariadb") or "mariadb", "--no-defaults", "-S", str(sock), "-uroot", "-e", sql], timeout=30)


def _start_database(cluster: Cluster, lay: Layout, log: Path) -> None:
    datadir, sock = lay.path("db"), lay.path("mysqld.sock")
    init = _run([which("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                 "--auth-root-authentication-method=normal", "--skip-test-db"], timeout=120)
    if init.returncode:
        raise SlurmUnavailable(f"mariadb-install-db failed: {_last_line(init.stderr or init.stdout)}")
    proc = _daemon([which("mariadbd"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                    f"--socket={sock}", f"--port={lay.ports['mysql']}", "--bind-address=127.0.0.1",
                    f"--pid-file={lay.path('mysqld.pid')}", "--skip-name-resolve",
                    "--innodb-buffer-pool-size=64M", "--innodb-lock-wait-timeout=900"], log / "mysqld.log")
    cluster.pids["mariadbd"] = proc.pid
    wait_until(lambda: _mariadb(sock, "SELECT 1").returncode == 0, 60,
               f"MariaDB does not start (see {log / 'mysqld.log'})")
    sql = (f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
           f"GRANT ALL ON slurm_acct_db.* TO '{DB_USER}'@'127.0.0.1';")
    made = _mariadb(sock, sql)
    if made.returncode:
        raise SlurmUnavailable(f"MariaDB user: {_last_line(made.stderr)}")


def _start_slurm(cluster: Cluster, lay: Layout, log: Path, timeout: float) -> None:
    dbd = _daemon([which("slurmdbd"), "-D"], log / "slurmdbd.out")
    cluster.pids["slurmdbd"] = dbd.pid
    wait_until(lambda: _run(["sacctmgr", "-n", "list", "cluster"], timeout=20).returncode == 0, timeout,
               f"slurmdbd does not answer (see {log / 'slurmdbd.log'})")
    added = _run(["sacctmgr", "-i", "add", "cluster", CLUSTER], timeout=30)
    if added.returncode and "already exists" not in added.stdout + added.stderr:
        raise SlurmUnavailable(f"sacctmgr add cluster: {_last_line(added.stderr or added.stdout)}")
    ctld = _daemon([which("slurmctld"), "-D"], log / "slurmctld.out")
    cluster.pids["slurmctld"] = ctld.pid
    wait_until(lambda: _run(["scontrol", "ping"], timeout=20).returncode == 0, timeout,
               f"slurmctld does not answer (see {log / 'slurmctld.log'})")
    slurmd = [which("slurmd"), "-D", "-N", cluster.node]
    if cluster.separate_node:
        # its own PID and UTS namespaces: the node's jobs see another /proc and hostname;
        # --kill-child: the node (and every job on it) ends with this process
        slurmd = ["unshare", "--pid", "--uts", "--mount-proc", "--kill-child", "sh", "-c",
                  f'hostname {cluster.node} && exec "$@"', "sh", *slurmd]
    node = _daemon(slurmd, log / "slurmd.out")
    cluster.pids["slurmd"] = node.pid

    def idle():
        # one line per partition of the node
        states = set(_run(["sinfo", "-h", "-n", cluster.node, "-o", "%t"], timeout=20).stdout.split())
        state = ",".join(sorted(states))
        if states & {"inval", "drain", "down", "down*", "drain*"} and time.monotonic() > started + 15:
            reason = _run(["scontrol", "show", "node", cluster.node], timeout=20).stdout
            m = re.search(r"Reason=(.*)", reason)
            raise SlurmUnavailable(f"node {cluster.node} is {state}: {m.group(1).strip() if m else '?'}")
        return states == {"idle"}

    started = time.monotonic()
    wait_until(idle, timeout, f"node {cluster.node} does not become idle (see {log / 'slurmd.log'})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("start", "stop", "install"))
    ap.add_argument("workdir", type=Path, help="state, logs and database of the cluster")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    args = ap.parse_args(argv)
    try:
        if args.action == "install":
            args.workdir.mkdir(parents=True, exist_ok=True)
            install_packages(args.workdir / "apt.log")
            print("SLURM's packages are installed")
            return 0
        if args.action == "start":
            cluster = start(args.workdir, install=not args.no_install)
            print(f"SLURM is up: node {cluster.node} ({cluster.cpus} CPUs, {cluster.gpus} fake GPUs), "
                  f"partitions {', '.join(PARTITIONS)}. For profiles/slurm:")
            for k, v in cluster.profile_env().items():
                print(f"export {k}={v}")
            return 0
        record = args.workdir / "cluster.json"
        if not record.exists():
            print(f"no cluster recorded in {args.workdir}", file=sys.stderr)
            return 1
        data = json.loads(record.read_text())
        Cluster(**{**data, "workdir": Path(data["workdir"])}).stop()
        print("SLURM stopped")
        return 0
    except SlurmUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
