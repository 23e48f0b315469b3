//! Server settings. Defaults are embedded; the command line overrides them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use monad_protocol::wire::Role;
use monad_sandbox::{ExecPolicy, Limits};

/// Everything the server needs to run.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// QUIC address to listen on.
    pub listen: SocketAddr,
    /// Address of the MCP over HTTP endpoint (`http://<it>/mcp`); `None` turns it off (the
    /// library default; the `monad-server` command line turns it on at 127.0.0.1:4480).
    pub http: Option<SocketAddr>,
    /// Where tokens, certificates and sessions live.
    pub data_dir: PathBuf,
    /// Connection bounds.
    pub transport: Transport,
    /// Limits of the primary workspaces' tools.
    pub limits: Limits,
    /// Command policy of the primary workspaces.
    pub exec: ExecPolicy,
    /// Requests one connection may have in flight at once.
    pub max_calls_per_connection: usize,
    /// Longest a routed call may take end to end (approval included).
    pub call_timeout: Duration,
    /// How long a new connection has to finish its handshake and say hello.
    pub hello_timeout: Duration,
    /// The same, for a connection that arrives while the server is busy (at least
    /// [`Quotas::busy_pending_handshakes`] pending); the shorter of the two applies.
    pub busy_hello_timeout: Duration,
    /// A request on a QUIC stream must arrive whole within this long of the stream opening.
    pub request_read_timeout: Duration,
    /// On shutdown, how long in-flight calls get to finish before connections close.
    pub shutdown_grace: Duration,
    /// What one user may hold at once.
    pub quotas: Quotas,
    /// Bounds of the HTTP listener.
    pub http_limits: HttpLimits,
    /// Where records are kept: the filesystem store unless it names a database.
    pub store: crate::settings::StoreSettings,
    /// Several hosts on one database: leases, the host-to-host secret, the advertised address.
    pub cluster: crate::settings::ClusterSettings,
    /// The cgroup under which each user's process group is made (`[server] process_cgroup`);
    /// `None`: under the server's own cgroup of each controller.
    pub process_cgroup: Option<PathBuf>,
    /// The store named by `serve --store/--objects`: over `[store]` of `config.toml` and the
    /// `MONAD_STORE_*` variables (which `store` is put under).
    pub store_flags: crate::settings::StoreFlags,
}

/// What one user may hold at once, so that no user can take the server from the others. The
/// defaults are far above what a heavy legitimate user needs (see `docs/operations.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    /// Sessions of one user in memory; opening one more drops the user's least recently used
    /// session that nothing uses, else is refused with `limit_exceeded`.
    pub max_sessions_in_memory_per_user: usize,
    /// Sessions one user may have stored; creating one more is refused with `limit_exceeded`.
    pub max_sessions_per_user: usize,
    /// QUIC connections of one user at once; one more is refused at its hello.
    pub max_connections_per_user: usize,
    /// Tool calls of one user in flight at once, over every connection and MCP over HTTP, and
    /// their other QUIC requests (session listings, history, landings).
    pub max_calls_per_user: usize,
    /// Requests of one user working on the store at once (listings, conversations, logs,
    /// artifacts, over QUIC and HTTP), on the blocking threads and store connections every user
    /// shares; as many more wait for one of them to end, and the next is refused with
    /// `limit_exceeded` (`429` over HTTP).
    pub max_store_work_per_user: usize,
    /// Turns of the built-in agent one user runs at once, over all their sessions (each turn
    /// talks to the model with the operator's key); one more is refused with `limit_exceeded`.
    pub max_turns_per_user: usize,
    /// Bytes one user's calls may hold in the server's memory at once: their requests (QUIC, MCP
    /// over HTTP, the API's JSON bodies) with the trees they become, and their attached clients'
    /// answers, a cluster's forwarded ones included (read, or
    /// read whole for a front that needs the result as one value), each until its answer is
    /// written out; a request or an answer that would pass it fails with `limit_exceeded`.
    pub max_call_bytes_per_user: usize,
    /// Connections that have not said hello yet, over all peers. One more makes room by closing
    /// the oldest (see [`crate::admission`]).
    pub max_pending_handshakes: usize,
    /// Connections that have not said hello yet from one address (an IPv6 /64); one more is
    /// refused, unless it can take the place of one whose address was never validated.
    pub max_pending_handshakes_per_address: usize,
    /// From this many pending handshakes on, the server is busy: a new connection must prove its
    /// address first (a QUIC Retry, one more round trip) and has
    /// [`ServerConfig::busy_hello_timeout`] to say hello. 0: always ask for the proof.
    pub busy_pending_handshakes: usize,
    /// Devices of one user the server remembers a last session for; binding one more forgets
    /// the user's least recently used device.
    pub max_devices_per_user: usize,
    /// MCP over HTTP sessions of one user; opening one more ends the user's least recently
    /// used one.
    pub max_mcp_sessions_per_user: usize,
    /// Workspace records of one user (`local` and `general`, however made); creating one more
    /// through the API is refused with `507`.
    pub max_workspaces_per_user: usize,
    /// Bytes of artifacts one user may have stored through the API (uploads and history
    /// snapshots, over all their sessions); an upload that would pass it is refused with `507`.
    pub max_artifact_bytes_per_user: u64,
    /// Processes and threads one user's commands may have at once over all their sessions (a
    /// cgroup's `pids.max` per user: `monad_sandbox::exec::cgroup`); 0 for no such bound.
    pub max_processes_per_user: u64,
    /// Bytes of memory one user's commands may use at once over all their sessions (the same
    /// cgroups' `memory.max`); 0 for no such bound. Default: half of the host's memory.
    pub max_memory_per_user: u64,
    /// The most processor time one user's commands may take together, in percent of one CPU
    /// (150: one and a half), over all their sessions (the same cgroups' `cpu.max`); 0 for no
    /// ceiling. Either way each user's commands together get an equal share of a busy host,
    /// however many processes they run.
    pub max_cpu_percent_per_user: u64,
    /// Connections one user's commands may have open at once through the network proxies of
    /// all their sessions' primary workspaces (each holds two of the server's descriptors); 0
    /// for no such bound.
    pub max_proxy_connections_per_user: usize,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_sessions_in_memory_per_user: 256,
            max_sessions_per_user: 10_000,
            max_connections_per_user: 64,
            max_calls_per_user: 256,
            max_store_work_per_user: 16,
            max_turns_per_user: 4,
            max_call_bytes_per_user: 1024 * 1024 * 1024,
            max_pending_handshakes: 256,
            max_pending_handshakes_per_address: 32,
            busy_pending_handshakes: 16,
            max_devices_per_user: 64,
            max_mcp_sessions_per_user: 32,
            max_workspaces_per_user: 10_000,
            max_artifact_bytes_per_user: 4 * 1024 * 1024 * 1024,
            max_processes_per_user: 4096,
            max_memory_per_user: half_the_memory(),
            max_cpu_percent_per_user: 0,
            max_proxy_connections_per_user: 256,
        }
    }
}

/// Half of the host's memory (`MemTotal` of `/proc/meminfo`), the default bound of one user's
/// commands; 0 (no bound) when it cannot be read.
fn half_the_memory() -> u64 {
    static HALF: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HALF.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        info.lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024 / 2)
    })
}

/// Bounds of the HTTP listener (MCP over HTTP).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpLimits {
    /// A connection must send a whole request head within this long of starting to send it
    /// (and a new connection within this long of opening).
    pub header_timeout: Duration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// A request body must arrive whole within this long of its head.
    pub body_timeout: Duration,
    /// Open HTTP connections at most. One more takes the place of the oldest connection that
    /// never authenticated; when every one did, it is answered `503` and closed at once.
    pub max_connections: usize,
    /// Open HTTP connections from one address (an IPv4 address, an IPv6 /64); one more is
    /// answered `503` and closed at once.
    pub max_connections_per_address: usize,
    /// HTTP connections that authenticated as one user; a request on one more is answered
    /// `429` and its connection closed.
    pub max_connections_per_user: usize,
    /// Origins accepted on `/mcp` besides the server's own loopback origins (`http://host:port`,
    /// as browsers send them).
    pub allowed_origins: Vec<String>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_address: 64,
            max_connections_per_user: 64,
            allowed_origins: Vec::new(),
        }
    }
}

/// The QUIC address a server listens on unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4433";
/// The MCP over HTTP address of the `monad-server` command unless told otherwise.
pub const DEFAULT_HTTP: &str = "127.0.0.1:4480";

impl ServerConfig {
    /// The embedded defaults, with `data_dir` as given.
    pub fn new(data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            listen: DEFAULT_LISTEN.parse().expect("a socket address"),
            http: None,
            data_dir,
            transport: Transport::default(),
            limits: Limits::default(),
            exec: ExecPolicy::default(),
            max_calls_per_connection: 64,
            call_timeout: Duration::from_secs(900),
            hello_timeout: Duration::from_secs(10),
            busy_hello_timeout: Duration::from_secs(2),
            request_read_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(10),
            quotas: Quotas::default(),
            http_limits: HttpLimits::default(),
            store: Default::default(),
            cluster: Default::default(),
            store_flags: Default::default(),
            process_cgroup: None,
        }
    }
}

/// QUIC transport bounds.
#[derive(Debug, Clone)]
pub struct Transport {
    /// Keep-alive ping interval.
    pub keep_alive: Duration,
    /// A connection silent for this long is closed (a killed client is noticed after it).
    pub idle_timeout: Duration,
    /// Bidirectional streams an agent's connection may open at once (its requests, and the
    /// refusals of those over `max_calls_per_connection`). Before its hello a connection may open
    /// [`HELLO_STREAMS`], and an attached client's [`CLIENT_STREAMS`].
    pub max_streams: u32,
}

/// Streams a connection may open before its hello is accepted: the hello's. quinn reserves state
/// at connect for every stream the peer may open (an entry in two hash maps each), about 10 KiB
/// per connection at 128; most connections are attached clients, which need one.
/// `MONAD_BENCH_ONLY=c cargo bench -p monad-tests --bench e2e` shows it per attached client.
pub const HELLO_STREAMS: u32 = 1;

/// Streams an attached client's connection may open at once, once its hello is accepted: one
/// per folder it attaches on the connection (`monad-client attach` opens one connection per
/// folder). A client over it waits for a stream; nothing is refused.
pub const CLIENT_STREAMS: u32 = 8;

impl Default for Transport {
    fn default() -> Self {
        Transport {
            keep_alive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(8),
            max_streams: 128,
        }
    }
}

/// The most bytes a connection's peer may have the server hold unread, over all its streams.
pub const CONNECTION_RECEIVE_WINDOW: u32 = 16 * 1024 * 1024;

impl Transport {
    /// As quinn's transport configuration.
    pub fn quinn(&self) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        t.keep_alive_interval(Some(self.keep_alive));
        t.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(self.idle_timeout).expect("idle timeout in range"),
        ));
        // Raised by role once the hello is accepted (`Transport::streams_for`).
        t.max_concurrent_bidi_streams(HELLO_STREAMS.into());
        t.max_concurrent_uni_streams(0u32.into());
        // Monad speaks on streams only: no datagrams are taken, where quinn would otherwise
        // keep up to 1.25 MiB of them per connection (that has said hello or not) unread.
        t.datagram_receive_buffer_size(None);
        // What a peer may have this side hold unread, over all its streams at once: quinn's
        // default is no bound but each stream's window (1.25 MB), so a peer that withheld each
        // stream's first byte had 128 streams' windows of the rest kept for it (160 MB a
        // connection, uncounted by any per-user bound). 16 MiB a connection still fills a
        // 50 ms path at 300 MB/s.
        t.receive_window(CONNECTION_RECEIVE_WINDOW.into());
        t
    }

    /// Bidirectional streams a connection of `role` may open at once after its hello.
    pub fn streams_for(&self, role: Role) -> u32 {
        match role {
            Role::Agent => self.max_streams,
            Role::Client => CLIENT_STREAMS,
        }
    }
}

/// The platform data directory for Monad, unless `MONAD_DATA_DIR` says otherwise. An empty
/// `MONAD_DATA_DIR` is unset, never the current directory.
pub fn default_data_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONAD_DATA_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    directories::BaseDirs::new().map(|d| d.data_dir().join("monad"))
}
