//! The cases, by area.

mod approvals;
mod auth;
mod binaries;
mod bodies;
mod crash;
mod mcp;
mod records;
mod resilience;
mod retention;
mod routing;
mod storage;
mod trust;
