//! Integration tests of the sandbox on real files and real processes.
//!
//! One test binary (`all`) so the linker runs once; the cases live in `suite/`.

mod suite;
