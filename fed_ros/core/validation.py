"""Validation before use: every update, descriptor and cluster model is checked before it touches a model.

Pure functions the server and robot nodes call directly (no rclpy here; the nodes convert
messages into small envelopes). Each returns a :class:`Decision` (accept, or reject with a
machine-readable ``code`` and a human ``reason`` naming the offending value); nothing raises on
hostile input. The only state touched is the optional :class:`ReplayGuard`, and only when the
input is accepted (``commit=True``), so a rejected message changes nothing.

Order of checks (cheap first, so hostile bulk is refused before it is collected or decoded):
``check_update_envelope`` needs only the header/first chunk (round, deadline, sender, size cap,
exact manifest, sample-count cap, base round, signature, replay); ``validate_update`` adds the
checks on the decoded tensors (schema again, finite values, digest of the received bytes).
:class:`AuditLog` writes one JSON line per decision and keeps per-round counters for reports.

This module gathers the names of the modules that implement it, for callers that use several:

* :mod:`fed_ros.core.decisions`: :class:`Decision`, the reject codes, :class:`Limits`;
* :mod:`fed_ros.core.sender_checks`: :class:`ValidationContext`; sender, round, signature, replay;
* :mod:`fed_ros.core.payload_checks`: manifest and tensor checks, ``validate_cluster_model``;
* :mod:`fed_ros.core.update_checks`: :class:`UpdateEnvelope`, ``check_update_envelope``, ``validate_update``;
* :mod:`fed_ros.core.descriptor_checks`: ``validate_descriptor``, ``digest_of_descriptor``;
* :mod:`fed_ros.core.audit_log`: :class:`AuditLog`, :class:`RoundCounters`, ``read_audit_log``.
"""
from __future__ import annotations

from fed_ros.core.audit_log import AuditLog, RoundCounters, read_audit_log
from fed_ros.core.decisions import (ACCEPTED, BAD_SIGNATURE, DESCRIPTOR, DIGEST, DUPLICATE, FOREIGN_CHUNK, FUTURE,
                                    LATE, MALFORMED, NO_ROUND, NON_FINITE, NOT_PARTICIPANT, NUM_SAMPLES, OK,
                                    OUT_OF_RANGE, OVERSIZE, REPLAY, ROLLBACK, SCHEMA, SIZE_MISMATCH, STALE_BASE,
                                    STALE_ROUND, TRANSFER, UNKNOWN_ROBOT, UNREACHABLE, UNSIGNED, Decision, Limits)
from fed_ros.core.descriptor_checks import DESCRIPTOR_KINDS, digest_of_descriptor, validate_descriptor
from fed_ros.core.payload_checks import (BYTES_PER_VALUE, ENCODING_FLOAT16, ENCODING_FLOAT32, ENCODING_INT8,
                                         check_payload_manifest, check_tensors, compare_manifest,
                                         expected_payload_bytes, validate_cluster_model)
from fed_ros.core.sender_checks import ValidationContext
from fed_ros.core.update_checks import UpdateEnvelope, check_update_envelope, validate_update

__all__ = [
    "ACCEPTED", "BAD_SIGNATURE", "BYTES_PER_VALUE", "DESCRIPTOR", "DESCRIPTOR_KINDS", "DIGEST", "DUPLICATE",
    "ENCODING_FLOAT16", "ENCODING_FLOAT32", "ENCODING_INT8", "FOREIGN_CHUNK", "FUTURE", "LATE", "MALFORMED",
    "NON_FINITE", "NOT_PARTICIPANT", "NO_ROUND", "NUM_SAMPLES", "OK", "OUT_OF_RANGE", "OVERSIZE", "REPLAY",
    "ROLLBACK", "SCHEMA", "SIZE_MISMATCH", "STALE_BASE", "STALE_ROUND", "TRANSFER", "UNKNOWN_ROBOT",
    "UNREACHABLE", "UNSIGNED", "AuditLog", "Decision", "Limits", "RoundCounters", "UpdateEnvelope",
    "ValidationContext", "check_payload_manifest", "check_tensors", "check_update_envelope", "compare_manifest",
    "digest_of_descriptor", "expected_payload_bytes", "read_audit_log", "validate_cluster_model",
    "validate_descriptor", "validate_update",
]
