//! The QUIC endpoint: hello and authentication, then one task per request stream.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use monad_protocol::io::{ReadError, read_frames, read_message, write_message};
use monad_protocol::wire::{self, Message, Role, reset};
use monad_protocol::{ErrorCode, ToolError};
use monad_sandbox::exec::cgroup::{self, ProcessGroups};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use crate::ServerError;
use crate::admission::{Admissions, Admitted, Bounds, Outcome, Source};
use crate::auth::{DeviceId, validate_client_name};
use crate::cluster::{AttachAt, Origin};
use crate::config::ServerConfig;
use crate::executor::Executor;
use crate::quota::{Held, PerUser, Slot};
use crate::recorder::Recorder;
use crate::session::{Attached, ClientLink, Registry, Session};
use crate::settings::{Layers, PromptOverrides, ServerSettings, Settings};
use crate::state::NotHeld;
use crate::store::FsStore;
use crate::tls;

pub use crate::state::State;
use crate::state::{Lookup, WorkspaceWatch, listing};

/// Largest hello accepted.
const MAX_HELLO: usize = 64 * 1024;
/// Largest request accepted: a 16 MiB write (the default `write_max_bytes`) as JSON, with room
/// for escapes. Requests are buffered whole, so this bounds memory per request.
const MAX_REQUEST: usize = 40 * 1024 * 1024;
/// Longest wait for the peer to acknowledge an answer before its stream is left behind.
const ANSWER_ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// QUIC application close codes.
const CLOSE_REFUSED: u32 = 1;
const CLOSE_SHUTDOWN: u32 = 2;
/// The connection's token was revoked.
const CLOSE_REVOKED: u32 = 3;
/// The code a folder's connection is closed with when this host finds that another host took
/// its session's lease over: its client reconnects, and attaches where the session is served.
const CLOSE_MOVED: u32 = 4;

/// How often the tokens are looked at for one revoked since ([`sweep_tokens`]).
pub(crate) const TOKEN_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the token whose hash is `token` still belongs to `user`. Looked up on the blocking
/// pool, since a PostgreSQL store answers with a query. One that cannot be read counts as valid
/// (the failure is logged): a store that cannot be reached for a moment does not cut everyone
/// off.
pub(crate) async fn token_still_valid(state: &Arc<State>, token: String, user: &str) -> bool {
    match state.tokens.verify_hash_off(token).await {
        Ok(Some(holder)) => holder == user,
        Ok(None) => false,
        Err(e) => {
            warn!("cannot read tokens to check a connection's again: {e}");
            true
        }
    }
}

/// Resolves once the token whose hash is `token` (of `user`) is revoked: when a sweep of the
/// tokens ([`sweep_tokens`]) no longer finds it and the store, asked once more, does not know it
/// either (a token created after the sweep's read is not among its hashes). Never, while the
/// tokens cannot be read.
pub(crate) async fn until_revoked(state: Arc<State>, token: String, user: String) {
    let mut swept = state.valid_tokens.subscribe();
    while swept.changed().await.is_ok() {
        let missing = swept
            .borrow_and_update()
            .as_ref()
            .is_some_and(|valid| !valid.contains(&token));
        if missing && !token_still_valid(&state, token.clone(), &user).await {
            return;
        }
    }
    std::future::pending().await
}

/// Every [`TOKEN_RECHECK`], reads the tokens' hashes (on the blocking pool: a PostgreSQL store
/// answers with a query; the file is read again only when it changed) and publishes them ([`State::valid_tokens`]), on which every
/// connection checks its own, in memory. One read per sweep for the whole server, rather than
/// one per connection; a sweep that cannot read them is skipped (logged), and the connections
/// stay.
async fn sweep_tokens(state: Arc<State>) {
    let mut tick = tokio::time::interval(TOKEN_RECHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let tokens = state.tokens.clone();
        match tokio::task::spawn_blocking(move || tokens.hashes()).await {
            Ok(Ok(hashes)) => {
                let hashes = Arc::new(hashes);
                state.valid_tokens.send_replace(Some(hashes.clone()));
                state.end_revoked_processes(&hashes).await;
            }
            Ok(Err(e)) => warn!("cannot read tokens to look for revoked ones: {e}"),
            Err(_) => {}
        }
    }
}

/// The file in the data dir that says its first token was made (then every start finds a token,
/// or none because every one was revoked, and makes none).
const FIRST_TOKEN_MADE: &str = "first-token-made";

/// Writes [`FIRST_TOKEN_MADE`]; a failure is said, not fatal: the next start that finds no
/// token would make one, as before the mark.
fn mark_first_token_made(path: &std::path::Path) {
    let note = b"The first start of this data dir made its first token: a start that finds no \
token (every one revoked) makes none; `monad-server token create --user NAME` does.\n";
    if let Err(e) = crate::fsutil::write_atomic(path, note, 0o600) {
        warn!("cannot mark that the first token was made: {e}");
    }
}

/// What the first start made: the first token, shown once.
#[derive(Debug, Clone)]
pub struct FirstStart {
    /// The user the token belongs to.
    pub user: String,
    /// The token.
    pub token: String,
}

/// The process groups that bound each user's commands together
/// (`server.max_processes_per_user`, `server.max_memory_per_user`, an equal share of the
/// processor with `server.max_cpu_percent_per_user` as its ceiling), made under
/// `server.process_cgroup` or the server's own cgroups. `None` when all three are 0, or when
/// the server's own cgroups cannot have them (said loudly: commands are then bounded per
/// workspace only); an error when the cgroup the operator named cannot.
fn process_groups(config: &ServerConfig) -> Result<Option<Arc<ProcessGroups>>, ServerError> {
    let quotas = &config.quotas;
    let ceiling = quotas.max_cpu_percent_per_user;
    let bounds = cgroup::Bounds {
        processes: quotas.max_processes_per_user,
        memory_bytes: quotas.max_memory_per_user,
        // An equal share per user wherever users have groups (the defaults); a ceiling when
        // the operator set one. With every bound at 0 the operator wants no groups at all.
        cpu_percent: (quotas.max_processes_per_user > 0
            || quotas.max_memory_per_user > 0
            || ceiling > 0)
            .then_some(ceiling),
    };
    if bounds == cgroup::Bounds::default() {
        return Ok(None);
    }
    let named = config.process_cgroup.as_deref();
    let unbounded = |why: &str| {
        warn!(
            "one user's commands over all their sessions are NOT bounded together: {why}; each \
             workspace's own bounds ([exec] max_processes, max_memory_bytes) still apply (see \
             \"One user cannot exhaust the server\" in docs/security.md)"
        )
    };
    match ProcessGroups::create(bounds, named) {
        Ok(groups) => {
            info!(
                processes = bounds.processes,
                memory_bytes = bounds.memory_bytes,
                cpu_percent = ceiling,
                "each user's commands are bounded together, in the cgroups under {}",
                groups.shown()
            );
            for why in groups.missing() {
                unbounded(why);
            }
            Ok(Some(Arc::new(groups)))
        }
        Err(why) if named.is_some() => Err(ServerError::Invalid(format!(
            "server.process_cgroup: {why}"
        ))),
        Err(why) => {
            unbounded(&why);
            Ok(None)
        }
    }
}

/// A bound server, ready to run.
#[derive(Debug)]
pub struct Server {
    endpoint: quinn::Endpoint,
    state: Arc<State>,
    fingerprint: String,
    /// The MCP over HTTP listener, when `config.http` asks for one.
    http: Option<std::net::TcpListener>,
    /// The data directory's lock, held while the server lives.
    _lock: Arc<crate::admin::DataLock>,
}

impl Server {
    /// Prepares the data dir (certificate, first token on first start) and binds the endpoint.
    pub fn bind(config: ServerConfig) -> Result<(Server, Option<FirstStart>), ServerError> {
        crate::fsutil::create_private_dir(&config.data_dir)
            .map_err(|e| ServerError::io("create", &config.data_dir, e))?;
        let lock = crate::admin::DataLock::take(&config.data_dir, crate::admin::DataLock::SERVER)
            .map_err(|refused| ServerError::Invalid(refused.message))?;
        // The data dir itself at once (one call: it closes everything below it to others); what
        // is inside it in the background, below.
        if let Err(e) = crate::fsutil::tighten_data_dir(&config.data_dir) {
            warn!("cannot make {} private: {e}", config.data_dir.display());
        }
        let (identity, _created) = tls::load_or_create(&config.data_dir.join("tls"))?;
        let quic = tls::quic_config(&identity, &config.transport)?;
        let endpoint = monad_protocol::pin::endpoint(config.listen, Some(quic))
            .map_err(|e| ServerError::io("listen on", config.listen.to_string(), e))?;
        let http = config.http.map(crate::mcp::bind).transpose()?;
        let (mut config, layers) = load_settings(config)?;
        config.cluster.check().map_err(ServerError::Invalid)?;
        let groups = process_groups(&config)?;
        if config.cluster.advertise.is_none() {
            // Other hosts reach this one where it listens, unless it says otherwise.
            let listening = endpoint
                .local_addr()
                .map_err(|e| ServerError::io("listen on", config.listen.to_string(), e))?;
            config.cluster.advertise = Some(listening.to_string());
        }
        let fs_store = Arc::new(
            FsStore::new(&config.data_dir)
                .with_max_devices_per_user(config.quotas.max_devices_per_user),
        );
        let feed = crate::feed::Feed::new();
        let (store, tokens, pg) = crate::store::open(&config, fs_store.clone())?;
        let cluster = pg.map(|pg| {
            Arc::new(crate::cluster::Cluster::new(
                pg,
                config.cluster.secret().cloned(),
                &identity.fingerprint,
            ))
        });
        // Only a host that forwards is reached by the others.
        if let Some(cluster) = &cluster
            && cluster.forwards()
            && let Ok(address) = cluster.store().host().address.parse::<SocketAddr>()
            && (address.ip().is_unspecified() || address.ip().is_loopback())
        {
            warn!(
                "this host advertises {address} to the other hosts of its store, which cannot \
                 reach it there unless they run on this machine: set `serve --advertise \
                 HOST:PORT`"
            );
        }
        let store = crate::store::observed::observe(store, feed.clone());
        // Only once it listens, its settings are read and its store is open: a start that fails
        // (a port in use, an unreachable database) leaves no token that was never shown, and the
        // next start is still the first one and prints the login line.
        //
        // Once per data dir: a restart after every token was revoked makes none (it made a
        // token no one asked for and printed it, to a log others may read, where the operator
        // had just locked everyone out); `token create` makes one.
        let made = config.data_dir.join(FIRST_TOKEN_MADE);
        let first = match (tokens.list()?.is_empty(), made.exists()) {
            (true, false) => {
                let (record, token) = tokens.create("admin")?;
                mark_first_token_made(&made);
                Some(FirstStart {
                    user: record.user,
                    token,
                })
            }
            (true, true) => {
                warn!(
                    "no token is valid (every one was revoked): no client or agent can connect \
                     until `monad-server token create --user NAME` makes one"
                );
                None
            }
            (false, marked) => {
                // A data dir from before the mark: its first token was made.
                if !marked {
                    mark_first_token_made(&made);
                }
                None
            }
        };
        // Off the start-up path: remove what writes cut short by a crash left behind, and read
        // every session's metadata now, so that the first listing does not read thousands of
        // files while an agent waits.
        let warm = store.clone();
        let lock = Arc::new(lock);
        let held = lock.clone();
        let housekeeping = watch::channel(false).0;
        let done = housekeeping.clone();
        let data_dir = config.data_dir.clone();
        // Said done however it ends (a panic, a thread that could not start), after the data
        // dir's lock went.
        struct Done(watch::Sender<bool>, Option<Arc<crate::admin::DataLock>>);
        impl Drop for Done {
            fn drop(&mut self) {
                drop(self.1.take());
                self.0.send_replace(true);
            }
        }
        let done = Done(done, Some(held));
        let _ = std::thread::Builder::new()
            .name("sessions-index".into())
            .spawn(move || {
                let _done = done;
                let tightened = crate::fsutil::tighten_modes(&data_dir);
                if tightened > 0 {
                    info!(
                        "made {tightened} files and directories of the data dir private (0600/0700)"
                    );
                }
                // The registry's sessions are pruned by their last activity, as their metadata
                // has it, not only by when a host last landed in them. Without it (the sessions
                // cannot be listed), nothing is pruned here; each landing prunes its own.
                match warm.all_sessions() {
                    Ok(metas) => {
                        let last_active: HashMap<String, u64> = metas
                            .iter()
                            .filter_map(|m| {
                                let secs = crate::fsutil::parse_rfc3339(&m.last_active)?;
                                Some((m.id.clone(), secs.saturating_mul(1000)))
                            })
                            .collect();
                        match warm.prune_folder_sessions(crate::landing::now_ms(), &last_active) {
                            Ok(0) => {}
                            Ok(n) => {
                                info!("{n} folders of the MCP roots registry had stale sessions")
                            }
                            Err(e) => warn!("folder registry: {e}"),
                        }
                    }
                    Err(e) => warn!("cannot list sessions: {e}"),
                }
                let removed = fs_store.remove_stale_temp_files();
                if removed > 0 {
                    info!(
                        "removed {removed} leftovers of interrupted writes and deletes \
                         (temporary files, deleted sessions' directories)"
                    );
                }
                // The data dir stays this server's until the cleanup is done (`_done`).
            });
        // What a user's calls' records hold on their way to the store.
        let record_bytes = PerUser::new(config.quotas.max_call_bytes_per_user);
        let recorder = Recorder::start(store.clone()).counting(record_bytes.clone());
        let state = Arc::new(State {
            registry: Registry::new(&config.data_dir, store, layers)
                .with_quotas(
                    config.quotas.max_sessions_in_memory_per_user,
                    config.quotas.max_sessions_per_user,
                )
                .with_process_groups(groups)
                .with_connection_budgets((config.quotas.max_proxy_connections_per_user > 0).then(
                    || {
                        monad_sandbox::exec::ConnectionBudgets::new(
                            config.quotas.max_proxy_connections_per_user,
                        )
                    },
                ))
                .with_cluster(cluster.clone())
                .with_recorder(recorder.clone()),
            cluster,
            executor: Executor {
                call_timeout: Some(config.call_timeout),
                recorder: Some(recorder),
                feed: feed.clone(),
            },
            agents: Default::default(),
            feed,
            tokens,
            connections: PerUser::new(config.quotas.max_connections_per_user),
            user_calls: PerUser::new(config.quotas.max_calls_per_user),
            user_reads: PerUser::new(config.quotas.max_calls_per_user),
            store_work: crate::quota::Turns::new(config.quotas.max_store_work_per_user),
            agent_turns: PerUser::new(config.quotas.max_turns_per_user),
            call_bytes: PerUser::new(config.quotas.max_call_bytes_per_user),
            record_bytes,
            network_reports: Default::default(),
            handshakes: Admissions::new(Bounds {
                total: config.quotas.max_pending_handshakes,
                per_source: config.quotas.max_pending_handshakes_per_address,
            }),
            config,
            generations: AtomicU64::new(1),
            calls: watch::channel(0).0,
            housekeeping: housekeeping.clone(),
            valid_tokens: watch::channel(None).0,
            started_by_token: Default::default(),
            searching: Default::default(),
        });
        if let Some(cluster) = &state.cluster {
            // A host paused past its lease (a stopped VM), woken after another host took its
            // sessions over, still had their folders attached: unreachable from the new owner
            // until they reconnected, which nothing made them do. Their connections are closed
            // now; each client reconnects and attaches where its session is served.
            let weak = Arc::downgrade(&state);
            cluster.store().on_lease_lost(Box::new(move |session| {
                let Some(state) = weak.upgrade() else {
                    return;
                };
                // Taken here again meanwhile (a call for it): its folders are where it is served.
                let here = state.cluster.as_ref();
                if here.and_then(|c| c.store().held_epoch(session)).is_some() {
                    return;
                }
                for link in state.registry.online_links(session) {
                    link.conn.close(
                        CLOSE_MOVED,
                        &format!("another host serves session {session} now: attach again, there"),
                    );
                }
            }));
        }
        Ok((
            Server {
                endpoint,
                state,
                fingerprint: identity.fingerprint,
                http,
                _lock: lock,
            },
            first,
        ))
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint
            .local_addr()
            .expect("a bound endpoint has an address")
    }

    /// The address of the MCP over HTTP endpoint (`http://<it>/mcp`), when enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// SHA-256 of the server's certificate, hex: what clients pin.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The shared state (sessions, tokens), for embedding and tests.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests finish
    /// for the configured grace, and closes every connection.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let http = self.http.and_then(|listener| {
            crate::mcp::Http::spawn(listener, self.state.clone())
                .inspect_err(|e| warn!("MCP over HTTP is off: {e}"))
                .ok()
        });
        // Sessions idle past the retention setting leave memory (they stay on disk).
        let reaper = {
            let state = self.state.clone();
            tokio::spawn(async move {
                let idle = state.registry.idle_limit();
                let every = (idle / 4).clamp(
                    std::time::Duration::from_secs(1),
                    std::time::Duration::from_secs(600),
                );
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    // Saving metadata blocks (fsync): off the async workers.
                    let state = state.clone();
                    let dropped =
                        tokio::task::spawn_blocking(move || state.registry.unload_idle(idle))
                            .await
                            .unwrap_or(0);
                    if dropped > 0 {
                        info!("dropped {dropped} idle sessions from memory");
                    }
                }
            })
        };
        // Revoked tokens: their connections are closed.
        let sweep = tokio::spawn(sweep_tokens(self.state.clone()));
        // The auto-purge (`[retention] max_age_days`), when on.
        let purge = self
            .state
            .registry
            .purge_settings()
            .map(|purge| tokio::spawn(crate::session::run_purge(self.state.clone(), purge)));
        // `session delete` and `session gc` while the server runs go through it.
        let admin = tokio::spawn(crate::admin::serve_socket(
            self.state.clone(),
            self.state.config.data_dir.join(crate::admin::ADMIN_SOCKET),
            stop_rx.clone(),
        ));
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    // Connections that have not said hello are bounded over all peers and per
                    // address; see `admission` for who makes room for whom.
                    let remote = incoming.remote_address();
                    let admitted = match self.state.handshakes.handshake(
                        Source::of(remote.ip()),
                        incoming.remote_address_validated(),
                        self.state.config.quotas.busy_pending_handshakes,
                    ) {
                        Outcome::Admitted(admitted) => admitted,
                        Outcome::Retry => {
                            debug!(%remote, "asked to prove its address (retry)");
                            if let Err(e) = incoming.retry() {
                                e.into_incoming().refuse();
                            }
                            continue;
                        }
                        Outcome::Refused(why) => {
                            debug!(%remote, ?why, "refused: too many handshakes in progress");
                            incoming.refuse();
                            continue;
                        }
                    };
                    let state = self.state.clone();
                    let stop = stop_rx.clone();
                    connections.spawn(handle_connection(state, incoming, stop, admitted));
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = &mut shutdown => break,
            }
        }
        reaper.abort();
        sweep.abort();
        if let Some(purge) = purge {
            purge.abort();
        }
        info!("shutting down: no new connections; letting in-flight calls finish");
        self.endpoint.set_server_config(None);
        let _ = stop_tx.send(true);
        let grace = self.state.config.shutdown_grace;
        let http = http.map(|http| tokio::spawn(http.shutdown(grace)));
        let drained = tokio::time::timeout(grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                "in-flight calls still running after {} s; closing",
                grace.as_secs()
            );
        }
        self.endpoint
            .close(CLOSE_SHUTDOWN.into(), b"server shutting down");
        connections.shutdown().await;
        if let Some(http) = http {
            let _ = http.await;
        }
        let _ = admin.await;
        self.endpoint.wait_idle().await;
        // Saving metadata and waiting for the recorder's writes block (fsync): off the async
        // workers.
        let state = self.state.clone();
        // Held by the metadata's saving until it ends: a saving given up on still holds the
        // data dir until the process exits, so that no other server or command starts on it
        // while it may write.
        let lock = self._lock.clone();
        // The records get the grace, and at least `RECORDS_WAIT`: a grace of 0 for the calls
        // must not lose every shutdown's last records.
        let wait = grace.max(RECORDS_WAIT);
        let _ = tokio::task::spawn_blocking(move || {
            // The records first: a session's metadata a batch still holds is older than what
            // the registry saves, and must not be written over it.
            let written = state
                .executor
                .recorder
                .as_ref()
                .is_none_or(|recorder| recorder.flush_within(wait));
            if !written {
                warn!(
                    "the store did not take the calls' records within {} s: those still \
                     waiting are lost",
                    wait.as_secs_f64()
                );
            }
            save_sessions(state, lock, written, wait);
        })
        .await;
        // The start's housekeeping holds the data dir too, until it is done: once `run` has
        // returned the data dir must be free (a server restarted on it right after a quick stop
        // was refused), so its end is waited for, bounded.
        if tokio::time::timeout(HOUSEKEEPING_WAIT, self.state.housekeeping())
            .await
            .is_err()
        {
            warn!(
                "the start's housekeeping of the data dir has not ended; it holds the data dir \
                 until it does"
            );
        }
    }
}

/// The longest a shutdown that gave up on the recorder waits for a save of metadata it began.
const ABANDON_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest a shutdown waits for the start's housekeeping of the data dir to end.
const HOUSEKEEPING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Saves the sessions' metadata at shutdown (then, when `release` — the records were written —
/// releases their leases; when they were not, also the snapshots the recorder held, after
/// stopping it from saving any), on a thread of its own holding the data dir's `lock` until it ends,
/// waited for while the store takes saves: at most `wait` without one (a store that does not
/// answer, a database gone, must not hold the exit for ever; what it did not take is lost, with
/// a warning), however many sessions a healthy store saves meanwhile.
fn save_sessions(
    state: Arc<State>,
    lock: Arc<crate::admin::DataLock>,
    release: bool,
    wait: std::time::Duration,
) {
    use std::sync::mpsc::RecvTimeoutError;
    // `false` after each save, `true` once all is done.
    let (said, saving) = std::sync::mpsc::channel();
    let save = move || {
        let each = || {
            let _ = said.send(false);
        };
        // What the recorder did not write may hold snapshots of metadata older than what is
        // saved here: it saves none after this, and hands them over to be saved here.
        let held = match &state.executor.recorder {
            Some(recorder) if !release => {
                let (held, settled) = recorder.abandon_within(ABANDON_WAIT);
                if !settled {
                    warn!(
                        "the recorder is still saving a session's metadata; it may write an \
                         older copy over what is saved now"
                    );
                }
                held
            }
            _ => Vec::new(),
        };
        state.registry.flush_each(each);
        state.registry.save_held(held, each);
        // Written whole: the sessions can be served elsewhere at once. Not while the recorder
        // may still write to them: their leases run out instead.
        if let Some(cluster) = &state.cluster
            && release
        {
            cluster.store().release_leases();
        }
        // Let go before saying so: a server started on this data dir once this one has returned
        // must find it free (the lock went with the closure, after the word, and a restart in
        // that moment was refused).
        drop(lock);
        let _ = said.send(true);
    };
    if let Err(e) = std::thread::Builder::new()
        .name("shutdown-save".into())
        .spawn(save)
    {
        warn!("cannot save the sessions' metadata at shutdown: {e}");
        return;
    }
    loop {
        match saving.recv_timeout(wait) {
            Ok(true) => return,
            Ok(false) => {}
            Err(RecvTimeoutError::Timeout) => {
                return warn!(
                    "the store took none of the sessions' metadata for {} s: what was not saved \
                     is lost (their last activity), and their leases run out",
                    wait.as_secs_f64()
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                return warn!("saving the sessions' metadata at shutdown failed part-way");
            }
        }
    }
}

/// The least a shutdown waits for the store to take the calls' records
/// (`server.shutdown_grace_secs` when longer).
const RECORDS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Applies `<data_dir>/config.toml` and the `MONAD_*` environment over the programmatic
/// settings in `config`; returns the updated config and the layers sessions merge their own
/// `config.toml` into.
fn load_settings(mut config: ServerConfig) -> Result<(ServerConfig, Layers), ServerError> {
    let path = config.data_dir.join("config.toml");
    let text = monad_protocol::settings_file::read(&path)
        .map_err(|e| ServerError::io("read", &path, e))?;
    let name = path.display().to_string();
    let base = Settings {
        limits: config.limits.clone(),
        exec: config.exec.clone(),
        server: ServerSettings {
            call_timeout_secs: config.call_timeout.as_secs(),
            hello_timeout_secs: config.hello_timeout.as_secs(),
            busy_hello_timeout_ms: config.busy_hello_timeout.as_millis() as u64,
            request_read_timeout_ms: config.request_read_timeout.as_millis() as u64,
            shutdown_grace_secs: config.shutdown_grace.as_secs(),
            max_calls_per_connection: config.max_calls_per_connection,
            keep_alive_ms: config.transport.keep_alive.as_millis() as u64,
            idle_timeout_ms: config.transport.idle_timeout.as_millis() as u64,
            max_sessions_in_memory_per_user: config.quotas.max_sessions_in_memory_per_user,
            max_sessions_per_user: config.quotas.max_sessions_per_user,
            max_connections_per_user: config.quotas.max_connections_per_user,
            max_calls_per_user: config.quotas.max_calls_per_user,
            max_store_work_per_user: config.quotas.max_store_work_per_user,
            max_turns_per_user: config.quotas.max_turns_per_user,
            max_call_bytes_per_user: config.quotas.max_call_bytes_per_user,
            max_pending_handshakes: config.quotas.max_pending_handshakes,
            max_pending_handshakes_per_address: config.quotas.max_pending_handshakes_per_address,
            busy_pending_handshakes: config.quotas.busy_pending_handshakes,
            max_devices_per_user: config.quotas.max_devices_per_user,
            max_mcp_sessions_per_user: config.quotas.max_mcp_sessions_per_user,
            max_workspaces_per_user: config.quotas.max_workspaces_per_user,
            max_artifact_bytes_per_user: config.quotas.max_artifact_bytes_per_user,
            max_processes_per_user: config.quotas.max_processes_per_user,
            max_memory_per_user: config.quotas.max_memory_per_user,
            max_cpu_percent_per_user: config.quotas.max_cpu_percent_per_user,
            max_proxy_connections_per_user: config.quotas.max_proxy_connections_per_user,
            process_cgroup: config.process_cgroup.clone(),
            http_header_timeout_ms: config.http_limits.header_timeout.as_millis() as u64,
            http_idle_timeout_ms: config.http_limits.idle_timeout.as_millis() as u64,
            http_max_connections: config.http_limits.max_connections,
            http_body_timeout_ms: config.http_limits.body_timeout.as_millis() as u64,
            http_max_connections_per_address: config.http_limits.max_connections_per_address,
            http_max_connections_per_user: config.http_limits.max_connections_per_user,
            http_allowed_origins: config.http_limits.allowed_origins.clone(),
        },
        store: config.store.clone(),
        cluster: config.cluster.clone(),
        ..Settings::default()
    };
    let layers = Layers::new(
        text.as_deref().map(|t| (name.as_str(), t)),
        crate::settings::with_aliases(
            crate::settings::environment().map_err(ServerError::Invalid)?,
        ),
    )
    .and_then(|layers| layers.with_base(&base))
    // The error names its own source (this file, an environment variable, or the layers
    // together) and line.
    .map_err(|e| ServerError::Invalid(e.to_string()))?;
    let settings = layers.global();
    let [
        call,
        hello,
        busy_hello,
        request_read,
        grace,
        keep_alive,
        idle,
    ] = settings.server.durations();
    config.limits = settings.limits;
    config.exec = settings.exec;
    config.call_timeout = call;
    config.hello_timeout = hello;
    config.busy_hello_timeout = busy_hello;
    config.request_read_timeout = request_read;
    config.shutdown_grace = grace;
    config.max_calls_per_connection = settings.server.max_calls_per_connection.max(1);
    config.transport.keep_alive = keep_alive;
    config.transport.idle_timeout = idle;
    config.quotas = settings.server.quotas();
    config.process_cgroup = settings.server.process_cgroup.clone();
    config.http_limits = settings.server.http_limits();
    // The object store's variables given by the embedder are no setting (never in a file).
    config.store = config.store_flags.over(crate::settings::StoreSettings {
        object_vars: std::mem::take(&mut config.store.object_vars),
        ..settings.store
    });
    // `serve --advertise` over the file and the environment.
    let advertise = config.cluster.advertise.take();
    config.cluster = settings.cluster;
    if advertise.is_some() {
        config.cluster.advertise = advertise;
    }
    Ok((config, layers))
}

/// One connection: handshake and hello within the deadline (unless evicted meanwhile), then
/// requests until it closes or the server stops.
async fn handle_connection(
    state: Arc<State>,
    incoming: quinn::Incoming,
    mut stop: watch::Receiver<bool>,
    pending: Admitted,
) {
    let remote = incoming.remote_address();
    let limit = if pending.under_pressure() {
        state
            .config
            .hello_timeout
            .min(state.config.busy_hello_timeout)
    } else {
        state.config.hello_timeout
    };
    let deadline = tokio::time::Instant::now() + limit;
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(e) => return debug!(%remote, "handshake failed: {e}"),
    };
    // Dropping an unfinished handshake ends it.
    let conn = tokio::select! {
        () = pending.evicted() => return debug!(%remote, "handshake dropped: room made for a newer one"),
        handshake = tokio::time::timeout_at(deadline, connecting) => match handshake {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => return debug!(%remote, "handshake failed: {e}"),
            Err(_) => return debug!(%remote, "handshake not finished in time"),
        },
    };
    let hello = tokio::select! {
        () = pending.evicted() => {
            conn.close(CLOSE_REFUSED.into(), b"too many connections without a hello");
            return debug!(%remote, "closed before its hello: room made for a newer one");
        }
        hello = tokio::time::timeout_at(deadline, accept_hello(&state, &conn)) => hello,
    };
    // Said hello (or not in time): no longer an unauthenticated handshake.
    drop(pending);
    let ((role, user, device_id, client_name, minor, origin, token), _connection_slot) = match hello
    {
        Ok(Ok(who)) => who,
        Ok(Err(e)) => {
            // One line per refused connection; the token itself is never logged.
            info!(%remote, "refused a connection: {e}");
            return;
        }
        Err(_) => {
            conn.close(CLOSE_REFUSED.into(), b"no hello in time");
            return;
        }
    };
    info!(%remote, %user, ?role, "connected");
    let limit = Arc::new(Semaphore::new(state.config.max_calls_per_connection));
    // Each request runs as a task of its own. A `TaskTracker` rather than a `JoinSet`: a
    // `JoinSet` wakes this loop to reap every finished request, one more thread wake-up per call
    // on the answer's path; the tracker is only waited on when the connection ends.
    let streams = tokio_util::task::TaskTracker::new();
    // Cancelled when the connection ends: what is still running for it stops there.
    let ended = tokio_util::sync::CancellationToken::new();
    let _ending = ended.clone().drop_guard();
    // Its MCP host's hold on the focus it landed on: released with the connection.
    let landing = crate::requests::HostSlot::default();
    // Its token is checked again at each sweep of the tokens: a revoked token's connection is
    // closed (an attached folder kept serving calls through one, and an agent calling). A
    // forwarded connection has no token of its own.
    let revoked = match &token {
        Some(token) => futures_util::future::Either::Left(until_revoked(
            state.clone(),
            token.clone(),
            user.clone(),
        )),
        None => futures_util::future::Either::Right(std::future::pending()),
    };
    tokio::pin!(revoked);
    let mut closing = false;
    let why = loop {
        tokio::select! {
            () = &mut revoked, if !closing => {
                closing = true;
                conn.close(CLOSE_REVOKED.into(), b"the token was revoked");
                info!(%remote, %user, ?role, "closing: its token was revoked");
            }
            accepted = conn.accept_bi() => {
                let (send, recv) = match accepted {
                    Ok(stream) => stream,
                    Err(e) => break e,
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    // Over the per-connection bound: refuse this request, keep the connection.
                    // Written on a task of its own, within a bound: a peer that gives the
                    // stream no credit held this loop, so that a revoked token's connection
                    // went on serving.
                    let mut send = send;
                    streams.spawn(async move {
                        let refusal = Message::Error {
                            id: 0,
                            error: ToolError::new(
                                ErrorCode::LimitExceeded,
                                "too many requests in flight on this connection",
                            ),
                        };
                        let written =
                            tokio::time::timeout(REFUSAL_WRITE, write_message(&mut send, &refusal));
                        match written.await {
                            Ok(Ok(())) => drop(send.finish()),
                            _ => drop(send.reset(0u32.into())),
                        }
                    });
                    continue;
                };
                let ctx = Ctx {
                    state: state.clone(),
                    conn: conn.clone(),
                    user: user.clone(),
                    token: token.clone(),
                    device_id: device_id.clone(),
                    client_name: client_name.clone(),
                    minor,
                    origin,
                    stop: stop.clone(),
                    landing: landing.clone(),
                };
                let ended = ended.clone();
                streams.spawn(async move {
                    let request = async {
                        match role {
                            Role::Agent => agent_request(&ctx, send, recv).await,
                            Role::Client => client_request(&ctx, send, recv).await,
                        }
                    };
                    tokio::select! {
                        () = request => {}
                        () = ended.cancelled() => {}
                    }
                    drop(permit);
                });
            }
            _ = stop.changed() => {
                // Shutting down: finish what is in flight (the server bounds how long).
                streams.close();
                streams.wait().await;
                conn.close(CLOSE_SHUTDOWN.into(), b"server shutting down");
                return info!(%remote, %user, ?role, "disconnected (server shutting down)");
            }
        }
    };
    ended.cancel();
    streams.close();
    streams.wait().await;
    info!(%remote, %user, ?role, "disconnected: {}", disconnected_because(&why));
}

/// Why a connection ended, for the log: a peer that closed it says why (`monad-client call`
/// interrupted, an attach detached), one that vanished is noticed by the time-out.
fn disconnected_because(error: &quinn::ConnectionError) -> String {
    match error {
        quinn::ConnectionError::ApplicationClosed(close) => {
            let reason = String::from_utf8_lossy(&close.reason);
            format!(
                "closed by the peer ({})",
                monad_protocol::text::printable(if reason.is_empty() {
                    "no reason given"
                } else {
                    &reason
                })
            )
        }
        quinn::ConnectionError::TimedOut => {
            "nothing heard from the peer for the idle time-out".into()
        }
        other => other.to_string(),
    }
}

/// Reads a request of at most `max` bytes, within `request_read_timeout` of now. `None` when
/// the stream ended first, or when it was malformed, too large or too slow (the peer is told,
/// and the stream stopped).
async fn read_request(
    ctx: &Ctx,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    max: usize,
    memory: &Held,
) -> Option<Message> {
    let limit = ctx.state.config.request_read_timeout;
    let mut hold = |n: usize| memory.take(n);
    let bytes = match tokio::time::timeout(limit, read_frames(recv, max, &mut hold)).await {
        Ok(Ok(bytes)) => bytes?,
        Ok(Err(ReadError::Refused)) => {
            let _ = recv.stop(reset::CANCELLED.into());
            send_error(
                send,
                0,
                crate::state::over_call_memory(memory.limit(), "the request"),
            )
            .await;
            return None;
        }
        Ok(Err(e)) => {
            // Malformed or oversized: close it, and answer if the stream still can.
            let _ = recv.stop(reset::MALFORMED.into());
            send_error(send, 0, e.to_tool_error()).await;
            return None;
        }
        Err(_) => {
            let _ = recv.stop(reset::TIMEOUT.into());
            let error = ToolError::new(
                ErrorCode::Timeout,
                format!(
                    "the request did not arrive whole within {} ms \
                     (server.request_read_timeout_ms)",
                    limit.as_millis()
                ),
            );
            send_error(send, 0, error).await;
            return None;
        }
    };
    // The tree the request becomes is counted before it is made.
    match crate::state::hold_request(memory, &bytes) {
        Ok(()) => {}
        Err(NotHeld::TooManyValues(e)) => {
            let error = ToolError::new(
                ErrorCode::LimitExceeded,
                format!("the request is refused: {e}"),
            );
            send_error(send, 0, error).await;
            return None;
        }
        Err(NotHeld::OverMemory(error)) => {
            send_error(send, 0, error).await;
            return None;
        }
    }
    match Message::from_json(&bytes) {
        Ok(request) => Some(request),
        Err(e) => {
            send_error(send, 0, ReadError::Json(e).to_tool_error()).await;
            None
        }
    }
}

/// Reads and checks the hello; answers welcome or refused.
/// The welcome holds one of the user's connection slots, given back when the connection ends.
async fn accept_hello(state: &State, conn: &quinn::Connection) -> Result<(Who, Slot), ServerError> {
    let (mut send, recv) = conn
        .accept_bi()
        .await
        .map_err(|e| ServerError::Protocol(e.to_string()))?;
    let mut recv = monad_protocol::stream::QuietRecv::new(recv);
    let hello = read_message(&mut *recv, MAX_HELLO).await;
    // The hello is the stream's one message; its end may still be on its way.
    recv.let_go();
    let checked = check_hello(state, hello).await.and_then(|who| {
        match state.connections.try_acquire(&who.1) {
            Some(slot) => Ok((who, slot)),
            None => Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "you have {} connections to this server open, its limit \
                     (server.max_connections_per_user); close some (detach folders, end \
                     agents and `monad-client mcp` bridges you no longer use), then retry",
                    state.connections.limit()
                ),
            )),
        }
    });
    // Before the welcome, so that the peer's next stream never waits for the credit.
    if let Ok(((role, ..), _)) = &checked {
        conn.set_max_concurrent_bi_streams(state.config.transport.streams_for(*role).into());
    }
    let (reply, result) = match checked {
        Ok(((role, user, device_id, client_name, minor, origin, token), slot)) => (
            Message::Welcome {
                protocol: wire::PROTOCOL_MAJOR,
                minor: wire::negotiate_minor(minor),
                user: user.clone(),
                server: format!("monad-server {}", env!("CARGO_PKG_VERSION")),
            },
            Ok((
                (
                    role,
                    user,
                    device_id,
                    client_name,
                    wire::negotiate_minor(minor),
                    origin,
                    token,
                ),
                slot,
            )),
        ),
        Err(error) => {
            let message = error.message.clone();
            (Message::Refused { error }, Err(message))
        }
    };
    write_message(&mut send, &reply)
        .await
        .map_err(|e| ServerError::Protocol(e.to_string()))?;
    let _ = send.finish();
    match result {
        Ok(who) => Ok(who),
        Err(message) => {
            // Let the refusal reach the peer before the connection goes.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), send.stopped()).await;
            conn.close(CLOSE_REFUSED.into(), b"refused");
            Err(ServerError::Protocol(message))
        }
    }
}

/// Who a hello says it is: role, user, device, client name, protocol minor version, and
/// whether another host forwards its calls.
/// Who a hello says the peer is; the last part is the hash of the token it presented (none for
/// a host forwarding its agent's calls), checked again while the connection lasts.
type Who = (Role, String, DeviceId, String, u32, Origin, Option<String>);

async fn check_hello(
    state: &State,
    hello: Result<Option<Message>, monad_protocol::io::ReadError>,
) -> Result<Who, ToolError> {
    let hello = match hello {
        Ok(Some(hello)) => hello,
        Ok(None) => return Err(ToolError::new(ErrorCode::Malformed, "no hello")),
        Err(e) => return Err(e.to_tool_error()),
    };
    let Message::Hello {
        protocol,
        minor,
        role,
        token,
        device_id,
        client_name,
        forwarded_for,
        ..
    } = hello
    else {
        return Err(ToolError::new(
            ErrorCode::Malformed,
            format!("expected hello, got {}", hello.kind()),
        ));
    };
    if protocol != wire::PROTOCOL_MAJOR {
        return Err(ToolError::new(
            ErrorCode::Unsupported,
            format!(
                "protocol version {protocol} is not supported; this server speaks {}",
                wire::PROTOCOL_MAJOR
            ),
        ));
    }

    // Another host of the same store, forwarding its agent's calls: authenticated by the
    // hosts' shared secret (in place of a token), for the user it authenticated.
    if let Some(user) = forwarded_for {
        let accepted = state
            .cluster
            .as_ref()
            .is_some_and(|cluster| cluster.accepts(&token));
        if !accepted {
            return Err(ToolError::new(
                ErrorCode::Unauthorized,
                "a forwarded connection needs the hosts' shared secret ([cluster] secret), and \
                 this one is not it (or this host has none)",
            ));
        }
        if role != Role::Agent || user.trim().is_empty() || user.len() > 256 {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                "a forwarded connection is an agent's, for a named user",
            ));
        }
        let device_id = DeviceId::parse(&device_id)
            .map_err(|m| ToolError::new(ErrorCode::InvalidArguments, m))?;
        validate_client_name(&client_name)
            .map_err(|m| ToolError::new(ErrorCode::InvalidArguments, m))?;
        return Ok((
            role,
            user,
            device_id,
            client_name,
            minor,
            Origin::Forwarded,
            None,
        ));
    }
    // Hashed once: what the store looks up, and what the connection checks again at each sweep.
    let presented = crate::auth::token_hash(&token);
    let user = match state.tokens.verify_hash_off(presented.clone()).await {
        Ok(Some(user)) => user,
        Ok(None) => {
            return Err(ToolError::new(
                ErrorCode::Unauthorized,
                "the token is unknown or revoked; create one with `monad-server token create` and \
             log in again with `monad-client login`",
            ));
        }
        Err(e) => {
            warn!("cannot read tokens: {e}");
            return Err(ToolError::new(
                ErrorCode::Internal,
                "the server cannot read its tokens",
            ));
        }
    };
    // Checked once the token is: an unauthenticated peer learns nothing else.
    let device_id =
        DeviceId::parse(&device_id).map_err(|m| ToolError::new(ErrorCode::InvalidArguments, m))?;
    validate_client_name(&client_name)
        .map_err(|m| ToolError::new(ErrorCode::InvalidArguments, m))?;
    Ok((
        role,
        user,
        device_id,
        client_name,
        minor,
        Origin::Agent,
        Some(presented),
    ))
}

/// What a request handler knows about its connection.
struct Ctx {
    state: Arc<State>,
    conn: quinn::Connection,
    user: String,
    /// The hash of the connection's token (none for a forwarded connection).
    token: Option<String>,
    device_id: DeviceId,
    client_name: String,
    /// The protocol's minor version on this connection.
    minor: u32,
    /// An agent's own connection, or another host forwarding its agent's calls.
    origin: Origin,
    /// Turns true when the server shuts down.
    stop: watch::Receiver<bool>,
    /// The hold of this connection's MCP host on the focus it landed on.
    landing: crate::requests::HostSlot,
}

impl Ctx {
    /// How this connection's requests name sessions.
    fn lookup<'a>(&'a self, requested: Option<&'a str>) -> Lookup<'a> {
        match self.origin {
            Origin::Agent => Lookup::Resolve {
                requested,
                device: Some(&self.device_id),
            },
            // The forwarding host resolved the session: its exact id, no device to bind.
            Origin::Forwarded => Lookup::Open(requested),
        }
    }

    /// The session a request of this connection means (off the async workers).
    async fn session(&self, requested: Option<&str>) -> Result<Arc<Session>, ToolError> {
        self.state.session(&self.user, self.lookup(requested)).await
    }
}

/// A prompt for the session's built-in agent: its events as they come, then the turn's result.
/// A reset stream cancels the turn; the turn still ends properly (what the model said so far
/// stays in `session.md`).
async fn prompt(
    ctx: &Ctx,
    id: u64,
    session: Arc<Session>,
    text: String,
    overrides: PromptOverrides,
    send: quinn::SendStream,
    answers: Option<monad_protocol::stream::QuietRecv>,
) {
    let (events_tx, mut events) = tokio::sync::mpsc::channel(64);
    let cancel = tokio_util::sync::CancellationToken::new();
    // A front that answers permissions (minor 6, `ask: true`): its answers come on this stream.
    let front = answers.map(|recv| WireFront::new(events_tx.clone(), recv));
    let mut turn = Box::pin(
        ctx.state.agents.prompt(
            &ctx.state,
            &session,
            (&ctx.user, ctx.token.as_deref()),
            (text, &overrides),
            events_tx,
            cancel.clone(),
            front
                .as_ref()
                .map(|f| f as &dyn crate::agent::FrontPermission),
        ),
    );
    // An event is written while the turn goes on being polled: a front that stops reading
    // holds up that write, not the turn, which goes on to its end (its deadline, a cancel) and
    // lets the session go. Written in the loop's body, one stuck write held the turn, and its
    // session, until the connection died. A write in progress is never given up half-way (the
    // stream would go on mid-message).
    let stopped = send.stopped();
    tokio::pin!(stopped);
    let mut out = Outgoing::Idle(send);
    let mut gone = false;
    let result = loop {
        tokio::select! {
            result = &mut turn => break result,
            Some(event) = events.recv(), if out.is_idle() && !gone => {
                out.start(Message::AgentEvent { id, event });
            }
            written = out.written(), if !out.is_idle() => {
                if written.is_err() {
                    gone = true;
                    cancel.cancel();
                }
            }
            _ = &mut stopped, if !gone => {
                gone = true;
                cancel.cancel();
            }
        }
    };
    drop(turn);
    let session_id = session.id.clone();
    drop(session);
    if gone {
        return;
    }
    let Some(mut send) = out.stream().await else {
        return;
    };
    while let Ok(event) = events.try_recv() {
        if write_message(&mut send, &Message::AgentEvent { id, event })
            .await
            .is_err()
        {
            return;
        }
    }
    match result {
        Ok(result) => {
            let done = Message::TurnDone {
                id,
                session: session_id,
                result,
            };
            if write_message(&mut send, &done).await.is_ok() {
                finish(&mut send).await;
            }
        }
        Err(error) => send_error(&mut send, id, error).await,
    }
}

/// A front's stream, or the write of a message in progress on it, which holds the stream
/// meanwhile and gives it back when done: polled beside other work (a turn, a call; see
/// [`prompt`]), which a front that stops reading then holds up no longer. A write in progress
/// is finished, never dropped half-way, before another message goes on the stream.
enum Outgoing {
    Idle(quinn::SendStream),
    Writing(Writing),
    /// A write failed: the stream is gone with it.
    Broken,
}

/// A message being written on a stream, and the stream with how the write went.
type Writing =
    std::pin::Pin<Box<dyn Future<Output = (quinn::SendStream, Result<(), std::io::Error>)> + Send>>;

impl Outgoing {
    /// Whether a message can start out ([`Outgoing::start`]).
    fn is_idle(&self) -> bool {
        matches!(self, Outgoing::Idle(_))
    }

    /// Starts writing `message` on the idle stream (nothing happens otherwise: callers ask
    /// [`Outgoing::is_idle`] first).
    fn start(&mut self, message: Message) {
        if !self.is_idle() {
            return;
        }
        if let Outgoing::Idle(mut send) = std::mem::replace(self, Outgoing::Broken) {
            *self = Outgoing::Writing(Box::pin(async move {
                let written = write_message(&mut send, &message).await;
                (send, written)
            }));
        }
    }

    /// The write in progress, to its end (pending for ever when none is: callers ask
    /// [`Outgoing::is_idle`] first); the stream is idle again unless it failed.
    async fn written(&mut self) -> Result<(), std::io::Error> {
        let Outgoing::Writing(write) = self else {
            return std::future::pending().await;
        };
        let (send, written) = write.await;
        *self = match written {
            Ok(()) => Outgoing::Idle(send),
            Err(_) => Outgoing::Broken,
        };
        written
    }

    /// The stream once the write in progress, if any, is done; `None` when a write failed.
    async fn stream(mut self) -> Option<quinn::SendStream> {
        if !self.is_idle() {
            let _ = self.written().await;
        }
        match self {
            Outgoing::Idle(send) => Some(send),
            Outgoing::Writing(_) | Outgoing::Broken => None,
        }
    }
}

/// A prompt's front that approves or rejects restricted calls itself (minor
/// [`wire::PERMISSION_MINOR`]): each question goes out as an [`AgentEvent::Permission`], and its
/// [`Message::PermissionAnswer`] comes back on the prompt's own stream. A front that stops
/// answering (its stream ends or breaks, or sends something else) rejects what it was asked and
/// whatever it is asked after: the folder's owner is never asked on its behalf.
///
/// [`AgentEvent::Permission`]: monad_protocol::agent::AgentEvent::Permission
struct WireFront {
    events: tokio::sync::mpsc::Sender<monad_protocol::agent::AgentEvent>,
    waiting: Arc<std::sync::Mutex<WireWaiting>>,
    reader: tokio::task::JoinHandle<()>,
}

/// Questions waiting for the front's answer, by call id; `closed` once the front cannot answer.
#[derive(Default)]
struct WireWaiting {
    asked: HashMap<String, tokio::sync::oneshot::Sender<bool>>,
    closed: bool,
}

impl WireFront {
    fn new(
        events: tokio::sync::mpsc::Sender<monad_protocol::agent::AgentEvent>,
        mut recv: monad_protocol::stream::QuietRecv,
    ) -> WireFront {
        let waiting: Arc<std::sync::Mutex<WireWaiting>> = Arc::default();
        let reader = tokio::spawn({
            let waiting = waiting.clone();
            async move {
                while let Ok(Some(Message::PermissionAnswer { call_id, allow, .. })) =
                    // Each byte of the id escaped as `\u00XX` at worst, and the rest.
                    read_message(&mut *recv, 6 * wire::MAX_CALL_ID_LEN + 256).await
                {
                    let answer = waiting
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .asked
                        .remove(&call_id);
                    // An answer for nothing asked (late, after a cancel) is ignored.
                    if let Some(answer) = answer {
                        let _ = answer.send(allow);
                    }
                }
                let mut waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
                waiting.closed = true;
                // Dropping the senders rejects what is still waiting.
                waiting.asked.clear();
            }
        });
        WireFront {
            events,
            waiting,
            reader,
        }
    }
}

impl Drop for WireFront {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl crate::agent::FrontPermission for WireFront {
    fn ask(
        &self,
        call_id: String,
        ask: crate::executor::PermissionAsk,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(async move {
            let (tx, rx) = tokio::sync::oneshot::channel();
            {
                let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
                if waiting.closed {
                    return false;
                }
                waiting.asked.insert(call_id.clone(), tx);
            }
            let event = monad_protocol::agent::AgentEvent::Permission {
                call_id,
                tool: ask.tool,
                workspace: ask.workspace,
                what: ask.what,
            };
            if self.events.send(event).await.is_err() {
                return false;
            }
            rx.await.unwrap_or(false)
        })
    }
}

async fn send_error(send: &mut quinn::SendStream, id: u64, error: ToolError) {
    let _ = write_message(send, &Message::Error { id, error }).await;
    finish(send).await;
}

/// Finishes an answer's stream and waits (bounded) until the peer has acknowledged it: on
/// shutdown the connection is closed as soon as its requests are done, and closing drops
/// whatever the peer has not acknowledged yet, such as the answer to an in-flight call.
async fn finish(send: &mut quinn::SendStream) {
    if send.finish().is_ok() {
        let _ = tokio::time::timeout(ANSWER_ACK_WAIT, send.stopped()).await;
    }
}

/// Writes the answer to an agent's request other than a call and finishes its stream
/// ([`write_counted`]).
async fn answer_counted(ctx: &Ctx, send: &mut quinn::SendStream, id: u64, answer: &Message) {
    if write_counted(ctx, send, id, answer).await {
        finish(send).await;
    }
}

/// Writes a message of an answer other than a call's. Until it is written, it counts against
/// what the user's requests may hold in memory (`server.max_call_bytes_per_user`), as a call's
/// answer does: an agent that reads none of its answers (a conversation of megabytes asked for
/// on every stream it may open) holds at most that, and an answer past it is refused, saying
/// so (and the stream finished). Whether the message went out.
async fn write_counted(
    ctx: &Ctx,
    send: &mut quinn::SendStream,
    id: u64,
    message: &Message,
) -> bool {
    let json = message.to_json();
    let held = ctx.state.call_bytes.holder(&ctx.user);
    if !held.take(json.len()) {
        let refused = crate::state::over_call_memory(held.limit(), "the answer");
        send_error(send, id, refused).await;
        return false;
    }
    // Once written, what the transport still holds of it is bounded by the agent's window.
    monad_protocol::io::write_encoded(send, &json).await.is_ok()
}

/// One agent request: a call, or a listing.
async fn agent_request(ctx: &Ctx, mut send: quinn::SendStream, recv: quinn::RecvStream) {
    // A request is one message and the stream's end: read that end when done with it, so the
    // agent is not told to stop a stream it already finished.
    let mut recv = monad_protocol::stream::QuietRecv::new(recv);
    // Requests being read (buffered) are bounded per user, not only per stream and connection.
    let reading = match ctx.state.user_read(&ctx.user) {
        Ok(slot) => slot,
        Err(e) => {
            let _ = recv.stop(reset::CANCELLED.into());
            return send_error(&mut send, 0, e).await;
        }
    };
    // What the request and its answers hold in memory, counted until the answer is written.
    let memory = Arc::new(ctx.state.call_bytes.holder(&ctx.user));
    let request = read_request(ctx, &mut send, &mut recv, MAX_REQUEST, &memory).await;
    drop(reading);
    let Some(request) = request else {
        return;
    };
    // Nothing more comes on the stream but its end (which may still be on its way), save the
    // answers of a front that answers a turn's permission questions.
    let answers = match &request {
        Message::Prompt { ask: true, .. } if ctx.minor >= wire::PERMISSION_MINOR => Some(recv),
        _ => {
            recv.let_go();
            None
        }
    };
    // A call's answer counts with its request until it is written; any other request's count
    // ends once it is read (a turn's calls count their own; a watch lasts).
    let memory = matches!(request, Message::Call { .. }).then_some(memory);
    match request {
        Message::Call {
            id,
            session,
            tool,
            args,
        } => {
            // Progress is best effort: lines an agent does not take in time are dropped, so a
            // call holds at most `wire::PROGRESS_QUEUE` lines for it, each cut where it came in
            // from an attached client or another host (`wire::progress_line`).
            let (progress_tx, mut progress_rx) =
                tokio::sync::mpsc::channel::<String>(wire::PROGRESS_QUEUE);
            let sink = move |m: &str| {
                let _ = progress_tx.try_send(m.to_owned());
            };
            let lookup = ctx.lookup(session.as_deref());
            let mut call = Box::pin(ctx.state.call_from(
                ctx.origin,
                (&ctx.user, ctx.token.as_deref()),
                lookup,
                &tool,
                args,
                &sink,
                memory,
            ));
            // A progress line is written while the call goes on being polled: an agent that
            // stops reading holds up that write, not the call, which goes on to its end or its
            // time-out.
            let stopped = send.stopped();
            tokio::pin!(stopped);
            let mut out = Outgoing::Idle(send);
            let called = loop {
                tokio::select! {
                    called = &mut call => break called,
                    Some(message) = progress_rx.recv(), if out.is_idle() => {
                        out.start(Message::Progress { id, message });
                    }
                    // A failed write: the answer's write fails too, below.
                    _ = out.written(), if !out.is_idle() => {}
                    // The agent reset its stream: it cancelled; dropping the call cancels it
                    // everywhere (a client run, a prompt, a command).
                    _ = &mut stopped => return,
                }
            };
            drop(call);
            // Its slot goes now: a progress line an agent is slow to take, written below, must
            // not hold one of the user's calls.
            let called = called.map(|(output, mut guard)| {
                guard.answering();
                (output, guard)
            });
            let Some(mut send) = out.stream().await else {
                return;
            };
            // Progress sent just before the end loses the race above: relay it before the result.
            while let Ok(message) = progress_rx.try_recv() {
                let _ = write_message(&mut send, &Message::Progress { id, message }).await;
            }
            // The call's slot goes as its answer starts out (`answering`); the rest of what it
            // counts against, once the answer, body included, is written (`answered`).
            let (output, mut guard) = match called {
                Ok(called) => called,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            // A large `content` goes after the result as raw bytes: relayed as it arrives from
            // an attached client, or moved out of a primary workspace's result. An agent of an
            // older minor version gets it inline.
            let bodies = ctx.minor >= wire::BODY_MINOR;
            let (workspace, mut outcome, body) = if bodies {
                (output.workspace, output.outcome, output.body)
            } else {
                let (workspace, outcome) = output.complete().await;
                (workspace, outcome, None)
            };
            let (announced, local) = match &body {
                Some(pending) => (Some(pending.body.clone()), None),
                None if bodies => match outcome.split_body() {
                    Some((announced, bytes)) => (Some(announced), Some(bytes)),
                    None => (None, None),
                },
                None => (None, None),
            };
            // A host forwarding its agent's call (which says minor 0 in its hello) leaves out
            // what its own agent's minor cannot read, itself.
            if ctx.origin != crate::cluster::Origin::Forwarded {
                outcome.for_minor(&tool, ctx.minor);
            }
            let head = Message::Result {
                id,
                workspace,
                outcome,
                body: announced,
            };
            guard.answering();
            if write_message(&mut send, &head).await.is_err() {
                return;
            }
            if let Some(pending) = body {
                if pending.relay(&mut send).await.is_err() {
                    return;
                }
            } else if let Some(bytes) = local
                && send.write_chunk(bytes::Bytes::from(bytes)).await.is_err()
            {
                return;
            }
            // What the answer holds until it is acknowledged still counts.
            let _memory = guard.answered();
            finish(&mut send).await;
        }
        Message::Prompt {
            id,
            session,
            text,
            model,
            base_url,
            ..
        } => {
            let session = match ctx.session(session.as_deref()).await {
                Ok(s) => s,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            // With several hosts, a conversation runs only where its session is served: its
            // calls reach the folders attached there, and one host writes its history.
            match ctx.state.route(&session, ctx.origin).await {
                Ok(crate::cluster::Route::Local) => {}
                Ok(crate::cluster::Route::Forward { address }) => {
                    let error = ToolError::new(
                        ErrorCode::WorkspaceDisconnected,
                        format!(
                            "session {} is served by the host at {}: a conversation runs \
                             where its session is served; connect to that host, or prompt \
                             again once it has let the session go",
                            session.id,
                            crate::cluster::shown(&address)
                        ),
                    );
                    return send_error(&mut send, id, error).await;
                }
                Err(e) => return send_error(&mut send, id, e).await,
            }
            let overrides = PromptOverrides { model, base_url };
            prompt(ctx, id, session, text, overrides, send, answers).await;
        }
        Message::ListWorkspaces { id, session } => {
            let session = match ctx.session(session.as_deref()).await {
                Ok(s) => s,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            let answer = workspaces_message(id, &session, ctx.minor);
            drop(session);
            answer_counted(ctx, &mut send, id, &answer).await;
        }
        Message::Watch { id, session } => {
            let session = match ctx.session(session.as_deref()).await {
                Ok(s) => s,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            let mut watch = WorkspaceWatch::new(session);
            let mut stop = ctx.stop.clone();
            loop {
                let listed = workspaces_message(id, watch.session(), ctx.minor);
                if !write_counted(ctx, &mut send, id, &listed).await {
                    return;
                }
                let stopping = tokio::select! {
                    changed = watch.changed() => if changed { false } else { return },
                    _ = send.stopped() => return,
                    // A watch never ends by itself: let the shutdown close its connection.
                    _ = stop.wait_for(|stopping| *stopping) => true,
                };
                if stopping {
                    return finish(&mut send).await;
                }
            }
        }
        Message::ListSessions { id, limit, next } => {
            // One of the user's requests in flight, as a call is, and of their store work:
            // bounded per user, not only per connection, on the blocking pool every user shares.
            let slot = match ctx.state.store_turn(&ctx.user).await {
                Ok(slot) => slot,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            // Listing reads every session's metadata from the store the first time: off the
            // async workers.
            let (state, user) = (ctx.state.clone(), ctx.user.clone());
            // The slot is held by the work itself: given back as the work ends, before the
            // answer (which the agent may read before acknowledging it), and not sooner when
            // this request is dropped (its connection gone: the work goes on on the pool).
            let page = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                match limit {
                    None => state.registry.list(&user).map(|all| (all, None)),
                    Some(limit) => state
                        .registry
                        .list_page(&user, limit as usize, next.as_deref()),
                }
            })
            .await
            .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())));
            let (sessions, next) = match page {
                Ok(page) => page,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            let answer = Message::Sessions { id, sessions, next }.for_minor(ctx.minor);
            answer_counted(ctx, &mut send, id, &answer).await;
        }
        // Only another host of the deployment asks this (see `Cluster::take_for_attach`).
        Message::Yield { id, session } if ctx.origin == Origin::Forwarded => {
            let (state, user, asked) = (ctx.state.clone(), ctx.user.clone(), session.clone());
            let given = tokio::task::spawn_blocking(move || state.registry.give_up(&asked, &user))
                .await
                .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())));
            match given {
                Ok(gave) => {
                    if gave {
                        tracing::info!(
                            "gave session {session} up to another host, where a folder attaches"
                        );
                    } else {
                        tracing::debug!(
                            "asked to give session {session} up: not in memory here, nothing to \
                             give"
                        );
                    }
                    let _ = write_message(&mut send, &Message::Done { id, session }).await;
                    finish(&mut send).await;
                }
                Err(e) => send_error(&mut send, id, e).await,
            }
        }
        Message::Yield { id, .. } => {
            let error = ToolError::new(
                ErrorCode::Denied,
                "only another host of this deployment asks a host to give a session up",
            );
            send_error(&mut send, id, error).await;
        }
        other => {
            let kind = other.kind();
            // Store requests (sessions, history, landings) run on the blocking pool every user
            // shares: one of the user's requests in flight each, as a call is, and of their
            // store work.
            let slot = match ctx.state.store_turn(&ctx.user).await {
                Ok(slot) => slot,
                Err(e) => return send_error(&mut send, 0, e).await,
            };
            let caller = crate::requests::Caller {
                user: &ctx.user,
                device: Some(&ctx.device_id),
                landing: &ctx.landing,
            };
            // Given back as the store work ends, before the answer (which the agent may read
            // before acknowledging it), and even when this request is dropped before.
            let answered = crate::requests::answer(&ctx.state, &caller, other, slot).await;
            match answered {
                Some(answer) => {
                    let answer = answer.for_minor(ctx.minor);
                    answer_counted(ctx, &mut send, 0, &answer).await;
                }
                None => {
                    send_error(
                        &mut send,
                        0,
                        ToolError::new(
                            ErrorCode::Malformed,
                            format!("an agent cannot send `{kind}`"),
                        ),
                    )
                    .await;
                }
            }
        }
    }
}

/// The workspaces of `session` as an agent speaking minor `minor` reads them.
fn workspaces_message(id: u64, session: &Session, minor: u32) -> Message {
    Message::Workspaces {
        id,
        session: session.id.clone(),
        workspaces: listing(session),
    }
    .for_minor(minor)
}

/// Longest a refusal of a request over the per-connection bound may take to write.
const REFUSAL_WRITE: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest path an attached folder may have, in bytes: Linux's `PATH_MAX`.
const MAX_FOLDER_PATH: usize = 4096;

/// One client request: an attachment, held for as long as its stream stays open.
async fn client_request(ctx: &Ctx, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    let memory = ctx.state.call_bytes.holder(&ctx.user);
    let Some(request) = read_request(ctx, &mut send, &mut recv, MAX_HELLO, &memory).await else {
        return;
    };
    drop(memory);
    let Message::Attach {
        id,
        session,
        name,
        path,
        trust,
        tools,
        focus,
        folder,
        exact_name,
        network,
    } = request
    else {
        return send_error(
            &mut send,
            0,
            ToolError::new(
                ErrorCode::Malformed,
                format!("a client cannot send `{}`", request.kind()),
            ),
        )
        .await;
    };
    // Each tool once, in the order given: a list naming one thousands of times was kept as
    // sent, with the folder in the session's metadata, which every listing copies.
    let mut tools = tools;
    let mut seen = Vec::with_capacity(monad_protocol::ToolName::ALL.len());
    tools.retain(|tool| {
        !seen.contains(tool) && {
            seen.push(*tool);
            true
        }
    });
    // A path no file system takes (Linux's PATH_MAX) is no folder: refused before anything
    // keeps it (a record, a session's list, the registry).
    for (what, given) in [("path", Some(&path)), ("folder", folder.as_ref())] {
        if let Some(given) = given.filter(|g| g.len() > MAX_FOLDER_PATH) {
            let error = ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "the folder's {what} is {} bytes; a path is at most {MAX_FOLDER_PATH}",
                    given.len()
                ),
            );
            return send_error(&mut send, id, error).await;
        }
    }
    // The attach's own store work (where the folder lands, its workspace record) waits for one
    // of the user's turns at the store each, held by the work on the blocking pool to its end:
    // attaches in flight, or dropped with their connections while their work went on, took
    // every thread of the pool all users share. Waited for, never refused, as the session's
    // lookup is (a refused attach is one its client gives up on; the waiting is bounded by the
    // user's connections and their streams). One at a time: the lookup of the session between
    // them waits for a turn of its own.
    // Without a session named, a folder with an active session (an MCP host's, or one
    // `sessions --new` started in it) attaches there, so that host and folder meet.
    let folder = folder.filter(|f| std::path::Path::new(f).is_absolute());
    let (session, active) = match (session, &folder) {
        (None, Some(folder)) => {
            let state = ctx.state.clone();
            let (user, device, folder) = (ctx.user.clone(), ctx.device_id.clone(), folder.clone());
            let turn = ctx.state.store_work.wait_for(&ctx.user).await;
            let target = tokio::task::spawn_blocking(move || {
                let _turn = turn;
                crate::landing::attach_target(
                    &state.registry,
                    &user,
                    &device,
                    &folder,
                    crate::landing::now_ms(),
                )
            })
            .await
            .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())));
            let active = match target {
                Ok(active) => active,
                Err(e) => return send_error(&mut send, id, e).await,
            };
            let is_active = active.is_some();
            (active, is_active)
        }
        (session, _) => (session, false),
    };
    let session = match ctx.session(session.as_deref()).await {
        Ok(s) => s,
        Err(e) => return send_error(&mut send, id, e).await,
    };
    // Several hosts on one store: the host a folder attaches to serves its session live.
    if let Some(cluster) = &ctx.state.cluster {
        match cluster.take_for_attach(&session.id, &ctx.user).await {
            // Taken since this copy was read: the host that held it may have changed it.
            Ok(AttachAt::Here) => {
                if let Err(e) = ctx.state.fresh(&session).await {
                    return send_error(&mut send, id, e).await;
                }
            }
            Ok(AttachAt::Elsewhere { address, why }) => {
                let reason = format!(
                    "session {} is served by another host ({}), {why}",
                    session.id,
                    crate::cluster::shown(&address)
                );
                // A client that knows where to go attaches there; nothing was attached here.
                // A host that advertised nothing, or a wildcard, is only named.
                if ctx.minor >= wire::ELSEWHERE_MINOR
                    && monad_protocol::address::check_destination(&address).is_ok()
                {
                    let elsewhere = Message::Elsewhere {
                        id,
                        session: session.id.clone(),
                        host: address,
                        reason,
                    };
                    let _ = write_message(&mut send, &elsewhere).await;
                    return finish(&mut send).await;
                }
                let error = ToolError::new(
                    ErrorCode::WorkspaceDisconnected,
                    format!(
                        "{reason}: attach there, or once it lets the session go (the attach \
                         tries again)"
                    ),
                );
                return send_error(&mut send, id, error).await;
            }
            Err(e) => return send_error(&mut send, id, e).await,
        }
    }
    if session.refuses(trust) {
        return send_error(
            &mut send,
            id,
            ToolError::new(
                ErrorCode::Denied,
                "this server does not accept folders attached with full trust \
                 (attach.allow_full_trust = false); attach it restricted",
            ),
        )
        .await;
    }
    // A name it cannot have is refused before a record is made for the folder.
    if exact_name
        && let Some(wanted) = &name
        && let Err(e) = session.name_usable_for(&ctx.device_id, &path, wanted)
    {
        return send_error(&mut send, id, e).await;
    }
    let uri = format!("{}:{}", ctx.client_name, path);
    let record = {
        let store = ctx.state.registry.store().clone();
        let (user, device, path, uri) = (
            ctx.user.clone(),
            ctx.device_id.to_string(),
            path.clone(),
            uri.clone(),
        );
        let session_id = session.id.clone();
        let max = ctx.state.config.quotas.max_workspaces_per_user;
        let turn = ctx.state.store_work.wait_for(&ctx.user).await;
        let resolved = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            // A folder never attached before makes a record within the user's records, as one
            // made through the API does (each attach of another path made one, unbounded). A
            // store that cannot say lets the attach go on, its record left out, as before.
            let room = crate::store::record_room(store.as_ref(), &user, max, |r| {
                r.device_id == device && r.path == path
            });
            let (_creating, known) = match room {
                Ok(crate::store::RecordRoom::Full(count)) => {
                    return Err(ToolError::new(
                        ErrorCode::LimitExceeded,
                        format!(
                            "you have {count} workspace records, the most this server keeps for \
                             one user (server.max_workspaces_per_user); delete one (DELETE \
                             /api/v1/workspaces/ID) to attach a folder never attached before"
                        ),
                    ));
                }
                Ok(crate::store::RecordRoom::Free(creating)) => (Some(creating), None),
                Ok(crate::store::RecordRoom::Known(record)) => (None, Some(record)),
                Err(e) => {
                    warn!("workspace records: {e}");
                    (None, None)
                }
            };
            // A record found with this uri is the one resolving would give back unchanged.
            let record = match known {
                Some(record) if record.uri == uri => Ok(record),
                _ => store.resolve_record(&user, &device, &path, &uri),
            }
            .and_then(|record| {
                store.touch_record(&record.id, &session_id, 0)?;
                Ok(record.id)
            });
            Ok(record.inspect_err(|e| warn!("workspace record: {e}")).ok())
        })
        .await
        .unwrap_or(Ok(None));
        match resolved {
            Ok(record) => record,
            Err(e) => return send_error(&mut send, id, e).await,
        }
    };
    let generation = ctx.state.generations.fetch_add(1, Ordering::Relaxed);
    let base = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|b| !b.is_empty() && *b != "~" && *b != ".")
        .unwrap_or("folder")
        .to_owned();
    let (kick, mut kicked) = tokio::sync::mpsc::unbounded_channel::<String>();
    let folder = Attached {
        name: base,
        uri,
        trust,
        tools,
        device_id: ctx.device_id.clone(),
        path,
        record,
        folder,
        // A few words from the client, listed to agents: bounded, and escaped where shown.
        network: network.as_deref().map(wire::bounded_network),
        link: Some(ClientLink {
            conn: ctx.conn.clone().into(),
            attachment: id,
            generation,
            minor: ctx.minor,
            kick,
        }),
    };
    let mut shared_moves = ctx
        .state
        .registry
        .link_attached(&ctx.user, &session.id, &folder);
    let mut again = folder.clone();
    // A link another session's attachment left here by a share is replaced, not taken over.
    let exact = exact_name && name.is_some();
    let workspace = match ctx
        .state
        .registry
        .attach_own(&session, folder, name.as_deref(), exact)
    {
        Ok(workspace) => workspace,
        Err(e) => {
            ctx.state.registry.detach_everywhere(&session, generation);
            return send_error(&mut send, id, e).await;
        }
    };
    // In the folder's active session, the folder is the focus unless the session has one.
    let asked_focus = focus;
    let focus = focus || (active && session.focus().is_none());
    if focus {
        // Just attached under this connection: online, so this cannot fail but for a detach
        // that already happened; then there is nothing to focus on.
        if let Err(e) = session.set_focus(&workspace.name) {
            warn!(session = %session.id, workspace = %workspace.name, "focus: {}", e.message);
        }
    }
    // Back, too, in the sessions it was shared into before and that still list it (an MCP
    // host's, which landed on it there): a folder's connection that dropped and came back
    // would otherwise leave such a host's calls failing on it, offline, until it landed again.
    again.name.clone_from(&workspace.name);
    ctx.state.registry.share_again(&again, &session);
    info!(session = %session.id, workspace = %workspace.name, focus, "attached");
    // Detaches however this task ends: when the connection drops, its handler may abort this
    // task before the read below fails, and a folder left online with a dead link would stay
    // listed (and keep the connection, and the endpoint's socket, alive).
    let _detach = DetachOnDrop {
        state: ctx.state.clone(),
        session: session.clone(),
        generation,
        name: workspace.name.clone(),
    };
    let ok = write_message(
        &mut send,
        &Message::Attached {
            id,
            session: session.id.clone(),
            workspace: workspace.clone(),
        }
        .for_minor(ctx.minor),
    )
    .await;
    if ok.is_ok() {
        // Held until the client finishes or resets the stream, or the connection drops, or the
        // server shuts down and no agent's call (which might run here) is in flight any more.
        // Meanwhile the client reports the folder's network connections on it.
        let mut stop = ctx.stop.clone();
        let mut calls = ctx.state.calls.subscribe();
        let recorder = ctx.state.executor.recorder.as_ref();
        let reports = attach_reports(
            &ctx.state,
            &ctx.user,
            recorder,
            &session.id,
            &workspace.name,
            &mut recv,
        );
        tokio::pin!(reports);
        let stopping = async {
            let _ = stop.wait_for(|stopping| *stopping).await;
            let _ = calls.wait_for(|n| *n == 0).await;
        };
        tokio::pin!(stopping);
        // What the client knows of the focus: what it asked for. A focus it did not ask for
        // (the folder's active session had none), and every move to or from the folder after,
        // it is told of (one that knows how to hear it), so that its owner knows where an
        // agent's calls that name no workspace go.
        let mut focus_moves = session.watch_focus();
        let mut told = asked_focus;
        // The same for each session the folder was shared into and serves too (an MCP host's
        // roots landed on it there), told to a client that knows how to hear which.
        let mut told_shared: HashMap<String, bool> = HashMap::new();
        // The frames of a focus move not written yet. They are written while the rest is
        // watched: a client that does not read its stream holds the write, and must not hold
        // this task past a takeover, its connection's end or the server's shutdown. Written
        // piece by piece (`SendStream::write` writes a piece or nothing), so that a `detached`
        // after them never lands inside a frame.
        let mut unsent: Vec<u8> = Vec::new();
        loop {
            if unsent.is_empty() {
                let now = focus_moves.borrow_and_update().clone();
                let is_focus = now.as_deref() == Some(workspace.name.as_str());
                if is_focus != told && ctx.minor >= wire::FOCUSED_MINOR {
                    let moved = Message::Focused {
                        attachment: id,
                        focus: is_focus,
                        now,
                        session: None,
                    };
                    unsent = moved.to_frames();
                }
                told = is_focus;
            }
            tokio::select! {
                // A detach by name also ends the focus: the client hears why it stops, not
                // first that the focus left.
                biased;
                // Taken over by another attach of the folder, or detached by name: its client
                // is told why (one that knows how to hear it), so that it stops.
                Some(reason) = kicked.recv() => {
                    info!(session = %session.id, workspace = %workspace.name, "{reason}");
                    // The rest of a focus move first, then why; a client that does not take
                    // them in time gets its stream reset.
                    let said = tokio::time::timeout(ANSWER_ACK_WAIT, async {
                        if send.write_all(&unsent).await.is_err() {
                            return false;
                        }
                        unsent.clear();
                        let detached = Message::Detached { attachment: id, reason };
                        ctx.minor < wire::CLI_MINOR
                            || write_message(&mut send, &detached).await.is_ok()
                    })
                    .await;
                    if said == Ok(true) {
                        finish(&mut send).await;
                    } else {
                        let _ = send.reset(reset::CANCELLED.into());
                    }
                    break;
                }
                () = &mut reports => break,
                () = &mut stopping => break,
                wrote = send.write(&unsent), if !unsent.is_empty() => match wrote {
                    Ok(n) => {
                        unsent.drain(..n);
                    }
                    Err(_) => break,
                },
                Ok(()) = focus_moves.changed(), if unsent.is_empty() => {}
                Some(moved) = shared_moves.recv(), if unsent.is_empty() => {
                    let is_focus = moved.now.as_deref() == Some(moved.name.as_str());
                    let was = told_shared.insert(moved.session.clone(), is_focus);
                    if was.unwrap_or(false) != is_focus
                        && ctx.minor >= wire::SHARED_FOCUS_MINOR
                    {
                        unsent = Message::Focused {
                            attachment: id,
                            focus: is_focus,
                            now: moved.now,
                            session: Some(moved.session),
                        }
                        .to_frames();
                    }
                }
            }
        }
        if !unsent.is_empty() {
            // Ended with a focus move cut short: the stream must not end as if it were whole.
            let _ = send.reset(reset::CANCELLED.into());
        }
    }
}

/// Largest message a client sends on its attach stream ([`Message::Network`]: at most
/// [`wire::MAX_NETWORK_EVENTS`] connections).
const MAX_REPORT: usize = 256 * 1024;

/// Reads an attach stream until it ends: the folder's network connections its client reports
/// go to the session's audit log. Anything else is ignored; after a malformed message the rest
/// of the stream is only drained.
///
/// The client's word is not taken for how many connections a message holds nor how fast they
/// come (its sandbox bounds them, but a client of its own need not): at most
/// [`wire::MAX_NETWORK_EVENTS`] a message, and lines only as fast as a sandbox keeps them, over
/// all of `user`'s attach streams together ([`State::network_line`]); the rest are counted,
/// the count written with the next line the allowance takes, or at the stream's end. Without
/// it one user's client could fill the recorder every user's records go through, and the disk.
async fn attach_reports(
    state: &State,
    user: &str,
    recorder: Option<&crate::recorder::Recorder>,
    session: &str,
    workspace: &str,
    recv: &mut quinn::RecvStream,
) {
    let take = |now| state.network_line(user, now);
    // Connections not recorded and not yet said.
    let mut unsaid: u64 = 0;
    let mut ignored_said = false;
    loop {
        // A report is held in memory as it arrives: counted with the user's calls, never
        // refused (one stream holds at most one), so that the user's next calls are, and no
        // connection goes unrecorded for it.
        let memory = state.call_bytes.holder(user);
        let read = monad_protocol::io::read_message_relayed_counted(recv, MAX_REPORT, &mut |n| {
            memory.take_anyway(n);
            true
        })
        .await;
        match read {
            Ok(Some(Message::Network {
                events, dropped, ..
            })) => {
                let now = std::time::Instant::now();
                unsaid = unsaid.saturating_add(dropped);
                // The count is a line of its own, from the same allowance, taken first: a
                // client that keeps it spent on connections still has them counted as it goes.
                let said = if unsaid > 0 && take(now) {
                    std::mem::take(&mut unsaid)
                } else {
                    0
                };
                let mut kept = Vec::new();
                for (i, event) in events.into_iter().enumerate() {
                    if i < wire::MAX_NETWORK_EVENTS && take(now) {
                        kept.push(event);
                    } else {
                        unsaid = unsaid.saturating_add(1);
                    }
                }
                if let Some(recorder) = recorder
                    && (!kept.is_empty() || said > 0)
                {
                    crate::executor::record_network(
                        recorder, user, session, workspace, &kept, said,
                    );
                }
            }
            // Said once a stream: a client sending them at line speed wrote a line each to the
            // log, whose writer blocks the async workers when stderr is slow.
            Ok(Some(other)) => {
                if !ignored_said {
                    ignored_said = true;
                    warn!(
                        session,
                        workspace,
                        "ignored `{}` on an attach stream (others after it are ignored unsaid)",
                        other.kind()
                    );
                }
            }
            Ok(None) => break,
            // The client went away (killed, its network lost): the attachment's own end is
            // reported where it is noticed, not as a malformed message.
            Err(monad_protocol::io::ReadError::Io(e)) => {
                debug!(session, workspace, "attach stream ended: {e}");
                break;
            }
            Err(e) => {
                warn!(
                    session,
                    workspace, "malformed report on an attach stream: {e}"
                );
                let mut sink = [0u8; 64];
                while let Ok(Some(_)) = recv.read(&mut sink).await {}
                break;
            }
        }
    }
    if let Some(recorder) = recorder
        && unsaid > 0
    {
        crate::executor::record_network(recorder, user, session, workspace, &[], unsaid);
    }
}

/// Marks an attachment disconnected when dropped.
struct DetachOnDrop {
    state: Arc<State>,
    session: Arc<Session>,
    generation: u64,
    name: String,
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        // Offline everywhere: in its session and in any its link was shared into.
        self.state
            .registry
            .detach_everywhere(&self.session, self.generation);
        info!(session = %self.session.id, workspace = %self.name, "detached");
    }
}

/// A server bound on an ephemeral loopback port with a temporary data dir (kept by the
/// caller), not serving: its state for the unit tests of what runs on it.
#[cfg(test)]
pub(crate) fn bound_for_test() -> (tempfile::TempDir, Server) {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path().to_path_buf());
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let (server, _) = Server::bind(config).unwrap();
    (data, server)
}
