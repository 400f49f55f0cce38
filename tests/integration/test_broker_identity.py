"""Identity files of a broker: format, atomic writes, refusal of a foreign identity, failpoints."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rmqha.failpoints import ENV_VAR, FAILPOINT_EXIT_CODE, Failpoint
from rmqha.broker.identity import META_FILE, TEMP_META_FILE, IdentityStore, new_register_code
from rmqha.errors import BrokerIdentityError, CheckpointError


def test_meta_and_temp_files_use_rocketmq_layout(tmp_path):
    store = IdentityStore(tmp_path, "DefaultCluster", "broker-a")
    assert store.read_meta() is None and store.read_temp() is None
    code = new_register_code("127.0.0.1:10911")
    assert code.split(";")[0] == "127.0.0.1:10911"
    store.write_temp(3, code)
    assert (tmp_path / TEMP_META_FILE).read_text() == f"DefaultCluster#broker-a#3#{code}"
    temp = store.read_temp()
    assert (temp.broker_id, temp.register_code) == (3, code)
    meta = store.commit_meta(3)
    assert (tmp_path / META_FILE).read_text() == "DefaultCluster#broker-a#3"
    assert not (tmp_path / TEMP_META_FILE).exists()
    assert store.read_meta() == meta
    # No scratch file is left behind by the atomic writer.
    assert sorted(p.name for p in tmp_path.iterdir()) == [META_FILE]


def test_register_codes_are_unique_per_attempt():
    codes = {new_register_code("127.0.0.1:1") for _ in range(100)}
    assert len(codes) == 100


@pytest.mark.parametrize("file_name, content", [
    (META_FILE, "OtherCluster#broker-a#1"),
    (META_FILE, "DefaultCluster#broker-b#1"),
    (TEMP_META_FILE, "DefaultCluster#broker-b#1#127.0.0.1:1;1;ab"),
])
def test_foreign_identity_is_refused_naming_both_values(tmp_path, file_name, content):
    (tmp_path / file_name).write_text(content)
    store = IdentityStore(tmp_path, "DefaultCluster", "broker-a")
    with pytest.raises(BrokerIdentityError) as info:
        store.read_meta() if file_name == META_FILE else store.read_temp()
    msg = str(info.value)
    stored_cluster, stored_name = content.split("#")[:2]
    for value in (stored_cluster, stored_name, "DefaultCluster", "broker-a"):
        assert repr(value) in msg


@pytest.mark.parametrize("content", ["garbage", "c#b#x", "c#b#0", "c#b", ""])
def test_corrupt_meta_file_is_an_error_not_a_new_identity(tmp_path, content):
    (tmp_path / META_FILE).write_text(content)
    with pytest.raises(CheckpointError):
        IdentityStore(tmp_path, "c", "b").read_meta()


def test_names_that_cannot_be_stored_are_refused(tmp_path):
    with pytest.raises(BrokerIdentityError):
        IdentityStore(tmp_path, "a#b", "broker")


def test_scratch_left_by_a_crash_mid_write_is_ignored_and_removed(tmp_path):
    (tmp_path / (TEMP_META_FILE + ".tmp")).write_text("c#b#9#half")
    store = IdentityStore(tmp_path, "c", "b")
    assert store.read_temp() is None
    store.clean_scratch()
    assert list(tmp_path.iterdir()) == []


def _run_with_failpoint(tmp_path, point: str, script: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV_VAR: point})
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)


def test_failpoint_during_temp_write_leaves_no_temp_file(tmp_path):
    script = (
        "from rmqha.broker.identity import IdentityStore\n"
        f"IdentityStore({str(tmp_path)!r}, 'c', 'b').write_temp(1, 'addr;1;x')\n"
        "print('not reached')\n"
    )
    proc = _run_with_failpoint(tmp_path, Failpoint.DURING_TEMP_META_WRITE.value, script)
    assert proc.returncode == FAILPOINT_EXIT_CODE, proc.stderr
    assert "not reached" not in proc.stdout
    assert "failpoint during_temp_meta_write hit" in proc.stderr
    store = IdentityStore(tmp_path, "c", "b")
    assert store.read_temp() is None  # the scratch copy never counted
    assert (tmp_path / (TEMP_META_FILE + ".tmp")).exists()


def test_failpoint_between_meta_write_and_temp_removal_keeps_both_files(tmp_path):
    script = (
        "from rmqha.broker.identity import IdentityStore\n"
        f"s = IdentityStore({str(tmp_path)!r}, 'c', 'b')\n"
        "s.write_temp(4, 'addr;1;x')\n"
        "s.commit_meta(4)\n"
    )
    proc = _run_with_failpoint(tmp_path, Failpoint.AFTER_META_WRITTEN.value, script)
    assert proc.returncode == FAILPOINT_EXIT_CODE, proc.stderr
    store = IdentityStore(tmp_path, "c", "b")
    assert store.read_meta().broker_id == 4
    assert store.read_temp().broker_id == 4


def test_unlisted_failpoints_do_not_fire(tmp_path):
    script = (
        "from rmqha.broker.identity import IdentityStore\n"
        f"s = IdentityStore({str(tmp_path)!r}, 'c', 'b')\n"
        "s.write_temp(4, 'addr;1;x')\n"
        "s.commit_meta(4)\n"
        "print('done')\n"
    )
    proc = _run_with_failpoint(tmp_path, "after_register_broker", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
