//! `monad-server`: argument parsing and wiring; the behaviour lives in the library.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Parser, Subcommand};
use monad_protocol::output::{Table, count};
use monad_protocol::text::{json_safe, printable, printable_lines};
use monad_protocol::{errln, outln, output};
use monad_server::admin::{Admin, describe_age, parse_age};
use monad_server::auth::TokenStore;
use monad_server::store::SessionMeta;
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
    #[arg(long, global = true, value_parser = OsStringValueParser::new().try_map(data_dir_arg))]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// `--data-dir`: not blank, and said so (`--data-dir "$DATA"` with `DATA` unset), where an
/// empty `MONAD_DATA_DIR` is unset; blanks made a data directory named by them.
fn data_dir_arg(raw: std::ffi::OsString) -> Result<PathBuf, String> {
    if raw.as_encoded_bytes().trim_ascii().is_empty() {
        return Err("the data directory is empty (a variable that was not set?)".into());
    }
    Ok(PathBuf::from(raw))
}

/// `--listen` and `--http`: an IP address and port, or a host name and port (`localhost:4433`)
/// resolved once at start, to its first IPv4 address if it has one (the address clients are
/// then given), else its first.
fn listen_addr(raw: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = raw.parse() {
        return Ok(addr);
    }
    let addrs: Vec<SocketAddr> = raw
        .to_socket_addrs()
        .map_err(|e| format!("expected IP:PORT or HOST:PORT ({e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| "the name resolves to no address".to_owned())
}

/// `--advertise` and `token create --server`: `HOST:PORT` as a client's login checks it, so that
/// an address no client could use is a usage error, not a token or a host nobody reaches.
fn host_port_arg(raw: &str) -> Result<String, String> {
    monad_protocol::address::check_host_port(raw)
        .map(|()| raw.to_owned())
        .map_err(|why| format!("is not HOST:PORT: {why} (like monad.example.com:4433)"))
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// QUIC address to listen on (IP:PORT, or HOST:PORT with a name this machine resolves).
    #[arg(long, default_value = monad_server::config::DEFAULT_LISTEN, value_parser = listen_addr)]
    listen: SocketAddr,
    /// Address of the HTTP listener: MCP for AI hosts (http://ADDR/mcp, bearer tokens), the web
    /// view (http://ADDR/) and the API (http://ADDR/api/v1).
    #[arg(long, default_value = monad_server::config::DEFAULT_HTTP, value_parser = listen_addr)]
    http: SocketAddr,
    /// Do not serve HTTP (no MCP over HTTP, web view or API).
    #[arg(long, conflicts_with = "http")]
    no_http: bool,
    /// HOST:PORT where the other hosts of the same store reach this one (several hosts; also
    /// `MONAD_ADVERTISE` or `[cluster] advertise`). Default: the QUIC listen address.
    #[arg(long, value_name = "HOST:PORT", value_parser = host_port_arg)]
    advertise: Option<String>,
    /// Keep sessions, workspace records, bindings, tokens, audit and the artifact index in
    /// PostgreSQL (`postgres://USER:PASSWORD@HOST:PORT/DATABASE`), for several hosts on one
    /// store; over `[store] url` of config.toml and MONAD_STORE_URL.
    #[arg(long, value_name = "postgres://...", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    store: Option<String>,
    /// Keep artifact content in an S3-compatible bucket (endpoint, region and credentials from
    /// the AWS_* variables; needs --store or [store] url); over `[store] objects` of
    /// config.toml and MONAD_STORE_OBJECTS.
    #[arg(long, value_name = "s3://BUCKET/PREFIX", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    objects: Option<String>,
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
    /// Print the certificate's fingerprint (what `monad-client login --fingerprint` pins).
    Fingerprint,
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
        /// The session id (or a unique start of it).
        id: String,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Delete a session with its workspace, history and artifacts.
    ///
    /// It goes through the running server when there is one. Asks first on a terminal.
    Delete {
        /// The session id (or a unique start of it).
        id: String,
        /// Do not ask for confirmation (needed when standard input is not a terminal).
        #[arg(long, short)]
        yes: bool,
        /// Only show what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete sessions unused for a while, never a user's default session nor one in use.
    ///
    /// It goes through the running server when there is one. Lists them and asks first on a
    /// terminal.
    Gc {
        /// How long unused: days (`90` or `90d`) or hours (`12h`).
        #[arg(long, value_parser = parse_age_arg)]
        max_age: Duration,
        /// Do not ask for confirmation (needed when standard input is not a terminal).
        #[arg(long, short)]
        yes: bool,
        /// Only list what would be deleted.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a session's conversation (session.md).
    History {
        /// The session id (or a unique start of it).
        id: String,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// A session's tool calls from its audit log.
    ///
    /// Each with its time, tool, workspace, who decided, outcome and duration.
    Audit {
        /// The session id (or a unique start of it).
        id: String,
        /// Keep printing calls as they are recorded (Ctrl-C ends).
        #[arg(long, short)]
        follow: bool,
        /// Print JSON (stable for scripts): an array; with --follow, one object per line.
        #[arg(long)]
        json: bool,
    },
    /// List a session's artifacts.
    Artifacts {
        /// The session id (or a unique start of it).
        id: String,
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Print one artifact's content.
    Artifact {
        /// The session id (or a unique start of it).
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
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=100))]
        limit: u16,
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

/// `token create --user`: a name the token store takes, so that a bad one is a usage error.
fn user_arg(raw: &str) -> Result<String, String> {
    monad_server::auth::validate_user(raw)
        .map(|()| raw.to_owned())
        .map_err(|e| e.to_string())
}

fn parse_age_arg(text: &str) -> Result<Duration, String> {
    parse_age(text)
}

/// Whether standard output is a terminal (tables with headers) or a pipe (bare TSV).
fn stdout_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// Asks `question` on a terminal; without one, refuses unless `--yes` was given.
fn confirm(question: &str) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "standard input is not a terminal, so nobody can confirm: pass --yes to delete \
             without asking, or --dry-run to only list"
        );
    }
    output::err(&format!("{question} [y/N] "));
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .context("cannot read the answer")?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

fn sessions_table(sessions: &[SessionMeta]) -> Table {
    // The columns in the order `monad-client sessions` shows them (id, name, last active,
    // created: the list is most recently active first), with the owner after the name.
    let mut table = Table::new(&["id", "name", "owner", "last active", "created"]);
    for s in sessions {
        table.row(vec![
            p(&s.id).into_owned(),
            p(s.name.as_deref().unwrap_or("-")).into_owned(),
            p(&s.owner).into_owned(),
            p(&s.last_active).into_owned(),
            p(&s.created_at).into_owned(),
        ]);
    }
    table
}

/// Deletes `ids` after showing them (and asking, unless `yes`); `max_age`: only those still
/// unused for that long.
/// Deletes the `listed` sessions, after asking unless `yes`. For `gc`, `unused` is the age they
/// were listed for and when: only those still unused since then are deleted.
fn remove(
    remover: &monad_server::admin::Remover,
    listed: &[SessionMeta],
    yes: bool,
    dry_run: bool,
    unused: Option<(Duration, std::time::Instant)>,
) -> Result<()> {
    let what = count(listed.len(), "session", "sessions");
    let through = if remover.through_server() {
        " (through the running server)"
    } else {
        ""
    };
    if listed.is_empty() {
        errln!("nothing to delete");
        return Ok(());
    }
    output::err(&sessions_table(listed).render(true));
    if dry_run {
        // The ids on standard output, one per line, as a real run prints those it deleted:
        // for a script (`| wc -l`, `| xargs`); the table and the words go to standard error.
        for session in listed {
            outln!("{}", p(&session.id))?;
        }
        errln!("would delete {what}{through}; nothing deleted (--dry-run)");
        return Ok(());
    }
    if !yes
        && !confirm(&format!(
            "delete {what} with {} workspaces, history and artifacts?",
            if listed.len() == 1 { "its" } else { "their" }
        ))?
    {
        errln!("nothing deleted");
        return Ok(());
    }
    let ids: Vec<String> = listed.iter().map(|s| s.id.clone()).collect();
    // Unused since the listing: its age plus the time the question took (in whole seconds,
    // up), so that a session used while the user read the list is kept, whatever the age
    // (with `--max-age 0`, any use before now looked old enough).
    let max_age = unused.map(|(age, listed_at)| {
        let waited = listed_at.elapsed();
        age.saturating_add(Duration::from_secs(
            waited.as_secs() + u64::from(waited.subsec_nanos() > 0),
        ))
    });
    let (deleted, kept) = remover.delete(&ids, max_age).map_err(anyhow::Error::msg)?;
    for id in &deleted {
        outln!("{}", p(id))?;
    }
    for (id, why) in &kept {
        errln!("kept {}: {}", p(id), p(why));
    }
    errln!(
        "deleted {}{through}",
        count(deleted.len(), "session", "sessions")
    );
    if deleted.is_empty() && !kept.is_empty() {
        bail!("nothing was deleted");
    }
    Ok(())
}

fn session_command(admin: &Admin, cmd: SessionCommand) -> Result<()> {
    let resolve = |id: &str| admin.resolve(id).map_err(anyhow::Error::msg);
    match cmd {
        SessionCommand::List { json } => {
            let sessions = admin.sessions()?;
            if json {
                return print_json(&sessions);
            }
            output::out(&sessions_table(&sessions).render(stdout_terminal()))?;
        }
        SessionCommand::Show { id, json } => {
            let report = admin.show(&resolve(&id)?)?;
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
        SessionCommand::Delete { id, yes, dry_run } => {
            let id = resolve(&id)?;
            // Only what it is: a session whose conversation is corrupt can still be deleted.
            let meta = admin.meta(&id)?;
            let remover = Admin::open(admin.data_dir())?
                .remover("session delete")
                .map_err(anyhow::Error::msg)?;
            remove(&remover, &[meta], yes, dry_run, None)?;
        }
        SessionCommand::Gc {
            max_age,
            yes,
            dry_run,
        } => {
            let remover = Admin::open(admin.data_dir())?
                .remover("session gc")
                .map_err(anyhow::Error::msg)?;
            let listed_at = std::time::Instant::now();
            let unused = remover.unused(max_age).map_err(anyhow::Error::msg)?;
            errln!(
                "{} unused for {} (never a user's default, never one in use)",
                count(unused.len(), "session", "sessions"),
                describe_age(max_age)
            );
            remove(&remover, &unused, yes, dry_run, Some((max_age, listed_at)))?;
        }
        SessionCommand::History { id, json } => {
            let id = resolve(&id)?;
            let history = admin.history(&id)?;
            if json {
                return print_json(&serde_json::json!({ "session": id, "history": history }));
            }
            output::out(&printable_lines(&monad_server::store::history::render(
                &history,
            )))?;
        }
        SessionCommand::Audit { id, follow, json } => {
            let id = resolve(&id)?;
            let terminal = stdout_terminal();
            // A page at a time (a log of any size is never read whole into memory): one JSON
            // array over every page without --follow, else JSON lines or the table's rows.
            let array = json && !follow;
            let (mut first, mut opened) = (true, false);
            let mut offset = admin.each_audit_page(&id, |records| -> Result<()> {
                if !array {
                    print_audit(&records, json, terminal, first)?;
                    first = false;
                    return Ok(());
                }
                // Opened once the first page is read: a log that cannot be read prints nothing.
                if !opened {
                    output::out("[")?;
                    opened = true;
                }
                for r in &records {
                    let item = json_safe(&serde_json::to_string_pretty(r)?).replace('\n', "\n  ");
                    output::out(&format!("{}\n  {item}", if first { "" } else { "," }))?;
                    first = false;
                }
                Ok(())
            })?;
            if array {
                outln!("{}]", if first { "" } else { "\n" })?;
            }
            // Polled like `tail -f`; ends with Ctrl-C, or when the reader of the output leaves.
            while follow && !output::stdout_closed() && !reader_gone() {
                std::thread::sleep(Duration::from_millis(300));
                let (records, next) = admin.audit_from(&id, offset).map_err(anyhow::Error::msg)?;
                offset = next;
                print_audit(&records, json, terminal, false)?;
            }
        }
        SessionCommand::Artifacts { id, json } => {
            let artifacts = admin.artifacts(&resolve(&id)?)?;
            if json {
                return print_json(&artifacts);
            }
            let mut table = Table::new(&["id", "kind", "tool", "created", "size"]);
            for a in artifacts {
                table.row(vec![
                    p(&a.id).into_owned(),
                    a.kind.as_str().to_owned(),
                    p(a.tool.as_deref().unwrap_or("-")).into_owned(),
                    p(&a.created_at).into_owned(),
                    format!(
                        "{}{}",
                        count(a.size as usize, "byte", "bytes"),
                        if a.truncated { " (truncated)" } else { "" }
                    ),
                ]);
            }
            output::out(&table.render(stdout_terminal()))?;
        }
        SessionCommand::Artifact { id, artifact } => {
            let (_, content) = admin.artifact(&resolve(&id)?, &artifact)?;
            if stdout_terminal() {
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

/// Prints audit records: JSON lines (`json`), or a table (with its header on a terminal, the
/// first time only).
fn print_audit(
    records: &[monad_server::store::AuditRecord],
    json: bool,
    terminal: bool,
    first: bool,
) -> Result<()> {
    if json {
        for r in records {
            outln!("{}", json_safe(&serde_json::to_string(r)?))?;
        }
        return Ok(());
    }
    let mut table = Table::new(&[
        "time",
        "tool",
        "workspace",
        "decided by",
        "decision",
        "outcome",
        "duration",
        "target",
    ]);
    for r in records {
        table.row(vec![
            p(&r.time).into_owned(),
            p(&r.tool).into_owned(),
            p(r.workspace.as_deref().unwrap_or("-")).into_owned(),
            r.decided_by.as_str().to_owned(),
            r.decision.as_str().to_owned(),
            p(r.outcome.as_str()).into_owned(),
            format!("{} ms", r.duration_ms),
            p(&r.target).into_owned(),
        ]);
    }
    if records.is_empty() && !first {
        return Ok(());
    }
    let text = table.render(terminal);
    // Later rows of a followed table: without the header again.
    let text = if terminal && !first {
        text.split_once('\n')
            .map_or("", |(_, rest)| rest)
            .to_owned()
    } else {
        text
    };
    output::out(&text)?;
    Ok(())
}

fn workspace_command(admin: &Admin, cmd: WorkspaceCommand) -> Result<()> {
    match cmd {
        WorkspaceCommand::List { json } => {
            let records = admin.workspaces()?;
            if json {
                return print_json(&records);
            }
            let mut table = Table::new(&["id", "user", "uri", "last active"]);
            for r in records {
                table.row(vec![
                    p(&r.id).into_owned(),
                    p(&r.user).into_owned(),
                    p(&r.uri).into_owned(),
                    p(&r.last_active).into_owned(),
                ]);
            }
            output::out(&table.render(stdout_terminal()))?;
        }
        WorkspaceCommand::Show {
            id,
            limit,
            next,
            json,
        } => {
            let (record, page) = admin.workspace(&id, usize::from(limit), next.as_deref())?;
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
            let mut table = Table::new(&["session", "last active", "calls"]);
            for s in &page.items {
                table.row(vec![
                    p(&s.session).into_owned(),
                    p(&s.last_active).into_owned(),
                    s.calls.to_string(),
                ]);
            }
            output::out(&table.render(stdout_terminal()))?;
            if let Some(next) = page.next {
                outln!("more: --next {}", p(&next))?;
            }
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print the `monad-client login` line for it.
    ///
    /// The line is complete: server address, token, certificate fingerprint. The token is shown
    /// only once.
    Create {
        /// The user the token authenticates as: 1 to 64 letters, digits, `.`, `_` or `-`.
        #[arg(long, default_value = "admin", value_parser = user_arg)]
        user: String,
        /// The HOST:PORT clients reach the server at, for the login line (default: the address
        /// the server last listened on).
        #[arg(long, value_name = "HOST:PORT", value_parser = host_port_arg)]
        server: Option<String>,
    },
    /// List tokens (ids and users; tokens themselves are stored hashed).
    List {
        /// Print JSON (stable for scripts).
        #[arg(long)]
        json: bool,
    },
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
                // The sandbox's warnings too: commands running without namespaces from now
                // on, a `.git` a command changed.
                .unwrap_or_else(|_| "monad_server=info,monad_sandbox=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(output::log_colours(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        // A closed standard error must not turn into a panic (the report would be printed there).
        .log_internal_errors(false)
        .init();
    match run(parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote a session id or a path from a user: escaped.
            errln!("monad-server: {}", printable(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// The command line. Serving's flags also stand before any command (`monad-server --listen
/// ...` serves); before another command they would do nothing, so that `monad-server --store
/// URL session gc` would clean the files of the data directory, not the database it names:
/// refused as a usage error, as they are after the command.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
    let mut command = Cli::command();
    let matches = command.get_matches_mut();
    if let Some((name, _)) = matches.subcommand() {
        let given = matches.ids().find(|id| {
            matches.value_source(id.as_str()) == Some(ValueSource::CommandLine)
                && command
                    .get_arguments()
                    .any(|a| a.get_id() == *id && !a.is_global_set())
        });
        if let Some(id) = given {
            let flag = format!("--{}", id.as_str().replace('_', "-"));
            let to = if name == "serve" {
                format!("put it after `serve` (`monad-server serve {flag} ...`)")
            } else {
                format!("it is a flag of serving (`monad-server {flag} ...`), not of `{name}`")
            };
            command
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("{flag} before `{name}` would be ignored: {to}"),
                )
                .exit();
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
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
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{} is not a directory: --data-dir (or MONAD_DATA_DIR) names the server's data \
             directory",
            dir.display()
        );
    }
    // Only starting the server and `token create` make a data directory; the other commands
    // look into one, and a mistyped path would otherwise be created and shown empty. (With the
    // store in PostgreSQL, `MONAD_STORE_URL`, the data directory of the host may hold nothing
    // they need: then it is not asked for.)
    let makes_it = matches!(
        cli.command,
        None | Some(Command::Serve(_)) | Some(Command::Token(TokenCommand::Create { .. }))
    );
    let store_elsewhere = std::env::var("MONAD_STORE_URL").is_ok_and(|url| !url.trim().is_empty());
    if !makes_it && !store_elsewhere && !dir.exists() {
        bail!(
            "no data directory at {}: pass the server's --data-dir (or set MONAD_DATA_DIR)",
            dir.display()
        );
    }
    match cli.command {
        None => serve(dir, cli.serve),
        Some(Command::Serve(args)) => serve(dir, args),
        // They look, and leave even a corrupt file where it is; `session delete` and `gc`
        // delete through a store of their own (`Admin::remover`).
        Some(Command::Session(cmd)) => session_command(&Admin::open_to_look(&dir)?, cmd),
        Some(Command::Workspace(cmd)) => workspace_command(&Admin::open_to_look(&dir)?, cmd),
        Some(Command::Fingerprint) => {
            match Admin::new(&dir).fingerprint().map_err(anyhow::Error::msg)? {
                Some(fingerprint) => outln!("{fingerprint}")?,
                None => bail!(
                    "no certificate in {} yet: start `monad-server` once (or run `monad-server \
                     token create`), which makes it",
                    dir.display()
                ),
            }
            Ok(())
        }
        Some(Command::Token(cmd)) => {
            let new = !dir.exists();
            monad_server::fsutil::create_private_dir(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            if new {
                // Said, since a mistyped --data-dir makes a deployment no server uses.
                errln!(
                    "made a new data directory at {}, which no server has used yet: start \
                     `monad-server --data-dir` with it, or pass the running server's",
                    dir.display()
                );
            }
            let writes = match &cmd {
                TokenCommand::Create { .. } => Some("token create"),
                TokenCommand::Revoke { .. } => Some("token revoke"),
                TokenCommand::List { .. } => None,
            };
            if let Some(command) = writes {
                monad_server::admin::writes_as_owner(&dir, command).map_err(anyhow::Error::msg)?;
            }
            let store = TokenStore::open(&dir)?;
            match cmd {
                TokenCommand::Create { user, server } => {
                    let admin = Admin::new(&dir);
                    let fingerprint = admin.ensure_certificate()?;
                    let server = server
                        .or_else(|| admin.address())
                        .unwrap_or_else(|| monad_server::config::DEFAULT_LISTEN.to_owned());
                    let (record, token) = store.create(&user)?;
                    errln!(
                        "token {} for user {} (shown only once). On the machine whose folder \
                         they attach, run:",
                        p(&record.id),
                        p(&record.user)
                    );
                    // The token goes in the environment, not in the client's argv.
                    outln!(
                        "MONAD_TOKEN={token} monad-client login --server {} --fingerprint \
                         {fingerprint}",
                        p(&server)
                    )?;
                }
                TokenCommand::List { json } => {
                    let tokens = store.list()?;
                    if json {
                        let listed: Vec<serde_json::Value> = tokens
                            .iter()
                            .map(|t| {
                                serde_json::json!({
                                    "id": t.id, "user": t.user, "created_at": t.created_at
                                })
                            })
                            .collect();
                        return print_json(&listed);
                    }
                    let mut table = Table::new(&["id", "user", "created"]);
                    for t in tokens {
                        table.row(vec![
                            p(&t.id).into_owned(),
                            p(&t.user).into_owned(),
                            p(&t.created_at).into_owned(),
                        ]);
                    }
                    output::out(&table.render(stdout_terminal()))?;
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

/// Whether standard output is a pipe whose reader has gone (`session audit --follow | head
/// -1`): without a write to fail, a follow with nothing new to print would wait for the next
/// call to find out.
fn reader_gone() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdout = std::io::stdout();
    let mut fds = [PollFd::new(stdout.as_fd(), PollFlags::empty())];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|_| {
        fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
    })
}

fn serve(dir: PathBuf, args: ServeArgs) -> Result<()> {
    raise_open_files_limit();
    for name in monad_server::settings::unknown_variables(
        // `vars()` would panic on a name or value that is not UTF-8.
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
    ) {
        tracing::warn!(
            "{} is neither a setting (MONAD_<SECTION>_<KEY>, the sections of config.toml) nor \
             a variable Monad reads: ignored",
            printable(&name)
        );
    }
    let mut config = ServerConfig::new(dir);
    config.listen = args.listen;
    config.http = (!args.no_http).then_some(args.http);
    config.cluster.advertise = args.advertise;
    config.store_flags = monad_server::settings::StoreFlags {
        url: args.store,
        objects: args.objects,
    };
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let served = runtime.block_on(async {
        let (server, first) = Server::bind(config.clone())?;
        let addr = server.local_addr();
        // Where the other hosts reach it: `--advertise`, `MONAD_ADVERTISE` or `[cluster]
        // advertise`, else where it listens.
        let advertised = server.state().config.cluster.advertise.clone();
        let reach = reach_address(addr, advertised.as_deref());
        if let Err(e) = Admin::new(&config.data_dir).record_address(&reach) {
            tracing::warn!("cannot note the address for `token create`: {e}");
        }
        errln!(
            "monad-server listening on {addr} (QUIC), data in {}",
            config.data_dir.display()
        );
        errln!("certificate fingerprint: {}", server.fingerprint());
        if let Some(http) = server.http_addr() {
            errln!(
                "MCP for AI hosts: http://{http}/mcp (header `Authorization: Bearer TOKEN`), or \
                 `monad-client mcp` on stdio; the web view: http://{http}/"
            );
        }
        match first {
            Some(first) => {
                errln!();
                errln!(
                    "First start: created a certificate and a token for user `{}`.",
                    first.user
                );
                // The login line goes to standard output, for a script to take; this says
                // where it is when the two are read apart (a log of standard error alone).
                errln!(
                    "On the machine whose folder you want to attach, run the login line (on \
                     standard output):"
                );
                errln!();
                // The token goes in the environment, not in the client's argv.
                outln!(
                    "MONAD_TOKEN={} monad-client login --server {reach} --fingerprint {}",
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
                "create a token for a new client with `monad-server token create --user NAME`, \
                 which prints the client's login line"
            ),
        }
        server.run(shutdown_signal()).await;
        Ok(())
    });
    // What still runs on the blocking pool (a request's store work that a store gone does not
    // answer) does not hold the exit: the shutdown waited for what it must.
    runtime.shutdown_timeout(LEFTOVERS_WAIT);
    served
}

/// How long the exit waits for blocking work still running once the shutdown is done.
const LEFTOVERS_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

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

/// Resolves on SIGINT or SIGTERM; a second one, while the server shuts down, ends the process
/// at once (exit status 1), without waiting for what the shutdown waits for.
async fn shutdown_signal() {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            // SIGINT and SIGTERM keep their default action: they end the process at once.
            tracing::warn!(
                "cannot handle SIGINT and SIGTERM ({e}): a signal ends the server without its shutdown"
            );
            return std::future::pending().await;
        }
    };
    signals.next().await;
    let first = std::time::Instant::now();
    tokio::spawn(async move {
        loop {
            signals.next().await;
            // One action may send both (a terminal's Ctrl-C to the group, and a wrapper passing
            // it on): a second signal counts from a moment after the first.
            if first.elapsed() >= SECOND_SIGNAL_AFTER {
                break;
            }
        }
        tracing::warn!(
            "a second signal: exiting without waiting for the shutdown to finish (records and \
             session metadata not yet written are lost; the sessions' leases run out)"
        );
        std::process::exit(1);
    });
}

/// How long after the first signal another counts as a second one.
const SECOND_SIGNAL_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// SIGINT and SIGTERM, as they come.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The `HOST:PORT` a client's login names this server by: the address it listens on, unless
/// that is every address of the machine (`0.0.0.0`, `::`), which no client can send to; then
/// the address it advertises to the other hosts when that is one, else this machine's name.
fn reach_address(listening: SocketAddr, advertise: Option<&str>) -> String {
    if !listening.ip().is_unspecified() {
        return listening.to_string();
    }
    let wildcard = |a: &str| {
        a.parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_unspecified())
    };
    if let Some(advertise) = advertise.filter(|a| !wildcard(a)) {
        return advertise.to_owned();
    }
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{name}:{}", listening.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server listening on every address printed `--server 0.0.0.0:4433` in its login line,
    /// which no client can connect to.
    #[test]
    fn the_login_line_names_an_address_a_client_can_reach() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert_eq!(reach_address(at("10.1.2.3:4433"), None), "10.1.2.3:4433");
        assert_eq!(reach_address(at("[::1]:9"), Some("x:1")), "[::1]:9");
        assert_eq!(
            reach_address(at("0.0.0.0:4433"), Some("monad.example:4433")),
            "monad.example:4433"
        );
        let named = reach_address(at("[::]:7000"), Some("[::]:7000"));
        let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
        assert_eq!(named, format!("{host}:7000"));
        assert!(!named.starts_with("0.0.0.0") && !named.starts_with("[::]"));
    }
}
