//! The cases, by area.

mod approvals;
mod auth;
mod binaries;
mod mcp;
mod resilience;
mod routing;
