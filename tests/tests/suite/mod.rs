//! The cases, by area.

mod acp;
mod agent;
mod approvals;
mod auth;
mod binaries;
mod bodies;
mod chat;
mod cli;
mod crash;
mod data_at_rest;
mod devices;
mod failover;
mod handshakes;
mod http;
mod limits;
mod mcp;
mod pg_store;
mod processes;
mod providers;
mod records;
mod resilience;
mod retention;
mod routing;
mod storage;
mod trust;
mod web;
