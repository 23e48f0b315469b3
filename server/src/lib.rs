//! The Monad server: it owns each session's primary workspace and routes agents' tool calls.
//!
//! This crate is the home of the QUIC endpoint, authentication, the session registry, the
//! `ToolExecutor` and the storage backends. So far it holds no behaviour of its own: the
//! workspace tools it will route run in [`monad_sandbox::Sandbox`].
#![deny(missing_docs)]

pub use monad_sandbox::Sandbox;
