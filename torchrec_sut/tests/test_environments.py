"""ci/torchrec-env.sh's disk budget and lock, on fake environments (no torch, no download).

The installer removes the least recently used ready environments until a new one fits in
DMPCHECK_TORCHREC_BUDGET_GB (here in MB), never one a running dmpcheck cell holds, and two
installers of one release take turns on a lock, the second finding it ready.
"""
import fcntl
import os
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "ci", "torchrec-env.sh")


def fake_env(root, release, hours_ago):
    d = root / ("torchrec-" + release)
    d.mkdir(parents=True)
    (d / "payload").write_bytes(b"\0" * 1000 * 1024)  # du -sm: 1 MB with the folder
    (d / "dmpcheck-ready.json").write_text('{"torchrec": "%s"}' % release)
    used = d / "dmpcheck-last-used"
    used.write_text("\n")
    t = time.time() - hours_ago * 3600
    os.utime(used, (t, t))
    return d


def installer(root, *args, **env):
    e = dict(os.environ, DMPCHECK_TORCHREC_ENVS=str(root), PIP_NO_INDEX="1", DMPCHECK_TORCHREC_INSTALLER_TOOL="pip")
    e.update(env)
    return subprocess.Popen(["bash", SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)


def test_a_new_environment_makes_room_by_removing_the_least_recently_used(tmp_path):
    oldest = fake_env(tmp_path, "0.6.0", 3)
    older = fake_env(tmp_path, "0.7.0", 2)
    recent = fake_env(tmp_path, "0.8.0", 0)
    # 3 MB there, 2 MB to come, 4 MB allowed: one must go, the least recently used.
    p = installer(tmp_path, "1.9.2", DMPCHECK_TORCHREC_BUDGET_MB="4", DMPCHECK_TORCHREC_ENV_MB="2")
    out, _ = p.communicate(timeout=300)
    assert "removed the least recently used environment %s to stay within 4 MB" % oldest in out, out
    assert not oldest.exists() and older.exists() and recent.exists()
    # (pip cannot reach an index here: the install itself fails, and says so.)
    assert p.returncode == 1 and "the installer failed for torchrec 1.9.2" in out, out
    assert not (tmp_path / "torchrec-1.9.2" / "dmpcheck-ready.json").exists()


def test_an_environment_a_running_cell_holds_is_passed_by(tmp_path):
    """dmpcheck holds dmpcheck-in-use.lock shared while a cell runs on an environment: the eviction
    removes the next least recently used instead, and when every one is held, none."""
    oldest = fake_env(tmp_path, "0.6.0", 3)
    older = fake_env(tmp_path, "0.7.0", 2)
    held = open(oldest / "dmpcheck-in-use.lock", "w")
    fcntl.flock(held, fcntl.LOCK_SH)  # a cell is running on 0.6.0
    p = installer(tmp_path, "1.9.2", DMPCHECK_TORCHREC_BUDGET_MB="3", DMPCHECK_TORCHREC_ENV_MB="2")
    out, _ = p.communicate(timeout=300)
    assert "removed the least recently used environment %s" % older in out, out
    assert oldest.exists() and not older.exists()
    fcntl.flock(held, fcntl.LOCK_UN)
    fcntl.flock(held, fcntl.LOCK_SH)
    p = installer(tmp_path, "1.9.2", DMPCHECK_TORCHREC_BUDGET_MB="1", DMPCHECK_TORCHREC_ENV_MB="2")
    out, _ = p.communicate(timeout=300)
    assert "none can go (every other one is in use by a running dmpcheck); creating torchrec-1.9.2 over budget" in out
    assert (oldest / "dmpcheck-ready.json").exists()


def test_two_installers_of_one_release_take_turns_and_the_second_finds_it_ready(tmp_path):
    lock = open(tmp_path / ".torchrec-1.9.2.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another installer is building 1.9.2
    p = installer(tmp_path, "1.9.2")
    time.sleep(2)
    assert p.poll() is None, "the second installer did not wait for the first"
    assert not (tmp_path / "torchrec-1.9.2").exists()
    fake_env(tmp_path, "1.9.2", 0)  # the first one finishes
    fcntl.flock(lock, fcntl.LOCK_UN)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert "torchrec 1.9.2 ready in %s (made meanwhile by another process)" % (tmp_path / "torchrec-1.9.2") in out


def fake_uv(tmp_path):
    """A uv on PATH that records what it is asked and makes a venv whose python is this one (so the
    probe runs and finds no torch): what the installer asks for, with no download."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "uv.log"
    (bin_dir / "uv").write_text(
        "#!/bin/bash\necho \"$*\" >> %s\n"
        "if [ \"$1\" = venv ]; then d=${@: -1}; mkdir -p \"$d/bin\"; ln -s /usr/bin/python3 \"$d/bin/python\"; fi\n" % log)
    (bin_dir / "uv").chmod(0o755)
    return dict(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), DMPCHECK_TORCHREC_INSTALLER_TOOL="uv"), log


def test_a_set_of_pins_names_its_folder_and_takes_the_rest_from_the_releases_row(tmp_path):
    env, log = fake_uv(tmp_path)
    envs = tmp_path / "envs"
    p = installer(envs, "torchrec==1.2.0 fbgemm-gpu-cpu==1.1.0", **env)
    out, _ = p.communicate(timeout=120)
    asked = log.read_text()
    # fbgemm-gpu-cpu 1.1.0 is built against torch 2.6.0 (1.1.0's row): torch follows it.
    assert "torch==2.6.0 fbgemm-gpu-cpu==1.1.0 numpy tensordict" in asked, asked
    assert "--no-deps torchrec==1.2.0" in asked, asked
    assert "venv -q --python /usr/bin/python3 %s/torchrec-1.2.0+fbgemm-gpu-cpu=1.1.0" % envs in asked, asked
    assert p.returncode == 1 and "torchrec 1.2.0, fbgemm-gpu-cpu 1.1.0 installed but does not import" in out, out
    # A pinned package replaces the row's own; torch pinned wins over fbgemm's pair; a Python named.
    log.unlink()
    p = installer(envs, "torchrec==1.2.0 Numpy==1.26.4 torch==2.7.0 fbgemm_gpu_cpu==1.1.0 python==3.10", **env)
    out, _ = p.communicate(timeout=120)
    asked = log.read_text()
    assert "torch==2.7.0 fbgemm-gpu-cpu==1.1.0 tensordict" in asked and "numpy==1.26.4" in asked, asked
    assert " numpy " not in asked, asked
    assert "+fbgemm-gpu-cpu=1.1.0+numpy=1.26.4+python=3.10+torch=2.7.0" in asked, asked
    assert "python3.10" in asked or "/3.10." in asked, asked


def test_a_set_the_table_cannot_complete_is_refused_before_anything_is_made(tmp_path):
    env, log = fake_uv(tmp_path)
    for spec, said in [("torchrec==1.2.0 fbgemm-gpu-cpu==0.0.9", "no row of torchrec_sut/pins.tsv pins fbgemm-gpu-cpu 0.0.9"),
                       ("torchrec==9.9.9", "torchrec 9.9.9 is not in torchrec_sut/pins.tsv"),
                       ("torchrec==1.2.0 fbgemm", "'fbgemm' is not NAME==VERSION")]:
        p = installer(tmp_path / "envs", spec, **env)
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 2 and said in out, (spec, out)
    assert not log.exists()
