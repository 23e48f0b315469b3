//! End-to-end tests: the real server and the real client, over QUIC on loopback.
//!
//! One test binary (`all`) so the linker runs once; the cases live in `suite/`, grouped by what
//! they exercise. Every wait is bounded (see `monad_tests::within`), so a hang fails its test.

mod suite;
