//! Workspace-level integration tests: the real server and the real client over loopback QUIC.
//!
//! The end-to-end suites live in `tests/tests/`; the sandbox's own suites (escapes, races,
//! tools, commands) live in `sandbox/tests/`.
#![deny(missing_docs)]
