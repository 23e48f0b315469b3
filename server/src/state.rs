//! The shared state of a running server, below both fronts (QUIC in [`crate::server`], HTTP
//! and MCP in [`crate::mcp`] and [`crate::http`]): tokens, sessions, the executor, the built-in
//! agent's turns, the event feed, and the counters that bound what each user has in flight.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use monad_protocol::wire::WorkspaceInfo;
use monad_protocol::{ErrorCode, ToolError};
use serde_json::Value;
use tokio::sync::watch;

use crate::admission::Admissions;
use crate::auth::{DeviceId, TokenStore};
use crate::cluster::{Origin, Route};
use crate::config::ServerConfig;
use crate::executor::link::counted;
use crate::executor::{CallOutput, Executor, ProgressSink};
use crate::quota::{Held, PerUser, Slot};
use crate::session::{Registry, Session};
use monad_sandbox::AuditAllowance;

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
    /// Several hosts on one PostgreSQL store: leases and forwarding (none with the filesystem
    /// store).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
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
    /// Requests working on the store per user (`max_store_work_per_user`): [`State::store_turn`].
    pub(crate) store_work: crate::quota::Turns,
    /// The built-in agent's turns running per user (`max_turns_per_user`): [`State::agent_turn`].
    pub(crate) agent_turns: Arc<PerUser>,
    /// Bytes each user's calls hold in memory: their requests and the trees they become, and
    /// their attached clients' answers ([`crate::executor::link::CALL_MEMORY`]).
    pub(crate) call_bytes: Arc<PerUser>,
    /// Bytes each user's calls' records hold while they wait for the recorder to write them
    /// ([`crate::recorder::Recorder::counting`]), bounded like `call_bytes` but apart from it:
    /// a record never refuses an answer; a user at the bound has their next calls refused.
    pub(crate) record_bytes: Arc<PerUser>,
    /// Connections that have not said hello yet.
    pub(crate) handshakes: Arc<Admissions>,
    /// Per user, how many of their attached folders' network reports the audit log may still
    /// take: one allowance over all their attach streams ([`State::network_line`]).
    pub(crate) network_reports: std::sync::Mutex<std::collections::HashMap<String, AuditAllowance>>,
    /// The hashes of the tokens as the last sweep read them ([`crate::server`]'s, every 5 s;
    /// none before the first): a connection whose token is not among them is closed.
    pub(crate) valid_tokens: watch::Sender<Option<Arc<std::collections::HashSet<String>>>>,
    /// The background processes each token's calls started in primary workspaces, by the
    /// token's hash: ended when it is revoked ([`State::end_revoked_processes`]).
    pub(crate) started_by_token: std::sync::Mutex<std::collections::HashMap<String, Started>>,
    /// Per user: held while a search of theirs reads their conversations (the web view's). A
    /// search may read all of them (a word in none is looked for everywhere), so a user runs
    /// one at a time; another asked meanwhile is refused, not a second reader of everything.
    pub searching: crate::quota::UserLocks<std::sync::Mutex<()>>,
}

/// A token's user and the background processes its calls started (at most
/// [`STARTED_PER_TOKEN`], the oldest forgotten first).
#[derive(Debug, Default)]
pub(crate) struct Started {
    user: String,
    processes: std::collections::VecDeque<StartedProcess>,
}

/// Where a background process a token's call started runs, and its id.
#[derive(Debug)]
enum StartedProcess {
    /// In a primary workspace served here: the sandbox it runs in.
    Here(std::sync::Weak<monad_sandbox::Sandbox>, String),
    /// In the primary workspace (`workspace`, its URI) of `session`, served by another host
    /// the call was forwarded to: that host has no token to end it by, so it is ended through
    /// a call routed as any other (to whichever host serves the session then).
    Forwarded {
        session: String,
        workspace: String,
        process: String,
        /// Kills tried that could not be made (the user's call slots full, the host out of
        /// reach): tried again at the next sweeps, [`FORWARDED_KILL_TRIES`] times in all.
        tries: u8,
    },
}

/// How many sweeps of the tokens try to end one forwarded process.
const FORWARDED_KILL_TRIES: u8 = 3;

impl StartedProcess {
    /// False once it surely ended (it exited, or its sandbox is gone); a forwarded one cannot
    /// be told. A sandbox looked at is put in `looked`, for the caller to drop once it holds no
    /// lock: the last reference to one ends its processes and removes its files.
    fn may_run(&self, looked: &mut Vec<Arc<monad_sandbox::Sandbox>>) -> bool {
        match self {
            StartedProcess::Here(sandbox, id) => sandbox.upgrade().is_some_and(|sandbox| {
                let runs = sandbox.runs_process(id);
                looked.push(sandbox);
                runs
            }),
            StartedProcess::Forwarded { .. } => true,
        }
    }
}

/// Most background processes remembered per token: those that ended are let go first, then
/// the oldest forwarded one (whose end this host cannot tell), then the oldest. Where each
/// user's commands have a group of their own, a token's processes running here are bounded by
/// its user's (`server.max_processes_per_user`, 4096 by default), so one of them is let go only
/// past that; without the groups, or with that bound raised, past 4096 running.
const STARTED_PER_TOKEN: usize = 4096;

/// A request's turn at the store ([`State::store_turn`]), given back when dropped: held by the
/// work itself, to its end.
#[derive(Debug)]
pub(crate) struct StoreTurn {
    _call: Slot,
    _work: crate::quota::Turn,
}

impl State {
    /// Resolves once the start-up housekeeping of the data dir (modes, stale temporary files,
    /// the session index) is done.
    pub async fn housekeeping(&self) {
        let mut done = self.housekeeping.subscribe();
        let _ = done.wait_for(|done| *done).await;
    }

    /// `Err` when `user`'s calls' records waiting to be written hold their bound: their calls
    /// wait for the store to catch up, rather than the records piling up without bound.
    fn records_written(&self, user: &str) -> Result<(), ToolError> {
        let limit = self.record_bytes.limit();
        if self.record_bytes.held(user) < limit {
            return Ok(());
        }
        Err(ToolError::new(
            ErrorCode::LimitExceeded,
            format!(
                "your calls' records waiting to be written to the store hold {}, this server's \
                 limit (server.max_call_bytes_per_user); wait for the store to catch up",
                shown_bytes(limit)
            ),
        ))
    }

    /// The bytes `user`'s calls' records waiting to be written hold now.
    pub fn record_bytes_held(&self, user: &str) -> usize {
        self.record_bytes.held(user)
    }

    /// The bytes `user`'s calls hold in memory now, as `server.max_call_bytes_per_user` counts
    /// them.
    pub fn call_bytes_held(&self, user: &str) -> usize {
        self.call_bytes.held(user)
    }

    /// A slot for one of `user`'s tool calls, from any front (QUIC, HTTP, MCP, the built-in
    /// agent): one of their requests in flight ([`State::user_call`]), refused too while the
    /// records of their calls waiting for the store hold their limit.
    pub(crate) fn tool_call(&self, user: &str) -> Result<Slot, ToolError> {
        let slot = self.user_call(user)?;
        self.records_written(user)?;
        Ok(slot)
    }

    /// One of `user`'s slots for a request in flight (a tool call, or the store work of another
    /// request), or `limit_exceeded` when they have `server.max_calls_per_user` in flight
    /// already (over every connection and HTTP).
    pub(crate) fn user_call(&self, user: &str) -> Result<Slot, ToolError> {
        self.user_calls.try_acquire(user).ok_or_else(|| {
            ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {} requests in flight (tool calls, listings, reads of \
                     conversations and logs), this server's limit (server.max_calls_per_user); \
                     wait for some to finish, then retry",
                    self.user_calls.limit()
                ),
            )
        })
    }

    /// Whether the audit log takes one more line of `user`'s attached folders' network
    /// reports at `now`: a burst, then a few a second, over all their attach streams (a new
    /// stream, or many at once, bring no allowance of their own).
    pub(crate) fn network_line(&self, user: &str, now: std::time::Instant) -> bool {
        let mut all = self
            .network_reports
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match all.get_mut(user) {
            Some(allowance) => allowance.take(now),
            None => all.entry(user.to_owned()).or_default().take(now),
        }
    }

    /// One of `user`'s requests in flight (`limit_exceeded` past `server.max_calls_per_user`),
    /// then one of their turns at the store (`server.max_store_work_per_user` at once; as many
    /// more wait for one to end, and the next is refused), for a request whose work is the store's (a listing, a
    /// conversation, a log, an artifact). The store's work runs on the blocking threads and the
    /// database connections every user shares: one user's 256 requests in flight took half the
    /// blocking threads while everyone else's waited.
    pub(crate) async fn store_turn(&self, user: &str) -> Result<StoreTurn, ToolError> {
        let call = self.user_call(user)?;
        let Some(work) = self.store_work.take(user).await else {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {n} requests working on the store (listings, conversations, logs, \
                     artifacts) and {n} more waiting for their turn, this server's limit \
                     (server.max_store_work_per_user); wait for some to finish, then retry",
                    n = self.store_work.limit()
                ),
            ));
        };
        Ok(StoreTurn {
            _call: call,
            _work: work,
        })
    }

    /// One of `user`'s turns of the built-in agent, held while the turn runs, or
    /// `limit_exceeded` naming the setting: each turn talks to the model with the operator's
    /// key, and one user's turns in 256 sessions at once spent the key's rate limit while
    /// every other user's turns were refused by the provider.
    pub(crate) fn agent_turn(&self, user: &str) -> Result<Slot, ToolError> {
        self.agent_turns.try_acquire(user).ok_or_else(|| {
            ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {} turns of the built-in agent running in your sessions, this \
                     server's limit (server.max_turns_per_user); wait for one to end or cancel \
                     one, then send this again",
                    self.agent_turns.limit()
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

/// How a front names the session a request is for.
#[derive(Debug, Clone, Copy)]
pub enum Lookup<'a> {
    /// The QUIC front's rule ([`Registry::resolve`]): an id, a unique prefix of one or
    /// `default`, binding the device to it; without one, the session the device is bound to,
    /// else the user's default.
    Resolve {
        /// The session the request names, if any.
        requested: Option<&'a str>,
        /// The connection's device, when it has one.
        device: Option<&'a DeviceId>,
    },
    /// The HTTP front's rule: the session with exactly this id, `default` meaning the user's
    /// own ([`Registry::open_own`]), else the user's default (HTTP has no device to bind).
    Open(Option<&'a str>),
}

pub(crate) use monad_protocol::values::MAX_REQUEST_VALUES;
use monad_protocol::values::VALUE_BYTES;
/// Requests of at most this many bytes are not counted value by value: they are taken to hold
/// one value per two bytes.
const COUNTED_FROM: usize = 16 * 1024;

/// What the tree of the request `json` would take in memory beyond its bytes, counted before it
/// is made (a document of small numbers holds a value for every two of its bytes), or why it
/// is refused: more than [`MAX_REQUEST_VALUES`] values. A body that is not JSON is counted as
/// the most its tree could take: a reader makes a tree of what comes before the fault.
fn tree_bytes(json: &[u8]) -> Result<usize, serde_json::Error> {
    let most = (json.len() / 2 + 1).saturating_mul(VALUE_BYTES);
    if json.len() <= COUNTED_FROM {
        return Ok(most);
    }
    match monad_protocol::values::tree_bytes(json, MAX_REQUEST_VALUES) {
        Err(e) if !e.is_data() => Ok(most),
        counted => counted,
    }
}

/// Why a request's body was not taken in its user's memory ([`hold_request`]).
pub(crate) enum NotHeld {
    /// It holds more JSON values than any request takes.
    TooManyValues(serde_json::Error),
    /// It would take its user's calls past `server.max_call_bytes_per_user`.
    OverMemory(ToolError),
}

/// Takes in `memory` the tree the request `json` will become, counted before it is made (its
/// bytes were counted as they arrived).
pub(crate) fn hold_request(memory: &Held, json: &[u8]) -> Result<(), NotHeld> {
    let tree = tree_bytes(json).map_err(NotHeld::TooManyValues)?;
    if memory.take(tree) {
        Ok(())
    } else {
        Err(NotHeld::OverMemory(over_call_memory(
            memory.limit(),
            "the request",
        )))
    }
}

/// Most JSON values of a result a front makes a tree of ([`tree_held`]): a Monad client's results
/// hold a few values each (a listing's entries are one string), a search's some thousands.
pub(crate) const MAX_RESULT_VALUES: usize = 4_000_000;

/// `outcome` for a front that makes a tree of its result (MCP over HTTP, the built-in agent):
/// the tree of a result relayed as text is counted in `memory` before it is made, as a
/// request's is ([`hold_request`]). Past [`MAX_RESULT_VALUES`] or the user's bound it becomes a
/// `limit_exceeded` error: a result of 200 MiB of small numbers, counted as its 200 MiB of
/// text, made a tree of several GiB.
pub(crate) fn tree_held(
    memory: &Held,
    outcome: monad_protocol::wire::Outcome,
) -> monad_protocol::wire::Outcome {
    use monad_protocol::wire::Outcome;
    let Outcome::Ok { result } = &outcome else {
        return outcome;
    };
    let Some(text) = result.text() else {
        return outcome;
    };
    let refused = match monad_protocol::values::tree_bytes(text.as_bytes(), MAX_RESULT_VALUES) {
        Ok(bytes) if memory.take(bytes) => return outcome,
        Ok(_) => over_call_memory(memory.limit(), "the answer, made a tree of,"),
        Err(e) => ToolError::new(
            ErrorCode::LimitExceeded,
            format!("the answer cannot be passed on: {e}"),
        ),
    };
    Outcome::Error { error: refused }
}

/// The error of a request, or an answer, that would take its user's calls past what they may
/// hold in memory (`what`: "the request", "the answer from `lap`").
pub(crate) fn over_call_memory(limit: usize, what: &str) -> ToolError {
    ToolError::new(
        ErrorCode::LimitExceeded,
        format!(
            "{what} would take your calls past {} in this server's memory, its limit \
             (server.max_call_bytes_per_user); wait for other calls to finish, or send or ask \
             for less at once",
            shown_bytes(limit)
        ),
    )
}

/// A bound in bytes as a message shows it: in MiB from 1 MiB on.
fn shown_bytes(bytes: usize) -> String {
    if bytes >= 1024 * 1024 {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

/// Holds what an agent's call counts against while it runs: one of the user's call slots and
/// the server's count of calls in flight (at shutdown, attached clients stay while it is not
/// zero), and the bytes its request and its answer hold in memory. Before the answer goes out,
/// [`CallGuard::answering`]; once it is written, body included, [`CallGuard::answered`].
pub(crate) struct CallGuard<'a> {
    slot: Option<Slot>,
    _in_flight: CallInFlight<'a>,
    memory: Arc<Held>,
}

impl CallGuard<'_> {
    /// The answer is about to go out: the call's slot goes now. Its agent may make its next
    /// call (from this connection or another) as soon as it has read the answer, before this
    /// task goes on, and must not find this one still counted against its limit.
    pub(crate) fn answering(&mut self) {
        self.slot = None;
    }

    /// The answer is written, body included: the count in flight goes (the attached client
    /// that relayed the body is no longer needed); what the answer holds in memory stays
    /// counted, returned, while it waits in the stream's buffers to be acknowledged.
    pub(crate) fn answered(self) -> Arc<Held> {
        self.memory
    }
}

impl State {
    /// The session `lookup` means for `user`: from memory when it is loaded and nothing needs
    /// writing (the common case: an agent naming its session call after call), else looked up
    /// on the blocking pool, since opening a session that is not in memory reads (or creates,
    /// with an fsync) its metadata in the store, and binding a device may write the bindings.
    /// That work waits for one of the user's turns at the store (`max_store_work_per_user`),
    /// held by it to its end even when the request is dropped before: a lookup by name reads
    /// every session of the user's, and prompts, workspace listings and watches, which take no
    /// call slot, or calls cancelled at once, piled such lookups up on the pool and the
    /// database connections every user shares. It waits however many wait, never refused: a
    /// lookup is part of a call (which holds a call slot), an attach or a small request, each
    /// bounded where it comes in, and refusing one failed a legitimate burst (folders
    /// attaching again after a restart, whose client gives up on a refusal).
    pub(crate) async fn session(
        self: &Arc<Self>,
        user: &str,
        lookup: Lookup<'_>,
    ) -> Result<Arc<Session>, ToolError> {
        let in_memory = match lookup {
            Lookup::Resolve { requested, device } => {
                self.registry.resolve_in_memory(requested, user, device)
            }
            Lookup::Open(Some(id)) => self.registry.resolve_in_memory(Some(id), user, None),
            Lookup::Open(None) => None,
        };
        if let Some(found) = in_memory {
            return found;
        }
        type Work = Box<dyn FnOnce(&Registry, &str) -> Result<Arc<Session>, ToolError> + Send>;
        let work: Work = match lookup {
            Lookup::Resolve { requested, device } => {
                let requested = requested.map(str::to_owned);
                let device = device.cloned();
                Box::new(move |registry, user| {
                    registry.resolve(requested.as_deref(), user, device.as_ref())
                })
            }
            Lookup::Open(Some(id)) => {
                let id = id.to_owned();
                Box::new(move |registry, user| registry.open_own(&id, user))
            }
            Lookup::Open(None) => Box::new(|registry, user| registry.resolve(None, user, None)),
        };
        let turn = self.store_work.wait_for(user).await;
        let (state, user) = (self.clone(), user.to_owned());
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            work(&state.registry, &user)
        })
        .await
        .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())))
    }

    /// Where a call for `session` runs ([`crate::cluster::Cluster::route`]: always here with
    /// one host). Run here, the session is first read again from the store when this host took
    /// its lease since its copy was read ([`State::fresh`]).
    pub(crate) async fn route(
        self: &Arc<Self>,
        session: &Arc<Session>,
        origin: Origin,
    ) -> Result<Route, ToolError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Route::Local);
        };
        let route = cluster.route(&session.id, origin).await?;
        if matches!(route, Route::Local) {
            self.fresh(session).await?;
        }
        Ok(route)
    }

    /// Once this host holds the lease of `session`: when the lease's epoch is not the one its
    /// copy was read at (the lease was taken since: another host may have held the session and
    /// changed it), the record is read again ([`Registry::refresh`]), so that this host neither
    /// works on nor saves an older copy. Calls meanwhile wait for it; one that fails is tried
    /// again by the next call.
    pub(crate) async fn fresh(self: &Arc<Self>, session: &Arc<Session>) -> Result<(), ToolError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let Some(epoch) = cluster.store().held_epoch(&session.id) else {
            return Ok(());
        };
        let mut read_at = session.read_at_epoch().await;
        if *read_at == Some(epoch) {
            return Ok(());
        }
        let (state, copy) = (self.clone(), session.clone());
        tokio::task::spawn_blocking(move || state.registry.refresh(&copy))
            .await
            .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())))?;
        *read_at = Some(epoch);
        Ok(())
    }

    /// An agent's tool call, as both fronts make it: one of `user`'s call slots, the session
    /// `lookup` means, counted in flight, then [`Executor::call`]. The guard goes with the
    /// answer: drop it once the answer (and its body) is sent.
    pub(crate) async fn call(
        self: &Arc<Self>,
        caller: (&str, Option<&str>),
        lookup: Lookup<'_>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
        memory: Option<Arc<Held>>,
    ) -> Result<(CallOutput, CallGuard<'_>), ToolError> {
        self.call_from(Origin::Agent, caller, lookup, tool, args, progress, memory)
            .await
    }

    /// [`State::call`] for a call from `origin`. With several hosts on one store, the call runs
    /// where its session is served ([`crate::cluster::Cluster::route`]): here (this host holds
    /// or takes the session's lease), or forwarded to the host that holds it, as `user`; a call
    /// another host forwarded here is never forwarded again. `memory` counts what the call's
    /// request and answers hold in memory (the request's share already taken; `None`: a count
    /// of its own, from nothing), until the guard goes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call_from(
        self: &Arc<Self>,
        origin: Origin,
        (user, token): (&str, Option<&str>),
        lookup: Lookup<'_>,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
        memory: Option<Arc<Held>>,
    ) -> Result<(CallOutput, CallGuard<'_>), ToolError> {
        let slot = self.tool_call(user)?;
        let memory = memory.unwrap_or_else(|| Arc::new(self.call_bytes.holder(user)));
        let session = self.session(user, lookup).await?;
        let in_flight = self.call_in_flight();
        let route = self.route(&session, origin).await?;
        let output = match (route, &self.cluster) {
            (Route::Forward { address }, Some(cluster)) => {
                let id = session.id.clone();
                let primary = session.primary_uri();
                drop(session);
                let background = may_outlive_its_call(tool, &args);
                let forward = cluster.forward(&address, user, &id, tool, args, progress);
                let output = counted(&memory, forward).await?;
                if let Some(token) = token.filter(|_| background)
                    && let Some(process) = started_in(&output, &primary)
                {
                    let forwarded = StartedProcess::Forwarded {
                        session: id,
                        workspace: primary,
                        process,
                        tries: 0,
                    };
                    self.remember_started(token, user, forwarded);
                }
                output
            }
            _ => {
                let background = may_outlive_its_call(tool, &args);
                let call = self.executor.call(&session, tool, args, progress);
                let output = counted(&memory, call).await;
                if let Some(token) = token.filter(|_| background) {
                    self.note_started(token, user, &session, &output).await;
                }
                // The session is not needed any more (a body's recording holds its own
                // reference): it goes before the answer, so the agent's next request finds it
                // unused.
                drop(session);
                output
            }
        };
        let guard = CallGuard {
            slot: Some(slot),
            _in_flight: in_flight,
            memory,
        };
        Ok((output, guard))
    }
}

pub(crate) use monad_protocol::tools::may_outlive_its_call;

/// The id of the background process `output` says was started, when it was started in the
/// primary workspace whose URI is `primary`.
fn started_in(output: &CallOutput, primary: &str) -> Option<String> {
    if output.workspace.as_ref().map(|w| w.uri.as_str()) != Some(primary) {
        return None;
    }
    let monad_protocol::wire::Outcome::Ok { result } = &output.outcome else {
        return None;
    };
    result
        .value()
        .get("process")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

impl State {
    /// Notes the background process a `run_command` with the token whose hash is `token`
    /// started, when it ran in `session`'s primary workspace, so that it ends when the token is
    /// revoked.
    pub(crate) async fn note_started(
        &self,
        token: &str,
        user: &str,
        session: &Arc<Session>,
        output: &CallOutput,
    ) {
        let Some(process) = started_in(output, &session.primary_uri()) else {
            return;
        };
        let Ok(sandbox) = session.primary.sandbox().await else {
            return;
        };
        let here = StartedProcess::Here(Arc::downgrade(&sandbox), process);
        self.remember_started(token, user, here);
    }

    /// Remembers `process`, started with the token whose hash is `token`, of `user`.
    fn remember_started(&self, token: &str, user: &str, process: StartedProcess) {
        // Dropped after the lock (declared before it).
        let mut looked = Vec::new();
        let mut started = self
            .started_by_token
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = started.entry(token.to_owned()).or_default();
        entry.user = user.to_owned();
        entry.processes.retain(|p| p.may_run(&mut looked));
        if entry.processes.len() >= STARTED_PER_TOKEN {
            let oldest = entry
                .processes
                .iter()
                .position(|p| matches!(p, StartedProcess::Forwarded { .. }))
                .unwrap_or(0);
            entry.processes.remove(oldest);
        }
        entry.processes.push_back(process);
    }

    /// Ends the background processes started with a token the sweep no longer finds among
    /// `valid` (and the store, asked once more, does not know: one created after the sweep's
    /// read is not among them). Revoking a token (a leaked one) cuts off what runs with it, not
    /// only its connections: a loop it left running in a primary workspace ran on until the
    /// server stopped.
    pub(crate) async fn end_revoked_processes(
        self: &Arc<Self>,
        valid: &std::collections::HashSet<String>,
    ) {
        let missing: Vec<(String, String)> = self
            .started_by_token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(token, _)| !valid.contains(*token))
            .map(|(token, started)| (token.clone(), started.user.clone()))
            .collect();
        for (token, user) in missing {
            if crate::server::token_still_valid(self, token.clone(), &user).await {
                continue;
            }
            let Some(started) = self
                .started_by_token
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&token)
            else {
                continue;
            };
            // On a task of its own: a forwarded kill is a call to another host, and a token's
            // thousands of them must not hold up the sweep that enforces the other revokes.
            let state = self.clone();
            tokio::spawn(async move {
                let mut ended = 0;
                for process in started.processes {
                    if state.end_started(&user, &token, process).await {
                        ended += 1;
                    }
                }
                if ended > 0 {
                    tracing::info!(
                        %user,
                        ended,
                        "ended the background processes a revoked token's calls started"
                    );
                }
            });
        }
    }

    /// Kills `process`, of `user`; true when it was running. One started through a forwarded
    /// call is killed by a call routed to the host serving its session (recorded there, as
    /// the call that started it was).
    ///
    /// A kill that could not be made is remembered again under `token`, for the next sweeps;
    /// one of a session deleted meanwhile is not made (a call would create it again, empty).
    async fn end_started(
        self: &Arc<Self>,
        user: &str,
        token: &str,
        process: StartedProcess,
    ) -> bool {
        let kill = |process: &str| serde_json::json!({"process": process, "signal": "KILL"});
        match process {
            StartedProcess::Here(sandbox, process) => match sandbox.upgrade() {
                Some(sandbox) => sandbox
                    .call(monad_protocol::ToolName::ProcessKill, kill(&process))
                    .await
                    .is_ok(),
                None => false,
            },
            StartedProcess::Forwarded {
                session,
                workspace,
                process,
                tries,
            } => {
                // Tried again at the next sweep: the kill could not be made now.
                let retry = |session, workspace, process| {
                    let again = StartedProcess::Forwarded {
                        session,
                        workspace,
                        process,
                        tries: tries + 1,
                    };
                    self.try_again(token, user, again);
                    false
                };
                let store = self.registry.store().clone();
                let id = session.clone();
                match tokio::task::spawn_blocking(move || store.load(&id)).await {
                    Ok(Ok(Some(_))) => {}
                    // Deleted: so are its processes (a session with one running is not).
                    Ok(Ok(None)) => return false,
                    Ok(Err(_)) | Err(_) => return retry(session, workspace, process),
                }
                let mut args = kill(&process);
                args["workspace"] = Value::String(workspace.clone());
                let call = self.call_from(
                    Origin::Agent,
                    (user, None),
                    Lookup::Open(Some(&session)),
                    monad_protocol::ToolName::ProcessKill.as_str(),
                    args,
                    &|_: &str| {},
                    None,
                );
                match call.await {
                    Ok((output, _guard)) => {
                        matches!(output.outcome, monad_protocol::wire::Outcome::Ok { .. })
                    }
                    Err(e) => {
                        tracing::warn!(
                            %user,
                            %session,
                            %process,
                            "cannot end a revoked token's background process yet: {}",
                            e.message
                        );
                        retry(session, workspace, process)
                    }
                }
            }
        }
    }

    /// Remembers a forwarded process whose kill could not be made under its revoked `token`
    /// again, for the next sweep, unless it was tried [`FORWARDED_KILL_TRIES`] times.
    fn try_again(&self, token: &str, user: &str, process: StartedProcess) {
        match &process {
            StartedProcess::Forwarded { tries, process, .. } if *tries >= FORWARDED_KILL_TRIES => {
                tracing::warn!(
                    %user,
                    %process,
                    "gave up ending a revoked token's background process on another host"
                );
            }
            _ => self.remember_started(token, user, process),
        }
    }
}

/// The workspaces of a session as the fronts list them.
pub fn listing(session: &Session) -> Vec<WorkspaceInfo> {
    session.workspaces().into_iter().map(|w| w.info).collect()
}

/// Follows a session's workspaces for a front's watch: [`WorkspaceWatch::listing`] now, and
/// [`WorkspaceWatch::changed`] resolves at each change after the last look.
#[derive(Debug)]
pub struct WorkspaceWatch {
    session: Arc<Session>,
    changes: watch::Receiver<u64>,
}

impl WorkspaceWatch {
    /// Starts following `session`.
    pub fn new(session: Arc<Session>) -> WorkspaceWatch {
        let changes = session.subscribe();
        WorkspaceWatch { session, changes }
    }

    /// The session followed.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// The workspaces now.
    pub fn listing(&self) -> Vec<WorkspaceInfo> {
        listing(&self.session)
    }

    /// Resolves when the workspaces changed since the last look: `false` when they never will
    /// again (the session is gone).
    pub async fn changed(&mut self) -> bool {
        self.changes.changed().await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: ending a revoked token's process started through a forwarded call opened
    /// its session by id, which creates one it does not find: a session deleted since (gc,
    /// `session delete`) came back, empty, at the revoke, and counted against its user's
    /// sessions. A session gone is not opened; its processes went with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forwarded_process_of_a_deleted_session_does_not_bring_it_back() {
        let (_data, server) = crate::server::bound_for_test();
        let state = server.state().clone();
        let id = "4b7f3d2e-9c1a-4e5b-8f6d-2a3b4c5d6e7f";
        let process = StartedProcess::Forwarded {
            session: id.into(),
            workspace: format!("server:/sessions/{id}"),
            process: "p1".into(),
            tries: 0,
        };
        assert!(!state.end_started("ana", "a-token-hash", process).await);
        assert!(state.registry.store().load(id).unwrap().is_none());
        assert!(
            state.started_by_token.lock().unwrap().is_empty(),
            "nothing to try again"
        );

        // A kill that cannot be made now (every call slot of its user taken, as a revoked
        // token's calls may hold them) is tried again at the next sweep, not forgotten.
        let session = state.registry.create("ana").unwrap();
        let slots: Vec<_> = std::iter::from_fn(|| state.user_call("ana").ok()).collect();
        assert!(!slots.is_empty());
        let process = StartedProcess::Forwarded {
            session: session.id.clone(),
            workspace: session.primary_uri(),
            process: "p1".into(),
            tries: 0,
        };
        assert!(!state.end_started("ana", "a-token-hash", process).await);
        let started = state.started_by_token.lock().unwrap();
        let again: Vec<u8> = started["a-token-hash"]
            .processes
            .iter()
            .map(|p| match p {
                StartedProcess::Forwarded { tries, .. } => *tries,
                StartedProcess::Here(..) => 0,
            })
            .collect();
        assert_eq!(again, [1]);
    }

    /// Regression: a token's processes that ended were kept while their sandbox lived, so a
    /// leaked token could run short commands until its long one was forgotten, which then ran
    /// on after the token was revoked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tokens_running_process_is_not_forgotten_for_those_that_ended() {
        let (_data, server) = crate::server::bound_for_test();
        let state = server.state().clone();
        let session = state.registry.create("ana").unwrap();
        let sandbox = session.primary.sandbox().await.unwrap();
        let run = |argv: &[&str]| {
            sandbox.call(
                monad_protocol::ToolName::RunCommand,
                serde_json::json!({"argv": argv, "background": true}),
            )
        };
        let started = run(&["sleep", "600"]).await.unwrap();
        let long = started["process"].as_str().unwrap().to_owned();
        let here = |id: &str| StartedProcess::Here(Arc::downgrade(&sandbox), id.to_owned());
        state.remember_started("a-token-hash", "ana", here(&long));
        // One that ran and ended, then as many more as the token keeps (ended too).
        let short = run(&["true"]).await.unwrap();
        let short = short["process"].as_str().unwrap().to_owned();
        while sandbox.runs_process(&short) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        for _ in 0..=STARTED_PER_TOKEN {
            state.remember_started("a-token-hash", "ana", here(&short));
        }
        let started = state.started_by_token.lock().unwrap();
        let kept: Vec<&str> = started["a-token-hash"]
            .processes
            .iter()
            .filter_map(|p| match p {
                StartedProcess::Here(_, id) => Some(id.as_str()),
                StartedProcess::Forwarded { .. } => None,
            })
            .collect();
        assert_eq!(
            kept.len(),
            2,
            "{} kept; the first: {:?}",
            kept.len(),
            kept.first()
        );
        assert_eq!(kept, [long.as_str(), short.as_str()]);
        drop(started);
        sandbox.end_processes();
    }
}
