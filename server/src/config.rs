//! Server settings. Defaults are embedded; the command line overrides them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// How long a new connection has to say hello.
    pub hello_timeout: Duration,
    /// On shutdown, how long in-flight calls get to finish before connections close.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// The embedded defaults, with `data_dir` as given.
    pub fn new(data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 4433)),
            http: None,
            data_dir,
            transport: Transport::default(),
            limits: Limits::default(),
            exec: ExecPolicy::default(),
            max_calls_per_connection: 64,
            call_timeout: Duration::from_secs(900),
            hello_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
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
    /// Bidirectional streams the peer may open at once.
    pub max_streams: u32,
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            keep_alive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(8),
            max_streams: 128,
        }
    }
}

impl Transport {
    /// As quinn's transport configuration.
    pub fn quinn(&self) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        t.keep_alive_interval(Some(self.keep_alive));
        t.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(self.idle_timeout).expect("idle timeout in range"),
        ));
        t.max_concurrent_bidi_streams(self.max_streams.into());
        t.max_concurrent_uni_streams(0u32.into());
        t
    }
}

/// The platform data directory for Monad, unless `MONAD_DATA_DIR` says otherwise.
pub fn default_data_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("MONAD_DATA_DIR") {
        return Some(PathBuf::from(dir));
    }
    directories::BaseDirs::new().map(|d| d.data_dir().join("monad"))
}
