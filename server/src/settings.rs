//! `config.toml`: settings in three layers, global < session < environment, merged key by key.
//!
//! - global: `<data_dir>/config.toml`
//! - session: `<data_dir>/sessions/<id>/config.toml` (only what differs)
//! - environment: `MONAD_<SECTION>_<KEY>`, e.g. `MONAD_LIMITS_READ_MAX_BYTES=1048576`
//!
//! Each layer is checked on its own first, so a mistake is reported with the file (or variable),
//! the line and the key. Every key is documented in `docs/operations.md`.

use std::time::Duration;

use monad_sandbox::{ExecPolicy, Limits};
use serde::{Deserialize, Serialize};

/// Every setting. All keys are optional; missing ones keep their defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Tool limits of the primary workspaces.
    pub limits: Limits,
    /// Command policy of the primary workspaces.
    pub exec: ExecPolicy,
    /// Connections and time-outs (global layer and environment only).
    pub server: ServerSettings,
    /// What attached folders may do.
    pub attach: AttachSettings,
    /// How long things are kept.
    pub retention: Retention,
    /// The session's model: provider, endpoint, key variable and the agent loop's limits.
    pub llm: LlmSettings,
    /// Where records are kept (global layer and environment only).
    pub store: StoreSettings,
    /// Several hosts on one PostgreSQL store (global layer and environment only).
    pub cluster: ClusterSettings,
}

/// Several hosts on one PostgreSQL store (`[cluster]`): leases on live sessions, and calls
/// forwarded to the host that serves a session. Without `[store] url`, none of it applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// How long a host's lease on a live session lasts without a renewal (renewed every third
    /// of it): after a host dies, its sessions can be served elsewhere this many seconds later.
    pub lease_secs: u64,
    /// The secret hosts authenticate each other with when they forward calls (the same on
    /// every host; without it, this host neither forwards nor accepts forwarded calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret>,
    /// `HOST:PORT` where the other hosts reach this one's QUIC endpoint (`serve --advertise`,
    /// `MONAD_ADVERTISE`); default: the address it listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            lease_secs: 10,
            secret: None,
            advertise: None,
        }
    }
}

impl ClusterSettings {
    /// The lease time (at least a second).
    pub fn lease_time(&self) -> Duration {
        Duration::from_secs(self.lease_secs.max(1))
    }

    /// The hosts' shared secret, when there is one: a blank one is none (a key derived from it
    /// anyone could make), so that this host neither forwards nor accepts forwarded calls, and
    /// the web's page tokens are signed with a key of its own.
    pub fn secret(&self) -> Option<&Secret> {
        self.secret.as_ref().filter(|s| !s.is_blank())
    }

    /// Checks `advertise`: `HOST:PORT` (a name or an address, `[v6]:PORT`); and the secret, if
    /// any: at least [`MIN_SECRET_CHARS`] characters (never repeated in the error).
    pub fn check(&self) -> Result<(), String> {
        if let Some(secret) = self.secret()
            && secret.expose().trim().chars().count() < MIN_SECRET_CHARS
        {
            return Err(format!(
                "the hosts' shared secret ([cluster] secret or MONAD_CLUSTER_SECRET) is shorter \
                 than {MIN_SECRET_CHARS} characters: whoever guesses it can act as any user on \
                 every host; make a long random one, such as `openssl rand -hex 32` prints"
            ));
        }
        let Some(advertise) = &self.advertise else {
            return Ok(());
        };
        monad_protocol::address::check_host_port(advertise).map_err(|why| {
            format!(
                "the advertised address `{}` is not HOST:PORT: {why} (--advertise, \
                 MONAD_ADVERTISE or [cluster] advertise)",
                monad_protocol::text::printable(advertise)
            )
        })
    }
}

/// Fewest characters of the hosts' shared secret: a short one can be guessed, one QUIC
/// handshake a guess, and a host that accepts it lets its sender act as any user.
pub const MIN_SECRET_CHARS: usize = 16;

/// A secret setting: shown as `<secret>` in debug output and logs, never as itself.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `text`.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself (to send it, or compare with [`Secret::matches`]).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is this secret, compared in constant time (no early exit on the
    /// first differing byte, so the time taken says nothing about the secret).
    pub fn matches(&self, offered: &str) -> bool {
        // Both sides hashed first: equal lengths, and the length of the secret does not leak.
        let a = ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes());
        let b = ring::digest::digest(&ring::digest::SHA256, offered.as_bytes());
        a.as_ref()
            .iter()
            .zip(b.as_ref())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }

    /// Whether it is blank (no secret: forwarding is off).
    pub fn is_blank(&self) -> bool {
        self.0.trim().is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// Where records are kept (`[store]`): absent `url`, the filesystem store in the data dir;
/// `postgres://...`, PostgreSQL, with artifact content under `<data_dir>/blobs`, or in the
/// S3 bucket `objects` names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (or a `key=value` connection string); what
    /// it leaves out comes from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Connections to the database at most.
    pub pool_size: usize,
    /// A connection attempt fails after this many seconds (the server does not start).
    pub connect_timeout_secs: u64,
    /// One store operation fails after this many seconds.
    pub op_timeout_secs: u64,
    /// `s3://BUCKET[/PREFIX]`: artifact content in that S3 bucket (with the PostgreSQL store
    /// only); endpoint, region and credentials from the `AWS_*` variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<String>,
    /// Artifact content that no row names is removed once it is this many seconds old (so a
    /// write in flight is never taken).
    pub orphan_grace_secs: u64,
    /// The orphan sweep runs at start-up, then every this many seconds (0: at start-up only).
    pub sweep_interval_secs: u64,
    /// `AWS_*` variables for the object store that take precedence over the process
    /// environment's (for embedders and tests; never read from a file).
    #[serde(skip)]
    pub object_vars: Vec<(String, String)>,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            url: None,
            pool_size: 8,
            connect_timeout_secs: 10,
            op_timeout_secs: 60,
            objects: None,
            orphan_grace_secs: 3600,
            sweep_interval_secs: 3600,
            object_vars: Vec::new(),
        }
    }
}

/// The store named on `monad-server serve`'s command line (`--store`, `--objects`): over
/// `[store]` of `config.toml` and `MONAD_STORE_URL`/`MONAD_STORE_OBJECTS`, as a flag beats
/// the file and the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreFlags {
    /// `--store postgres://...`: the `[store] url`.
    pub url: Option<String>,
    /// `--objects s3://BUCKET[/PREFIX]`: the `[store] objects`.
    pub objects: Option<String>,
}

impl StoreFlags {
    /// `store` (from the file and the environment) with what the flags name put over it.
    pub fn over(&self, store: StoreSettings) -> StoreSettings {
        StoreSettings {
            url: self.url.clone().or(store.url),
            objects: self.objects.clone().or(store.objects),
            ..store
        }
    }
}

/// The `[store]` settings of the server at `data_dir`: its `config.toml` under the `MONAD_*`
/// variables of this process, for the commands that run beside (or without) a server.
pub fn store_settings(data_dir: &std::path::Path) -> Result<StoreSettings, crate::ServerError> {
    let path = data_dir.join("config.toml");
    let text = monad_protocol::settings_file::read(&path)
        .map_err(|e| crate::ServerError::io("read", &path, e))?;
    let name = path.display().to_string();
    let layers = Layers::new(
        text.as_deref().map(|t| (name.as_str(), t)),
        environment().map_err(crate::ServerError::Invalid)?,
    )
    .map_err(|e| crate::ServerError::Invalid(e.to_string()))?;
    Ok(layers.global().store)
}

/// The process's environment as the settings read it: `std::env::vars` panics on a name or a
/// value that is not UTF-8 (`env X=$(printf '\377') monad-server` died so, whatever the
/// command); such a variable is left out, and one Monad reads (`MONAD_*`, `AWS_*`) is an error
/// naming it.
pub fn environment() -> Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => vars.push((name, value)),
            (Ok(name), Err(_)) if name.starts_with("MONAD_") || name.starts_with("AWS_") => {
                return Err(format!("the environment variable {name} is not UTF-8 text"));
            }
            _ => {}
        }
    }
    Ok(vars)
}

impl StoreSettings {
    /// The object store's bounds (each at least a second).
    pub fn s3_options(&self) -> crate::store::S3Options {
        crate::store::S3Options {
            connect_timeout: Duration::from_secs(self.connect_timeout_secs.max(1)),
            op_timeout: Duration::from_secs(self.op_timeout_secs.max(1)),
        }
    }

    /// The object store's URL, when one is set (a blank value is none).
    pub fn objects_url(&self) -> Option<&str> {
        self.objects.as_deref().filter(|u| !u.trim().is_empty())
    }

    /// The `AWS_*` variables the object store reads: the process environment's, then
    /// [`StoreSettings::object_vars`] over them.
    pub fn aws_vars(&self) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = environment()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .collect();
        vars.extend(self.object_vars.iter().cloned());
        vars
    }

    /// The pool's bounds (each at least 1).
    pub fn pool_options(&self) -> crate::store::pg::PoolOptions {
        crate::store::pg::PoolOptions {
            size: self.pool_size.max(1),
            connect_timeout: Duration::from_secs(self.connect_timeout_secs.max(1)),
            op_timeout: Duration::from_secs(self.op_timeout_secs.max(1)),
        }
    }
}

/// The model a session's agent talks to, and the agent loop's limits (`[llm]`).
///
/// The key is never a setting: `api_key_env` names the environment variable of the server's
/// process that holds it, so no key is written into a session's files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmSettings {
    /// `openai` (Chat Completions, also Ollama, llama.cpp's server, vLLM) or `anthropic`.
    pub provider: crate::llm::ProviderKind,
    /// The API's base URL; empty: the provider's own (`https://api.openai.com/v1`,
    /// `https://api.anthropic.com`).
    pub base_url: String,
    /// The model's name (required to talk to a model).
    pub model: String,
    /// The NAME of the environment variable that holds the key; empty: `OPENAI_API_KEY` or
    /// `ANTHROPIC_API_KEY`. An unset variable sends no key (local servers need none).
    pub api_key_env: String,
    /// The system prompt's text; empty: Monad's own.
    pub system_prompt: String,
    /// Most tokens the model may generate in one request.
    pub max_output_tokens: u32,
    /// Most tool calls in one turn (one user message); past it the turn ends with an error.
    pub max_tool_calls_per_turn: u32,
    /// Most tokens (read and generated, over all of a turn's requests) in one turn.
    pub max_tokens_per_turn: u64,
    /// Tokens of conversation sent to the model at most (estimated); the oldest turns are left
    /// out first, never the system prompt or the current turn.
    pub context_budget_tokens: u64,
    /// Longest wait for the provider's first byte, and then between two pieces of its stream,
    /// in seconds.
    pub idle_timeout_secs: u64,
    /// Longest a turn (one user message, all its requests and calls) may run, in seconds (at
    /// least 1): past it the turn ends, what the model said kept. A provider that keeps
    /// sending a little at a time, within `idle_timeout_secs` each, held a turn for ever.
    pub max_turn_secs: u64,
    /// Base URLs a client may choose for one prompt (`monad-client chat --base-url`), besides
    /// `base_url` itself. Empty: none. The key named by `api_key_env` goes to whichever base
    /// URL a turn uses, so only the operator decides where it may go.
    pub allowed_base_urls: Vec<String>,
    /// Models a client may choose for one prompt (`monad-client chat --model`), besides
    /// `model` itself: names, or a name's start followed by `*` (`gpt-4o-mini*`); `"*"` alone,
    /// the default, allows any, and `[]` none. The key named by `api_key_env` pays for whatever
    /// model a turn uses, so the operator may bound what one user can spend it on.
    pub allowed_models: Vec<String>,
}

impl Default for LlmSettings {
    fn default() -> Self {
        LlmSettings {
            provider: crate::llm::ProviderKind::Openai,
            base_url: String::new(),
            model: String::new(),
            api_key_env: String::new(),
            system_prompt: String::new(),
            max_output_tokens: 4096,
            max_tool_calls_per_turn: 50,
            max_tokens_per_turn: 1_000_000,
            context_budget_tokens: 100_000,
            idle_timeout_secs: 120,
            max_turn_secs: 1800,
            allowed_base_urls: Vec::new(),
            allowed_models: vec!["*".into()],
        }
    }
}

/// A prompt's own choices ([`LlmSettings::for_prompt`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptOverrides {
    /// The model for this turn.
    pub model: Option<String>,
    /// The API base URL for this turn.
    pub base_url: Option<String>,
}

impl LlmSettings {
    /// These settings with a prompt's `overrides` applied.
    pub fn for_prompt(&self, overrides: &PromptOverrides) -> Result<LlmSettings, String> {
        let mut llm = self.clone();
        if let Some(model) = &overrides.model {
            if model.trim().is_empty() || model.chars().any(char::is_control) {
                return Err("the model name is empty or has control characters".into());
            }
            let listed = |allowed: &String| match allowed.strip_suffix('*') {
                Some(start) => model.starts_with(start),
                None => allowed == model,
            };
            if *model != self.model && !self.allowed_models.iter().any(listed) {
                return Err(format!(
                    "model {:?} is not allowed by this server: the operator's API key pays for \
                     it; the operator can allow it in llm.allowed_models",
                    monad_protocol::text::printable(model)
                ));
            }
            llm.model = model.clone();
        }
        if let Some(url) = &overrides.base_url {
            // The key goes wherever the turn's requests go: only to a URL the operator named,
            // compared exactly (no normalising that a crafted URL could slip through).
            let current = if self.base_url.is_empty() {
                self.provider.default_base_url()
            } else {
                self.base_url.as_str()
            };
            if url != current && !self.allowed_base_urls.iter().any(|a| a == url) {
                return Err(format!(
                    "base URL {:?} is not allowed by this server: the operator's API key would \
                     be sent there; the operator can allow it in llm.allowed_base_urls",
                    monad_protocol::text::printable(url)
                ));
            }
            llm.base_url = url.clone();
        }
        Ok(llm)
    }

    /// The endpoint these settings name, with the key read through `env` (the process
    /// environment in the server). Fails when no model is set or a key variable name is not a
    /// variable name.
    pub fn endpoint(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<crate::llm::Endpoint, crate::llm::LlmError> {
        use crate::llm::{Endpoint, LlmError};
        if self.model.trim().is_empty() {
            return Err(LlmError::Config(
                "no model: set `model` in [llm] (or MONAD_LLM_MODEL)".into(),
            ));
        }
        let var = if self.api_key_env.is_empty() {
            self.provider.default_api_key_env()
        } else {
            self.api_key_env.as_str()
        };
        if var.is_empty()
            || !var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || var.as_bytes()[0].is_ascii_digit()
        {
            return Err(LlmError::Config(format!(
                "api_key_env {var:?} is not an environment variable name"
            )));
        }
        let base_url = if self.base_url.is_empty() {
            self.provider.default_base_url().to_owned()
        } else {
            self.base_url.clone()
        };
        Ok(Endpoint {
            kind: self.provider,
            base_url,
            api_key: env(var).filter(|k| !k.is_empty()),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs.max(1)),
        })
    }
}

/// Connection bounds and time-outs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Longest a routed call may take end to end, approval included, in seconds.
    pub call_timeout_secs: u64,
    /// How long a new connection has to finish its handshake and say hello, in seconds.
    pub hello_timeout_secs: u64,
    /// The same while the server is busy (`busy_pending_handshakes`), in milliseconds.
    pub busy_hello_timeout_ms: u64,
    /// A request on a QUIC stream must arrive whole within this of the stream opening, in
    /// milliseconds.
    pub request_read_timeout_ms: u64,
    /// How long in-flight calls get to finish on shutdown, in seconds.
    pub shutdown_grace_secs: u64,
    /// Requests one connection may have in flight.
    pub max_calls_per_connection: usize,
    /// Keep-alive interval, in milliseconds.
    pub keep_alive_ms: u64,
    /// A connection silent this long is closed, in milliseconds.
    pub idle_timeout_ms: u64,
    /// Sessions of one user in memory at once.
    pub max_sessions_in_memory_per_user: usize,
    /// Sessions one user may have stored.
    pub max_sessions_per_user: usize,
    /// QUIC connections of one user at once.
    pub max_connections_per_user: usize,
    /// Tool calls of one user in flight at once (QUIC and HTTP together), and their other QUIC
    /// requests (session listings, history, landings).
    pub max_calls_per_user: usize,
    /// Requests of one user working on the store at once (QUIC and HTTP together).
    pub max_store_work_per_user: usize,
    /// Turns of the built-in agent one user runs at once, over all their sessions.
    pub max_turns_per_user: usize,
    /// Bytes one user's calls may hold in memory at once (their requests and their attached
    /// clients' answers).
    pub max_call_bytes_per_user: usize,
    /// Connections that have not said hello yet, over all peers.
    pub max_pending_handshakes: usize,
    /// Connections that have not said hello yet, from one address (an IPv6 /64).
    pub max_pending_handshakes_per_address: usize,
    /// Pending handshakes from which new connections must prove their address (QUIC Retry)
    /// and get `busy_hello_timeout_ms`; 0: always.
    pub busy_pending_handshakes: usize,
    /// Devices of one user the server remembers a last session for.
    pub max_devices_per_user: usize,
    /// MCP over HTTP sessions of one user.
    pub max_mcp_sessions_per_user: usize,
    /// Workspace records of one user; creating one more through the API is refused.
    pub max_workspaces_per_user: usize,
    /// Bytes of artifacts one user may have stored through the API.
    pub max_artifact_bytes_per_user: u64,
    /// Processes and threads one user's commands may have at once, over all their sessions (a
    /// cgroup per user); 0 for no such bound.
    pub max_processes_per_user: u64,
    /// Bytes of memory one user's commands may use at once, over all their sessions (the same
    /// cgroups); 0 for no such bound. Default: half of the host's memory.
    pub max_memory_per_user: u64,
    /// The most processor time one user's commands may take together, in percent of one CPU
    /// (the same cgroups); 0 for no ceiling (each user still gets an equal share).
    pub max_cpu_percent_per_user: u64,
    /// Connections one user's commands may have open at once through the network proxies of
    /// all their sessions' primary workspaces; 0 for no such bound.
    pub max_proxy_connections_per_user: usize,
    /// The cgroup directory the users' process groups are made under; unset: the server's own
    /// cgroup of each controller (on cgroup v1, in each controller's hierarchy; on cgroup v2,
    /// when the controllers can be enabled under it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_cgroup: Option<std::path::PathBuf>,
    /// Longest an HTTP request head may take to arrive, in milliseconds.
    pub http_header_timeout_ms: u64,
    /// An HTTP connection with no request in progress is closed after this, in milliseconds.
    pub http_idle_timeout_ms: u64,
    /// Open HTTP connections at most.
    pub http_max_connections: usize,
    /// Longest a request body may take to arrive whole after its head, in milliseconds.
    pub http_body_timeout_ms: u64,
    /// Open HTTP connections from one address (an IPv4 address, an IPv6 /64).
    pub http_max_connections_per_address: usize,
    /// HTTP connections that authenticated as one user.
    pub http_max_connections_per_user: usize,
    /// Origins accepted on `/mcp` besides the server's own loopback origins.
    pub http_allowed_origins: Vec<String>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        // The bounds' defaults have one home: the programmatic configuration.
        let quotas = crate::config::Quotas::default();
        let http = crate::config::HttpLimits::default();
        ServerSettings {
            call_timeout_secs: 900,
            hello_timeout_secs: 10,
            busy_hello_timeout_ms: 2000,
            request_read_timeout_ms: 120_000,
            shutdown_grace_secs: 10,
            max_calls_per_connection: 64,
            keep_alive_ms: 2000,
            idle_timeout_ms: 8000,
            max_sessions_in_memory_per_user: quotas.max_sessions_in_memory_per_user,
            max_sessions_per_user: quotas.max_sessions_per_user,
            max_connections_per_user: quotas.max_connections_per_user,
            max_calls_per_user: quotas.max_calls_per_user,
            max_store_work_per_user: quotas.max_store_work_per_user,
            max_turns_per_user: quotas.max_turns_per_user,
            max_call_bytes_per_user: quotas.max_call_bytes_per_user,
            max_pending_handshakes: quotas.max_pending_handshakes,
            max_pending_handshakes_per_address: quotas.max_pending_handshakes_per_address,
            busy_pending_handshakes: quotas.busy_pending_handshakes,
            max_devices_per_user: quotas.max_devices_per_user,
            max_mcp_sessions_per_user: quotas.max_mcp_sessions_per_user,
            max_workspaces_per_user: quotas.max_workspaces_per_user,
            max_artifact_bytes_per_user: quotas.max_artifact_bytes_per_user,
            max_processes_per_user: quotas.max_processes_per_user,
            max_memory_per_user: quotas.max_memory_per_user,
            max_cpu_percent_per_user: quotas.max_cpu_percent_per_user,
            max_proxy_connections_per_user: quotas.max_proxy_connections_per_user,
            process_cgroup: None,
            http_header_timeout_ms: http.header_timeout.as_millis() as u64,
            http_idle_timeout_ms: http.idle_timeout.as_millis() as u64,
            http_max_connections: http.max_connections,
            http_body_timeout_ms: http.body_timeout.as_millis() as u64,
            http_max_connections_per_address: http.max_connections_per_address,
            http_max_connections_per_user: http.max_connections_per_user,
            http_allowed_origins: http.allowed_origins,
        }
    }
}

/// What attached folders may do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttachSettings {
    /// Accept folders attached with `--trust full`. When false, such an attach is refused and the
    /// user must attach restricted. (The server can only make trust stricter: approvals are
    /// enforced by the client.)
    pub allow_full_trust: bool,
}

impl Default for AttachSettings {
    fn default() -> Self {
        AttachSettings {
            allow_full_trust: true,
        }
    }
}

/// Retention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Sessions idle this long are dropped from memory (they stay on disk), in hours.
    pub idle_unload_hours: u64,
    /// Bytes of a tool's output kept in its `tool_output` artifact; the rest is cut and the cut
    /// recorded.
    pub artifact_max_bytes: u64,
    /// Keep `tool_output` and `file_diff` artifacts at all.
    pub keep_artifacts: bool,
    /// The auto-purge (seed 004, which says 90): the running server deletes sessions inactive
    /// this many days (never a user's default, never one in use) and the workspace records inactive
    /// that long that no session uses any more. Absent: off (the default). A fraction is
    /// taken (`0.5` is twelve hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_days: Option<Days>,
    /// How often the auto-purge looks, in seconds (at least 1).
    pub purge_every_secs: u64,
    /// Sessions and records one auto-purge pass deletes at most (at least 1); the rest wait for
    /// the next pass.
    pub purge_max_per_pass: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            idle_unload_hours: 24,
            artifact_max_bytes: 256 * 1024,
            keep_artifacts: true,
            max_age_days: None,
            purge_every_secs: 3600,
            purge_max_per_pass: 100,
        }
    }
}

impl Retention {
    /// The auto-purge's age, pass interval and bound per pass, when it is on.
    pub fn purge(&self) -> Option<crate::session::Purge> {
        self.max_age_days.map(|days| crate::session::Purge {
            max_age: days.duration(),
            every: Duration::from_secs(self.purge_every_secs.max(1)),
            max_per_pass: self.purge_max_per_pass.max(1),
        })
    }
}

/// A number of days above 0 and at most [`Days::MAX`], a fraction allowed
/// (`retention.max_age_days`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Days(f64);

impl Days {
    /// The longest age taken: 100 years.
    pub const MAX: f64 = 36_525.0;

    /// `days`, when it is a number above 0 and at most [`Days::MAX`].
    pub fn new(days: f64) -> Result<Days, String> {
        if days.is_finite() && days > 0.0 && days <= Days::MAX {
            Ok(Days(days))
        } else {
            Err(format!(
                "{days} is not a number of days: give one above 0 and at most {} (a fraction \
                 is taken, e.g. 0.5), or leave the key out to turn the auto-purge off",
                Days::MAX
            ))
        }
    }

    /// The age.
    pub fn duration(self) -> Duration {
        Duration::from_secs_f64(self.0 * 86_400.0)
    }
}

impl<'de> Deserialize<'de> for Days {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Days::new(f64::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl ServerSettings {
    /// The per-user bounds (each at least 1).
    pub fn quotas(&self) -> crate::config::Quotas {
        crate::config::Quotas {
            max_sessions_in_memory_per_user: self.max_sessions_in_memory_per_user.max(1),
            max_sessions_per_user: self.max_sessions_per_user.max(1),
            max_connections_per_user: self.max_connections_per_user.max(1),
            max_calls_per_user: self.max_calls_per_user.max(1),
            max_store_work_per_user: self.max_store_work_per_user.max(1),
            max_turns_per_user: self.max_turns_per_user.max(1),
            max_call_bytes_per_user: self.max_call_bytes_per_user.max(1),
            max_pending_handshakes: self.max_pending_handshakes.max(1),
            max_pending_handshakes_per_address: self.max_pending_handshakes_per_address.max(1),
            busy_pending_handshakes: self.busy_pending_handshakes,
            max_devices_per_user: self.max_devices_per_user.max(1),
            max_mcp_sessions_per_user: self.max_mcp_sessions_per_user.max(1),
            max_workspaces_per_user: self.max_workspaces_per_user.max(1),
            max_artifact_bytes_per_user: self.max_artifact_bytes_per_user.max(1),
            // The most `pids.max` takes (the kernel's `PID_MAX_LIMIT`): as many as a host has.
            max_processes_per_user: self.max_processes_per_user.min(4 * 1024 * 1024),
            max_memory_per_user: self.max_memory_per_user,
            // A thousand CPUs at most: past what any host has, within what the kernel takes.
            max_cpu_percent_per_user: self.max_cpu_percent_per_user.min(100_000),
            max_proxy_connections_per_user: self.max_proxy_connections_per_user,
        }
    }

    /// The HTTP listener's bounds (time-outs at least 100 ms, at least one connection).
    pub fn http_limits(&self) -> crate::config::HttpLimits {
        crate::config::HttpLimits {
            header_timeout: Duration::from_millis(self.http_header_timeout_ms.max(100)),
            idle_timeout: Duration::from_millis(self.http_idle_timeout_ms.max(100)),
            body_timeout: Duration::from_millis(self.http_body_timeout_ms.max(100)),
            max_connections: self.http_max_connections.max(1),
            max_connections_per_address: self.http_max_connections_per_address.max(1),
            max_connections_per_user: self.http_max_connections_per_user.max(1),
            allowed_origins: self.http_allowed_origins.clone(),
        }
    }

    /// As durations: (call, hello, busy hello, request read, shutdown grace, keep-alive, idle).
    pub fn durations(&self) -> [Duration; 7] {
        [
            Duration::from_secs(self.call_timeout_secs.max(1)),
            Duration::from_secs(self.hello_timeout_secs.max(1)),
            Duration::from_millis(self.busy_hello_timeout_ms.max(100)),
            Duration::from_millis(self.request_read_timeout_ms.max(100)),
            Duration::from_secs(self.shutdown_grace_secs),
            Duration::from_millis(self.keep_alive_ms.max(100)),
            Duration::from_millis(self.idle_timeout_ms.max(1000)),
        ]
    }
}

/// A setting that cannot be used; says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The file, or `environment variable NAME`.
    pub source_name: String,
    /// The line, for files.
    pub line: Option<usize>,
    /// What is wrong, naming the key.
    pub message: String,
}

/// The checked layers: the global file and the environment, ready to merge a session's file
/// between them.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    global: toml::Table,
    env: toml::Table,
}

const SECTIONS: [&str; 8] = [
    "limits",
    "exec",
    "server",
    "attach",
    "retention",
    "llm",
    "store",
    "cluster",
];

impl Layers {
    /// Checks the global file (`None` when absent) and the `MONAD_*` variables in `vars`.
    pub fn new(
        global: Option<(&str, &str)>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Layers, ConfigError> {
        let global = match global {
            Some((name, text)) => parse_layer(name, text)?,
            None => toml::Table::new(),
        };
        let env = env_layer(vars)?;
        Ok(Layers { global, env })
    }

    /// Puts `base` (the embedding program's own settings) under every layer: files and the
    /// environment override it key by key. Then checks what the layers give together: values
    /// each fine alone may not work together (the `[limits]` bounds, [`Limits::check`]).
    pub fn with_base(mut self, base: &Settings) -> Result<Layers, ConfigError> {
        let mut table = match toml::Value::try_from(base) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        deep_merge(&mut table, std::mem::take(&mut self.global));
        self.global = table;
        checked(self.merge(None)?)?;
        Ok(self)
    }

    /// The settings with no session file: global < environment.
    pub fn global(&self) -> Settings {
        self.merge(None)
            .expect("both layers were checked on their own")
    }

    /// The settings of a session: global < the session's file < environment, checked
    /// together as in [`Layers::with_base`].
    pub fn session(&self, file: Option<(&str, &str)>) -> Result<Settings, ConfigError> {
        let table = match file {
            Some((name, text)) => {
                let table = parse_layer(name, text)?;
                session_keys_only(name, text, &table)?;
                Some(table)
            }
            None => None,
        };
        checked(self.merge(table)?)
    }

    fn merge(&self, session: Option<toml::Table>) -> Result<Settings, ConfigError> {
        let mut merged = self.global.clone();
        if let Some(session) = session {
            deep_merge(&mut merged, session);
        }
        deep_merge(&mut merged, self.env.clone());
        toml::Value::Table(merged)
            .try_into()
            .map_err(|e: toml::de::Error| together(e.message().to_owned()))
    }
}

/// An error of the layers together, not of one of them.
fn together(message: String) -> ConfigError {
    ConfigError {
        source_name: "the configuration (its files and MONAD_* variables together)".into(),
        line: None,
        message,
    }
}

/// `settings` when what they hold works together ([`Limits::check`], [`ExecPolicy::check`])
/// and no time or count is past what the server can hold ([`bounded`]).
fn checked(settings: Settings) -> Result<Settings, ConfigError> {
    settings.limits.check().map_err(together)?;
    settings.exec.check().map_err(together)?;
    bounded(&settings).map_err(together)?;
    Ok(settings)
}

/// The longest time a setting may give: ten years, in seconds. A deadline further away is past
/// the clock's range (`Instant + Duration` panics on every call, connection or lease), and past
/// what QUIC's idle time-out can say.
const LONGEST_SECS: i64 = 10 * 365 * 24 * 3600;

/// The most a count may be (connections, calls, sessions, a pool's connections, deletions per
/// pass): more than any machine serves, and within what a semaphore holds (2^61 permits).
const MOST: i64 = u32::MAX as i64;

/// Refuses a time (a key ending in `_secs`, `_ms` or `_hours`) over [`LONGEST_SECS`], and a
/// count (a key of `[server]`, `[store]` or `[retention]` starting `max_` or holding `_max_`,
/// `pool_size`, `busy_pending_handshakes`; bytes and memory aside) over [`MOST`]. Such values
/// read as "no bound" to a person, and made the server panic or refuse everyone.
fn bounded(settings: &Settings) -> Result<(), String> {
    let Ok(toml::Value::Table(sections)) = toml::Value::try_from(settings) else {
        return Ok(());
    };
    for (section, keys) in &sections {
        let Some(keys) = keys.as_table() else {
            continue;
        };
        for (key, value) in keys {
            let Some(n) = value.as_integer() else {
                continue;
            };
            let count = matches!(section.as_str(), "server" | "store" | "retention")
                && (key.starts_with("max_")
                    || key.contains("_max_")
                    || key == "pool_size"
                    || key == "busy_pending_handshakes")
                && !key.contains("bytes")
                && !key.contains("memory");
            let most = if key.ends_with("_secs") {
                LONGEST_SECS
            } else if key.ends_with("_ms") {
                LONGEST_SECS * 1000
            } else if key.ends_with("_hours") {
                LONGEST_SECS / 3600
            } else if count {
                MOST
            } else {
                continue;
            };
            if n > most {
                let what = if count { "" } else { " (ten years)" };
                return Err(format!(
                    "`{section}.{key}` is {n}; it must be at most {most}{what}"
                ));
            }
        }
    }
    Ok(())
}

/// The sections a session's `config.toml` may set, and the keys of `[retention]` it may: what
/// a session reads from its own settings. The rest is the server's (connections, the store,
/// the cluster, when sessions are unloaded or purged), read from the global file and the
/// environment only.
const SESSION_SECTIONS: [&str; 4] = ["limits", "exec", "attach", "llm"];
const SESSION_RETENTION_KEYS: [&str; 2] = ["artifact_max_bytes", "keep_artifacts"];

/// Refuses, in the session file `name`, a section or key only the global layers set: it would
/// be taken without a word and do nothing.
fn session_keys_only(name: &str, text: &str, table: &toml::Table) -> Result<(), ConfigError> {
    for (section, value) in table {
        let (what, line_starts) = match section.as_str() {
            s if SESSION_SECTIONS.contains(&s) => continue,
            "retention" => {
                let Some(key) = value.as_table().and_then(|keys| {
                    keys.keys()
                        .find(|k| !SESSION_RETENTION_KEYS.contains(&k.as_str()))
                }) else {
                    continue;
                };
                (format!("retention.{key}"), key.clone())
            }
            other => (format!("[{other}]"), format!("[{other}")),
        };
        let line = text
            .lines()
            .position(|l| l.trim_start().starts_with(&line_starts))
            .map(|i| i + 1);
        return Err(ConfigError {
            source_name: name.to_owned(),
            line,
            message: format!(
                "`{what}` is the server's, read from the global config.toml and the MONAD_* \
                 variables only; a session's file sets {} and {}",
                SESSION_SECTIONS
                    .iter()
                    .map(|s| format!("`[{s}]`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                SESSION_RETENTION_KEYS
                    .iter()
                    .map(|k| format!("`retention.{k}`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        });
    }
    Ok(())
}

/// Parses one file and checks it alone against [`Settings`].
fn parse_layer(name: &str, text: &str) -> Result<toml::Table, ConfigError> {
    let located = |e: toml::de::Error| {
        let mut message = e.message().trim().to_owned();
        let key = e.span().and_then(|span| key_at(text, span.start));
        // Type errors name only the value ("invalid type: string, expected u64"): add its key.
        if let Some(key) = &key
            && !message.contains(key.rsplit('.').next().unwrap_or(key))
        {
            message = format!("`{key}`: {message}");
        }
        ConfigError {
            source_name: name.to_owned(),
            line: e
                .span()
                .map(|span| monad_protocol::text::line_at(text, span.start)),
            message,
        }
    };
    let table: toml::Table = toml::from_str(text).map_err(located)?;
    toml::from_str::<Settings>(text).map_err(|e| {
        let mut error = located(e);
        // A secret's value is never repeated (a number there would be, by the type error): a
        // secret that is not a string, found in what the file says rather than in how its text
        // spells the key (a comment after its section's header, a quoted key, an inline table).
        if let Some(key) = SECRET_KEYS.into_iter().find(|key| {
            let (section, name) = key.split_once('.').expect("a secret's key has a section");
            table
                .get(section)
                .and_then(|s| s.get(name))
                .is_some_and(|v| !v.is_str())
        }) {
            error.message = format!("`{key}`: must be a string (its value is not shown here)");
        }
        error
    })?;
    Ok(table)
}

/// The settings whose values are secret: never shown in an error, and taken from the
/// environment as they are (`[store] url` holds the database's password).
const SECRET_KEYS: [&str; 2] = ["cluster.secret", "store.url"];

/// The dotted key (`section.key`) assigned on the line that holds byte `offset` of `text`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let (key, _) = text[start..end].split_once('=')?;
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    if key.is_empty() {
        return None;
    }
    // A header's name is what its brackets hold, a comment after them left out.
    let section = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .and_then(|l| l.trim_start_matches('[').split(']').next())
        .map(|name| name.trim().to_owned());
    Some(match section {
        Some(section) => format!("{section}.{key}"),
        None => key.to_owned(),
    })
}

/// The `MONAD_*` variables a Monad program reads that are not settings: the server's (data
/// directory, advertised address) and the client's, which a shell that runs both may hold.
const OTHER_VARIABLES: [&str; 5] = [
    "MONAD_DATA_DIR",
    "MONAD_ADVERTISE",
    "MONAD_CONFIG_DIR",
    "MONAD_TOKEN",
    "MONAD_PROMPT_GUARD_MS",
];

/// The prefixes of the variables Monad's own tests and benches read (`MONAD_TEST_PYTHON`,
/// `MONAD_BENCH_ONLY`, ...), which reach the servers they start.
const OTHER_PREFIXES: [&str; 3] = ["MONAD_TEST_", "MONAD_BENCH_", "MONAD_SANDBOX_TEST_"];

/// The names among `vars` that start with `MONAD_` but are neither a setting
/// (`MONAD_<SECTION>_<KEY>` of a real section; a wrong key there is an error of its own) nor a
/// variable a Monad program reads: a mistyped section (`MONAD_LIMIT_READ_MAX_BYTES`) would
/// otherwise be ignored without a word. The server warns of them at start.
pub fn unknown_variables(vars: impl IntoIterator<Item = String>) -> Vec<String> {
    vars.into_iter()
        .filter(|name| {
            name.starts_with("MONAD_")
                && !OTHER_VARIABLES.contains(&name.as_str())
                && !OTHER_PREFIXES.iter().any(|p| name.starts_with(p))
                && setting_of(name).is_none()
        })
        .collect()
}

/// The section and key a `MONAD_<SECTION>_<KEY>` variable sets (lower case), when it names a
/// real section; `None` for any other name.
fn setting_of(name: &str) -> Option<(&'static str, String)> {
    let rest = name.strip_prefix("MONAD_")?.to_ascii_lowercase();
    let section = SECTIONS
        .iter()
        .find(|s| rest.starts_with(&format!("{s}_")))?;
    Some((section, rest[section.len() + 1..].to_owned()))
}

/// `MONAD_<SECTION>_<KEY>=value` as a table. Values are read as TOML (numbers, booleans, arrays,
/// inline tables) and otherwise taken as strings. `MONAD_DATA_DIR` and `MONAD_CONFIG_DIR` are not
/// settings and are left alone; any other `MONAD_<SECTION>_...` must name a real key.
fn env_layer(vars: impl IntoIterator<Item = (String, String)>) -> Result<toml::Table, ConfigError> {
    let mut table = toml::Table::new();
    for (name, value) in vars {
        let Some((section, key)) = setting_of(&name) else {
            continue;
        };
        // A secret is text: a TOML string (quoted) is that string, as before; anything else is
        // taken as written (read as TOML, digits would be a number, whose type error would
        // print it).
        let parsed = if SECRET_KEYS.contains(&format!("{section}.{key}").as_str()) {
            match toml::from_str::<toml::Table>(&format!("v = {value}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
            {
                Some(text @ toml::Value::String(_)) => text,
                _ => toml::Value::String(value.clone()),
            }
        } else {
            toml::from_str::<toml::Table>(&format!("v = {value}"))
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(value.clone()))
        };
        let mut one = toml::Table::new();
        let mut inner = toml::Table::new();
        inner.insert(key, parsed);
        one.insert(section.to_owned(), toml::Value::Table(inner));
        toml::Value::Table(one.clone())
            .try_into::<Settings>()
            .map_err(|e| ConfigError {
                source_name: format!("environment variable {name}"),
                line: None,
                message: e.message().trim().to_owned(),
            })?;
        deep_merge(&mut table, one);
    }
    Ok(table)
}

/// The environment with its short names spelled out: `MONAD_ADVERTISE` is
/// `MONAD_CLUSTER_ADVERTISE` (the full name wins when both are set).
pub fn with_aliases(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = vars.into_iter().collect();
    let full = vars.iter().any(|(k, _)| k == "MONAD_CLUSTER_ADVERTISE");
    for (name, _) in vars.iter_mut() {
        if name == "MONAD_ADVERTISE" && !full {
            *name = "MONAD_CLUSTER_ADVERTISE".into();
        }
    }
    vars
}

/// Merges `over` into `base`, key by key, tables recursively.
fn deep_merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => deep_merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a secret that TOML reads as a number was printed whole in the type error,
    /// from the file and from `MONAD_CLUSTER_SECRET`.
    #[test]
    fn a_secret_is_never_repeated_in_an_error_and_taken_from_the_environment_as_it_is() {
        let e = parse_layer("config.toml", "[cluster]\nsecret = 918273645500112233\n").unwrap_err();
        let shown = e.to_string();
        assert!(!shown.contains("918273645500112233"), "{shown}");
        assert!(shown.contains("cluster.secret"), "{shown}");
        let e = parse_layer("config.toml", "[store]\nurl = 5\n").unwrap_err();
        assert!(!e.message.contains('5'), "{e}");
        // However the file spells the key or its section (a header's comment, a quoted key,
        // an inline table, a dotted key): the key found from the text was wrong, and the value
        // was shown.
        for file in [
            "[cluster] # shared by all hosts\nsecret = 918273645500112233\n",
            "[cluster]\n'secret' = 918273645500112233\n",
            "cluster = { secret = 918273645500112233 }\n",
            "cluster.secret = 918273645500112233\n",
            "[store]\nurl = [918273645500112233]\n",
        ] {
            let e = parse_layer("config.toml", file).unwrap_err();
            let shown = e.to_string();
            assert!(!shown.contains("918273645500112233"), "{file}: {shown}");
            assert!(
                shown.contains("cluster.secret") || shown.contains("store.url"),
                "{file}: {shown}"
            );
        }
        // A header's comment no longer garbles the key of another error.
        let e =
            parse_layer("config.toml", "[limits] # mine\nread_max_bytes = \"x\"\n").unwrap_err();
        assert!(e.message.contains("`limits.read_max_bytes`"), "{e}");
        let table = env_layer([(
            "MONAD_CLUSTER_SECRET".to_owned(),
            "918273645500112233".to_owned(),
        )])
        .unwrap();
        assert_eq!(
            table["cluster"]["secret"].as_str(),
            Some("918273645500112233")
        );
        // A quoted one is the string it quotes, as it always was.
        let table = env_layer([("MONAD_CLUSTER_SECRET".to_owned(), "\"abc\"".to_owned())]).unwrap();
        assert_eq!(table["cluster"]["secret"].as_str(), Some("abc"));
    }

    #[test]
    fn variables_that_are_neither_settings_nor_known_are_named() {
        let names = [
            "MONAD_LIMIT_READ_MAX_BYTES",
            "MONAD_BOGUS",
            "MONAD_LIMITS_READ_MAX_BYTES",
            "MONAD_DATA_DIR",
            "MONAD_TOKEN",
            "MONAD_ADVERTISE",
            "MONAD_BENCH_ONLY",
            "PATH",
        ]
        .map(str::to_owned);
        assert_eq!(
            unknown_variables(names),
            ["MONAD_LIMIT_READ_MAX_BYTES", "MONAD_BOGUS"]
        );
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn the_auto_purge_is_off_unless_max_age_days_is_a_positive_number_of_days() {
        let off = Layers::new(None, vars(&[])).unwrap().global();
        assert_eq!(off.retention.purge(), None);
        let file = "[retention]\nmax_age_days = 90\n";
        let on = Layers::new(Some(("config.toml", file)), vars(&[]))
            .unwrap()
            .global();
        let purge = on.retention.purge().unwrap();
        assert_eq!(purge.max_age, Duration::from_secs(90 * 86_400));
        assert_eq!(purge.every, Duration::from_secs(3600));
        assert_eq!(purge.max_per_pass, 100);
        let half = Layers::new(None, vars(&[("MONAD_RETENTION_MAX_AGE_DAYS", "0.5")]))
            .unwrap()
            .global();
        assert_eq!(
            half.retention.purge().unwrap().max_age,
            Duration::from_secs(12 * 3600)
        );
        for bad in ["0", "-1", "nan", "inf", "1e9", "\"soon\""] {
            let file = format!("[retention]\nmax_age_days = {bad}\n");
            let e = Layers::new(Some(("config.toml", &file)), vars(&[])).unwrap_err();
            assert_eq!(e.line, Some(2), "{bad}: {e}");
            assert!(e.to_string().contains("max_age_days"), "{bad}: {e}");
        }
        let e = Layers::new(None, vars(&[("MONAD_RETENTION_MAX_AGE_DAYS", "-3")])).unwrap_err();
        assert!(
            e.to_string().contains("MONAD_RETENTION_MAX_AGE_DAYS"),
            "{e}"
        );
    }

    #[test]
    fn the_store_flags_beat_the_environment_and_the_file_and_keep_the_other_keys() {
        let file = "[store]\nurl = \"postgres://file@db/monad\"\nobjects = \"s3://file\"\n\
                    pool_size = 3\n";
        let layers = Layers::new(
            Some(("config.toml", file)),
            vars(&[("MONAD_STORE_URL", "postgres://env@db/monad")]),
        )
        .unwrap();
        let store = layers.global().store;
        assert_eq!(StoreFlags::default().over(store.clone()), store, "no flag");
        let flags = StoreFlags {
            url: Some("postgres://flag@db/monad".into()),
            objects: None,
        };
        let over = flags.over(store.clone());
        assert_eq!(over.url.as_deref(), Some("postgres://flag@db/monad"));
        assert_eq!(over.objects.as_deref(), Some("s3://file"), "from the file");
        assert_eq!(over.pool_size, 3);
        let flags = StoreFlags {
            url: None,
            objects: Some("s3://flag/p".into()),
        };
        let over = flags.over(store);
        assert_eq!(
            over.url.as_deref(),
            Some("postgres://env@db/monad"),
            "from the env"
        );
        assert_eq!(over.objects_url(), Some("s3://flag/p"));
    }

    #[test]
    fn the_store_is_the_filesystem_unless_a_url_is_set_in_the_file_or_monad_store_url() {
        let none = Layers::new(None, vars(&[])).unwrap().global();
        assert_eq!(none.store, StoreSettings::default());
        assert_eq!(none.store.url, None);
        let file = "[store]\nurl = \"postgres://monad@db/monad\"\npool_size = 4\n";
        let layers = Layers::new(Some(("config.toml", file)), vars(&[])).unwrap();
        assert_eq!(
            layers.global().store.url.as_deref(),
            Some("postgres://monad@db/monad")
        );
        assert_eq!(layers.global().store.pool_size, 4);
        let layers = Layers::new(
            Some(("config.toml", file)),
            vars(&[("MONAD_STORE_URL", "postgres://other@db2:6000/x")]),
        )
        .unwrap();
        assert_eq!(
            layers.global().store.url.as_deref(),
            Some("postgres://other@db2:6000/x"),
            "the environment beats the file"
        );
        let layers = Layers::new(
            Some((
                "config.toml",
                "[store]\nobjects = \"s3://bkt/p\"\norphan_grace_secs = 5\n",
            )),
            vars(&[("MONAD_STORE_OBJECTS", "s3://other")]),
        )
        .unwrap();
        assert_eq!(layers.global().store.objects_url(), Some("s3://other"));
        assert_eq!(layers.global().store.orphan_grace_secs, 5);
        let e = Layers::new(Some(("config.toml", "[store]\nurll = \"x\"\n")), vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.toml:2") && e.contains("urll"), "{e}");
    }

    #[test]
    fn cluster_settings_come_from_the_file_or_the_environment_and_never_show_the_secret() {
        let none = Layers::new(None, vars(&[])).unwrap().global();
        assert_eq!(none.cluster, ClusterSettings::default());
        assert_eq!(none.cluster.lease_time(), Duration::from_secs(10));
        let layers = Layers::new(
            Some((
                "config.toml",
                "[cluster]\nlease_secs = 3\nsecret = \"s3cret-value\"\n",
            )),
            vars(&[("MONAD_CLUSTER_ADVERTISE", "10.0.0.2:4433")]),
        )
        .unwrap();
        let cluster = layers.global().cluster;
        assert_eq!(cluster.lease_secs, 3);
        assert_eq!(cluster.advertise.as_deref(), Some("10.0.0.2:4433"));
        let secret = cluster.secret.clone().unwrap();
        assert!(secret.matches("s3cret-value"));
        assert!(!secret.matches("s3cret-valuf"));
        assert!(!secret.matches(""));
        assert!(
            !format!("{cluster:?}").contains("s3cret"),
            "debug output shows the secret: {cluster:?}"
        );
        for bad in ["10.0.0.2", "host:", ":4433", "host:99999", "a b:1"] {
            let settings = ClusterSettings {
                advertise: Some(bad.into()),
                ..ClusterSettings::default()
            };
            assert!(settings.check().is_err(), "{bad} accepted");
        }
        for good in ["10.0.0.2:4433", "host-b.internal:4433", "[::1]:4433"] {
            let settings = ClusterSettings {
                advertise: Some(good.into()),
                ..ClusterSettings::default()
            };
            assert_eq!(settings.check(), Ok(()), "{good}");
        }
        // A secret short enough to guess is refused, without being repeated; none, or a blank
        // one, turns forwarding off.
        let with = |secret: Option<&str>| ClusterSettings {
            secret: secret.map(Secret::new),
            ..ClusterSettings::default()
        };
        let short = with(Some("hunter2-hunter2")).check().unwrap_err();
        assert!(
            short.contains("shorter than 16") && !short.contains("hunter2"),
            "{short}"
        );
        assert!(
            with(Some("     padded     ")).check().is_err(),
            "spaces are no secret"
        );
        for fine in [None, Some(""), Some("   "), Some("sixteen-chars-ok")] {
            assert_eq!(with(fine).check(), Ok(()), "{fine:?}");
        }
        let e = Layers::new(Some(("config.toml", "[cluster]\nlease = 3\n")), vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("lease"), "{e}");
    }

    #[test]
    fn monad_advertise_is_the_short_name_of_the_advertised_address() {
        let short = Layers::new(
            None,
            with_aliases(vars(&[("MONAD_ADVERTISE", "10.0.0.3:4433")])),
        )
        .unwrap();
        assert_eq!(
            short.global().cluster.advertise.as_deref(),
            Some("10.0.0.3:4433")
        );
        let both = Layers::new(
            None,
            with_aliases(vars(&[
                ("MONAD_ADVERTISE", "10.0.0.3:4433"),
                ("MONAD_CLUSTER_ADVERTISE", "10.0.0.4:4433"),
            ])),
        )
        .unwrap();
        assert_eq!(
            both.global().cluster.advertise.as_deref(),
            Some("10.0.0.4:4433"),
            "the full name wins"
        );
    }

    #[test]
    fn layers_merge_key_by_key_with_environment_last() {
        let global = "[limits]\nread_max_bytes = 100\nlist_max_entries = 7\n[exec]\nallow_unsandboxed_exec = true\n";
        let layers = Layers::new(
            Some(("config.toml", global)),
            vars(&[
                ("MONAD_LIMITS_LIST_MAX_ENTRIES", "9"),
                ("MONAD_DATA_DIR", "/x"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        let g = layers.global();
        assert_eq!(g.limits.read_max_bytes, 100);
        assert_eq!(g.limits.list_max_entries, 9, "environment beats the file");
        assert!(g.exec.allow_unsandboxed_exec);
        assert_eq!(
            g.limits.search_max_results,
            Limits::default().search_max_results
        );
        let s = layers
            .session(Some((
                "sessions/x/config.toml",
                "[limits]\nread_max_bytes = 5\n",
            )))
            .unwrap();
        assert_eq!(s.limits.read_max_bytes, 5, "session beats global");
        assert_eq!(s.limits.list_max_entries, 9, "environment beats session");
        assert!(s.exec.allow_unsandboxed_exec, "untouched keys inherit");
    }

    #[test]
    fn mistakes_name_the_file_line_and_key() {
        let e = Layers::new(
            Some(("/d/config.toml", "[limits]\n\nread_max_byts = 1\n")),
            vec![],
        )
        .unwrap_err();
        assert_eq!(e.source_name, "/d/config.toml");
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("read_max_byts"), "{e}");
        assert!(e.to_string().starts_with("/d/config.toml:3: "), "{e}");
        let e = Layers::new(
            Some(("c.toml", "[limits]\nread_max_bytes = \"big\"\n")),
            vec![],
        )
        .unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("`limits.read_max_bytes`"), "{e}");
        let e = Layers::new(Some(("c.toml", "[limits\n")), vec![]).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        let e = Layers::new(None, vars(&[("MONAD_LIMITS_NOPE", "1")])).unwrap_err();
        assert!(e.to_string().contains("MONAD_LIMITS_NOPE"), "{e}");
        let e = Layers::new(None, vars(&[("MONAD_LIMITS_READ_MAX_BYTES", "lots")])).unwrap_err();
        assert!(e.to_string().contains("MONAD_LIMITS_READ_MAX_BYTES"), "{e}");
        let layers = Layers::new(None, vec![]).unwrap();
        let e = layers
            .session(Some(("s.toml", "[exec]\nenv = 3\n")))
            .unwrap_err();
        assert_eq!((e.source_name.as_str(), e.line), ("s.toml", Some(2)));
        // What only the global layers set, in a session's file, was taken and did nothing.
        for (file, what, line) in [
            (
                "[limits]\nread_max_bytes = 9\n\n[server]\ncall_timeout_secs = 5\n",
                "`[server]`",
                4,
            ),
            ("[store]\npool_size = 2\n", "`[store]`", 1),
            ("[cluster]\nlease_secs = 3\n", "`[cluster]`", 1),
            (
                "[retention]\nkeep_artifacts = false\nidle_unload_hours = 1\n",
                "`retention.idle_unload_hours`",
                3,
            ),
        ] {
            let e = layers.session(Some(("s.toml", file))).unwrap_err();
            assert!(e.message.contains(what), "{e}");
            assert_eq!(e.line, Some(line), "{e}");
        }
        let s = layers
            .session(Some((
                "s.toml",
                "[retention]\nartifact_max_bytes = 10\nkeep_artifacts = false\n[attach]\n\
                 allow_full_trust = false\n",
            )))
            .unwrap();
        assert_eq!(s.retention.artifact_max_bytes, 10);
        assert!(!s.attach.allow_full_trust);
    }

    #[test]
    fn limits_that_cannot_work_together_stop_the_start_whichever_layers_set_them() {
        let start = |file: Option<&str>, env: &[(&str, &str)], base: &Settings| {
            Layers::new(file.map(|f| ("c.toml", f)), vars(env))?.with_base(base)
        };
        let default = Settings::default();
        let e = start(
            Some("[limits]\ncommand_max_timeout_ms = 1000\n"),
            &[],
            &default,
        )
        .unwrap_err();
        assert!(e.message.contains("command_default_timeout_ms"), "{e}");
        assert!(
            e.to_string()
                .contains("files and MONAD_* variables together"),
            "{e}"
        );
        // Each layer fine alone: the default from the file, the maximum from the environment.
        let e = start(
            Some("[limits]\ncommand_default_timeout_ms = 5000\n"),
            &[("MONAD_LIMITS_COMMAND_MAX_TIMEOUT_MS", "4000")],
            &default,
        )
        .unwrap_err();
        assert!(e.message.contains("(5000) is above"), "{e}");
        let e = start(None, &[("MONAD_LIMITS_LIST_MAX_ENTRIES", "0")], &default).unwrap_err();
        assert!(e.message.contains("`limits.list_max_entries` is 0"), "{e}");
        // A time or a count meant as "no bound" panicked the server (on every call,
        // connection or lease) or had it refuse every connection: refused, whichever layer.
        for (file, env, key) in [
            (
                "[server]\ncall_timeout_secs = 9223372036854775807\n",
                None,
                "server.call_timeout_secs",
            ),
            (
                "[server]\nidle_timeout_ms = 5000000000000000000\n",
                None,
                "server.idle_timeout_ms",
            ),
            (
                "[retention]\npurge_every_secs = 9223372036854775807\n",
                None,
                "retention.purge_every_secs",
            ),
            (
                "[cluster]\nlease_secs = 9223372036854775807\n",
                None,
                "cluster.lease_secs",
            ),
            (
                "",
                Some((
                    "MONAD_SERVER_MAX_CALLS_PER_CONNECTION",
                    "9223372036854775807",
                )),
                "server.max_calls_per_connection",
            ),
            ("[store]\npool_size = 4294967296\n", None, "store.pool_size"),
        ] {
            let env: Vec<(&str, &str)> = env.into_iter().collect();
            let e = start(Some(file), &env, &default).unwrap_err();
            assert!(e.message.contains(&format!("`{key}` is ")), "{key}: {e}");
        }
        // At the bounds, and bytes past any count, are taken.
        assert!(
            start(
                Some(
                    "[server]\ncall_timeout_secs = 315360000\nmax_calls_per_connection = \
                     4294967295\nmax_artifact_bytes_per_user = 9223372036854775807\n"
                ),
                &[],
                &default
            )
            .is_ok()
        );
        // The embedding program's base counts: its default under the file's maximum is fine.
        let mut base = Settings::default();
        base.limits.command_default_timeout_ms = 30_000;
        assert!(
            start(
                Some("[limits]\ncommand_max_timeout_ms = 60000\n"),
                &[],
                &base
            )
            .is_ok()
        );
        // The layers alone are not checked together: the commands beside a server read only
        // their `[store]`.
        assert!(
            Layers::new(
                Some(("c.toml", "[limits]\ncommand_max_timeout_ms = 1\n")),
                vec![]
            )
            .is_ok()
        );
        // A session's file is checked with the layers it sits between.
        let layers = start(None, &[], &default).unwrap();
        let e = layers
            .session(Some(("s.toml", "[limits]\ncommand_max_timeout_ms = 10\n")))
            .unwrap_err();
        assert!(e.message.contains("command_default_timeout_ms"), "{e}");
    }

    #[test]
    fn a_base_sits_under_the_files() {
        let mut base = Settings::default();
        base.limits.read_max_bytes = 42;
        base.limits.list_max_entries = 43;
        let layers = Layers::new(Some(("c.toml", "[limits]\nlist_max_entries = 1\n")), vec![])
            .unwrap()
            .with_base(&base)
            .unwrap();
        let g = layers.global();
        assert_eq!(
            (g.limits.read_max_bytes, g.limits.list_max_entries),
            (42, 1)
        );
    }

    #[test]
    fn environment_values_take_toml_syntax_or_strings() {
        let layers = Layers::new(
            None,
            vars(&[
                ("MONAD_EXEC_EXTRA_READ_PATHS", "[\"/opt\"]"),
                ("MONAD_EXEC_PATH_ENV", "/bin:/usr/bin"),
                ("MONAD_ATTACH_ALLOW_FULL_TRUST", "false"),
                ("MONAD_EXEC_NETWORK", "host"),
            ]),
        )
        .unwrap();
        let g = layers.global();
        assert_eq!(g.exec.extra_read_paths, [std::path::PathBuf::from("/opt")]);
        assert_eq!(g.exec.path_env, "/bin:/usr/bin");
        assert!(!g.attach.allow_full_trust);
        assert_eq!(g.exec.network, monad_sandbox::NetworkMode::Host);
        assert_eq!(
            Layers::default().global().exec.network,
            monad_sandbox::NetworkMode::Off,
            "off by default"
        );
    }

    #[test]
    fn llm_settings_layer_like_every_key_and_never_hold_a_key() {
        let layers = Layers::new(
            Some((
                "config.toml",
                "[llm]\nprovider = \"anthropic\"\nmodel = \"m1\"\napi_key_env = \"MY_KEY\"\n",
            )),
            vars(&[("MONAD_LLM_MAX_TOOL_CALLS_PER_TURN", "3")]),
        )
        .unwrap();
        let s = layers
            .session(Some((
                "sessions/x/config.toml",
                "[llm]\nmodel = \"m2\"\nbase_url = \"http://127.0.0.1:9/\"\n",
            )))
            .unwrap();
        assert_eq!(s.llm.provider, crate::llm::ProviderKind::Anthropic);
        assert_eq!(s.llm.model, "m2", "session beats global");
        assert_eq!(s.llm.max_tool_calls_per_turn, 3, "environment applies");
        let endpoint = s
            .llm
            .endpoint(|v| (v == "MY_KEY").then(|| "sk-secret".to_owned()))
            .unwrap();
        assert_eq!(endpoint.api_key.as_deref(), Some("sk-secret"));
        assert_eq!(endpoint.base_url, "http://127.0.0.1:9/");
        // A key itself is not a setting: the file is refused, naming the key.
        let e = layers
            .session(Some(("s.toml", "[llm]\napi_key = \"sk-secret\"\n")))
            .unwrap_err();
        assert!(e.message.contains("api_key"), "{e}");
        let e =
            Layers::new(Some(("c.toml", "[llm]\nprovider = \"gemini\"\n")), vec![]).unwrap_err();
        assert_eq!(e.line, Some(2), "{e}");
    }

    #[test]
    fn llm_endpoint_needs_a_model_and_a_variable_name() {
        let mut llm = LlmSettings::default();
        assert!(llm.endpoint(|_| None).is_err(), "no model");
        llm.model = "m".into();
        let e = llm.endpoint(|_| Some("k".into())).unwrap();
        assert_eq!(e.base_url, "https://api.openai.com/v1");
        assert_eq!(e.api_key.as_deref(), Some("k"), "OPENAI_API_KEY by default");
        llm.api_key_env = "sk-abc".into();
        assert!(llm.endpoint(|_| None).is_err(), "a key pasted as the name");
        llm.api_key_env = "LOCAL".into();
        assert_eq!(
            llm.endpoint(|_| None).unwrap().api_key,
            None,
            "unset: no key"
        );
    }

    #[test]
    fn a_prompt_may_choose_only_models_the_operator_allowed() {
        let llm = |allowed: &[&str]| LlmSettings {
            model: "own".into(),
            allowed_models: allowed.iter().map(|a| (*a).to_owned()).collect(),
            ..LlmSettings::default()
        };
        let asked = |llm: &LlmSettings, model: &str| {
            llm.for_prompt(&PromptOverrides {
                model: Some(model.to_owned()),
                base_url: None,
            })
            .map(|l| l.model)
        };
        // The default: any.
        assert_eq!(asked(&LlmSettings::default(), "any-1").unwrap(), "any-1");
        let listed = llm(&["small", "mini-*"]);
        assert_eq!(asked(&listed, "small").unwrap(), "small");
        assert_eq!(asked(&listed, "mini-2025").unwrap(), "mini-2025");
        assert_eq!(asked(&listed, "mini-").unwrap(), "mini-");
        assert_eq!(
            asked(&listed, "own").unwrap(),
            "own",
            "its own is always allowed"
        );
        for refused in ["smal", "small-2", "mini", "huge"] {
            let e = asked(&listed, refused).expect_err(refused);
            assert!(e.contains("llm.allowed_models"), "{e}");
        }
        // None but its own.
        assert!(asked(&llm(&[]), "small").is_err());
        assert!(asked(&llm(&[]), "own").is_ok());
    }

    #[test]
    fn a_prompt_may_choose_only_base_urls_the_operator_allowed() {
        let llm = LlmSettings {
            model: "m".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            allowed_base_urls: vec!["http://127.0.0.1:2/v1".into()],
            ..LlmSettings::default()
        };
        let asked = |model: Option<&str>, base_url: Option<&str>| {
            llm.for_prompt(&PromptOverrides {
                model: model.map(str::to_owned),
                base_url: base_url.map(str::to_owned),
            })
        };
        assert_eq!(asked(None, None).unwrap(), llm);
        let other = asked(Some("m2"), Some("http://127.0.0.1:2/v1")).unwrap();
        assert_eq!(
            (other.model.as_str(), other.base_url.as_str()),
            ("m2", "http://127.0.0.1:2/v1")
        );
        assert!(
            asked(None, Some("http://127.0.0.1:1/v1")).is_ok(),
            "its own URL"
        );
        for url in [
            "http://127.0.0.1:2/v1/",
            "http://127.0.0.1:2/v1?x",
            "http://evil.example/v1",
            "",
        ] {
            let e = asked(None, Some(url)).expect_err(url);
            assert!(e.contains("llm.allowed_base_urls"), "{e}");
        }
        assert!(asked(Some(""), None).is_err());
        assert!(asked(Some("m\u{1b}[2J"), None).is_err());
        let default = LlmSettings {
            model: "m".into(),
            ..LlmSettings::default()
        };
        assert!(
            default
                .for_prompt(&PromptOverrides {
                    model: None,
                    base_url: Some("https://api.openai.com/v1".into()),
                })
                .is_ok(),
            "the provider's own URL when none is set"
        );
    }
}
