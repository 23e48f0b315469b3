//! The shared state of a running server, below both fronts (QUIC in [`crate::server`], HTTP
//! and MCP in [`crate::mcp`] and [`crate::http`]): tokens, sessions, the executor, the built-in
//! agent's turns, the event feed, and the counters that bound what each user has in flight.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use monad_protocol::{ErrorCode, ToolError};
use tokio::sync::watch;

use crate::admission::Admissions;
use crate::auth::TokenStore;
use crate::config::ServerConfig;
use crate::executor::Executor;
use crate::quota::{PerUser, Slot};
use crate::session::Registry;

/// Shared state of a running server.
#[derive(Debug)]
pub struct State {
    /// Server settings.
    pub config: ServerConfig,
    /// Tokens.
    pub tokens: TokenStore,
    /// Sessions.
    pub registry: Registry,
    /// Routing and execution.
    pub executor: Executor,
    /// The built-in agent's turns (one at a time per session).
    pub agents: crate::agent::Agents,
    /// What happens in sessions as the store writes it (for the HTTP front's event streams).
    pub feed: crate::feed::Feed,
    pub(crate) generations: AtomicU64,
    /// Agents' calls in flight; on shutdown, attached clients stay until it is zero.
    pub(crate) calls: watch::Sender<usize>,
    /// Turns true when the start-up housekeeping of the data dir is done.
    pub(crate) housekeeping: watch::Sender<bool>,
    /// QUIC connections per user.
    pub(crate) connections: Arc<PerUser>,
    /// Tool calls in flight per user (QUIC and HTTP).
    pub(crate) user_calls: Arc<PerUser>,
    /// QUIC requests being read per user (bounded like calls in flight).
    pub(crate) user_reads: Arc<PerUser>,
    /// Connections that have not said hello yet.
    pub(crate) handshakes: Arc<Admissions>,
}

impl State {
    /// Resolves once the start-up housekeeping of the data dir (modes, stale temporary files,
    /// the session index) is done.
    pub async fn housekeeping(&self) {
        let mut done = self.housekeeping.subscribe();
        let _ = done.wait_for(|done| *done).await;
    }

    /// One of `user`'s slots for a tool call in flight, or `limit_exceeded` when they have
    /// `server.max_calls_per_user` in flight already (over every connection and HTTP).
    pub(crate) fn user_call(&self, user: &str) -> Result<Slot, ToolError> {
        self.user_calls.try_acquire(user).ok_or_else(|| {
            ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {} tool calls in flight, this server's limit \
                     (server.max_calls_per_user); wait for some to finish, then retry",
                    self.user_calls.limit()
                ),
            )
        })
    }

    /// One of `user`'s slots for a request being read, or `limit_exceeded` saying which
    /// setting bounds them.
    pub(crate) fn user_read(&self, user: &str) -> Result<Slot, ToolError> {
        self.user_reads.try_acquire(user).ok_or_else(|| {
            ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {} requests still arriving, this server's limit \
                     (server.max_calls_per_user); send whole requests, then retry",
                    self.user_reads.limit()
                ),
            )
        })
    }

    /// Counts an agent's call in [`State::calls`] until the guard is dropped: at shutdown,
    /// attached clients stay connected while calls still need them.
    pub(crate) fn call_in_flight(&self) -> CallInFlight<'_> {
        self.calls.send_modify(|n| *n += 1);
        CallInFlight(self)
    }
}

/// Counts an agent's call out of [`State::calls`] when dropped.
pub(crate) struct CallInFlight<'a>(&'a State);

impl Drop for CallInFlight<'_> {
    fn drop(&mut self) {
        self.0.calls.send_modify(|n| *n -= 1);
    }
}
