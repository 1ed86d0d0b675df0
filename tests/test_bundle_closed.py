"""Bundles are closed worlds and private, and writing one never costs what was collected (issue 19).

* a manifest whose frame paths lead outside the bundle (``..``, absolute, a symbolic link) is
  refused naming the manifest and the entry, before any file is opened;
* bundles, reports and crash files are 0600 files in 0700 folders, whatever the umask;
* a full disk (a real tmpfs) is exit 4 naming the file, no ``.tmp`` is left, and the frames
  written stay listed in a manifest;
* ``collect --out`` naming a folder that already holds a bundle is refused before a single
  request reaches the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import one_document, run_forensics
from fake_engine_helpers import FakeEngine, local_inventory

import forensics.bundle as bundle
from forensics.bundle import BundleError
from forensics.evidence import Evidence, Gap

pytestmark = pytest.mark.timeout(300)


def _evidence(rows: int = 4) -> Evidence:
    events = pd.DataFrame({"engine": pd.array(["decode-0"] * rows, dtype="string"),
                           "line": pd.array(range(rows), dtype="Int64")})
    probes = pd.DataFrame({"kind": pd.array(["health"] * rows, dtype="string"), "n": list(range(rows))})
    return Evidence(deployment={"name": "d"}, frames={"events": events, "probes": probes},
                    gaps=[Gap("logs", "router-0 (local)", "journalctl not found")], commands=[],
                    window={"since": None, "until": None}, collected_at="2026-11-30T03:01:00+00:00")


def _edit_manifest(folder: Path, **files: str) -> None:
    """Point frame entries elsewhere, with the sha256 of what they now point at (as a forger would)."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for name, file in files.items():
        target = Path(file) if file.startswith("/") else folder / file
        manifest["frames"][name]["file"] = file
        if target.is_file():
            manifest["frames"][name]["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
    path.write_text(json.dumps(manifest))


# ------------------------------------------------------------------------------ closed world


def test_a_frame_of_another_bundle_is_not_taken_as_this_ones(tmp_path):
    mine = bundle.write(_evidence(4), tmp_path / "mine")
    other = bundle.write(_evidence(9), tmp_path / "other")
    _edit_manifest(mine, events="../other/frames/events.parquet")
    with pytest.raises(BundleError, match=r"mine/manifest\.json: frames\.events\.file '\.\./other/frames/events"
                                          r"\.parquet' is not a plain relative name inside the bundle"):
        bundle.open(mine)
    assert len(bundle.open(other).frames["events"]) == 9  # the other one is fine on its own


def test_an_absolute_path_is_refused_alike_whether_the_file_exists_or_not(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    messages = []
    for target in (secret, tmp_path / "no-such-file"):
        folder = bundle.write(_evidence(), tmp_path / f"b-{target.name}")
        _edit_manifest(folder, events=str(target))
        with pytest.raises(BundleError) as caught:
            bundle.open(folder)
        messages.append(str(caught.value).replace(target.name, "X").replace(folder.name, "B"))
        assert f"frames.events.file '{target}'" in str(caught.value) and "refused before opening" in str(caught.value)
    assert messages[0] == messages[1]  # nothing tells whether the file exists


def test_a_symbolic_link_leading_out_is_refused(tmp_path):
    outside = bundle.write(_evidence(7), tmp_path / "outside")
    folder = bundle.write(_evidence(), tmp_path / "b")
    shutil.rmtree(folder / "frames")
    (folder / "frames").symlink_to(outside / "frames")  # the manifest still says frames/events.parquet
    _edit_manifest(folder, events="frames/events.parquet", probes="frames/probes.parquet")
    with pytest.raises(BundleError, match=r"manifest\.json: frames\.\w+\.file 'frames/\w+\.parquet' leads outside "
                                          r"the bundle"):
        bundle.open(folder)


def test_the_manifest_is_checked_before_any_frame_is_opened(tmp_path):
    folder = bundle.write(_evidence(), tmp_path / "b")
    manifest = json.loads((folder / "manifest.json").read_text())
    # The first entry's file is damaged (opening it would say "checksum mismatch"); the second leads out.
    (folder / manifest["frames"]["events"]["file"]).write_bytes(b"damaged")
    manifest["frames"]["probes"]["file"] = "/etc/passwd"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"frames\.probes\.file '/etc/passwd' is not a plain relative name"):
        bundle.open(folder)


def test_diagnose_refuses_a_bundle_leading_out_with_exit_4_naming_manifest_and_entry(tmp_path):
    folder = bundle.write(_evidence(), tmp_path / "b")
    _edit_manifest(folder, events="/etc/hostname")
    done = run_forensics("diagnose", "--bundle", str(folder), "--json")
    assert done.returncode == 4, done.stderr
    doc = one_document(done.stdout)
    assert doc["exit"] == 4 and f"{folder}/manifest.json: frames.events.file '/etc/hostname'" in doc["error"]


# ------------------------------------------------------------------------------ modes


def _modes(folder: Path) -> dict[str, int]:
    paths = [folder, *folder.rglob("*")]
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in paths}


def _umask_022():
    os.umask(0o022)


def test_collect_report_and_crash_files_are_private_whatever_the_umask(tmp_path):
    with FakeEngine() as engine:
        inventory = local_inventory(tmp_path / "inventory.toml", engine)
        out = tmp_path / "bundle"
        done = subprocess.run([sys.executable, "-m", "forensics", "collect", "--inventory", str(inventory),
                               "--out", str(out), "--sample", "1s", "--json"], capture_output=True, text=True,
                              timeout=240, preexec_fn=_umask_022)
    assert done.returncode in (0, 3), done.stderr
    modes = _modes(out)
    assert "frames/probes.parquet" in modes and "manifest.json" in modes
    assert {name: mode for name, mode in modes.items() if mode != ((out / name).is_dir() and 0o700 or 0o600)} == {}

    script = ("import sys, forensics as fx; from forensics.report import Investigation, write_report\n"
              "inv = Investigation(sys.argv[1], target='local-fake')\n"
              "inv.add_bundle(sys.argv[2]); inv.add_verdict(fx.diagnose(bundle=sys.argv[2]))\n"
              "write_report(inv, sys.argv[3], formats='md,html')\n")
    report = tmp_path / "investigation" / "report"
    built = subprocess.run([sys.executable, "-c", script, str(tmp_path / "investigation"), str(out), str(report)],
                           capture_output=True, text=True, timeout=240, preexec_fn=_umask_022)
    assert built.returncode == 0, built.stderr
    report_modes = _modes(report)
    assert "report.md" in report_modes and "report.html" in report_modes
    assert {n: m for n, m in report_modes.items() if m != ((report / n).is_dir() and 0o700 or 0o600)} == {}
    investigation = tmp_path / "investigation"
    inv_modes = _modes(investigation)
    assert "investigation.toml" in inv_modes and "verdicts/incident.json" in inv_modes
    assert "evidence/incident/frames/probes.parquet" in inv_modes
    assert {n: m for n, m in inv_modes.items() if m != ((investigation / n).is_dir() and 0o700 or 0o600)} == {}


def test_an_investigation_copies_only_what_the_manifest_lists(tmp_path):
    from forensics.report import Investigation

    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash\n")
    folder = bundle.write(_evidence(), tmp_path / "b")
    (folder / "extra").symlink_to(secret)
    (folder / "frames" / "more.parquet").symlink_to(secret)
    inv = Investigation(tmp_path / "inv", target="t")
    inv.add_bundle(folder)
    copied = sorted(str(p.relative_to(tmp_path / "inv" / "evidence" / "incident"))
                    for p in (tmp_path / "inv" / "evidence" / "incident").rglob("*"))
    assert copied == ["frames", "frames/events.parquet", "frames/probes.parquet", "manifest.json"]


def test_a_crash_file_is_private(tmp_path):
    cache = tmp_path / "cache"
    script = ("from forensics.cli.contract import save_crash\n"
              "try:\n    raise RuntimeError('boom')\nexcept RuntimeError as exc:\n"
              "    print(save_crash(exc, ['collect', '--api-key', 'Qzs3cretWv']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PD_FORENSICS_CACHE": str(cache)}, preexec_fn=_umask_022)
    saved = Path(done.stdout.strip())
    assert saved.is_file(), done.stderr
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    assert "Qzs3cretWv" not in saved.read_text() and "boom" in saved.read_text()


# ------------------------------------------------------------------------------ a full disk


@pytest.fixture
def small_tmpfs(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)], check=True, timeout=60)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=60)


def _fill(mount_point: Path, leave: int) -> None:
    """Fill the filesystem until ``leave`` bytes are free."""
    free = shutil.disk_usage(mount_point).free
    (mount_point / "filler").write_bytes(b"\0" * max(0, free - leave))


def test_a_full_disk_is_exit_4_naming_the_file_and_keeps_what_was_written(tmp_path, small_tmpfs):
    _fill(small_tmpfs, 64 * 1024)
    out = small_tmpfs / "bundle"
    # A small frame first (fits), then one too big for what is left.
    big = pd.DataFrame({"raw": pd.array([os.urandom(64).hex() for _ in range(4000)], dtype="string")})
    evidence = _evidence()
    evidence.frames["events"] = big
    script = ("import pickle, sys\nfrom forensics.cli.contract import run\nimport click\n"
              "import forensics.bundle as b\n"
              "from forensics.exitcodes import ForensicsError\n"
              "evidence = pickle.load(open(sys.argv[1], 'rb'))\n"
              "try:\n    b.write(evidence, sys.argv[2])\nexcept ForensicsError as exc:\n"
              "    print(int(exc.exit_status)); print(exc)\n")
    pickled = tmp_path / "evidence.pickle"
    pd.to_pickle(evidence, pickled)
    done = subprocess.run([sys.executable, "-c", script, str(pickled), str(out)], capture_output=True, text=True,
                          timeout=120)
    status, message = done.stdout.split("\n", 1)
    assert status == "4", done.stdout + done.stderr
    assert f"{out}/frames/events.parquet" in message and "No space left on device" in message
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], sorted(out.rglob("*"))
    # The frame that fitted is kept and listed; the manifest says which one is not.
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "unwritten" and manifest["exit"] == 4
    assert set(manifest["unwritten_frames"]) == {"events"} and "probes" in manifest["frames"]
    with pytest.raises(BundleError, match="could not be written"):
        bundle.open(out)
    assert len(bundle.open(out, partial=True).frames["probes"]) == 4


def test_collect_onto_a_full_disk_exits_4_naming_the_path(tmp_path, small_tmpfs):
    _fill(small_tmpfs, 8 * 1024)
    out = small_tmpfs / "bundle"
    with FakeEngine() as engine:
        inventory = local_inventory(tmp_path / "inventory.toml", engine)
        done = run_forensics("collect", "--inventory", str(inventory), "--out", str(out), "--sample", "1s", "--json")
    assert done.returncode == 4, done.stderr
    doc = one_document(done.stdout)
    assert str(out) in doc["error"] and "No space left on device" in doc["error"], doc
    assert "internal error" not in done.stderr
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")], sorted(out.rglob("*"))


# ------------------------------------------------------------------------------ --out


@pytest.mark.parametrize("holds", ["a bundle", "a file"])
def test_collect_refuses_a_used_out_before_any_request(tmp_path, holds):
    out = tmp_path / "out"
    if holds == "a bundle":
        bundle.write(_evidence(), out)
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = sorted(p.name for p in out.rglob("*"))
    with FakeEngine() as engine:
        inventory = local_inventory(tmp_path / "inventory.toml", engine)
        done = run_forensics("collect", "--inventory", str(inventory), "--out", str(out), "--sample", "2s", "--json")
        seen = list(engine.requests)
    assert done.returncode == 4, done.stderr
    doc = one_document(done.stdout)
    assert f"{out}: exists and is not an empty folder" in doc["error"]
    assert seen == [], f"collect sent {len(seen)} request(s) before refusing --out: {seen[:5]}"
    assert sorted(p.name for p in out.rglob("*")) == before
