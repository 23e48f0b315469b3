//! `monad-server`: argument parsing and wiring; the behaviour lives in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
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
    #[arg(long, default_value = "127.0.0.1:4433")]
    listen: SocketAddr,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (the default).
    Serve(ServeArgs),
    /// Manage tokens.
    #[command(subcommand)]
    Token(TokenCommand),
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
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monad-server: {e:#}");
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
        Some(Command::Token(cmd)) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let store = TokenStore::new(&dir);
            match cmd {
                TokenCommand::Create { user } => {
                    let (record, token) = store.create(&user)?;
                    println!("{token}");
                    eprintln!(
                        "token {} for user {} (shown only once)",
                        record.id, record.user
                    );
                }
                TokenCommand::List => {
                    for t in store.list()? {
                        println!("{}\t{}\t{}", t.id, t.user, t.created_at);
                    }
                }
                TokenCommand::Revoke { id } => {
                    if !store.revoke(&id)? {
                        anyhow::bail!("no token with id `{id}` (see `monad-server token list`)");
                    }
                    eprintln!("revoked {id}");
                }
            }
            Ok(())
        }
    }
}

fn serve(dir: PathBuf, args: ServeArgs) -> Result<()> {
    let mut config = ServerConfig::new(dir);
    config.listen = args.listen;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let (server, first) = Server::bind(config.clone())?;
        let addr = server.local_addr();
        eprintln!(
            "monad-server listening on {addr} (QUIC), data in {}",
            config.data_dir.display()
        );
        eprintln!("certificate fingerprint: {}", server.fingerprint());
        match first {
            Some(first) => {
                eprintln!();
                eprintln!(
                    "First start: created a certificate and a token for user `{}`.",
                    first.user
                );
                eprintln!("On the machine whose folder you want to attach, run:");
                eprintln!();
                println!(
                    "monad-client login --server {addr} --token {} --fingerprint {}",
                    first.token,
                    server.fingerprint()
                );
                eprintln!();
                eprintln!("and then attach a folder:");
                eprintln!();
                eprintln!("monad-client attach ~/dev/project");
                eprintln!();
            }
            None => eprintln!(
                "create a token for a new client with `monad-server token create`; log in with \
                 `monad-client login --server {addr} --token TOKEN --fingerprint {}`",
                server.fingerprint()
            ),
        }
        server.run(shutdown_signal()).await;
        Ok(())
    })
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
