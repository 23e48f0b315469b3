//! The Monad server: it owns each session's primary workspace and routes agents' tool calls.
//!
//! - [`server::Server`] binds the QUIC endpoint ([`tls`]: a self-signed certificate made on first
//!   start, whose SHA-256 clients pin), authenticates each connection's hello with a token
//!   ([`auth::TokenStore`], hashed in `tokens.toml`), and serves one request per stream.
//! - [`session::Registry`] holds the sessions: each has a primary workspace (a
//!   [`monad_sandbox::Sandbox`] at `sessions/<id>/workspace`) and the folders clients attached.
//! - [`executor::Executor`] routes a call ([`route::plan`], a pure function) and runs it in the
//!   primary workspace or on the attached client, relaying progress; it also answers the session
//!   tools (`workspaces`, `memory_store`, `memory_recall`).
//! - [`llm`]: the model providers (OpenAI-compatible Chat Completions, Anthropic Messages),
//!   streamed, with tool calling; [`agent`]: the built-in agent loop, one turn of a session's
//!   conversation at a time, its tool calls through the executor.
//! - [`mcp`] serves MCP over Streamable HTTP at `http://<--http>/mcp` for AI hosts, with the
//!   same tokens, calling the executor directly.
//! - [`cluster`]: several hosts on one PostgreSQL store: the lease that makes one host the
//!   owner of a live session ([`store::pg::lease`], fenced by an epoch), and calls for a session
//!   owned elsewhere forwarded to its owner over host-to-host QUIC (shared secret).
#![deny(missing_docs)]

use std::path::{Path, PathBuf};

pub mod admin;
pub mod admission;
pub mod agent;
pub mod auth;
pub mod cluster;
pub mod config;
pub mod executor;
pub mod feed;
pub mod fsutil;
pub mod http;
mod landing;
pub mod llm;
pub mod mcp;
pub mod quota;
pub mod recorder;
mod requests;
pub mod roots;
pub mod route;
pub mod server;
pub mod session;
pub mod settings;
pub mod state;
pub mod store;
pub mod tls;

pub use config::ServerConfig;
pub use server::{FirstStart, Server};

/// What can go wrong in the server outside a tool call.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A file or socket operation failed.
    #[error("cannot {op} {}: {error}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The underlying error, in the message only. (Not named `source`: thiserror would
        /// make a field of that name the error's source too, and a chain printed whole would
        /// say it twice.)
        error: std::io::Error,
    },
    /// A configuration or data file is malformed.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and key where known.
        message: String,
    },
    /// The certificate could not be made or loaded.
    #[error("TLS: {0}")]
    Tls(String),
    /// A value given on the command line or in a request is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// A peer broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
}

impl ServerError {
    /// An I/O error on `path`.
    pub fn io(op: &'static str, path: impl AsRef<Path>, error: std::io::Error) -> ServerError {
        ServerError::Io {
            op,
            path: path.as_ref().to_path_buf(),
            error,
        }
    }
}
