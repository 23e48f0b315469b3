//! Several hosts on one PostgreSQL store: who serves a live session, and calls forwarded to it.
//!
//! Each live session is served by one host, the holder of its lease (see
//! [`crate::store::pg::lease`]). An agent may reach any host: [`Cluster::route`] decides where
//! its call runs ([`decide`], a pure function), and [`Cluster::forward`] carries a call for a
//! session served elsewhere to that host over QUIC, as the agent's user, and brings back the
//! answer. Hosts authenticate each other with the shared secret of `[cluster] secret` (sent in
//! the hello in place of a user's token, compared in constant time, never logged) and share
//! the `tls/` directory, so each pins the one certificate they all present: its own.
//!
//! With the filesystem store there is no cluster: every call runs here, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monad_protocol::io::{read_message, write_message};
use monad_protocol::wire::{self, Message, Outcome, Role};
use monad_protocol::{ErrorCode, ToolError};
use serde_json::Value;

use crate::executor::{CallOutput, ProgressSink};
use crate::settings::Secret;
use crate::store::PgStore;
use crate::store::pg::Lease;

/// How long reaching another host (QUIC handshake and hello) may take before the call is told
/// that the session's owner is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection to another host for one user's calls, once made.
type Link = Arc<tokio::sync::Mutex<Option<quinn::Connection>>>;

/// How many connection slots there may be before those whose connection closed are swept.
const LINKS_SWEPT_PAST: usize = 64;

/// How long asking a session's holder to give it up ([`Cluster::take_for_attach`]) may take,
/// connecting included, before the attach waits for its lease instead.
const YIELD_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a session's holder did not give it up.
enum Unyielding {
    /// Something uses it there (in words).
    Kept(String),
    /// It could not be asked, or did not understand (an older host).
    Unknown(String),
}

/// The largest answer a forwarded call brings back (the owner sends large contents inline to
/// a forwarding host).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// Where a call comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// An agent connected to this host.
    Agent,
    /// Another host, forwarding its agent's call here because this host serves the session:
    /// never forwarded again.
    Forwarded,
}

/// Where a call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Here: this host serves the session.
    Local,
    /// At the host that serves the session, reached at `address`.
    Forward {
        /// Its advertised `HOST:PORT`.
        address: String,
    },
}

/// Where a call for `session` runs, given who holds its lease (after this host tried to take
/// it), where the call comes from, and whether this host may forward (it has a secret).
pub fn decide(
    session: &str,
    lease: &Lease,
    origin: Origin,
    can_forward: bool,
) -> Result<Route, ToolError> {
    let (address, epoch) = match lease {
        Lease::Held { .. } => return Ok(Route::Local),
        Lease::Elsewhere { address, epoch, .. } => (address, *epoch),
    };
    match origin {
        Origin::Forwarded => Err(ToolError::new(
            ErrorCode::WorkspaceDisconnected,
            format!(
                "session {session} is served by another host now (lease epoch {epoch}); a \
                 forwarded call is not forwarded again: ask again"
            ),
        )),
        Origin::Agent if !can_forward => Err(ToolError::new(
            ErrorCode::WorkspaceDisconnected,
            format!(
                "session {session} is served by another host ({}), and this host does not \
                 forward calls (no [cluster] secret): connect to that host, or give every host \
                 the same [cluster] secret",
                shown(address)
            ),
        )),
        Origin::Agent if address.trim().is_empty() => Err(ToolError::new(
            ErrorCode::WorkspaceDisconnected,
            format!(
                "session {session} is served by another host, which advertised no address to \
                 forward calls to (serve --advertise HOST:PORT)"
            ),
        )),
        Origin::Agent => Ok(Route::Forward {
            address: address.clone(),
        }),
    }
}

/// Where a folder attaching to a session goes ([`Cluster::take_for_attach`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachAt {
    /// Here: this host holds the session's lease now.
    Here,
    /// Another host serves the session and keeps it.
    Elsewhere {
        /// Its advertised `HOST:PORT` (empty when it advertised none).
        address: String,
        /// Why it keeps the session, as a clause after its address ("where a folder is
        /// attached to it", "which keeps renewing its lease").
        why: String,
    },
}

/// A holder's address as an error shows it (it may have advertised none).
pub(crate) fn shown(address: &str) -> &str {
    if address.trim().is_empty() {
        "address not advertised"
    } else {
        address
    }
}

/// The error an agent gets when the host that serves its session cannot be reached.
pub fn unreachable(session: &str, address: &str, why: &str, lease: Duration) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceDisconnected,
        format!(
            "session {session}: its owner host ({address}) is unreachable ({why}); another host \
             serves it once that host's lease expires (within {} s)",
            lease.as_secs()
        ),
    )
}

/// This host in a cluster: its leases (in the PostgreSQL store), the shared secret, and the
/// connections it forwards calls over.
pub struct Cluster {
    store: Arc<PgStore>,
    secret: Option<Secret>,
    /// The certificate every host presents (they share `tls/`).
    fingerprint: String,
    /// The device id this host says hello with when it forwards.
    device: String,
    /// The client endpoints calls are forwarded from, one per address family (IPv4, IPv6):
    /// an endpoint bound for one cannot reach the other.
    endpoint: Mutex<[Option<quinn::Endpoint>; 2]>,
    /// Connections to other hosts, by (address, user): each slot locked while its connection
    /// is made, so that one host that does not answer holds up only the calls to it.
    links: Mutex<HashMap<(String, String), Link>>,
    /// Sessions found served by another host, with its address and when that was found: a
    /// call in the next [`Cluster::owner_memory`] is forwarded there without asking the
    /// database again (asking takes the lease row's lock, a commit the database syncs: it was
    /// most of a forwarded call's cost). Forgotten when a forward to it fails.
    owners: Mutex<HashMap<String, (String, tokio::time::Instant)>>,
}

/// The most sessions served elsewhere that a host remembers the owner of at once.
const OWNERS_MAX: usize = 65_536;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("host", self.store.host())
            .field("forwards", &self.forwards())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// This host on `store` (named by its [`crate::store::pg::Host`]), forwarding with
    /// `secret` (none: it neither forwards nor accepts forwarded calls; a blank one is none, as
    /// [`crate::settings::ClusterSettings::secret`] gives it), pinning
    /// `fingerprint` (its own certificate's) when it reaches other hosts.
    pub fn new(store: Arc<PgStore>, secret: Option<Secret>, fingerprint: &str) -> Cluster {
        Cluster {
            store,
            secret,
            fingerprint: fingerprint.to_owned(),
            device: uuid::Uuid::new_v4().hyphenated().to_string(),
            endpoint: Mutex::new([None, None]),
            links: Mutex::new(HashMap::new()),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this host forwards calls and accepts forwarded ones (it has a secret that is not
    /// blank).
    pub fn forwards(&self) -> bool {
        self.secret.is_some()
    }

    /// The store the leases are in.
    pub fn store(&self) -> &Arc<PgStore> {
        &self.store
    }

    /// Whether `offered` is the hosts' secret (false when this host has none).
    pub fn accepts(&self, offered: &str) -> bool {
        self.secret.as_ref().is_some_and(|s| s.matches(offered))
    }

    /// Where a call for `session` runs: here when this host holds its lease (from memory) or
    /// takes it now (nobody serves it, or its holder's lease expired), else at its holder.
    pub async fn route(&self, session: &str, origin: Origin) -> Result<Route, ToolError> {
        if self.store.held_epoch(session).is_some() {
            return Ok(Route::Local);
        }
        if origin == Origin::Agent
            && self.forwards()
            && let Some(address) = self.remembered_owner(session)
        {
            return Ok(Route::Forward { address });
        }
        let lease = self.take(session).await?;
        let route = decide(session, &lease, origin, self.forwards())?;
        if let Route::Forward { address } = &route {
            let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
            if owners.len() >= OWNERS_MAX {
                owners.clear();
            }
            owners.insert(
                session.to_owned(),
                (address.clone(), tokio::time::Instant::now()),
            );
        }
        Ok(route)
    }

    /// How long a session's owner found in the database is trusted without asking again: a
    /// quarter of the lease time, at most a second. A hand-over within it sends a call to the
    /// former owner, which refuses it (or cannot be reached: then it is forgotten at once).
    fn owner_memory(&self) -> Duration {
        (self.store.host().ttl / 4).min(Duration::from_secs(1))
    }

    /// The owner of `session` found in the database within [`Cluster::owner_memory`].
    fn remembered_owner(&self, session: &str) -> Option<String> {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        match owners.get(session) {
            Some((address, found)) if found.elapsed() < self.owner_memory() => {
                Some(address.clone())
            }
            Some(_) => {
                owners.remove(session);
                None
            }
            None => None,
        }
    }

    /// Forgets the owner remembered for `session` (a forward to it failed).
    fn forget_owner(&self, session: &str) {
        self.owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }

    /// Takes (or keeps) the lease of `session`, off the async workers.
    pub async fn take(&self, session: &str) -> Result<Lease, ToolError> {
        let (store, id) = (self.store.clone(), session.to_owned());
        tokio::task::spawn_blocking(move || store.take_lease(&id))
            .await
            .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?
            .map_err(crate::session::store_error)
    }

    /// Takes the lease of `session` for a folder attaching here, waiting at most one lease time
    /// (and a second) for another host's lease to run out. A laptop comes here when its host
    /// died, whose lease then expires within `lease_secs`: the attach goes through as soon as
    /// it has, instead of being refused while the dead host's lease runs. A live holder keeps
    /// renewing its lease, and the folder is sent to it once the wait is over. The lease has no
    /// notification in the database to wait on, so its row is read again every 250 ms.
    ///
    /// First, the holder is asked to give the session up ([`Message::Yield`], as `user`): a
    /// host that holds it only because an agent's calls ran there (it stays in memory for
    /// hours when idle) lets it go, and the attach goes through at once; a holder where
    /// something uses it (a folder attached, a call running) says what, and the folder is sent
    /// there at once ([`AttachAt::Elsewhere`]) rather than after the wait. A holder that cannot
    /// be asked (it died, it has no address, or this host has no secret) is waited for as
    /// before.
    pub async fn take_for_attach(&self, session: &str, user: &str) -> Result<AttachAt, ToolError> {
        let deadline = tokio::time::Instant::now() + self.store.host().ttl + Duration::from_secs(1);
        let address = match self.take(session).await? {
            Lease::Elsewhere { address, .. } => address,
            Lease::Held { .. } => return Ok(AttachAt::Here),
        };
        if self.forwards() && !address.trim().is_empty() {
            match self.ask_to_yield(&address, user, session).await {
                Ok(()) => {}
                Err(Unyielding::Kept(why)) => {
                    return Ok(AttachAt::Elsewhere {
                        address,
                        why: format!("where {why}"),
                    });
                }
                Err(Unyielding::Unknown(why)) => tracing::debug!(
                    "the host at {address} was not asked to give session {session} up ({why}); \
                     waiting for its lease"
                ),
            }
        }
        loop {
            match self.take(session).await? {
                Lease::Elsewhere { .. } if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Lease::Elsewhere { address, .. } => {
                    return Ok(AttachAt::Elsewhere {
                        address,
                        why: "which keeps renewing its lease".into(),
                    });
                }
                Lease::Held { .. } => return Ok(AttachAt::Here),
            }
        }
    }

    /// Asks the host at `address` to give `session` up ([`Message::Yield`]), as `user`.
    async fn ask_to_yield(
        &self,
        address: &str,
        user: &str,
        session: &str,
    ) -> Result<(), Unyielding> {
        let asked = async {
            let conn = self.link(address, user).await?;
            let (mut send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            let mut recv = monad_protocol::stream::QuietRecv::new(recv);
            let request = Message::Yield {
                id: 1,
                session: session.to_owned(),
            };
            write_message(&mut send, &request)
                .await
                .map_err(|e| e.to_string())?;
            let _ = send.finish();
            let answer = read_message(&mut *recv, 64 * 1024)
                .await
                .map_err(|e| e.to_string())?;
            recv.let_go();
            Ok::<_, String>(answer)
        };
        match tokio::time::timeout(YIELD_TIMEOUT, asked).await {
            Ok(Ok(Some(Message::Done { .. }))) => Ok(()),
            Ok(Ok(Some(Message::Error { error, .. }))) if error.code == ErrorCode::Denied => {
                Err(Unyielding::Kept(error.message))
            }
            // An older host does not know the request (`malformed`).
            Ok(Ok(Some(Message::Error { error, .. }))) => Err(Unyielding::Unknown(error.message)),
            Ok(Ok(Some(other))) => Err(Unyielding::Unknown(format!(
                "it answered `{}`",
                other.kind()
            ))),
            Ok(Ok(None)) => Err(Unyielding::Unknown("it closed the stream".into())),
            Ok(Err(why)) => Err(Unyielding::Unknown(why)),
            Err(_) => Err(Unyielding::Unknown(format!(
                "no answer within {} s",
                YIELD_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Gives up the lease of `session` (it left this host's memory).
    pub fn release(&self, session: &str) {
        if let Err(e) = self.store.release_lease(session) {
            tracing::warn!("the lease of session {session} stays until it expires: {e}");
        }
    }

    /// Runs `tool` in `session` at the host at `address`, as `user`, relaying its progress to
    /// `progress`. The answer comes back whole (large contents inline).
    pub async fn forward(
        &self,
        address: &str,
        user: &str,
        session: &str,
        tool: &str,
        args: Value,
        progress: &dyn ProgressSink,
    ) -> Result<CallOutput, ToolError> {
        let lease = self.store.host().ttl;
        let conn = self.link(address, user).await.map_err(|why| {
            self.forget_owner(session);
            unreachable(session, address, &why, lease)
        })?;
        let lost = |e: &dyn std::fmt::Display| {
            self.forget_owner(session);
            unreachable(session, address, &e.to_string(), lease)
        };
        let (mut send, recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
        // The answer ends its stream: read that end too, so the host is not told to stop (a
        // call dropped before its answer still stops it: a cancel).
        let mut recv = monad_protocol::stream::QuietRecv::new(recv);
        let request = Message::Call {
            id: 1,
            session: Some(session.to_owned()),
            tool: tool.to_owned(),
            args,
        };
        write_message(&mut send, &request)
            .await
            .map_err(|e| lost(&e))?;
        let _ = send.finish();
        // Read as text, not made a tree, and counted with the call's other memory: what the
        // owner host relays is what the user's own client answered.
        let memory = crate::executor::link::call_memory();
        loop {
            let read =
                crate::executor::link::read_answer(&mut *recv, MAX_ANSWER, memory.as_deref());
            let message = match read.await {
                Ok(Some(message)) => message,
                Ok(None) => return Err(lost(&"the stream ended before the answer")),
                Err(monad_protocol::io::ReadError::Refused) => {
                    let what = format!("the answer forwarded from {address}");
                    return Err(crate::executor::link::refused(memory.as_deref(), &what));
                }
                Err(e) => return Err(lost(&e)),
            };
            match message {
                Message::Progress { message, .. } => {
                    progress.progress(monad_protocol::wire::progress_line(&message))
                }
                Message::Result {
                    workspace,
                    outcome,
                    body: None,
                    ..
                } => {
                    recv.let_go();
                    return Ok(CallOutput {
                        workspace,
                        outcome,
                        body: None,
                    });
                }
                Message::Error { error, .. } => {
                    // Refused as a request (not a tool's error): e.g. the host no longer
                    // serves the session; ask the database next time.
                    self.forget_owner(session);
                    return Ok(CallOutput {
                        workspace: None,
                        outcome: Outcome::Error { error },
                        body: None,
                    });
                }
                other => {
                    return Err(lost(&format!(
                        "it answered `{}`, not a result",
                        other.kind()
                    )));
                }
            }
        }
    }

    /// An open connection to the host at `address` for `user`'s calls: the one kept, or a new
    /// one (handshake, pinned certificate, hello with the secret).
    async fn link(&self, address: &str, user: &str) -> Result<quinn::Connection, String> {
        let Some(secret) = &self.secret else {
            return Err("this host has no [cluster] secret".into());
        };
        let key = (address.to_owned(), user.to_owned());
        let slot = {
            let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
            // Slots of connections closed (a host gone, an idle time-out) go as new ones come,
            // each time their number reaches a power of two, rather than staying for every
            // address and user ever forwarded for.
            if !links.contains_key(&key)
                && links.len() >= LINKS_SWEPT_PAST
                && links.len().is_power_of_two()
            {
                // A slot another call holds (looked up, about to be locked) stays too: swept,
                // that call would connect into a slot no later call finds.
                links.retain(|_, slot| {
                    Arc::strong_count(slot) > 1
                        || match slot.try_lock() {
                            Ok(conn) => conn.as_ref().is_some_and(|c| c.close_reason().is_none()),
                            Err(_) => true,
                        }
                });
            }
            links.entry(key).or_default().clone()
        };
        let mut conn = slot.lock().await;
        if let Some(open) = conn.as_ref()
            && open.close_reason().is_none()
        {
            return Ok(open.clone());
        }
        *conn = None;
        let made = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(address, user, secret))
            .await
            .map_err(|_| format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))??;
        *conn = Some(made.clone());
        Ok(made)
    }

    async fn connect(
        &self,
        address: &str,
        user: &str,
        secret: &Secret,
    ) -> Result<quinn::Connection, String> {
        let addr = tokio::net::lookup_host(address)
            .await
            .map_err(|e| e.to_string())?
            .next()
            .ok_or_else(|| "no address".to_owned())?;
        let endpoint = self.endpoint(addr.is_ipv6())?;
        let conn = endpoint
            .connect(addr, "localhost")
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        let (mut send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        let mut recv = monad_protocol::stream::QuietRecv::new(recv);
        write_message(
            &mut send,
            &Message::Hello {
                protocol: wire::PROTOCOL_MAJOR,
                // Minor 0: large contents come inline, in the result.
                minor: 0,
                role: Role::Agent,
                token: secret.expose().to_owned(),
                device_id: self.device.clone(),
                client_name: "monad-host".into(),
                capabilities: vec!["progress".into()],
                forwarded_for: Some(user.to_owned()),
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        let _ = send.finish();
        let welcome = read_message(&mut *recv, 64 * 1024).await;
        // The welcome is the stream's one message; its end may still be on its way.
        recv.let_go();
        match welcome {
            Ok(Some(Message::Welcome { .. })) => Ok(conn),
            Ok(Some(Message::Refused { error })) => Err(format!("it refused: {}", error.message)),
            Ok(Some(other)) => Err(format!("it answered `{}` to the hello", other.kind())),
            Ok(None) => Err("it closed the hello".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The client endpoint calls to an address of this family are forwarded from (made on
    /// first use).
    fn endpoint(&self, v6: bool) -> Result<quinn::Endpoint, String> {
        let mut endpoints = self.endpoint.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut endpoints[usize::from(v6)];
        if let Some(endpoint) = slot.as_ref() {
            return Ok(endpoint.clone());
        }
        let mut endpoint = monad_protocol::pin::client_endpoint(v6)
            .map_err(|e| format!("cannot open a UDP socket: {e}"))?;
        let (config, _) = monad_protocol::pin::pinned_config(&self.fingerprint, wire::ALPN)?;
        endpoint.set_default_client_config(config);
        *slot = Some(endpoint.clone());
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elsewhere(address: &str) -> Lease {
        Lease::Elsewhere {
            holder: "h2".into(),
            address: address.into(),
            epoch: 4,
        }
    }

    #[test]
    fn a_call_runs_here_when_this_host_holds_the_lease() {
        for origin in [Origin::Agent, Origin::Forwarded] {
            for can_forward in [true, false] {
                assert_eq!(
                    decide("s1", &Lease::Held { epoch: 2 }, origin, can_forward),
                    Ok(Route::Local)
                );
            }
        }
    }

    #[test]
    fn an_agents_call_for_a_session_served_elsewhere_goes_to_its_owner() {
        assert_eq!(
            decide("s1", &elsewhere("10.0.0.2:4433"), Origin::Agent, true),
            Ok(Route::Forward {
                address: "10.0.0.2:4433".into()
            })
        );
    }

    #[test]
    fn without_a_secret_or_an_address_a_call_for_a_session_served_elsewhere_is_refused() {
        let e = decide("s1", &elsewhere("10.0.0.2:4433"), Origin::Agent, false).unwrap_err();
        assert_eq!(e.code, ErrorCode::WorkspaceDisconnected);
        assert!(e.message.contains("10.0.0.2:4433"), "{}", e.message);
        assert!(e.message.contains("[cluster] secret"), "{}", e.message);
        let e = decide("s1", &elsewhere(" "), Origin::Agent, true).unwrap_err();
        assert!(e.message.contains("--advertise"), "{}", e.message);
    }

    #[test]
    fn a_forwarded_call_is_never_forwarded_again() {
        let e = decide("s1", &elsewhere("10.0.0.2:4433"), Origin::Forwarded, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::WorkspaceDisconnected);
        assert!(e.message.contains("not forwarded again"), "{}", e.message);
    }

    #[test]
    fn an_unreachable_owner_is_named_with_the_session() {
        let e = unreachable("s1", "10.0.0.2:4433", "timed out", Duration::from_secs(10));
        assert!(e.message.contains("session s1"), "{}", e.message);
        assert!(
            e.message
                .contains("owner host (10.0.0.2:4433) is unreachable"),
            "{}",
            e.message
        );
    }
}
