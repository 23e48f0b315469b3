//! The Monad client: it attaches folders on this machine to sessions as restricted
//! workspaces, asks its user to approve what agents do there, and lets agents call tools.
//!
//! - [`config::ClientConfig`]: the server, its pinned certificate fingerprint, the token and this
//!   device's id, saved by `login`.
//! - [`connect`]: QUIC with the pinned certificate ([`connect::connect`]), then the hello.
//! - [`attach::attach`]: serve a folder ([`monad_sandbox::Sandbox`]) until stopped, reconnecting
//!   with backoff and re-attaching by itself; [`printer`] prints its events' lines without
//!   letting a stuck standard error hold up the folder or the exit.
//! - [`prompt`]: the text of an approval prompt, a pure function of the request.
//! - [`site`]: where a command's program is found (outside the workspace, in it, elsewhere),
//!   which decides what "always" may cover.
//! - [`login`]: where `login` takes the token from (flag, `MONAD_TOKEN`, standard input).
//! - [`approval`]: the approval policy, enforced here on the client, and the [`approval::Approver`]s
//!   that ask ([`terminal::TerminalApprover`] on the attach terminal,
//!   [`approval::ScriptedApprover`] for tests and automation).
//! - [`agent::Agent`]: call tools and list sessions, as `monad-client call` and the MCP bridge do.
//! - [`chat`]: `monad-client chat`, a terminal conversation with a session's built-in agent
//!   (slash commands, streamed answers, tool calls, approvals of folders attached from it).
//! - [`mcp`]: `monad-client mcp`, MCP over stdio for AI hosts, bridged to the server.
//! - [`acp`]: `monad-client acp`, an Agent Client Protocol agent over stdio for editors, bridged
//!   to the session's built-in agent on the server.
//! - [`call`]: what `monad-client call` prints (the text a model gets, or JSON) and its exit
//!   codes; the `tools` listing.
//! - [`interrupts`]: SIGINT, SIGTERM and SIGHUP for `call`, `mcp` and `acp`, which close their
//!   connection before exiting so that the server cancels their calls at once.
#![deny(missing_docs)]

use std::path::PathBuf;

use monad_protocol::{ErrorCode, ToolError};

pub mod acp;
pub mod agent;
pub mod approval;
pub mod attach;
pub mod call;
pub mod chat;
pub mod config;
pub mod connect;
pub mod interrupts;
pub mod login;
pub mod mcp;
pub mod printer;
pub mod prompt;
pub mod site;
pub mod terminal;

/// What can go wrong in the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `monad-client login` has not been run.
    #[error("not logged in (no token in {}); run `MONAD_TOKEN=TOKEN monad-client login --server HOST:PORT --fingerprint SHA256` first", .0.display())]
    NotLoggedIn(PathBuf),
    /// The client configuration is unreadable or invalid.
    #[error("config: {0}")]
    Config(String),
    /// The server presented a certificate other than the pinned one.
    #[error(
        "the server at {server} presented a certificate with fingerprint {presented}, but this \
         client trusts {expected}. If the server was reinstalled or its certificate replaced, \
         log in again with the fingerprint it prints at start-up (`monad-client login ... \
         --fingerprint NEW`); otherwise something may be impersonating it"
    )]
    FingerprintMismatch {
        /// The server address.
        server: String,
        /// The pinned fingerprint.
        expected: String,
        /// The fingerprint presented.
        presented: String,
    },
    /// The server refused (bad token, another user's session, bad request).
    #[error("the server refused: {}", .0.message)]
    Refused(ToolError),
    /// The server could not be reached, or the connection broke.
    #[error("cannot reach the server: {0}")]
    Unreachable(String),
    /// The server broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The folder to attach cannot be used.
    #[error("folder: {0}")]
    Folder(String),
    /// The terminal cannot be read (chat).
    #[error("terminal: {0}")]
    Terminal(String),
    /// The server ended an attachment: another `attach` of the folder took it over, or
    /// `monad-client detach` detached it. Not retried.
    #[error("detached: {0}")]
    Detached(String),
    /// Another host of the deployment serves the session, and keeps it: the folder attaches
    /// at `host` next.
    #[error("{reason}")]
    Elsewhere {
        /// That host's `HOST:PORT`, checked.
        host: String,
        /// Why, as the server said it.
        reason: String,
    },
}

impl ClientError {
    /// Errors that retrying cannot fix.
    pub fn is_fatal(&self) -> bool {
        match self {
            ClientError::Unreachable(_) | ClientError::Elsewhere { .. } => false,
            // A session another host serves now (it may let go of it, or the folder reaches
            // that host next): tried again.
            ClientError::Refused(e) => !matches!(
                e.code,
                ErrorCode::Internal | ErrorCode::WorkspaceDisconnected
            ),
            ClientError::NotLoggedIn(_)
            | ClientError::Config(_)
            | ClientError::FingerprintMismatch { .. }
            | ClientError::Protocol(_)
            | ClientError::Folder(_)
            | ClientError::Terminal(_)
            | ClientError::Detached(_) => true,
        }
    }
}
