//! `monad-client`: argument parsing and wiring; the behaviour lives in the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use monad_client::ClientError;
use monad_client::agent::{Agent, check_login};
use monad_client::approval::Approver;
use monad_client::attach::{AttachOptions, attach};
use monad_client::call;
use monad_client::config::{ClientConfig, default_config_dir};
use monad_client::interrupts::{Interrupts, end_by};
use monad_client::login;
use monad_client::printer::LinesPrinter;
use monad_client::terminal::{TerminalApprover, guard_from_setting};
use monad_protocol::output::{Table, count};
use monad_protocol::render;
use monad_protocol::text::{json_safe, printable, printable_lines};
use monad_protocol::wire::{History, HistoryMessage, HistoryRole, Host, SessionInfo, Trust};
use monad_protocol::{ToolClass, ToolName};
use monad_protocol::{errln, outln, output};

/// mimalloc rather than glibc's malloc. A call moves results of up to megabytes through a few
/// buffers and frees them; glibc gave the pages back at each free and faulted them in again at
/// the next call (page faults were 16% of `monad-client mcp`'s time on a 248 KiB read).
/// `monad-server` keeps glibc's: with mimalloc it held 25 to 40 KiB more per attached client
/// (`docs/benchmarks.md`, figure c).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How many of an attachment's lines may wait for a standard error that does not take them
/// (two per call); later ones are counted and left out (`monad_client::printer`).
const ATTACH_LINES_HELD: usize = 512;

/// How long an ending attachment waits for its last lines to be written.
const ATTACH_LAST_LINES_WAIT: Duration = Duration::from_secs(1);

/// What `--session` means, the same for every command.
const SESSION_HELP: &str = "Session id, or a unique start of it, as docker and git take ids \
                            (default: this device's current session, the one `sessions` marks \
                            with *, else your default session)";

#[derive(Parser)]
#[command(
    name = "monad-client",
    version,
    about = "Monad client: attach folders to AI sessions, approve what agents do, call tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum TrustArg {
    Restricted,
    Full,
}

#[derive(Clone, Copy, ValueEnum)]
enum ClassArg {
    Read,
    Write,
    Exec,
}

#[derive(Subcommand)]
enum Command {
    /// Save the server, token and certificate fingerprint (checked by connecting).
    ///
    /// The token is taken from --token, else MONAD_TOKEN, else standard input (its first line, or a
    /// prompt that does not echo on a terminal), so that it need not be in the command line.
    /// Several hosts of one deployment (one store, one certificate): repeat --server; they are
    /// tried in that order, and a laptop whose host dies re-attaches through another.
    Login {
        /// HOST:PORT of the server (HOST alone means port 4433); repeat for each host of a
        /// deployment of several.
        #[arg(long = "server", value_name = "HOST:PORT", required = true, value_parser = server_arg)]
        servers: Vec<String>,
        /// A token from `monad-server token create` (or the first start). Prefer MONAD_TOKEN or
        /// standard input: a command line is visible to other users of the machine.
        #[arg(long)]
        token: Option<String>,
        /// The certificate fingerprint the server printed at start-up.
        #[arg(long, value_parser = fingerprint_arg)]
        fingerprint: String,
    },
    /// Attach a folder to a session and approve what agents do in it.
    ///
    /// Options go before or after the folder. Ctrl-C (or SIGTERM, or its terminal closing)
    /// disconnects: the folder stays in the session, offline, until it is attached again
    /// (`detach` removes it). Attaching the
    /// same folder again (from another terminal) takes it over, and this one says so and exits.
    Attach {
        /// The folder.
        dir: Option<PathBuf>,
        /// Session id, or a unique start of it (default: the folder's active session, when an
        /// MCP host landed in it or `sessions --new` was run in it, and the folder becomes its
        /// focus unless it has one; else this device's current session, the one `sessions`
        /// marks with *, else your default session).
        #[arg(long)]
        session: Option<String>,
        /// Short name in the session (default: the folder's name, made unique). A name given
        /// here is used as given, or the attach fails (taken, or reserved like `primary`).
        #[arg(long)]
        name: Option<String>,
        /// `restricted` asks before each action; `full` runs everything at once.
        #[arg(long, value_enum, default_value = "restricted")]
        trust: TrustArg,
        /// Pre-approve classes of actions: read, write, exec (`--allow read write`,
        /// `--allow read,write`, or repeat the flag).
        #[arg(long, num_args = 1.., value_name = "CLASS")]
        allow: Vec<String>,
        /// Never prompt: anything not pre-approved is denied.
        #[arg(long)]
        non_interactive: bool,
        /// Seconds a prompt waits for an answer; then the call is refused as timed out (2 to
        /// 604800, a week).
        #[arg(long, default_value_t = 120, value_parser = prompt_seconds())]
        prompt_timeout: u64,
        /// Make this folder the session's focus: an agent's calls that name no workspace try
        /// it first (until it is detached by name, or another folder takes the focus; it stays
        /// the focus while offline).
        #[arg(long)]
        focus: bool,
    },
    /// Detach a folder from a session by its short name (or URI), from any terminal.
    ///
    /// Its `attach` stops, and the session forgets it (an offline folder is no longer listed).
    Detach {
        /// The folder's short name in the session (`status` lists them), or its URI.
        name: String,
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
    },
    /// Who you are, which server, this device's current session and its workspaces.
    ///
    /// The server's certificate fingerprint is shown too, and whether each workspace is online.
    Status {
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Forget the token (the server, device id and settings stay for the next login).
    Logout,
    /// Call a tool as an agent and print its result.
    ///
    /// It prints the text a model gets, or JSON with --json. Exit codes: 0 done; 1 the tool (or the
    /// client) failed; 2 usage error; 3 the command ran but exited non-zero, was killed or timed
    /// out.
    #[command(disable_help_flag = true)]
    Call {
        /// Tool name (`monad-client tools` lists them; `call TOOL --help` shows its arguments).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(
            monad_protocol::ToolName::ALL.map(monad_protocol::ToolName::as_str)
        ))]
        tool: Option<String>,
        /// The arguments, as a JSON object (default `{}`), in place of `--args`: `monad-client
        /// call read_file '{"path": "a.txt"}'`. The same forms as `--args` (`-`, `@FILE`).
        #[arg(value_name = "ARGS", conflicts_with = "args")]
        given_args: Option<String>,
        /// The arguments, as a JSON object; `-` reads them from standard input, `@FILE` from a
        /// file (a `write_file` of more than the 128 KiB one command-line argument may hold).
        #[arg(long, value_name = "JSON")]
        args: Option<String>,
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
        /// Workspace to run in (short name or URI).
        #[arg(long)]
        workspace: Option<String>,
        /// Print the whole answer as JSON (stable for scripts).
        #[arg(long)]
        json: bool,
        /// Print help; with TOOL, the tool's description and arguments.
        #[arg(short, long)]
        help: bool,
    },
    /// List the tools, or show one tool's description and arguments (from its JSON Schema).
    Tools {
        /// The tool to describe.
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(
            monad_protocol::ToolName::ALL.map(monad_protocol::ToolName::as_str)
        ))]
        tool: Option<String>,
        /// Print each tool's name, description and input and output JSON Schemas.
        #[arg(long)]
        json: bool,
    },
    /// Serve MCP on stdin/stdout for an AI host (Claude, an IDE...), bridged to the server.
    Mcp {
        /// Session used when the host's `initialize` names none in `_meta.sessionId`; it wins
        /// over the host's roots (default: the active session of the attached folder the host's
        /// roots are in, else this device's current session, the one `sessions` marks with *,
        /// else your default session).
        #[arg(long)]
        session: Option<String>,
    },
    /// Serve the Agent Client Protocol on stdin/stdout for an editor (Zed, and others).
    ///
    /// The editor talks to the session's built-in agent, bridged to the server.
    Acp,
    /// Talk to the session's built-in agent in this terminal.
    ///
    /// Answers are streamed and tool calls shown as they run; folders attached with /attach
    /// are approved here, and slash commands do the rest (/help lists them).
    Chat {
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
        /// The model for this chat instead of the session's `llm.model`.
        #[arg(long)]
        model: Option<String>,
        /// The API base URL for this chat instead of the session's; the server refuses one its
        /// operator did not list in `llm.allowed_base_urls`.
        #[arg(long, value_parser = base_url_arg)]
        base_url: Option<String>,
        /// Seconds an approval prompt of a folder attached with /attach waits for an answer;
        /// then the call is refused as timed out (2 to 604800, a week).
        #[arg(long, default_value_t = 120, value_parser = prompt_seconds())]
        prompt_timeout: u64,
    },
    /// List your sessions, start a new one, or switch to one.
    ///
    /// `*` marks this device's current session; `sessions use ID` switches to one.
    #[command(args_conflicts_with_subcommands = true)]
    Sessions {
        #[command(subcommand)]
        action: Option<SessionsAction>,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
        /// With --new: a human name for the new session, shown in lists.
        #[arg(long, requires = "new")]
        name: Option<String>,
        /// Create a new session (a fresh id), bind this device to it, and print its id. Run
        /// inside a folder this device attached (or with --folder), the new session becomes
        /// that folder's active session: MCP hosts whose roots are in the folder land in it,
        /// and the attached folder serves it too.
        #[arg(long)]
        new: bool,
        /// With --new: the folder to start the session for (default: the current directory).
        #[arg(long, requires = "new")]
        folder: Option<PathBuf>,
    },
    /// The session's conversation (`session.md`): append, show, replace, clear.
    #[command(subcommand)]
    History(HistoryCommand),
}

#[derive(Subcommand)]
enum SessionsAction {
    /// Make a session this device's current one: commands without --session use it.
    Use {
        /// The session id, or a unique start of it.
        #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
        id: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    User,
    Assistant,
    System,
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Append a message.
    Append {
        /// Who said it.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// What was said.
        #[arg(long)]
        text: String,
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
    },
    /// Show the conversation.
    Show {
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Replace the conversation with a snapshot (overwrite semantics).
    ///
    /// The snapshot is a JSON file holding a history (`{"created_at": ..., "messages":
    /// [{"role": "user", "text": ...}]}`, optionally `provider` and `model`), or what `history
    /// show --json` prints. `-` reads stdin.
    Replace {
        /// The snapshot file, or `-` for standard input.
        #[arg(long)]
        file: PathBuf,
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
    },
    /// Clear the conversation; the session keeps its id, workspace and attachments.
    Clear {
        #[arg(long, help = SESSION_HELP)]
        session: Option<String>,
    },
}

async fn history(command: HistoryCommand) -> Result<ExitCode> {
    // A snapshot that cannot be used is the command line's fault, as bad `call` arguments are:
    // a usage error, said before connecting.
    let snapshot = match &command {
        HistoryCommand::Replace { file, .. } => Some(read_snapshot(file)),
        _ => None,
    };
    let config = ClientConfig::load(&config_dir()?)?;
    let agent = Agent::connect(&config).await?;
    closed(&agent, history_on(&agent, command, snapshot).await).await
}

/// A path as the terminal should see it: lossy where it is not UTF-8, its control characters
/// (a tab too) escaped.
fn shown_path(path: &std::path::Path) -> String {
    monad_protocol::text::printable_name(&path.to_string_lossy()).into_owned()
}

/// The history `history replace --file` names (`-`: standard input), or a usage error (exit 2)
/// saying why it cannot be had.
fn read_snapshot(file: &std::path::Path) -> History {
    let usage = |message: String| -> ! {
        usage_error(
            "history replace",
            clap::error::ErrorKind::ValueValidation,
            message,
        )
    };
    let shown = shown_path(file);
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .unwrap_or_else(|e| usage(format!("cannot read standard input: {e}")))
    } else {
        std::fs::read_to_string(file).unwrap_or_else(|e| usage(format!("cannot read {shown}: {e}")))
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| usage(format!("{shown} is not JSON ({e})")));
    // Accept `history show --json` output as well as a bare history.
    let history = value.get("history").cloned().unwrap_or(value);
    serde_json::from_value(history).unwrap_or_else(|e| {
        usage(format!(
            "{shown} is not a history ({e}): expected {{\"created_at\": ..., \"messages\": \
             [{{\"role\": \"user\", \"text\": ...}}]}}"
        ))
    })
}

/// Closes `agent`'s connection ([`Agent::close`]) and gives back `done`, what the command got
/// through it. Each command closes its connection before it exits, whatever it got, and waits
/// (at most 1 s) until the close is sent: a connection left open is held by the server until
/// its idle time-out, counted against the user's connections
/// (`server.max_connections_per_user`), and a script calling in a few loops at once was refused.
async fn closed<T>(agent: &Agent, done: T) -> T {
    agent.close("done").await;
    done
}

async fn history_on(
    agent: &Agent,
    command: HistoryCommand,
    snapshot: Option<History>,
) -> Result<ExitCode> {
    match command {
        HistoryCommand::Append {
            role,
            text,
            session,
        } => {
            let role = match role {
                RoleArg::User => HistoryRole::User,
                RoleArg::Assistant => HistoryRole::Assistant,
                RoleArg::System => HistoryRole::System,
            };
            let id = agent
                .history_append(session.as_deref(), HistoryMessage { role, text })
                .await?;
            errln!("appended to session {}", printable(&id));
        }
        HistoryCommand::Show { session, json } => {
            let (id, history) = agent.history(session.as_deref()).await?;
            if json {
                let out = serde_json::json!({ "session": id, "history": history });
                outln!("{}", json_safe(&serde_json::to_string_pretty(&out)?))?;
            } else {
                errln!(
                    "session {}, created {}",
                    printable(&id),
                    printable(&history.created_at)
                );
                for m in &history.messages {
                    outln!("## {}\n\n{}\n", m.role.header(), printable_lines(&m.text))?;
                }
            }
        }
        HistoryCommand::Replace { session, .. } => {
            let history = snapshot.context("the snapshot is read before connecting")?;
            let count_messages = history.messages.len();
            let id = agent.history_replace(session.as_deref(), history).await?;
            errln!(
                "replaced the conversation of session {} ({})",
                printable(&id),
                count(count_messages, "message", "messages")
            );
        }
        HistoryCommand::Clear { session } => {
            let id = agent.history_clear(session.as_deref()).await?;
            errln!("cleared the conversation of session {}", printable(&id));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // rmcp's errors: a host's request dropped for its length, say.
                // and the sandbox's: commands running without namespaces from now on.
                .unwrap_or_else(|_| {
                    "monad_client=warn,monad_protocol=warn,monad_sandbox=warn,rmcp=error".into()
                }),
        )
        .with_writer(std::io::stderr)
        .with_ansi(output::log_colours(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        // A closed standard error must not turn into a panic (the report would be printed there).
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    // The MCP bridge only relays between the host's pipes and one QUIC connection: on one
    // thread, a message goes through without waking another (`docs/benchmarks.md`, the MCP
    // bench). So does an attached folder: its connection's calls are short on the thread (a
    // small read or listing, a check), and what takes longer runs on the blocking pool (larger
    // reads, search, glob, writes, previews, starting a command) or in a child process (the
    // command). On a pool of workers, each call woke three or four threads in turn, about 8
    // context switches per 4 KiB read against 2 on one thread (`docs/benchmarks.md`, eighth
    // round). The other commands keep a worker per core.
    let runtime = match &cli.command {
        Command::Mcp { .. } | Command::Attach { .. } => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Runtime::new(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            errln!("monad-client: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ended = runtime.block_on(run(cli));
    // A prompt still up (the process ends on a signal or a take-over while it asks) gives the
    // terminal its echo back before anything else is said.
    monad_client::terminal::restore();
    match ended {
        Ok(code) => code,
        Err(e) => {
            errln!("{}", failure_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// `login`'s token ([`login::read`]), with SIGINT, SIGTERM and SIGHUP watched meanwhile: one
/// that ends the process at the token prompt, which does not echo, gives the terminal its echo
/// back first (it was left off, and the shell after showed nothing typed).
async fn read_token(source: login::TokenSource) -> std::io::Result<Option<String>> {
    let mut interrupts = Interrupts::watch()?;
    let read = tokio::task::spawn_blocking(move || login::read(source));
    tokio::select! {
        read = read => {
            interrupts.stop();
            read.map_err(std::io::Error::other)?
        }
        signal = interrupts.next() => {
            monad_client::terminal::restore();
            end_by(signal)
        }
    }
}

/// `chat --base-url`: an `http://` or `https://` URL with a host, checked before the chat
/// starts rather than refused by the server at the first message.
fn base_url_arg(raw: &str) -> Result<String, String> {
    // A scheme is case-insensitive (RFC 3986).
    let lower = raw.to_ascii_lowercase();
    let host = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
    match host {
        Some(host) if !host.is_empty() && !raw.contains(char::is_whitespace) => Ok(raw.to_owned()),
        _ => Err("expected an http:// or https:// URL, like https://api.example.com/v1".into()),
    }
}

/// `--prompt-timeout`'s seconds: at least 2, so that a prompt outlasts the guard that ignores
/// keys typed just before it appeared (`terminal::PROMPT_GUARD`), and at most a week, so that
/// the deadline is a time the clock can hold (a larger one overflowed it at the first prompt).
fn prompt_seconds() -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(2..=7 * 24 * 3600)
}

/// `login --server`: `HOST:PORT` (`HOST` alone means port 4433), checked as the config checks
/// it, so that a malformed one is a usage error (status 2) like any other bad flag.
fn server_arg(raw: &str) -> Result<String, String> {
    if let Some((scheme, _)) = raw.split_once("://") {
        return Err(format!(
            "`{}` is a URL: give the server as HOST:PORT, without `{}://` (QUIC, not HTTP)",
            printable(raw),
            printable(scheme)
        ));
    }
    let address = monad_client::connect::with_default_port(raw);
    monad_client::config::check_addresses(std::slice::from_ref(&address))
        .map_err(config_message)?;
    Ok(address)
}

/// `login --fingerprint`, normalized as the config keeps it; malformed, a usage error.
fn fingerprint_arg(raw: &str) -> Result<String, String> {
    monad_client::config::normalize_fingerprint(raw).map_err(config_message)
}

/// A config error's sentence, without the `config:` its display starts with.
fn config_message(e: ClientError) -> String {
    match e {
        ClientError::Config(message) => message,
        other => other.to_string(),
    }
}

/// Exits with clap's usage error (status 2) for `subcommand`: the message, then how that
/// subcommand is used (not the top-level `monad-client <COMMAND>`).
fn usage_error(
    subcommand: &str,
    kind: clap::error::ErrorKind,
    message: impl std::fmt::Display,
) -> ! {
    let mut cli = Cli::command();
    // Names the subcommand (`monad-client call`, `monad-client history replace`: words apart)
    // in its usage line.
    cli.build();
    let mut command = cli;
    for word in subcommand.split(' ') {
        match command.find_subcommand(word).cloned() {
            Some(sub) => command = sub,
            None => break,
        }
    }
    command.error(kind, message).exit()
}

/// The line a command that failed ends with. Errors may quote the server or a peer: escaped,
/// like everything else.
fn failure_line(e: &anyhow::Error) -> String {
    format!("monad-client: {}", printable(&format!("{e:#}")))
}

fn config_dir() -> Result<PathBuf> {
    default_config_dir().context("no config directory: set MONAD_CONFIG_DIR")
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Login {
            servers,
            token,
            fingerprint,
        } => {
            // Each --server was checked alone; together, as the config checks them (a server
            // listed twice), before the token is read.
            if let Err(e) = monad_client::config::check_addresses(&servers) {
                usage_error(
                    "login",
                    clap::error::ErrorKind::ValueValidation,
                    config_message(e),
                );
            }
            let dir = config_dir()?;
            let source = login::source(
                token,
                std::env::var("MONAD_TOKEN").ok(),
                std::io::stdin().is_terminal(),
            );
            let Some(token) = read_token(source).await.context("cannot read the token")? else {
                bail!("{}", login::MISSING);
            };
            let mut config = ClientConfig::with_servers(&servers, &token, &fingerprint)?;
            // Keep the device id across logins (and a logout), so bindings and workspace
            // records stay.
            match ClientConfig::load_any(&dir) {
                Ok(old) => {
                    // One the server would refuse is made again (this device's earlier
                    // bindings were keyed by an id no server took).
                    match monad_client::config::check_device_id(&old.device_id) {
                        Ok(()) => config.device_id = old.device_id,
                        Err(why) => errln!(
                            "{why} in {}: this device gets a new one",
                            shown_path(&dir.join("config.toml"))
                        ),
                    }
                    // The machine's name as the file says: one given by hand (the host part
                    // of this device's workspace URIs) is not reset.
                    if !old.client_name.is_empty() {
                        config.client_name = old.client_name;
                    }
                    config.limits = old.limits;
                    config.exec = old.exec;
                }
                // None yet: this is the device's first login.
                Err(ClientError::NotLoggedIn(_)) => {}
                // One that cannot be read is not replaced: its device id (this device's
                // sessions) and its settings would be lost without a word.
                Err(e) => bail!(
                    "{e}; login keeps this device's id and settings from that file, and would \
                     lose them by replacing it: fix it, or move it aside to start afresh"
                ),
            }
            let checked = check_login(&config).await.map_err(|e| match e {
                // The pin being set here, not one kept from an earlier login.
                ClientError::FingerprintMismatch {
                    server,
                    expected,
                    presented,
                } => anyhow::anyhow!(
                    "the server at {server} presents the certificate fingerprint {presented}, \
                     not {expected} given with --fingerprint: use the one the server printed at \
                     start-up (`monad-server fingerprint` prints it again); another one may mean \
                     that something else answers at that address"
                ),
                other => other.into(),
            })?;
            config.save(&dir)?;
            errln!(
                "logged in to {} as {}; saved in {}",
                printable(&config.shown_servers()),
                printable(&checked.user),
                shown_path(&dir.join("config.toml"))
            );
            for (server, why) in &checked.unreachable {
                errln!(
                    "warning: {} did not answer ({}): kept, and tried when the other servers \
                     do not answer",
                    printable(server),
                    printable(why)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Attach {
            dir,
            session,
            name,
            trust,
            allow,
            non_interactive,
            prompt_timeout,
            focus,
        } => {
            let (allow, dir) = split_allow(allow, dir).map_err(|message| {
                usage_error("attach", clap::error::ErrorKind::ValueValidation, message)
            })?;
            let config = ClientConfig::load(&config_dir()?)?;
            let canonical = dir
                .canonicalize()
                .with_context(|| format!("cannot open {}", shown_path(&dir)))?;
            if !canonical.is_dir() {
                bail!("{} is not a directory", shown_path(&dir));
            }
            // Allowed (a user may mean it), but said: every file of the machine, or of the
            // user, is then within the agents' reach.
            let home = monad_client::config::canonical_home();
            if canonical.parent().is_none() || home.as_deref() == Some(canonical.as_path()) {
                errln!(
                    "warning: {} is {}: every file in it that you can read is within reach of \
                     the session's agents (what --allow and --trust do not pre-approve is still \
                     {}); attach the project's folder instead if that is what they need",
                    printable(&canonical.to_string_lossy()),
                    if canonical.parent().is_none() {
                        "the whole filesystem"
                    } else {
                        "your home directory"
                    },
                    if non_interactive { "denied" } else { "asked" }
                );
            }
            let mut options = AttachOptions::new(canonical.clone());
            options.limits = config.limits.clone().unwrap_or_default();
            options.exec = config.exec.clone().unwrap_or_default();
            // As root, commands run as the folder's owner; a folder root owns gets a user of
            // its own for them, who can read it but not write it: said now, not discovered
            // through a command's "Permission denied".
            if nix::unistd::geteuid().is_root()
                && options.exec.user.is_none()
                && std::os::unix::fs::MetadataExt::uid(&canonical.metadata()?) == 0
            {
                errln!(
                    "note: root owns {}, so its commands run as a user of their own, who may \
                     read it (as its modes allow) but not write it (Monad's file tools still can); to let commands \
                     write, attach it as, or give it to, an ordinary user, or set [exec] user",
                    printable(&canonical.to_string_lossy())
                );
            }
            options.session = session;
            options.exact_name = name.is_some();
            options.name = name.or_else(|| {
                canonical
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            });
            options.trust = match trust {
                TrustArg::Restricted => Trust::Restricted,
                TrustArg::Full => Trust::Full,
            };
            options.allow = allow
                .into_iter()
                .map(|c| match c {
                    ClassArg::Read => ToolClass::Read,
                    ClassArg::Write => ToolClass::Write,
                    ClassArg::Exec => ToolClass::Exec,
                })
                .collect();
            options.prompt_timeout = Duration::from_secs(prompt_timeout);
            options.focus = focus;
            options.non_interactive = non_interactive;
            let (stop, stopping) = tokio::sync::watch::channel(false);
            options.stop = Some(stopping);
            let guard = guard_from_setting(std::env::var("MONAD_PROMPT_GUARD_MS").ok().as_deref());
            // Lines are written on a thread of their own, at most ATTACH_LINES_HELD of them
            // waiting: a standard error that does not take them (a pipe nobody reads, a terminal
            // stopped with Ctrl-S) holds up its lines only, never the folder's calls or the exit.
            let (printer, tx) = LinesPrinter::start(std::io::stderr(), ATTACH_LINES_HELD)
                .context("cannot start the thread that prints the attachment's lines")?;
            let approver: Option<Arc<dyn Approver>> = if non_interactive {
                None
            } else {
                match TerminalApprover::start_holding(
                    options.prompt_timeout,
                    guard,
                    printer.pause(),
                    stop.subscribe(),
                ) {
                    Some(a) => Some(Arc::new(a)),
                    None => {
                        // With full trust nothing is asked: nothing to say.
                        if options.trust != Trust::Full {
                            let why =
                                monad_client::terminal::why_no_prompts().unwrap_or("no terminal");
                            errln!(
                                "{why}: actions that are not pre-approved (--allow) will be \
                                 denied"
                            );
                        }
                        None
                    }
                }
            };
            let mut interrupts = monad_client::interrupts::Interrupts::watch()
                .context("cannot watch for Ctrl-C, SIGTERM and SIGHUP")?;
            let attached = attach(&config, options, approver, Some(tx));
            tokio::pin!(attached);
            // Ctrl-C, SIGTERM and the terminal closing (SIGHUP) detach alike: the server is
            // told before this exits, so nothing waits on a folder whose owner is gone.
            let result = tokio::select! {
                r = &mut attached => r,
                _ = interrupts.next() => {
                    let _ = stop.send(true);
                    attached.await
                }
            };
            // The last lines (a re-attach, a call's end), then the one that says why it ends,
            // all through the printer: written directly, a stuck standard error would keep
            // this process from exiting.
            let (last, code) = match result {
                // Ctrl-C, SIGTERM or SIGHUP: the server knows the folder left, and keeps it,
                // offline.
                Ok(()) => (
                    "disconnected: the folder stays in the session, offline, until it is \
                     attached again (`monad-client detach NAME` removes it)"
                        .to_owned(),
                    ExitCode::SUCCESS,
                ),
                Err(ClientError::Detached(reason)) => (
                    format!("detached: {}", printable(&reason)),
                    ExitCode::SUCCESS,
                ),
                Err(e) => (failure_line(&e.into()), ExitCode::FAILURE),
            };
            printer.finish(&last, ATTACH_LAST_LINES_WAIT).await;
            Ok(code)
        }
        Command::Detach { name, session } => {
            let config = ClientConfig::load(&config_dir()?)?;
            let agent = Agent::connect(&config).await?;
            let id = closed(&agent, agent.detach(session.as_deref(), &name).await).await?;
            errln!(
                "detached `{}` from session {}: it is no longer in the session",
                printable(&name),
                printable(&id)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { json } => status(json).await,
        Command::Logout => {
            let dir = config_dir()?;
            match ClientConfig::logout(&dir)? {
                Some(server) => errln!(
                    "logged out of {}: the token is forgotten (the device id and settings stay \
                     in {})",
                    printable(&server),
                    shown_path(&dir.join("config.toml"))
                ),
                None => errln!("not logged in"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Call {
            tool,
            given_args,
            args,
            session,
            workspace,
            json,
            help,
        } => {
            let tool = match (tool.as_deref().and_then(ToolName::parse), help) {
                (Some(tool), true) => {
                    outln!("{}", render::tool_help(tool))?;
                    return Ok(ExitCode::SUCCESS);
                }
                (None, true) => {
                    let mut cli = Cli::command();
                    // Names the subcommand (`monad-client call`) in its usage line.
                    cli.build();
                    let help = cli
                        .find_subcommand_mut("call")
                        .map(|c| c.render_long_help().to_string())
                        .unwrap_or_default();
                    output::out(&help)?;
                    return Ok(ExitCode::SUCCESS);
                }
                (Some(tool), false) => tool,
                (None, false) => usage_error(
                    "call",
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "the tool to call is missing: `monad-client call TOOL [ARGS]` \
                     (`monad-client tools` lists them)",
                ),
            };
            let usage = |message: String| -> ! {
                usage_error("call", clap::error::ErrorKind::ValueValidation, message)
            };
            // What the messages call the arguments: as the command line gave them.
            let (args, named) = match (given_args, args) {
                (Some(given), _) => (given, "ARGS"),
                (None, Some(args)) => (args, "--args"),
                (None, None) => ("{}".to_owned(), "--args"),
            };
            // Arguments that cannot be read are the command line's fault, as bad JSON is: a
            // usage error, not a failed call.
            let args = match args.strip_prefix('@') {
                _ if args == "-" => std::io::read_to_string(std::io::stdin()).unwrap_or_else(|e| {
                    usage(format!("cannot read {named} from standard input: {e}"))
                }),
                Some(file) => std::fs::read_to_string(file).unwrap_or_else(|e| {
                    usage(format!(
                        "cannot read {named} from {}: {e}",
                        monad_protocol::text::printable_name(file)
                    ))
                }),
                None => args,
            };
            if args.trim().is_empty() {
                usage(format!(
                    "{named} is empty (standard input or the file gave nothing): give a JSON \
                     object, `{{}}` for no arguments"
                ));
            }
            let mut args: serde_json::Value = match serde_json::from_str(&args) {
                Ok(args) => args,
                Err(e) => usage(format!(
                    "{named} is not valid JSON ({e}): {}{}",
                    printable(monad_protocol::text::head(&args, 200)),
                    if args.len() > 200 { "\u{2026}" } else { "" }
                )),
            };
            let Some(map) = args.as_object_mut() else {
                usage(format!(
                    r#"{named} must be a JSON object, like '{{"path": "README.md"}}'"#
                ))
            };
            if let Some(w) = workspace {
                if w.is_empty() {
                    usage(
                        "--workspace is empty: give a workspace's name or URI, or leave it out \
                         to let the server route the call"
                            .to_owned(),
                    );
                }
                if let Some(given) = map
                    .get("workspace")
                    .filter(|given| given.as_str() != Some(&w))
                {
                    usage(format!(
                        "--workspace {} and the `workspace` in {named} ({}) differ: give one",
                        printable(&w),
                        printable(&given.to_string())
                    ));
                }
                map.insert("workspace".into(), w.into());
            }
            let mut interrupts = Interrupts::watch().context("cannot watch for signals")?;
            let config = ClientConfig::load(&config_dir()?)?;
            let agent = tokio::select! {
                agent = Agent::connect(&config) => agent?,
                signal = interrupts.next() => end_by(signal),
            };
            let called = agent.call(session.as_deref(), tool.as_str(), args, |p| {
                errln!("… {}", printable(p))
            });
            let reply = tokio::select! {
                reply = called => reply,
                signal = interrupts.next() => {
                    // The server cancels the call at once: its prompt is withdrawn, nothing
                    // more of it runs (`monad_client::interrupts`).
                    agent.close("the caller interrupted the call").await;
                    errln!("interrupted: the call is cancelled");
                    end_by(signal)
                }
            };
            // The answer is in (or the call was refused): a signal while it is printed ends the
            // process at once.
            interrupts.stop();
            let reply = closed(&agent, reply).await?;
            let printed = call::printed(tool, &reply, json);
            output::err(&printed.stderr);
            output::out(&printed.stdout)?;
            Ok(ExitCode::from(call::exit_code(tool, &reply.outcome)))
        }
        Command::Tools { tool, json } => {
            let tool = tool.as_deref().and_then(ToolName::parse);
            if json {
                let value = call::tools_json(tool);
                outln!("{}", serde_json::to_string_pretty(&value)?)?;
            } else {
                match tool {
                    Some(tool) => outln!("{}", render::tool_help(tool))?,
                    None => output::out(&call::tools_list())?,
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp { session } => {
            let mut interrupts = Interrupts::watch().context("cannot watch for signals")?;
            let config = ClientConfig::load(&config_dir()?)?;
            let ended = monad_client::mcp::serve_stdio(config, session, interrupts.next()).await?;
            match ended {
                Some(signal) => end_by(signal),
                None => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Acp => {
            let mut interrupts = Interrupts::watch().context("cannot watch for signals")?;
            let config = ClientConfig::load(&config_dir()?)?;
            let ended = monad_client::acp::serve_stdio(config, interrupts.next()).await?;
            match ended {
                Some(signal) => end_by(signal),
                None => Ok(ExitCode::SUCCESS),
            }
        }
        Command::History(command) => history(command).await,
        Command::Chat {
            session,
            model,
            base_url,
            prompt_timeout,
        } => {
            let config = ClientConfig::load(&config_dir()?)?;
            let options = monad_client::chat::ChatOptions {
                session,
                prompt: monad_client::agent::PromptOptions { model, base_url },
                prompt_timeout: Duration::from_secs(prompt_timeout),
                guard: guard_from_setting(std::env::var("MONAD_PROMPT_GUARD_MS").ok().as_deref()),
            };
            if monad_client::chat::run(config, options).await? {
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::from(call::EXIT_TOOL_ERROR))
            }
        }
        Command::Sessions {
            action: Some(SessionsAction::Use { id }),
            ..
        } => {
            let config = ClientConfig::load(&config_dir()?)?;
            let agent = Agent::connect(&config).await?;
            let session = closed(&agent, agent.open_session(Some(&id)).await).await?;
            errln!(
                "this device now uses session {}{}",
                printable(&session.id),
                session
                    .name
                    .as_deref()
                    .map(|n| format!(" ({})", printable(n)))
                    .unwrap_or_default()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Sessions {
            json,
            new: true,
            folder,
            name,
            action: None,
        } => {
            let config = ClientConfig::load(&config_dir()?)?;
            let named_folder = folder.is_some();
            let here = match folder {
                Some(dir) => {
                    let resolved = dir
                        .canonicalize()
                        .with_context(|| format!("cannot open {}", shown_path(&dir)))?;
                    // As `attach` takes it: a folder, not a file in one, named in UTF-8 (the
                    // server keeps folders by their path as text).
                    if !resolved.is_dir() {
                        bail!("{} is not a directory", shown_path(&dir));
                    }
                    if resolved.to_str().is_none() {
                        bail!(
                            "{} is not valid UTF-8: no folder of that path can be attached, so \
                             none has sessions",
                            shown_path(&resolved)
                        );
                    }
                    Some(resolved)
                }
                None => std::env::current_dir().and_then(|d| d.canonicalize()).ok(),
            };
            let agent = Agent::connect(&config).await?;
            let here = here.as_deref().and_then(|p| p.to_str());
            let started = match &name {
                Some(name) => agent.new_named_session(here, name).await,
                None => agent.open_session_in(None, here).await,
            };
            let session = closed(&agent, started).await?;
            let mut serving = session
                .workspaces
                .iter()
                .filter(|w| w.online && w.host == Host::Client)
                .peekable();
            if serving.peek().is_none()
                && named_folder
                && let Some(here) = here
            {
                // Only a folder this device has attached (or an MCP host landed in) can have
                // an active session: say what to do if it is neither, rather than nothing.
                errln!(
                    "no folder of this device serves the new session now; if {} is not attached \
                     from this device, the new session is not its active session: `{}` attaches \
                     it there",
                    printable(here),
                    monad_protocol::text::shell_words(&[
                        "monad-client",
                        "attach",
                        here,
                        "--session",
                        &session.id
                    ])
                );
            }
            for w in serving {
                errln!(
                    "`{}` ({}) works in the new session: it is the folder's active session",
                    printable(&w.name),
                    printable(&w.uri)
                );
            }
            if json {
                outln!("{}", json_safe(&serde_json::to_string_pretty(&session)?))?;
            } else {
                outln!("{}", printable(&session.id))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sessions {
            json, new: false, ..
        } => {
            let config = ClientConfig::load(&config_dir()?)?;
            let agent = Agent::connect(&config).await?;
            let listed = async {
                let sessions = agent.sessions().await?;
                // This device's current session: what a command without --session uses.
                let (current, _) = agent.workspaces(None).await?;
                Ok::<_, monad_client::ClientError>((sessions, current))
            };
            let (sessions, current) = closed(&agent, listed.await).await?;
            if json {
                let listed: Vec<serde_json::Value> = sessions
                    .iter()
                    .map(|s| {
                        let mut value = serde_json::to_value(s).unwrap_or_default();
                        value["current"] = (s.id == current).into();
                        value
                    })
                    .collect();
                outln!("{}", json_safe(&serde_json::to_string_pretty(&listed)?))?;
            } else {
                output::out(&sessions_table(&sessions, &current).render(stdout_terminal()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Whether standard output is a terminal (tables with headers) or a pipe (bare TSV).
fn stdout_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// The workspaces of a session in a few words: `primary, laptop (offline)`.
fn workspace_names(s: &SessionInfo) -> String {
    s.workspaces
        .iter()
        .map(|w| {
            if w.online {
                printable(&w.name).into_owned()
            } else {
                format!("{} (offline)", printable(&w.name))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn sessions_table(sessions: &[SessionInfo], current: &str) -> Table {
    let mut table = Table::new(&["", "id", "name", "last active", "created", "workspaces"]);
    for s in sessions {
        table.row(vec![
            if s.id == current { "*" } else { "" }.to_owned(),
            printable(&s.id).into_owned(),
            printable(s.name.as_deref().unwrap_or("-")).into_owned(),
            printable(&s.last_active).into_owned(),
            printable(&s.created_at).into_owned(),
            workspace_names(s),
        ]);
    }
    table
}

/// `attach --allow` takes one or more classes, each alone or several joined by commas
/// (`--allow read,write`), so `attach --allow read DIR` reads DIR as a class: when no folder
/// was given apart from the options, the value of the `--allow`s that is no class and is a
/// directory (else the last that is no class) is the folder, wherever it is (`--allow write DIR --allow read` too: clap gives the values of every
/// `--allow` as one list). Any other value that is no class is refused by name.
fn split_allow(
    allow: Vec<String>,
    dir: Option<PathBuf>,
) -> std::result::Result<(Vec<ClassArg>, PathBuf), String> {
    let mut classes = Vec::new();
    let mut others = Vec::new();
    for value in allow {
        let parts: Option<Vec<ClassArg>> = value
            .split(',')
            .map(|part| ClassArg::from_str(part.trim(), true).ok())
            .collect();
        match parts {
            Some(parts) => classes.extend(parts),
            None => others.push(value),
        }
    }
    // The folder: the one of them that is a directory, else the last.
    let dir = match dir {
        Some(dir) => Some(dir),
        None => {
            let at = others
                .iter()
                .rposition(|v| std::path::Path::new(v).is_dir())
                .or_else(|| others.len().checked_sub(1));
            at.map(|at| PathBuf::from(others.remove(at)))
        }
    };
    if let Some(bad) = others.first() {
        return Err(format!(
            "invalid value `{}` for --allow: read, write or exec (several: --allow read,write)",
            printable(bad)
        ));
    }
    match dir {
        Some(dir) => Ok((classes, dir)),
        None => Err("the folder to attach is missing: `monad-client attach DIR`".to_owned()),
    }
}

/// `monad-client status`.
async fn status(json: bool) -> Result<ExitCode> {
    let dir = config_dir()?;
    // What is known is shown even logged out (the server and fingerprint stay), and `--json`
    // always answers with an object.
    let config = match ClientConfig::load_any(&dir) {
        Ok(config) => config,
        Err(e) if json => {
            let value = serde_json::json!({
                "logged_in": false,
                "reachable": false,
                "config": dir.join("config.toml").to_string_lossy(),
                "error": e.to_string(),
            });
            outln!("{}", json_safe(&serde_json::to_string_pretty(&value)?))?;
            errln!("monad-client: {}", printable(&e.to_string()));
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => return Err(e.into()),
    };
    let logged_in = !config.token.is_empty();
    let connected = if logged_in {
        Agent::connect(&config).await
    } else {
        Err(ClientError::NotLoggedIn(dir.join("config.toml")))
    };
    let reached = match connected {
        Ok(agent) => {
            let reached = async {
                let (session, workspaces) = agent.workspaces(None).await?;
                let named = agent
                    .sessions()
                    .await
                    .ok()
                    .and_then(|all| all.into_iter().find(|s| s.id == session))
                    .and_then(|s| s.name);
                Ok((
                    agent.user().to_owned(),
                    session,
                    named,
                    workspaces,
                    agent.server().to_owned(),
                ))
            };
            closed(&agent, reached.await).await
        }
        Err(e) => Err(e),
    };
    if json {
        let mut value = serde_json::json!({
            "server": config.server,
            "servers": config.addresses(),
            "fingerprint": config.fingerprint,
            "device_id": config.device_id,
            "client_name": config.client_name,
            // As text: a path that is not UTF-8 has no JSON form of its own.
            "config": dir.join("config.toml").to_string_lossy(),
            "logged_in": logged_in,
        });
        match &reached {
            Ok((user, session, name, workspaces, on)) => {
                value["reachable"] = true.into();
                value["connected_to"] = on.clone().into();
                value["user"] = user.clone().into();
                value["session"] = serde_json::json!({
                    "id": session, "name": name, "workspaces": workspaces,
                });
            }
            Err(e) => {
                value["reachable"] = false.into();
                value["error"] = e.to_string().into();
            }
        }
        outln!("{}", json_safe(&serde_json::to_string_pretty(&value)?))?;
    } else {
        match &reached {
            _ if config.servers.is_empty() => outln!("server       {}", printable(&config.server))?,
            Ok((_, _, _, _, on)) => outln!(
                "servers      {} (connected to {})",
                printable(&config.shown_servers()),
                printable(on)
            )?,
            Err(_) => outln!("servers      {}", printable(&config.shown_servers()))?,
        }
        outln!("fingerprint  {}", printable(&config.fingerprint))?;
        outln!(
            "device       {} ({})",
            printable(&config.client_name),
            printable(&config.device_id)
        )?;
        outln!("config       {}", shown_path(&dir.join("config.toml")))?;
        if !logged_in {
            outln!("logged in    no (monad-client login --server ... --fingerprint ...)")?;
        }
        if let Ok((user, session, name, workspaces, _)) = &reached {
            outln!("user         {}", printable(user))?;
            outln!(
                "session      {}{}",
                printable(session),
                name.as_deref()
                    .map(|n| format!(" ({})", printable(n)))
                    .unwrap_or_default()
            )?;
            let mut table = Table::new(&["workspace", "uri", "trust", "state", "network"]);
            for w in workspaces {
                table.row(vec![
                    printable(&w.name).into_owned(),
                    printable(&w.uri).into_owned(),
                    w.trust.as_str().to_owned(),
                    if w.online { "online" } else { "offline" }.to_owned(),
                    // Not known: a folder last attached by an older client.
                    w.network
                        .as_deref()
                        .map_or_else(|| "-".to_owned(), |n| printable(n).into_owned()),
                ]);
            }
            outln!(
                "workspaces   {}",
                count(workspaces.len(), "workspace", "workspaces")
            )?;
            output::out(&table.render(true))?;
        }
    }
    match reached {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            errln!("monad-client: {}", printable(&e.to_string()));
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(values: &[&str], dir: Option<&str>) -> std::result::Result<(usize, PathBuf), String> {
        split_allow(
            values.iter().map(|v| v.to_string()).collect(),
            dir.map(PathBuf::from),
        )
        .map(|(classes, dir)| (classes.len(), dir))
    }

    /// Regression: `attach --allow exe DIR` and `--allow read,write DIR` named the folder as
    /// the value that is no class.
    #[test]
    fn the_folder_is_the_last_value_that_is_no_class_and_others_are_named() {
        assert_eq!(split(&["read", "DIR"], None), Ok((1, PathBuf::from("DIR"))));
        assert_eq!(
            split(&["write", "DIR", "read"], None),
            Ok((2, PathBuf::from("DIR")))
        );
        assert_eq!(
            split(&["read,write", "DIR"], None),
            Ok((2, PathBuf::from("DIR")))
        );
        assert_eq!(
            split(&["read, exec"], Some("DIR")),
            Ok((2, PathBuf::from("DIR")))
        );
        let e = split(&["exe", "DIR"], None).unwrap_err();
        assert!(e.contains("`exe`") && !e.contains("DIR"), "{e}");
        let e = split(&["read,exe", "DIR"], None).unwrap_err();
        assert!(e.contains("`read,exe`"), "{e}");
        let e = split(&["exe"], Some("DIR")).unwrap_err();
        assert!(e.contains("`exe`"), "{e}");
        // A directory given before a bad class is the folder.
        let real = std::env::temp_dir();
        let real = real.to_str().unwrap();
        let e = split(&["read", real, "exe"], None).unwrap_err();
        assert!(e.contains("`exe`") && !e.contains(real), "{e}");
        assert!(split(&["read"], None).unwrap_err().contains("missing"));
    }

    /// Regression: `login --server host:` was checked as `host::4433`, and a URL pasted from
    /// the MCP line as a host name.
    #[test]
    fn a_server_address_is_checked_as_typed() {
        for (typed, said) in [
            ("host:", "`host:`"),
            ("nohost:abc", "`nohost:abc`"),
            ("127.0.0.1:4433/", "`127.0.0.1:4433/`"),
            ("http://127.0.0.1:4433", "without `http://`"),
        ] {
            let e = server_arg(typed).unwrap_err();
            assert!(
                e.contains(said) && !e.contains(":4433:4433"),
                "{typed}: {e}"
            );
        }
        assert_eq!(server_arg("example.com").unwrap(), "example.com:4433");
    }
}
