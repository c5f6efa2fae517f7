"""Ranks on different "hosts": network namespaces joined by a veth pair (shared.py).

The seed scenario and a table_row_wise scenario of two hosts x two ranks run through `dmpcheck
worker` under the real launchers: torchrun (torch 2.14, from the torchrec 1.9.2 environment) with
one node and with two nodes (c10d rendezvous), Open MPI's mpirun (Debian's openmpi-bin, its rsh
agent entering the other namespace), and by hand with torchrun's variables; Slurm's srun and
sbatch are in test_slurm.py.  Needs root (CI is root); skips otherwise unless DMPCHECK_REQUIRE_MULTIHOST=1.
"""
import os
import shutil
import subprocess

import pytest

from shared import DMPCHECK, LONG, SEED, TORCHRUN, TWRW, assert_seed, assert_twrw, reports, sh, two_hosts, unavailable


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two namespaces joined by a veth pair (shared.py); removed whatever happens."""
    with two_hosts() as made:
        names, addrs = made["ns"], made["addr"]
        agent = tmp_path_factory.mktemp("bin") / "netns-rsh"
        agent.write_text("#!/bin/sh\n# mpirun's rsh agent: a host address is a namespace.\nhost=$1; shift\n"
                         "case \"$host\" in %s) ns=%s ;; %s) ns=%s ;; *) echo \"unknown host $host\" >&2; exit 1 ;; esac\n"
                         "exec ip netns exec \"$ns\" sh -c \"$*\"\n" % (addrs[0], names[0], addrs[1], names[1]))
        agent.chmod(0o755)
        yield dict(made, agent=str(agent))


# The same secret on every rank, as a user of an external launcher sets it (docs/reliability.md).
SECRET = "multihost-test-secret-%d" % os.getpid()


def in_ns(ns, args, env=None, log=None):
    e = dict(os.environ)
    e["DMPCHECK_RUN_SECRET"] = SECRET
    if log:  # torchrun keeps its agent's log directory (torchelastic_*) in TMPDIR: the test's own
        e["TMPDIR"] = os.path.dirname(log)
    e.update(env or {})
    return subprocess.Popen(["ip", "netns", "exec", ns] + args, env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def wait_all(procs, logs, timeout=300):
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("timed out:\n" + "\n".join(open(l).read()[-3000:] for l in logs))
    return codes


def test_plain_run_inside_a_host_needs_nothing_but_its_loopback(hosts, tmp_path):
    """`dmpcheck run` in a namespace: its launcher, store and ranks live on that host's loopback."""
    out, log = str(tmp_path / "out"), str(tmp_path / "run.log")
    p = in_ns(hosts["ns"][1], [DMPCHECK, "run", SEED, "--quiet", "--out", out], {"DMPCHECK_TORCHREC_ENVS": str(tmp_path / "none")}, log)
    assert wait_all([p], [log]) == [0], open(log).read()[-3000:]
    assert_seed(out)  # the release cells are skipped here (no environments): the reference's four remain


def sockets(ns):
    """(state, local address, local port, line) of every TCP socket of a dmpcheck process in the namespace."""
    out = sh("ip", "netns", "exec", ns, "ss", "-tanpH").stdout
    found = []
    for line in out.splitlines():
        if "dmpcheck" not in line:
            continue
        fields = line.split()
        address, port = fields[3].rsplit(":", 1)
        found.append((fields[0], address.strip("[]"), int(port), line))
    return found


def test_a_single_host_run_uses_loopback_only_and_refuses_other_hosts(hosts, tmp_path):
    """From its start to its training, every TCP socket of a `dmpcheck run` (launcher and ranks) is
    a loopback one: its store is a file in a private directory, Gloo's pairs listen on 127.0.0.1.
    Another host connecting to any port it used is refused."""
    import time

    scenario = tmp_path / "long.yaml"
    scenario.write_text(LONG)
    log = str(tmp_path / "run.log")
    p = in_ns(hosts["ns"][0], [DMPCHECK, "run", str(scenario), "--out", str(tmp_path / "out")], log=log)
    seen = {}
    try:
        deadline = time.time() + 60
        while time.time() < deadline and "step 2/" not in open(log).read():
            assert p.poll() is None, open(log).read()
            for state, address, port, line in sockets(hosts["ns"][0]):
                seen[(state, address, port)] = line
        # Gloo listens only while its pairs connect, a window the sampling may miss under load; the
        # pairs' established sockets name both ends, and every port seen is probed below.
        assert seen, "no socket of the run seen before its second step"
        for (state, address, port), line in seen.items():
            assert address in ("127.0.0.1", "::1"), line
        probe = ("import socket, sys\nfor port in map(int, sys.argv[2:]):\n"
                 "    s = socket.socket(); s.settimeout(3)\n"
                 "    try:\n        s.connect((sys.argv[1], port)); print('OPEN', port)\n"
                 "    except OSError as e:\n        print('REFUSED', port, e.errno)\n")
        ports = sorted({port for _, _, port in seen})
        out = sh("ip", "netns", "exec", hosts["ns"][1], "python3", "-c", probe, hosts["addr"][0], *map(str, ports)).stdout
        assert "OPEN" not in out and out.count("REFUSED") == len(ports), out
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_workers_by_hand_with_torchruns_variables(hosts, tmp_path):
    out, logs, procs = str(tmp_path / "out"), [], []
    for rank, ns in enumerate(hosts["ns"]):
        logs.append(str(tmp_path / ("rank%d.log" % rank)))
        procs.append(in_ns(ns, [DMPCHECK, "worker", SEED, "--out", out],
                           {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": hosts["addr"][0], "MASTER_PORT": "29710"}, logs[-1]))
    assert wait_all(procs, logs) == [0, 0], open(logs[0]).read()[-3000:]
    assert_seed(out)


PROBE_WRONG_SECRET = """
import hashlib, hmac, os, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
greeting = b""
while len(greeting) < 72:
    chunk = s.recv(72 - len(greeting))
    if not chunk:
        break
    greeting += chunk
assert greeting[:8] == b"DMPSTOR1", greeting
nonce_s, nonce_c = greeting[8:72], os.urandom(32).hex().encode()
s.sendall(nonce_c + hmac.new(b"a-guessed-secret", b"client" + nonce_s + nonce_c, hashlib.sha256).hexdigest().encode())
print("CLOSED" if s.recv(64) == b"" else "ANSWERED")
"""


def test_a_multi_host_runs_store_binds_master_addr_and_refuses_a_wrong_secret(hosts, tmp_path):
    """Workers by hand on two hosts: rank 0's store listens on MASTER_ADDR only (not every
    interface, not loopback); a process on the other host that cannot prove the secret is refused
    and reported, and the run passes."""
    import time

    scenario = tmp_path / "long.yaml"
    scenario.write_text(LONG.replace("steps: 100000", "steps: 3000"))
    out, logs, procs = str(tmp_path / "out"), [], []
    a, port = hosts["addr"][0], 29714
    for rank, ns in enumerate(hosts["ns"]):
        logs.append(str(tmp_path / ("rank%d.log" % rank)))
        procs.append(in_ns(ns, [DMPCHECK, "worker", str(scenario), "--out", out],
                           {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                            "MASTER_ADDR": a, "MASTER_PORT": str(port)}, logs[-1]))
    try:
        listeners = []
        deadline = time.time() + 60
        while time.time() < deadline and not any(p == port for _, _, p, _ in listeners):
            listeners = [s for s in sockets(hosts["ns"][0]) if s[0] == "LISTEN"]
            time.sleep(0.05)
        assert any(p == port for _, _, p, _ in listeners), listeners
        for state, address, p, line in listeners:
            assert address == a, line  # the store and Gloo's pairs: MASTER_ADDR's interface only
        probe = sh("ip", "netns", "exec", hosts["ns"][1], "python3", "-c", PROBE_WRONG_SECRET, a, str(port)).stdout
        assert probe.strip() == "CLOSED", probe
        on_loopback = sh("ip", "netns", "exec", hosts["ns"][0], "python3", "-c",
                         "import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=5); print('OPEN')\n"
                         "except OSError:\n    print('REFUSED')\n" % port).stdout
        assert on_loopback.strip() == "REFUSED", on_loopback
    finally:
        codes = wait_all(procs, logs)
    assert codes == [0, 0], "\n".join(open(l).read()[-3000:] for l in logs)
    log0 = open(logs[0]).read()
    assert "refused a connection to the run's store from %s:" % hosts["addr"][1] in log0, log0[-3000:]
    got = reports(out, "long-reference-run")
    assert [r["verdict"] for r in got.values()] == ["pass"], got


def need_torchrun():
    if not os.path.exists(TORCHRUN):
        unavailable("torchrun comes from the torchrec 1.9.2 environment: bash ci/torchrec-env.sh 1.9.2")


def test_real_torchrun_one_node(hosts, tmp_path):
    """torchrun's agent hosts its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE)."""
    need_torchrun()
    out, log = str(tmp_path / "out"), str(tmp_path / "torchrun.log")
    p = in_ns(hosts["ns"][0], [TORCHRUN, "--nproc-per-node=2", "--master-addr=127.0.0.1", "--master-port=29711", "--no-python",
                               DMPCHECK, "worker", SEED, "--out", out], log=log)
    assert wait_all([p], [log]) == [0], open(log).read()[-3000:]
    assert_seed(out)


@pytest.mark.parametrize("scenario,per_node", [(SEED, 1), (TWRW, 2)], ids=["seed", "table_row_wise_2x2"])
def test_real_torchrun_two_nodes(hosts, tmp_path, scenario, per_node):
    """--nnodes=2 with the c10d rendezvous: the agent on the first host hosts it; --local-addr gives
    each agent its host's address (the namespaces share one host name)."""
    need_torchrun()
    out, logs, procs = str(tmp_path / "out"), [], []
    endpoint = hosts["addr"][0] + ":29712"
    for i, ns in enumerate(hosts["ns"]):
        logs.append(str(tmp_path / ("node%d.log" % i)))
        procs.append(in_ns(ns, [TORCHRUN, "--nnodes=2", "--nproc-per-node=%d" % per_node, "--rdzv-backend=c10d",
                                "--rdzv-endpoint=" + endpoint, "--rdzv-id=dmpcheck-test",
                                "--rdzv-conf=is_host=%d" % (1 if i == 0 else 0), "--local-addr=" + hosts["addr"][i],
                                "--no-python", DMPCHECK, "worker", scenario, "--out", out], log=logs[-1]))
    assert wait_all(procs, logs) == [0, 0], "\n".join(open(l).read()[-3000:] for l in logs)
    (assert_seed if scenario == SEED else assert_twrw)(out)
    assert "is not set: the run's store" not in open(logs[0]).read()  # the secret reached every rank


@pytest.mark.parametrize("scenario,per_node", [(SEED, 1), (TWRW, 2)], ids=["seed", "table_row_wise_2x2"])
def test_real_mpirun_two_hosts(hosts, tmp_path, scenario, per_node):
    if shutil.which("mpirun") is None:
        unavailable("mpirun is not installed (Debian: apt-get install openmpi-bin; ci/setup.sh installs it)")
    out, log = str(tmp_path / "out"), str(tmp_path / "mpirun.log")
    a, b = hosts["addr"]
    p = in_ns(hosts["ns"][0], ["mpirun", "--allow-run-as-root", "-np", str(2 * per_node), "--host",
                               "%s:%d,%s:%d" % (a, per_node, b, per_node), "--mca", "plm_rsh_agent", hosts["agent"],
                               "--mca", "oob_tcp_if_include", a.rsplit(".", 1)[0] + ".0/24",
                               "--mca", "btl_tcp_if_include", a.rsplit(".", 1)[0] + ".0/24",
                               "-x", "MASTER_ADDR=" + a, "-x", "MASTER_PORT=29713", "-x", "PATH", "-x", "DMPCHECK_RUN_SECRET",
                               DMPCHECK, "worker", scenario, "--out", out], log=log)
    assert wait_all([p], [log]) == [0], open(log).read()[-3000:]
    (assert_seed if scenario == SEED else assert_twrw)(out)
