"""Finding the sglang a deployment really runs: the engine's own interpreter answers.

``PYTHON -c LOCATE_SCRIPT [SGLANG_LOCATION]`` runs on the engine's host with the engine's
interpreter (the inventory's ``python``; ``python3`` when none is given). It never imports
sglang (``importlib.util.find_spec`` only), so it is quick and safe on a GPU host, and
prints one JSON object: the package directory, the release (``importlib.metadata`` of the
distribution in that directory, else sglang's own ``_version.py``), and for
``sglang/srt/disaggregation/nixl/conn.py``: its real path, owner, group, mode, size,
sha256, change time (``ctime_ns``: what the running engine's start time is compared with),
whether its directory is writable (by this user; on a read-only file system or an immutable
directory by nobody, root included), its bytecode files, the pd-forensics backups and records
beside it, and whether a killed deploy left its temporary file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from forensics.exitcodes import EnvironmentProblem
from forensics.hosts import CommandResult, Host

CONN_RELATIVE = "srt/disaggregation/nixl/conn.py"  # under the sglang package directory

# Runs on the target's interpreter (Python 3.8 or later): keep it plain.
LOCATE_SCRIPT = r'''
import glob, hashlib, importlib.util, json, os, re, sys
loc = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else None
if loc:
    sys.path.insert(0, loc)
out = {"python": sys.executable, "python_version": "%d.%d.%d" % tuple(sys.version_info[:3]),
       "cache_tag": sys.implementation.cache_tag, "location": loc, "uid": os.getuid(), "gid": os.getgid(),
       "groups": sorted(set(os.getgroups()))}
spec = importlib.util.find_spec("sglang")
pkg = list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else None
out["package_dir"] = pkg
version = source = None
if pkg:
    site = os.path.dirname(pkg)
    try:
        import importlib.metadata as md
        for dist in md.distributions(path=[site]):
            if (dist.metadata["Name"] or "").lower().replace("_", "-") == "sglang":
                version, source = dist.version, "importlib.metadata"
                break
    except Exception:
        pass
    if version is None:
        for name in ("_version.py", "version.py"):
            try:
                with open(os.path.join(pkg, name), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            m = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?["']([^"']+)["']""",
                          text)
            if m and not m.group(1).startswith("0.0.0"):
                version, source = m.group(1), "sglang/" + name
                break
    conn = os.path.join(pkg, "srt", "disaggregation", "nixl", "conn.py")
    out["conn"] = conn
    if os.path.exists(conn):
        real = os.path.realpath(conn)
        st = os.stat(real)
        with open(real, "rb") as handle:
            data = handle.read()
        d = os.path.dirname(real)
        n = os.path.basename(real)
        backups = []
        for b in sorted(glob.glob(os.path.join(d, n + ".pd-forensics-backup-*"))):
            stamp = b.rsplit(".pd-forensics-backup-", 1)[1]
            rec = os.path.join(d, n + ".pd-forensics-record-" + stamp + ".json")
            try:
                with open(rec, encoding="utf-8") as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                record = None
            with open(b, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            backups.append({"path": b, "record": rec if record is not None else None, "recorded": record,
                            "sha256": digest})
        try:
            readonly = bool(os.statvfs(d).f_flag & os.ST_RDONLY)
        except OSError:
            readonly = None
        immutable = None
        try:  # FS_IOC_GETFLAGS; FS_IMMUTABLE_FL (0x10) or FS_APPEND_FL (0x20): even root cannot rename there
            import array, fcntl
            fd = os.open(d, os.O_RDONLY)
            try:
                flags = array.array("l", [0])
                fcntl.ioctl(fd, 0x80086601, flags, True)
                immutable = bool(flags[0] & 0x30)
            finally:
                os.close(fd)
        except Exception:
            pass
        out["file"] = {"path": real, "symlink": real != conn, "uid": st.st_uid, "gid": st.st_gid,
                       "mode": st.st_mode & 0o7777, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                       "mtime": st.st_mtime, "ctime_ns": st.st_ctime_ns, "dir_writable": os.access(d, os.W_OK),
                       "dir_readonly_fs": readonly, "dir_immutable": immutable,
                       "pycache": sorted(glob.glob(os.path.join(d, "__pycache__", "conn.*.pyc"))),
                       "backups": backups,
                       "stale_temp": os.path.exists(os.path.join(d, "." + n + ".pd-forensics-deploy.tmp"))}
out["version"] = version
out["version_source"] = source
print(json.dumps(out))
'''


def locate_argv(python: str | None, location: str | None) -> list[str]:
    argv = [python or "python3", "-c", LOCATE_SCRIPT]
    if location:
        argv.append(location)
    return argv


@dataclass
class Located:
    """What the engine's interpreter says about its sglang and its nixl/conn.py."""

    python: str
    package_dir: str | None
    version: str | None
    version_source: str | None
    conn: str | None
    file: dict[str, Any] | None
    raw: dict[str, Any] = field(default_factory=dict)
    result: CommandResult | None = None

    @property
    def path(self) -> str:
        assert self.file is not None
        return self.file["path"]


def locate(host: Host, python: str | None, location: str | None, *, label: str,
           timeout: float = 120.0) -> Located:
    result = host.run(locate_argv(python, location), timeout=timeout)
    if not result.ok:
        why = (result.stderr_text.strip().splitlines() or [result.error or result.state.value])[-1]
        state = result.state.value + (f" (exit {result.exit_code})" if result.exit_code is not None else "")
        raise EnvironmentProblem(f"{label}: cannot ask {python or 'python3'} on {host.name} where sglang is: "
                                 f"{state}: {why}")
    try:
        data = json.loads(result.stdout_text.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise EnvironmentProblem(f"{label}: {python} answered no JSON: {result.stdout_text[-200:]!r}") from exc
    if not data.get("package_dir"):
        where = f" (nor in {location})" if location else ""
        raise EnvironmentProblem(f"{label}: {data.get('python') or python} has no sglang package{where}")
    if location and not data["package_dir"].startswith(location.rstrip("/") + "/"):
        raise EnvironmentProblem(f"{label}: the inventory says sglang is in {location}, but "
                                 f"{data.get('python')} finds it in {data['package_dir']}")
    if data.get("file") is None:
        raise EnvironmentProblem(f"{label}: {data.get('conn')}: no such file (is this a NIXL install?)")
    return Located(python=data.get("python") or python or "python3", package_dir=data["package_dir"],
                   version=data.get("version"), version_source=data.get("version_source"),
                   conn=data.get("conn"), file=data.get("file"), raw=data, result=result)
