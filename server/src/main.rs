//! `monad-server`: argument parsing and wiring; the behaviour lives in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use monad_protocol::text::{json_safe, printable, printable_lines};
use monad_protocol::{errln, outln, output};
use monad_server::admin::Admin;
use monad_server::auth::TokenStore;
use monad_server::{Server, ServerConfig};

#[derive(Parser)]
#[command(
    name = "monad-server",
    version,
    about = "Monad server: sessions, workspaces and tool routing for AI agents"
)]
struct Cli {
    /// Where tokens, certificates and sessions live (default: the platform data dir + monad;
    /// also MONAD_DATA_DIR).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// QUIC address to listen on.
    #[arg(long, default_value = monad_server::config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Address of the MCP over HTTP endpoint for AI hosts (http://ADDR/mcp, bearer tokens).
    #[arg(long, default_value = monad_server::config::DEFAULT_HTTP)]
    http: SocketAddr,
    /// Do not serve MCP over HTTP.
    #[arg(long, conflicts_with = "http")]
    no_http: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (the default).
    Serve(ServeArgs),
    /// Manage tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Inspect and clean up sessions.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Inspect workspace records (attached folders).
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
}

#[derive(Subcommand)]
enum SessionCommand {
    /// List sessions, most recently active first.
    List {
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Show a session: owner, times, counts, attached folders.
    Show {
        /// The session id.
        id: String,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Delete a session with its workspace, history and artifacts (server stopped).
    Delete {
        /// The session id.
        id: String,
    },
    /// Delete sessions unused for DAYS days, never `default` (server stopped).
    Gc {
        /// Age in days.
        #[arg(long)]
        max_age: u64,
    },
    /// Print a session's conversation (session.md).
    History {
        /// The session id.
        id: String,
    },
    /// List a session's artifacts.
    Artifacts {
        /// The session id.
        id: String,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Print one artifact's content.
    Artifact {
        /// The session id.
        id: String,
        /// The artifact id (from `session artifacts`).
        artifact: String,
    },
}

#[derive(Subcommand)]
enum WorkspaceCommand {
    /// List workspace records, most recently active first.
    List {
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Show a record and a page of the sessions it was used in, most recent first.
    Show {
        /// The record id.
        id: String,
        /// Page size, 1 to 100.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// The `next` token printed with the previous page.
        #[arg(long)]
        next: Option<String>,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
}

/// JSON for scripts: valid, the same values, and with every control, escape, bidi and
/// zero-width character as a `\uXXXX` escape, so that it is safe on a terminal too.
fn print_json(value: &impl serde::Serialize) -> Result<()> {
    outln!("{}", json_safe(&serde_json::to_string_pretty(value)?))?;
    Ok(())
}

/// A field from a user, an agent or a client (names, paths, URIs, ids), safe to print.
fn p(text: &str) -> std::borrow::Cow<'_, str> {
    printable(text)
}

fn session_command(admin: &Admin, cmd: SessionCommand) -> Result<()> {
    match cmd {
        SessionCommand::List { json } => {
            let sessions = admin.sessions()?;
            if json {
                return print_json(&sessions);
            }
            for s in sessions {
                outln!(
                    "{}\t{}\t{}\t{}",
                    p(&s.id),
                    p(&s.owner),
                    p(&s.created_at),
                    p(&s.last_active)
                )?;
            }
        }
        SessionCommand::Show { id, json } => {
            let report = admin.show(&id)?;
            if json {
                return print_json(&report);
            }
            let m = &report.meta;
            outln!("session     {}", p(&m.id))?;
            if let Some(name) = &m.name {
                outln!("name        {}", p(name))?;
            }
            outln!("owner       {}", p(&m.owner))?;
            outln!("created     {}", p(&m.created_at))?;
            outln!("last active {}", p(&m.last_active))?;
            if let Some(provider) = &m.provider {
                outln!("provider    {}", p(provider))?;
            }
            if let Some(model) = &m.model {
                outln!("model       {}", p(model))?;
            }
            outln!("messages    {}", report.messages)?;
            outln!("tool calls  {} ({} denied)", report.calls, report.denied)?;
            outln!("artifacts   {}", report.artifacts)?;
            outln!("devices     {} bound", report.bound_devices)?;
            outln!("workspaces  primary (server:/sessions/{})", p(&m.id))?;
            for w in &report.workspaces {
                outln!("            {} ({})", p(&w.uri), p(&w.id))?;
            }
        }
        SessionCommand::Delete { id } => {
            admin.delete(&id).map_err(anyhow::Error::msg)?;
            errln!("deleted session {}", p(&id));
        }
        SessionCommand::Gc { max_age } => {
            let deleted = admin.gc(max_age).map_err(anyhow::Error::msg)?;
            for id in &deleted {
                outln!("{}", p(id))?;
            }
            errln!(
                "deleted {} sessions unused for {max_age} days",
                deleted.len()
            );
        }
        SessionCommand::History { id } => {
            let history = admin.history(&id)?;
            output::out(&printable_lines(&monad_server::store::history::render(
                &history,
            )))?;
        }
        SessionCommand::Artifacts { id, json } => {
            let artifacts = admin.artifacts(&id)?;
            if json {
                return print_json(&artifacts);
            }
            for a in artifacts {
                outln!(
                    "{}\t{}\t{}\t{}\t{} bytes{}",
                    p(&a.id),
                    a.kind.as_str(),
                    p(a.tool.as_deref().unwrap_or("-")),
                    p(&a.created_at),
                    a.size,
                    if a.truncated { " (truncated)" } else { "" }
                )?;
            }
        }
        SessionCommand::Artifact { id, artifact } => {
            let (_, content) = admin.artifact(&id, &artifact)?;
            use std::io::IsTerminal;
            if std::io::stdout().is_terminal() {
                // On a terminal, escaped like everything else; piped, the bytes as stored.
                let text = String::from_utf8_lossy(&content);
                output::out(&printable_lines(&text))?;
            } else {
                output::out_bytes(&content)?;
            }
        }
    }
    Ok(())
}

fn workspace_command(admin: &Admin, cmd: WorkspaceCommand) -> Result<()> {
    match cmd {
        WorkspaceCommand::List { json } => {
            let records = admin.workspaces()?;
            if json {
                return print_json(&records);
            }
            for r in records {
                outln!(
                    "{}\t{}\t{}\t{}",
                    p(&r.id),
                    p(&r.user),
                    p(&r.uri),
                    p(&r.last_active)
                )?;
            }
        }
        WorkspaceCommand::Show {
            id,
            limit,
            next,
            json,
        } => {
            let (record, page) = admin.workspace(&id, limit, next.as_deref())?;
            if json {
                return print_json(&serde_json::json!({
                    "record": record,
                    "sessions": page.items,
                    "next": page.next,
                }));
            }
            outln!(
                "{} ({}) of {}, device {}",
                p(&record.uri),
                p(&record.id),
                p(&record.user),
                p(&record.device_id)
            )?;
            for s in &page.items {
                outln!(
                    "{}\t{}\t{} calls",
                    p(&s.session),
                    p(&s.last_active),
                    s.calls
                )?;
            }
            if let Some(next) = page.next {
                outln!("more: --next {}", p(&next))?;
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print it (it is shown only once).
    Create {
        /// The user the token authenticates as.
        #[arg(long, default_value = "admin")]
        user: String,
    },
    /// List tokens (ids and users; tokens themselves are stored hashed).
    List,
    /// Revoke a token by id.
    Revoke {
        /// The token's id, from `token list`.
        id: String,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "monad_server=info".into()),
        )
        .with_writer(std::io::stderr)
        // A closed standard error must not turn into a panic (the report would be printed there).
        .log_internal_errors(false)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote a session id or a path from a user: escaped.
            errln!("monad-server: {}", printable(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

fn data_dir(cli: &Cli) -> Result<PathBuf> {
    match &cli.data_dir {
        Some(dir) => Ok(dir.clone()),
        None => monad_server::config::default_data_dir()
            .context("no data directory: pass --data-dir or set MONAD_DATA_DIR"),
    }
}

fn run(cli: Cli) -> Result<()> {
    let dir = data_dir(&cli)?;
    match cli.command {
        None => serve(dir, cli.serve),
        Some(Command::Serve(args)) => serve(dir, args),
        Some(Command::Session(cmd)) => session_command(&Admin::new(&dir), cmd),
        Some(Command::Workspace(cmd)) => workspace_command(&Admin::new(&dir), cmd),
        Some(Command::Token(cmd)) => {
            monad_server::fsutil::create_private_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let store = TokenStore::new(&dir);
            match cmd {
                TokenCommand::Create { user } => {
                    let (record, token) = store.create(&user)?;
                    outln!("{token}")?;
                    errln!(
                        "token {} for user {} (shown only once)",
                        p(&record.id),
                        p(&record.user)
                    );
                }
                TokenCommand::List => {
                    for t in store.list()? {
                        outln!("{}\t{}\t{}", p(&t.id), p(&t.user), p(&t.created_at))?;
                    }
                }
                TokenCommand::Revoke { id } => {
                    if !store.revoke(&id)? {
                        anyhow::bail!(
                            "no token with id `{}` (see `monad-server token list`)",
                            p(&id)
                        );
                    }
                    errln!("revoked {}", p(&id));
                }
            }
            Ok(())
        }
    }
}

fn serve(dir: PathBuf, args: ServeArgs) -> Result<()> {
    raise_open_files_limit();
    let mut config = ServerConfig::new(dir);
    config.listen = args.listen;
    config.http = (!args.no_http).then_some(args.http);
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let (server, first) = Server::bind(config.clone())?;
        let addr = server.local_addr();
        errln!(
            "monad-server listening on {addr} (QUIC), data in {}",
            config.data_dir.display()
        );
        errln!("certificate fingerprint: {}", server.fingerprint());
        if let Some(http) = server.http_addr() {
            errln!(
                "MCP for AI hosts: http://{http}/mcp (header `Authorization: Bearer TOKEN`), or \
                 `monad-client mcp` on stdio"
            );
        }
        match first {
            Some(first) => {
                errln!();
                errln!(
                    "First start: created a certificate and a token for user `{}`.",
                    first.user
                );
                errln!("On the machine whose folder you want to attach, run:");
                errln!();
                // The token goes in the environment, not in the client's argv.
                outln!(
                    "MONAD_TOKEN={} monad-client login --server {addr} --fingerprint {}",
                    first.token,
                    server.fingerprint()
                )?;
                errln!();
                errln!("and then attach a folder:");
                errln!();
                errln!("monad-client attach ~/dev/project");
                errln!();
            }
            None => errln!(
                "create a token for a new client with `monad-server token create`; log in with \
                 `MONAD_TOKEN=TOKEN monad-client login --server {addr} --fingerprint {}`",
                server.fingerprint()
            ),
        }
        server.run(shutdown_signal()).await;
        Ok(())
    })
}

/// Raises the soft limit on open files to the hard limit: every loaded session holds its
/// primary workspace's directory open (and every connection a socket), and the usual soft limit
/// of 1,024 would cap a server at about a thousand sessions in use within a day.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!("cannot raise the open-files limit from {soft} to {hard}: {e}");
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
