//! The Monad protocol: what travels between agents, the server and attached clients.
//!
//! This crate holds data and pure functions only, no I/O:
//!
//! - [`address`]: `HOST:PORT` as a client logs in to it and a host of a deployment advertises
//!   it, checked the same way everywhere.
//! - [`agent`]: the built-in agent's turn as data: the events a front sees while it runs and
//!   how it ended.
//! - [`tools`]: the tool contract. [`tools::ToolName`] names every tool and gives its approval
//!   class ([`tools::ToolClass`]), a description for models and the JSON Schema of its
//!   arguments, generated from the typed argument structs so schema and code never drift.
//! - [`error`]: the wire error, a stable [`error::ErrorCode`] plus a sentence, kept apart from
//!   the internal error types of the other crates.
//! - [`wire`]: the messages of the QUIC protocol ([`wire::Message`]), the ALPN and versions.
//! - [`frame`]: how messages are cut into length-prefixed frames, as pure functions on byte
//!   slices; [`io`] (feature `tokio`) reads and writes them on async streams.
//! - [`values`]: how many values a JSON document holds, counted without making a tree of it,
//!   for a reader that looks before it makes one of what a peer sent.
//! - [`render`]: tool results as text written for a model (numbered file lines, one entry per
//!   line, `path:line: text` matches, exit status then output), which the MCP front and
//!   `monad-client call` share; and tools' arguments described for people.
//! - [`text`]: text from agents and peers made safe for a terminal (control, escape, bidi and
//!   zero-width characters shown as visible escapes), used by the client and the server.
//! - `output` (feature `cli`): standard output and error for the binaries, without a panic when
//!   the reader went away (`| head`).
//! - `mcp` (feature `mcp`): the MCP front both transports share: tool descriptors, results,
//!   and the rmcp handler over a transport's backend.
//! - `pin` and `stream` (feature `quic`): the QUIC client configuration that accepts one
//!   certificate and the endpoint's socket; letting go of a request's receive stream without
//!   telling its peer to stop.
#![deny(missing_docs)]

pub mod address;
pub mod agent;
pub mod error;
pub mod frame;
#[cfg(feature = "tokio")]
pub mod io;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "cli")]
pub mod output;
#[cfg(feature = "quic")]
pub mod pin;
pub mod render;
pub mod roots;
#[cfg(feature = "cli")]
pub mod settings_file;
#[cfg(feature = "quic")]
pub mod stream;
pub mod text;
pub mod tools;
pub mod values;
pub mod wire;

pub use error::{ErrorCode, ToolError};
pub use tools::{ToolClass, ToolName};
