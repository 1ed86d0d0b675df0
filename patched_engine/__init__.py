"""The patched engine: a libcst codemod of sglang's ``nixl/conn.py``, its diff, apply and verification.

Modules load on demand (libcst is heavy): ``patched_engine.codemod.patch_source``,
``patched_engine.apply.apply_file``, ``patched_engine.verify.verify_release``.
"""
