"""The code the codemod inserts into a release's ``nixl/conn.py``, as reviewable templates.

Everything here is written into sglang's own file, so it may only use what that file
already has in scope (``logger``, ``KVPoll``, ``GUARD``, ``self``); it never imports
PD Forensics: a patched engine must run where this project is not installed.
Templates use 4-space indentation; ``str.format`` fills the few per-release parts.
"""

from __future__ import annotations

PATCH_ID = "nixl-bootstrap-hardening/1"
SENTINEL_NAME = "PD_FORENSICS_PATCH"
MARK = "# pd-forensics patch:"

ABORT_HANDLER_NAME = "_pd_forensics_handle_abort"
FRAME_ROOM_HELPER_NAME = "_pd_forensics_frame_room"

# Module level, right after ``GUARD = ...``: the sentinel that makes the codemod
# idempotent (and lets a deployed file be recognised), plus the helper the per-message
# except clause uses to name the room in its log line.
MODULE_PRELUDE = f'''
{MARK} this file is patched; running the codemod again changes nothing.
{SENTINEL_NAME} = "{PATCH_ID}"


def {FRAME_ROOM_HELPER_NAME}(frames):
    """Best-effort room of a decode->prefill message, for log lines only (pd-forensics patch)."""
    try:
        start = 1 if frames[0] in (GUARD, b"ABORT") else 0
        return int(frames[start].decode("ascii"))
    except Exception:
        return None
'''

# Step 1, a method of NixlKVManager (written inside a class so that the docstring's
# indentation is the one it will have in the file). ``{record_failure}`` and ``{mark_failed}`` differ per
# release: record_failure exists from 0.5.3, and before 0.5.6 ``update_status`` keeps the
# max of old and new, so Failed (0) could never override and is written directly.
ABORT_HANDLER = '''
class NixlKVManager:
    {mark} handler for the decode-side ABORT (sglang 0.5.16 added its own).
    def {name}(self, msg):
        """Decode-side ABORT (``[b"ABORT", room, ip, port]``): fail the room, keep the loop alive.

        Added by the pd-forensics patch ({patch_id}). Mirrors the Mooncake prefill
        handler (sglang 0.5.13+) and sglang's own NIXL fix (0.5.16): a known room that has
        not reached Success becomes Failed; anything else is ignored. No ABORT_ACK is sent:
        this release's NIXL decode does not read one (sglang 0.5.16 sends none either).
        Each ABORT is logged at INFO so that the fix is visible at the default log level.
        """
        try:
            room = int(msg[1].decode("ascii"))
        except Exception as e:
            logger.warning(
                f"Ignoring malformed abort notification ({{len(msg)}} parts): {{e!r}}"
            )
            return
        if room in self.request_status and self.check_status(room) != KVPoll.Success:
{record_failure}{mark_failed}            logger.info(
                f"Received abort notification for room {{room}}, marked as Failed"
            )
        else:
            logger.info(
                f"Received abort notification for room {{room}}, "
                f"ignoring (already completed or unknown)"
            )
'''

RECORD_FAILURE = (
    '            self.record_failure(room, "Aborted by decode-side abort notification.")\n'
)
MARK_FAILED_VIA_UPDATE_STATUS = "            self.update_status(room, KVPoll.Failed)\n"
MARK_FAILED_DIRECTLY = (
    "            # This release's update_status keeps the max status, so Failed (0) would\n"
    "            # never override Bootstrapping (1): write it directly.\n"
    "            self.request_status[room] = KVPoll.Failed\n"
)

# Step 1, in the loop, right before the GUARD check.
ABORT_BRANCH = '''
{mark} the decode's ABORT (sent from 0.5.13) must not reach the GUARD check.
if {frames}[0] == b"ABORT":
    self.{handler}({frames})
    continue
'''

# Step 2, replaces ``assert frames[0] == GUARD, "... Foreign traffic?"``.
GUARD_CHECK = '''
{mark} drop a foreign frame with a warning; never kill the thread.
if {frames}[0] != GUARD:
    logger.warning(
        f"Dropping a message on the bootstrap socket whose first part is "
        f"{{{frames}[0][:64]!r}} ({{len({frames})}} parts): first part should be {{GUARD}}"
    )
    continue
'''

# Step 3: wraps everything after ``recv_multipart()``; ``pass`` is replaced by the loop body.
PER_MESSAGE_TRY = '''
{mark} one try per message: no single frame can end this loop.
try:
    pass
except Exception:
    logger.exception(
        f"Dropping a bootstrap message that could not be handled "
        f"(room={{{helper}({frames})}}, {{len({frames})}} parts); the bootstrap thread keeps running"
    )
'''

# Step 5, before the first unguarded ``self.transfer_infos[room]`` read of add_transfer_request.
CLEARED_ROOM_GUARD = '''
{mark} skip a cleared room instead of a KeyError in the scheduler.
if {room} not in self.transfer_infos:
    logger.warning(
        f"Skipping KV transfer for room {{{room}}}: its transfer info has been cleared"
    )
    return {empty}
'''
