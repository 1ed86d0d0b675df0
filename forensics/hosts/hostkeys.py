"""Strict host keys: known_hosts only; an unknown or changed key is refused with its fingerprint.

Fingerprints read as OpenSSH prints them (``SHA256:`` + unpadded base64 of the key's
SHA-256), so the operator can compare them with ``ssh-keygen -lf`` on the server.
"""

from __future__ import annotations

import base64
import hashlib

import paramiko

from ..exitcodes import EnvironmentProblem


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` as ``ssh-keygen -l`` and OpenSSH's prompts print it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class HostKeyRefused(EnvironmentProblem):
    """The server's host key did not match known_hosts (unknown or changed); nothing was sent to it."""

    def __init__(self, message: str, *, host: str, key_type: str, fingerprint: str, known_hosts: str | None) -> None:
        super().__init__(message, path=known_hosts)
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint


class UnknownHostKey(HostKeyRefused):
    pass


class ChangedHostKey(HostKeyRefused):
    def __init__(self, message: str, *, expected_fingerprint: str, **kw) -> None:
        super().__init__(message, **kw)
        self.expected_fingerprint = expected_fingerprint


class RefuseUnknownPolicy(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, refusing with the fingerprint and the way to accept it knowingly."""

    def __init__(self, known_hosts: str | None) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:
        fp = fingerprint(key)
        where = self.known_hosts or "(no known_hosts file)"
        raise UnknownHostKey(
            f"unknown host key for {hostname}: {key.get_name()} {fp} is not in {where}; "
            f"verify it out of band (ssh-keygen -lf on the server), then add it to known_hosts",
            host=hostname, key_type=key.get_name(), fingerprint=fp, known_hosts=self.known_hosts,
        )


def changed_key_error(exc: paramiko.BadHostKeyException, host: str, known_hosts: str | None) -> ChangedHostKey:
    got, expected = fingerprint(exc.key), fingerprint(exc.expected_key)
    return ChangedHostKey(
        f"host key for {host} CHANGED: the server presents {exc.key.get_name()} {got} but "
        f"{known_hosts or 'known_hosts'} has {exc.expected_key.get_name()} {expected}; refusing "
        f"(someone may be intercepting, or the host was rebuilt: check before editing known_hosts)",
        host=host, key_type=exc.key.get_name(), fingerprint=got, known_hosts=known_hosts,
        expected_fingerprint=expected,
    )
