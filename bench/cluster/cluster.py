"""A small real Spark standalone cluster on one Linux machine: one network namespace per worker host.

Layout (everything named with the prefix ``sgc-``, addresses only from the benchmarking range 198.18.0.0/24)::

    root namespace: bridge sgc-br0 198.18.0.1/24, the Spark Master (198.18.0.1:7077, UI :8080), the driver
      |-- veth sgc-w1-h <-> sgc-w1-n in namespace sgc-w1 (198.18.0.11/24): one standalone Worker, 1 core
      |-- veth sgc-w2-h <-> sgc-w2-n in namespace sgc-w2 (198.18.0.12/24): one standalone Worker, 1 core
      ...

The namespaces get no default route and no NAT, so their traffic never leaves the bridge. Every veth end
gets a ``tc netem`` qdisc (rate and delay; ``tbf``, rate only, on kernels without netem) on egress, which
shapes both directions of every link; traffic between two workers crosses two shaped links. Processes run
from pyspark's bundled ``spark-class`` with this interpreter as the executors' Python and this sparkgrad on
their PYTHONPATH. Every process is recorded by PID in ``<state dir>/state.json``; ``down`` ends them by PID
(and every process left in the harness's namespaces, executors included), then deletes the namespaces, veths
and bridge, also after a crash.

Needs root, iproute2 (`ip`, `tc`; the harness never installs it) and Java 17.

Usage (as root; the workers import the sparkgrad this interpreter imports, e.g. ``PYTHONPATH=python``)::

    python bench/cluster/cluster.py up --workers 2 --rate 1gbit --delay 0.2ms   # --delay none without netem
    python bench/cluster/cluster.py up --worker-env 0:SPARKGRAD_DEVICE=cuda:0      # a GPU host and a CPU host
    python bench/cluster/cluster.py status
    python bench/cluster/cluster.py down

From Python (the driver runs in the root namespace; ``sys.path`` must hold bench/cluster)::

    from cluster import cluster, spark_session, wait_for_executors
    with cluster(workers=2, rate="1gbit", delay="0.2ms") as info:
        spark = spark_session(info, "my-app", local_dir="/tmp/driver")  # spark://198.18.0.1:7077
        wait_for_executors(spark, 2)
        # SharedTrainingMaster: VoidConfiguration(network_mask="198.18.0.0/24") finds the bridge address
        ...
        spark.stop()

Per-host environment: ``up(worker_env={0: {"SPARKGRAD_DEVICE": "cuda:0"}})`` (``--worker-env
0:SPARKGRAD_DEVICE=cuda:0``, repeatable) starts the Worker daemon of host 0 (namespace ``sgc-w1``) with
that variable. A standalone Worker launches its executors with its own environment (plus the application's
``spark.executorEnv.*``, which wins), and PySpark's Python workers inherit the executor's: the variable
reaches every Python worker on that host and on no other, as ``spark-env.sh`` on one real host would. Every
Worker also inherits the environment of the process that runs ``up`` (``SPARKGRAD_DEVICE`` included: unset
it there for hosts that must not have it).

``unavailable_reason()`` says why a cluster cannot be built here (not root, no iproute2, no Java);
``up`` raises ``ClusterUnavailable`` with such a message, which the test fixture turns into a skip (a failure
with ``SPARKGRAD_REQUIRE=cluster``). The harness installs nothing: it names what to install.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "sgc-"
SUBNET = ipaddress.ip_network("198.18.0.0/24")
BRIDGE = f"{PREFIX}br0"
BRIDGE_IP = "198.18.0.1"
FIRST_WORKER_HOST = 11
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_PORT = 7078
WORKER_UI_PORT = 8081
MAX_WORKERS = 32
MARKER = ".sparkgrad-cluster"  # in the state dir: `down` deletes only a directory `up` filled
DEFAULT_STATE_DIR = os.path.join(tempfile.gettempdir(), "sparkgrad-cluster")
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# set by the harness for every daemon (_spark_env, up): a worker_env entry may not replace them
_HARNESS_ENV = (
    "SPARK_HOME",
    "SPARK_CONF_DIR",
    "SPARK_LOCAL_IP",
    "SPARK_LOCAL_DIRS",
    "SPARK_DAEMON_MEMORY",
    "SPARK_MASTER_OPTS",
    "PYSPARK_PYTHON",
    "PYTHONPATH",
)
# Requests to the master's UI must never go through a proxy from the environment: they stay on the bridge.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ClusterUnavailable(RuntimeError):
    """This machine cannot host the cluster (not root, no network namespaces, iproute2, Java or pyspark)."""


@dataclass
class WorkerHost:
    """One worker host: a namespace, its veth pair and address, and the extra environment of its Worker
    daemon (which its executors and their Python workers inherit)."""

    namespace: str
    host_link: str
    ns_link: str
    address: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class ClusterInfo:
    """What ``up`` built; saved as JSON in ``<state_dir>/state.json``.

    Args:
        state_dir: directory of the state file, logs and the workers' work and local directories.
        rate: tc rate of every link (None: not limited).
        delay: tc delay of every link (None: none added).
        hosts: the worker hosts.
        processes: role -> PID of every process the harness started.
        qdisc: the tc qdisc that shapes the links: "netem" (rate and delay), "tbf" (rate only, on kernels
            without netem) or None (not shaped).
    """

    state_dir: str
    rate: str | None
    delay: str | None
    hosts: list[WorkerHost] = field(default_factory=list)
    processes: dict[str, int] = field(default_factory=dict)
    qdisc: str | None = None

    @property
    def master_url(self) -> str:
        """The Spark master URL the driver connects to."""
        return f"spark://{BRIDGE_IP}:{MASTER_PORT}"

    @property
    def driver_host(self) -> str:
        """The root namespace's address on the bridge: the driver binds here."""
        return BRIDGE_IP

    def save(self) -> None:
        """Write the state file atomically (``down`` reads it after a crash)."""
        path = Path(self.state_dir) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, state_dir: str) -> ClusterInfo | None:
        """The saved state, or None when there is no readable state file in ``state_dir``."""
        try:
            raw = json.loads((Path(state_dir) / "state.json").read_text())
            hosts = [WorkerHost(**h) for h in raw.pop("hosts")]
            return cls(**raw, hosts=hosts)
        except (OSError, ValueError, TypeError, KeyError):
            return None


# -- commands ------------------------------------------------------------------------------------------


def _run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def unavailable_reason() -> str | None:
    """Why no cluster can be built on this machine (None when nothing obvious is missing).

    Returns:
        A message naming what is missing, or None. ``up`` may still raise ``ClusterUnavailable`` when
        the kernel refuses network namespaces or netem.
    """
    if not sys.platform.startswith("linux"):
        return f"the cluster harness needs Linux network namespaces, this is {sys.platform}"
    if os.geteuid() != 0:
        return "the cluster harness needs root (it creates network namespaces, veths and a bridge)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        # never installed from here: the harness must not change the host it is asked to test on
        return (
            f"the cluster harness needs iproute2 (missing: {', '.join(missing)}): "
            "install it first, e.g. `apt-get install iproute2`"
        )
    try:
        from sparkgrad.spark.demo import MIN_JAVA, java_major_version
    except ImportError as exc:
        return f"the cluster harness needs sparkgrad importable by this interpreter ({exc})"
    java = java_major_version()
    if java is None or java < MIN_JAVA:
        found = "none found (JAVA_HOME / PATH)" if java is None else f"found Java {java}"
        return f"the cluster harness needs Java {MIN_JAVA}+ for Spark: {found}"
    try:
        spark_class = os.path.join(_spark_home(), "bin", "spark-class")
    except ImportError:
        return "the cluster harness needs pyspark"
    if not os.access(spark_class, os.X_OK):
        return f"pyspark's spark-class is missing or not executable: {spark_class}"
    return None


# -- discovery of what exists ---------------------------------------------------------------------------


def _namespaces() -> list[str]:
    """The harness's network namespaces that exist now."""
    if not shutil.which("ip"):
        return []
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def _links() -> list[str]:
    """The harness's links in the root namespace that exist now."""
    if not shutil.which("ip"):
        return []
    names = []
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(PREFIX):
                names.append(name)
    return names


def _namespace_pids(namespace: str) -> list[int]:
    out = _run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _bridge_listeners() -> list[int]:
    """PIDs of the processes listening on the bridge address (the master's, also when the state is lost)."""
    if not shutil.which("ss"):
        return []
    out = _run(["ss", "-H", "-ltnp", "src", BRIDGE_IP], check=False).stdout
    return sorted({int(pid) for pid in re.findall(r"pid=(\d+)", out)})


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:  # reap our own children so that a zombie does not count as running
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _check_subnet_free() -> None:
    """Refuse to build when 198.18.0.0/24 is already in use by something that is not the harness."""
    for line in _run(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
        tokens = line.split()
        dev, addr = tokens[1], tokens[3]
        if not dev.startswith(PREFIX) and ipaddress.ip_interface(addr).network.overlaps(SUBNET):
            raise RuntimeError(f"{SUBNET} is already used on interface {dev} ({addr}); not touching it")
    for line in _run(["ip", "-4", "route", "show"]).stdout.splitlines():
        dest = line.split()[0]
        if dest == "default" or f"dev {BRIDGE}" in line:
            continue
        try:
            net = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if net.overlaps(SUBNET):
            raise RuntimeError(f"a route to {dest} already overlaps {SUBNET}: `{line}`; not touching it")


# -- up / down / status ----------------------------------------------------------------------------------


def _worker_hosts(workers: int, worker_env: Mapping[int, Mapping[str, str]]) -> list[WorkerHost]:
    hosts = []
    for i in range(1, workers + 1):
        ns = f"{PREFIX}w{i}"
        env = dict(worker_env.get(i - 1, {}))
        hosts.append(WorkerHost(ns, f"{ns}-h", f"{ns}-n", str(SUBNET[FIRST_WORKER_HOST + i - 1]), env))
    return hosts


def _index_problem(index: Any, workers: int) -> str | None:
    """What is wrong with a worker_env index (None: nothing)."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < workers:
        return (
            f"worker index {index!r} is not one of 0..{workers - 1} (there are {workers} workers; "
            f"index 0 is the first host, namespace {PREFIX}w1)"
        )
    return None


def _variable_problem(name: Any, value: Any) -> str | None:
    """What is wrong with one worker_env variable (None: nothing)."""
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        return f"{name!r} is not an environment variable name (letters, digits, _; not starting with a digit)"
    if name in _HARNESS_ENV:
        return (
            f"{name} is set by the harness itself and cannot be overridden (reserved: "
            f"{', '.join(_HARNESS_ENV)})"
        )
    if not isinstance(value, str) or "\0" in value:
        return f"the value of {name} must be a string without NUL, got {value!r}"
    return None


def check_worker_env(
    worker_env: Mapping[int, Mapping[str, str]] | None, workers: int
) -> dict[int, dict[str, str]]:
    """A validated copy of ``up``'s ``worker_env``: worker index (0-based) -> {variable: value}.

    Args:
        worker_env: the mapping to check (None: empty).
        workers: the number of worker hosts (indexes run 0 .. workers - 1).

    Raises:
        ValueError: not a mapping, an index that is not an int in range, a variable name that is not a
            shell name or that the harness sets itself, or a value that is not a string without NUL; the
            message starts with ``worker_env``.
    """
    if worker_env is None:
        return {}
    if not isinstance(worker_env, Mapping):
        raise ValueError(
            f"worker_env: expected a mapping of worker index -> {{name: value}}, got {worker_env!r}"
        )
    checked: dict[int, dict[str, str]] = {}
    for index, env in worker_env.items():
        problem = _index_problem(index, workers)
        if problem:
            raise ValueError(f"worker_env: {problem}")
        if not isinstance(env, Mapping):
            raise ValueError(f"worker_env[{index!r}]: expected a mapping of name -> value, got {env!r}")
        for name, value in env.items():
            problem = _variable_problem(name, value)
            if problem:
                raise ValueError(f"worker_env[{index!r}]: {problem}")
        checked[index] = dict(env)
    return checked


def parse_worker_env(items: Sequence[str] | None, workers: int) -> dict[int, dict[str, str]]:
    """``--worker-env INDEX:NAME=VALUE`` items (the CLI's, repeatable) as ``up``'s ``worker_env``.

    The value is everything after the first ``=`` (it may hold ``:`` and ``=``, or be empty).

    Raises:
        ValueError: a malformed item, a bad index or name (as ``check_worker_env``), or the same variable
            given twice for one worker; the message names ``--worker-env`` and the item.
    """
    parsed: dict[int, dict[str, str]] = {}
    for item in items or ():
        index, colon, assignment = item.partition(":")
        name, equals, value = assignment.partition("=")
        if not colon or not equals:
            raise ValueError(
                f"--worker-env {item!r}: expected INDEX:NAME=VALUE, e.g. 0:SPARKGRAD_DEVICE=cuda:0"
            )
        if not index.isdigit():
            raise ValueError(f"--worker-env {item!r}: the worker index {index!r} is not a number 0, 1, ...")
        problem = _index_problem(int(index), workers) or _variable_problem(name, value)
        if problem:
            raise ValueError(f"--worker-env {item!r}: {problem}")
        env = parsed.setdefault(int(index), {})
        if name in env:
            raise ValueError(f"--worker-env {item!r}: {name} is given twice for worker {int(index)}")
        env[name] = value
    return parsed


_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def _rate_bits(rate: str) -> float:
    """Bits per second of a tc rate ("1gbit", "100mbit", "10mbps" = 10 MB/s)."""
    number, unit = re.match(r"^([\d.]+)(\w+)$", rate).groups()
    if unit.endswith("bps"):  # bytes per second
        return float(number) * 8 * _RATE_UNITS[unit[:-3] + "bit"]
    return float(number) * _RATE_UNITS[unit]


def _shape(device: str, rate: str | None, delay: str | None, namespace: str | None = None) -> str | None:
    """Shape ``device``'s egress: netem (rate and delay) when the kernel has it, else tbf (rate only).

    Returns:
        The qdisc used (None: nothing to shape).

    Raises:
        ClusterUnavailable: a delay was asked for and the kernel has no netem, or no qdisc could be added.
    """
    if rate is None and delay is None:
        return None
    tc = ["tc"] + (["-n", namespace] if namespace else []) + ["qdisc", "add", "dev", device, "root"]
    netem = [*tc, "netem", "delay", delay or "0ms"] + (["rate", rate] if rate else [])
    result = _run(netem, check=False)
    if result.returncode == 0:
        return "netem"
    if delay is not None or "unknown" not in result.stderr:
        raise ClusterUnavailable(
            f"cannot shape {device} (`{' '.join(netem)}`): {result.stderr.strip()}; a delay needs the "
            "kernel's netem qdisc (sch_netem): without it pass --delay none (tbf then shapes the rate)"
        )
    # token bucket: a burst of 2 ms at the rate (at least one 64 KiB GSO packet), 50 ms of queue
    burst = max(int(_rate_bits(rate) / 8 * 0.002), 65536)
    tbf = [*tc, "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
    result = _run(tbf, check=False)
    if result.returncode != 0:
        raise ClusterUnavailable(f"cannot shape {device} (`{' '.join(tbf)}`): {result.stderr.strip()}")
    return "tbf"


def _build_network(info: ClusterInfo) -> None:
    _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    _run(["ip", "addr", "add", f"{BRIDGE_IP}/{SUBNET.prefixlen}", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    for host in info.hosts:
        result = _run(["ip", "netns", "add", host.namespace], check=False)
        if result.returncode != 0:
            raise ClusterUnavailable(
                f"`ip netns add {host.namespace}` failed (no network namespace support?): "
                f"{result.stderr.strip()}"
            )
        ns = ["ip", "-n", host.namespace]
        _run(["ip", "link", "add", host.host_link, "type", "veth", "peer", "name", host.ns_link])
        _run(["ip", "link", "set", host.ns_link, "netns", host.namespace])
        _run(["ip", "link", "set", host.host_link, "master", BRIDGE])
        _run(["ip", "link", "set", host.host_link, "up"])
        _run([*ns, "link", "set", "lo", "up"])
        _run([*ns, "addr", "add", f"{host.address}/{SUBNET.prefixlen}", "dev", host.ns_link])
        _run([*ns, "link", "set", host.ns_link, "up"])
        # egress on each end: the host end shapes traffic into the namespace, the namespace end traffic out
        info.qdisc = _shape(host.host_link, info.rate, info.delay)
        _shape(host.ns_link, info.rate, info.delay, namespace=host.namespace)
        info.save()


def _spark_env(state_dir: str, local_ip: str, python_path: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("SPARK_MASTER_HOST", "SPARK_MASTER_PORT", "SPARK_WORKER_INSTANCES", "SPARK_CONF_DIR"):
        env.pop(key, None)
    conf_dir = os.path.join(state_dir, "conf")  # empty: no spark-defaults/spark-env from elsewhere
    os.makedirs(conf_dir, exist_ok=True)
    env.update(
        SPARK_HOME=_spark_home(),
        SPARK_CONF_DIR=conf_dir,
        SPARK_LOCAL_IP=local_ip,  # every service, UIs included, binds to this address only
        SPARK_DAEMON_MEMORY="512m",
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([*python_path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    return env


def _start(info: ClusterInfo, role: str, args: list[str], env: dict[str, str]) -> None:
    log_dir = os.path.join(info.state_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, f"{role}.log"), "ab") as log:
        # a session of its own: the processes outlive the CLI and ignore its terminal's Ctrl-C
        proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    info.processes[role] = proc.pid
    info.save()


def _master_json(timeout_s: float = 2.0) -> dict[str, Any]:
    url = f"http://{BRIDGE_IP}:{MASTER_UI_PORT}/json/"
    with _OPENER.open(url, timeout=timeout_s) as response:
        return json.loads(response.read().decode())


def alive_workers() -> list[str]:
    """Hosts of the workers the master reports ALIVE (empty when the master does not answer)."""
    try:
        state = _master_json()
    except (OSError, ValueError):
        return []
    return [str(w.get("host")) for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def log_tail(state_dir: str = DEFAULT_STATE_DIR, lines: int = 15) -> str:
    """The last ``lines`` lines of every process log under ``state_dir`` (for error messages)."""
    parts = []
    for path in sorted(Path(state_dir, "logs").glob("*.log")):
        text = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(parts)


def up(
    workers: int = 2,
    rate: str | None = "1gbit",
    delay: str | None = "0.2ms",
    state_dir: str = DEFAULT_STATE_DIR,
    python_path: Sequence[str] | None = None,
    timeout_s: float = 120.0,
    worker_env: Mapping[int, Mapping[str, str]] | None = None,
) -> ClusterInfo:
    """Build the namespaces and links, start the Master and one Worker per namespace, wait until all register.

    Args:
        workers: number of worker hosts (1 core each).
        rate: tc rate of every link, e.g. "1gbit", "100mbit" (None: not limited).
        delay: tc delay of every link, e.g. "0.2ms" (None: none added).
        state_dir: where the state file, logs and work directories go.
        python_path: entries put first on the workers' (and so the executors') PYTHONPATH; None: the
            directory this process imports sparkgrad from, when it can import it.
        timeout_s: how long to wait for every worker to register with the master.
        worker_env: extra environment variables for the Worker daemon of each host, by 0-based host
            index: ``{0: {"SPARKGRAD_DEVICE": "cuda:0"}}`` sets it on the first host (namespace sgc-w1)
            only. The host's executors and their Python workers inherit it (an application's
            ``spark.executorEnv.*`` still wins). Every Worker also inherits this process's environment.

    Returns:
        The cluster's description (also saved in ``<state_dir>/state.json``).

    Raises:
        ClusterUnavailable: this machine cannot host the cluster (the message says why).
        RuntimeError: a cluster (or leftovers) exists already, or the cluster did not come up in time; in
            the latter case everything built so far is torn down again.
    """
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers: expected 1..{MAX_WORKERS}, got {workers}")
    if rate is not None and not _RATE.match(rate):
        raise ValueError(f"rate: expected a tc rate such as '1gbit' or '100mbit', got {rate!r}")
    if delay is not None and not _DELAY.match(delay):
        raise ValueError(f"delay: expected a tc time such as '0.2ms', got {delay!r}")
    worker_env = check_worker_env(worker_env, workers)
    reason = unavailable_reason()
    if reason:
        raise ClusterUnavailable(reason)
    leftovers = _namespaces() + _links()
    if leftovers or ClusterInfo.load(state_dir) is not None:
        raise RuntimeError(
            f"a cluster already exists (state dir {state_dir}, names {leftovers}); "
            "run `python bench/cluster/cluster.py down` first"
        )
    _check_subnet_free()
    if python_path is None:
        python_path = _sparkgrad_path()
    if os.path.isdir(state_dir) and os.listdir(state_dir):
        raise RuntimeError(
            f"state dir {state_dir} is not empty; give an empty or new directory (or run down if it is ours)"
        )
    os.makedirs(state_dir, exist_ok=True)
    (Path(state_dir) / MARKER).touch()
    info = ClusterInfo(os.path.abspath(state_dir), rate, delay, _worker_hosts(workers, worker_env))
    info.save()
    try:
        _build_network(info)
        spark_class = os.path.join(_spark_home(), "bin", "spark-class")
        master = [spark_class, MASTER_CLASS, "--host", BRIDGE_IP, "--port", str(MASTER_PORT)]
        master += ["--webui-port", str(MASTER_UI_PORT)]
        _start(info, "master", master, _spark_env(info.state_dir, BRIDGE_IP, python_path))
        for host in info.hosts:
            work = os.path.join(info.state_dir, "work", host.namespace)
            local = os.path.join(info.state_dir, "local", host.namespace)
            os.makedirs(work)
            os.makedirs(local)
            env = _spark_env(info.state_dir, host.address, python_path)
            env.update(host.env)
            env["SPARK_LOCAL_DIRS"] = local
            worker = ["ip", "netns", "exec", host.namespace, spark_class, WORKER_CLASS]
            worker += [
                "--host",
                host.address,
                "--port",
                str(WORKER_PORT),
                "--webui-port",
                str(WORKER_UI_PORT),
            ]
            worker += ["--cores", "1", "--memory", "1g", "--work-dir", work, info.master_url]
            _start(info, host.namespace, worker, env)
        _wait_for_workers(info, timeout_s)
    except BaseException:
        down(state_dir)
        raise
    return info


def _sparkgrad_path() -> list[str]:
    try:
        import sparkgrad
    except ImportError:
        return []
    return [str(Path(sparkgrad.__file__).resolve().parents[1])]


def _wait_for_workers(info: ClusterInfo, timeout_s: float) -> None:
    expected = {h.address for h in info.hosts}
    deadline = time.monotonic() + timeout_s
    while True:
        dead = [role for role, pid in info.processes.items() if not _alive(pid)]
        if dead:
            raise RuntimeError(
                f"cluster processes exited during start-up: {dead}\n{log_tail(info.state_dir)}"
            )
        if expected <= set(alive_workers()):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"workers {sorted(expected - set(alive_workers()))} did not register with the master within "
                f"{timeout_s:.0f} s\n{log_tail(info.state_dir)}"
            )
        time.sleep(0.5)


def _terminate(pids: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is still running after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = {p for p in pids if _alive(p)}
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if _alive(p)}
            time.sleep(0.1)


def down(state_dir: str = DEFAULT_STATE_DIR) -> list[str]:
    """End every process of the cluster by PID and delete its namespaces, veths and bridge.

    Works after a crash: it uses the state file when there is one, ends every process in the harness's
    namespaces and a Master listening on the bridge address, and deletes whatever carries the harness's
    prefix. Idempotent.

    Args:
        state_dir: the state directory given to ``up``.

    Returns:
        What it removed, one line each.
    """
    removed = []
    info = ClusterInfo.load(state_dir)
    namespaces = _namespaces()
    pids = set()
    if info is not None:
        for role, pid in info.processes.items():
            # a recorded PID is ours only while it still runs Spark (PIDs are reused after a crash)
            if _alive(pid) and "org.apache.spark.deploy" in _cmdline(pid):
                pids.add(pid)
                removed.append(f"process {role} pid {pid}")
    for pid in _bridge_listeners():  # a master whose state file is lost: it listens on the bridge address
        if pid not in pids and MASTER_CLASS in _cmdline(pid):
            pids.add(pid)
            removed.append(f"master on {BRIDGE_IP} pid {pid}")
    for ns in namespaces:  # everything in the harness's namespaces is the harness's (executors too)
        for pid in _namespace_pids(ns):
            if pid not in pids:
                pids.add(pid)
                removed.append(f"process in {ns} pid {pid}")
    _terminate(pids)
    for ns in namespaces:
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(f"namespace {ns}")
    for link in _links():  # veth host ends (their peers went with the namespaces) and the bridge
        if _run(["ip", "link", "delete", link], check=False).returncode == 0:
            removed.append(f"link {link}")
    if (Path(state_dir) / MARKER).exists():  # only a directory `up` filled
        shutil.rmtree(state_dir, ignore_errors=True)
        removed.append(f"state dir {state_dir}")
    return removed


def status(state_dir: str = DEFAULT_STATE_DIR) -> str:
    """What exists now: the state file's cluster, the harness's namespaces, links and processes.

    Args:
        state_dir: the state directory given to ``up``.

    Returns:
        A human-readable report.
    """
    info = ClusterInfo.load(state_dir)
    lines = []
    if info is None:
        lines.append(f"no state file in {state_dir}")
    else:
        lines.append(
            f"cluster {info.master_url}: {len(info.hosts)} workers, rate {info.rate}, delay {info.delay}"
            f" ({info.qdisc or 'not shaped'})"
        )
        for role, pid in info.processes.items():
            lines.append(f"  {role}: pid {pid} {'running' if _alive(pid) else 'NOT running'}")
        for host in info.hosts:
            if host.env:
                env = " ".join(f"{name}={value}" for name, value in sorted(host.env.items()))
                lines.append(f"  {host.namespace} ({host.address}) worker environment: {env}")
        lines.append(f"  workers alive at the master: {sorted(alive_workers())}")
    for ns in _namespaces():
        procs = [f"{pid} {_role(_cmdline(pid))}" for pid in _namespace_pids(ns)]
        lines.append(f"namespace {ns}: {', '.join(procs) or 'no processes'}")
    links = _links()
    lines.append(f"links: {', '.join(links) if links else 'none'}")
    return "\n".join(lines)


def _role(cmdline: str) -> str:
    for cls, name in ((WORKER_CLASS, "worker"), (EXECUTOR_CLASS, "executor"), (MASTER_CLASS, "master")):
        if cls in cmdline:
            return name
    return cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "?"


def executor_pids(host: WorkerHost) -> list[int]:
    """PIDs of the Spark executor JVMs running on ``host`` now (e.g. to kill one in a fault test)."""
    return [pid for pid in _namespace_pids(host.namespace) if EXECUTOR_CLASS in _cmdline(pid)]


def executor_log(info: ClusterInfo, host: WorkerHost) -> str:
    """The stderr of every executor the Worker on ``host`` has launched so far, in one string.

    Spark's default log4j profile logs a failed task's exception there (``ERROR Executor: Exception in
    task ...``), with the Python traceback of a PySpark task: which host a failure happened on.
    """
    work = Path(info.state_dir, "work", host.namespace)
    return "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("*/*/stderr")))


@contextmanager
def cluster(
    workers: int = 2,
    rate: str | None = "1gbit",
    delay: str | None = "0.2ms",
    state_dir: str = DEFAULT_STATE_DIR,
    python_path: Sequence[str] | None = None,
    timeout_s: float = 120.0,
    worker_env: Mapping[int, Mapping[str, str]] | None = None,
) -> Iterator[ClusterInfo]:
    """``up`` on entry, ``down`` on exit, also when the body raises (arguments as for ``up``).

    Yields:
        The running cluster's description.
    """
    info = up(workers, rate, delay, state_dir, python_path, timeout_s, worker_env)
    try:
        yield info
    finally:
        down(state_dir)


def spark_session(
    info: ClusterInfo, app_name: str, local_dir: str, conf: dict[str, str] | None = None
) -> Any:
    """A SparkSession whose driver runs here (root namespace) against the cluster, 1 core per executor.

    Sets ``PYSPARK_PYTHON`` to this interpreter (the executors run the same one). Stop any other active
    SparkSession first: one SparkContext per process.

    Args:
        info: the running cluster.
        app_name: Spark application name.
        local_dir: the driver's scratch directory.
        conf: extra Spark settings (override the defaults here).

    Returns:
        The SparkSession.
    """
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    settings = {
        "spark.driver.host": info.driver_host,
        "spark.driver.bindAddress": info.driver_host,
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": str(len(info.hosts)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": local_dir,
        "spark.python.worker.reuse": "true",
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        **(conf or {}),
    }
    builder = SparkSession.builder.master(info.master_url).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def wait_for_executors(spark: Any, count: int, timeout_s: float = 90.0) -> None:
    """Block until ``count`` executors have registered with the driver.

    Args:
        spark: the SparkSession from ``spark_session``.
        count: executors to wait for.
        timeout_s: give up after this long.

    Raises:
        RuntimeError: fewer executors registered within ``timeout_s``.
    """
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while True:
        # getExecutorInfos lists the driver too
        registered = len(tracker._jtracker.getExecutorInfos()) - 1
        if registered >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {registered} of {count} executors registered within {timeout_s:.0f} s")
        time.sleep(0.25)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``up``, ``down``, ``status``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="state file, logs, work directories")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="build the network and start the master and workers")
    p_up.add_argument("--workers", type=int, default=2)
    p_up.add_argument("--rate", default="1gbit", help="tc rate per link, 'none' for unlimited")
    p_up.add_argument("--delay", default="0.2ms", help="tc delay per link, 'none' for no added delay")
    p_up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the workers")
    p_up.add_argument(
        "--worker-env",
        action="append",
        metavar="INDEX:NAME=VALUE",
        help="an environment variable for the Worker daemon of host INDEX (0-based) and so for its "
        "executors' Python workers, e.g. 0:SPARKGRAD_DEVICE=cuda:0; repeatable",
    )
    sub.add_parser("down", help="end every process by PID and delete the namespaces, veths and bridge")
    sub.add_parser("status", help="print what exists")
    args = parser.parse_args(argv)
    if args.command == "up":
        try:
            worker_env = parse_worker_env(args.worker_env, args.workers)
        except ValueError as exc:
            p_up.error(str(exc))  # exits with status 2 and the usage line
        try:
            info = up(
                args.workers,
                None if args.rate == "none" else args.rate,
                None if args.delay == "none" else args.delay,
                args.state_dir,
                timeout_s=args.timeout,
                worker_env=worker_env,
            )
        except ClusterUnavailable as exc:
            print(f"cluster unavailable: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:
            print(f"cluster not started: {exc}", file=sys.stderr)
            return 1
        print(f"up: {info.master_url}, workers {[h.address for h in info.hosts]}, state {info.state_dir}")
    elif args.command == "down":
        print("\n".join(down(args.state_dir)) or "nothing to remove")
    else:
        print(status(args.state_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
