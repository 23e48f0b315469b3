//! `monad-client chat`: a terminal conversation with a session's built-in agent.
//!
//! The pure parts are tested alone: [`parse`] turns an input line into a message or a slash
//! command, [`Transcript`] turns the turn's [`AgentEvent`]s into the text to print (streamed
//! text as it comes, a line when a tool call starts and one when it ends, with its outcome and
//! duration), and [`render_workspace`], [`render_context`] and [`HELP`] are what the commands
//! print. Everything a model or a peer wrote is escaped ([`monad_protocol::text`]).
//!
//! [`run`] does the I/O. Input is read a line at a time by [`LineReader`], only when the chat
//! asks for a line, and only while it holds the [`TerminalLock`]; the approval prompts of
//! folders attached with `/attach` take that lock while they are up, so a prompt and the chat's
//! input never read the terminal at the same time. Ctrl-C during a turn drops the prompt's
//! future, which cancels the turn on the server; Ctrl-C at the input line, or Ctrl-D at an
//! empty one, quits. Folders attached with `/attach` are detached when the chat quits or
//! switches session.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monad_protocol::ToolName;
use monad_protocol::agent::{AgentEvent, StopReason, TurnResult};
use monad_protocol::text::{printable, printable_lines};
use monad_protocol::wire::{ChatInfo, Host, WorkspaceInfo};
use serde_json::Value;

use crate::ClientError;
use crate::agent::{Agent, PromptOptions};
use crate::approval::Approver;
use crate::attach::{AttachEvent, AttachOptions, attach};
use crate::config::ClientConfig;
use crate::printer::LinesPause;
use crate::terminal::TerminalApprover;

/// What the user typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Nothing (an empty or blank line).
    Empty,
    /// A message for the agent.
    Message(String),
    /// A slash command.
    Command(Command),
    /// A line that starts with `/` but is no command (or a command used wrongly): what to say.
    Invalid(String),
}

/// The slash commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/workspace`: the session, its provider and model, message count, workspaces.
    Workspace,
    /// `/clear`: empty `session.md`'s conversation (the rest of the session stays).
    Clear,
    /// `/context`: the messages the next turn sends.
    Context,
    /// `/help`.
    Help,
    /// `/quit`.
    Quit,
    /// `/attach DIR`: attach a folder from this machine, restricted, to the chat's session.
    Attach(PathBuf),
    /// `/session`, `/session ID`, `/session new`.
    Session(SessionChoice),
}

/// What `/session` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionChoice {
    /// Show the session's id.
    Show,
    /// Switch to a new session.
    New,
    /// Switch to this session (resumed, or created with this id).
    Switch(String),
}

/// What `/help` prints.
pub const HELP: &str = "\
commands:
  /workspace      the session: id, provider, model, message count, workspaces
  /context        how many messages of the conversation the next turn sends
  /clear          clear the conversation (session.md keeps its frontmatter; workspaces stay)
  /attach DIR     attach a folder from this machine (restricted: you approve each action here)
  /session        show this session's id; /session ID switches, /session new starts a new one
  /help           this list
  /quit           leave (Ctrl-D on an empty line too); folders attached here are detached
Anything else is a message for the agent (start it with // to send a leading /).
Ctrl-C during an answer cancels it; Ctrl-C at the prompt quits.";

/// Parses one input line (without its line break).
pub fn parse(line: &str) -> Input {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.trim().is_empty() {
        return Input::Empty;
    }
    if let Some(rest) = line.strip_prefix("//") {
        return Input::Message(format!("/{rest}"));
    }
    let Some(command) = line.trim().strip_prefix('/') else {
        return Input::Message(line.to_owned());
    };
    let (name, arg) = match command.split_once(char::is_whitespace) {
        Some((name, arg)) => (name, arg.trim()),
        None => (command, ""),
    };
    let no_arg = |c: Command| {
        if arg.is_empty() {
            Input::Command(c)
        } else {
            Input::Invalid(format!("/{name} takes no argument"))
        }
    };
    match name {
        "workspace" => no_arg(Command::Workspace),
        "clear" => no_arg(Command::Clear),
        "context" => no_arg(Command::Context),
        "help" => no_arg(Command::Help),
        "quit" | "exit" => no_arg(Command::Quit),
        "attach" if arg.is_empty() => Input::Invalid("usage: /attach DIR".into()),
        "attach" => Input::Command(Command::Attach(PathBuf::from(arg))),
        "session" => Input::Command(Command::Session(match arg {
            "" => SessionChoice::Show,
            "new" => SessionChoice::New,
            id if id.split_whitespace().count() == 1 => SessionChoice::Switch(id.to_owned()),
            _ => return Input::Invalid("usage: /session [ID | new]".into()),
        })),
        _ => Input::Invalid(format!(
            "unknown command /{}; /help lists them",
            printable(name)
        )),
    }
}

/// What `/workspace` prints; `chat` is this chat's own model and base URL, when it has them.
pub fn render_workspace(info: &ChatInfo, chat: &PromptOptions) -> String {
    let session_model = if info.model.is_empty() {
        "(none: set llm.model)".to_owned()
    } else {
        printable(&info.model).into_owned()
    };
    let model = match &chat.model {
        Some(model) => format!(
            "{} (this chat's; the session's: {session_model})",
            printable(model)
        ),
        None => session_model,
    };
    let mut out = format!(
        "session   {}\nprovider  {}\nmodel     {model}\nmessages  {}\nworkspaces\n",
        printable(&info.session),
        printable(&info.provider),
        info.messages
    );
    // Names and URIs in columns, as the lists of `sessions` and `status` are.
    let width = |text: &str| printable(text).chars().count();
    let names = info.workspaces.iter().map(|w| width(&w.name)).max();
    let uris = info.workspaces.iter().map(|w| width(&w.uri)).max();
    for w in &info.workspaces {
        out.push_str(&format!(
            "  {}\n",
            workspace_line(w, names.unwrap_or(0), uris.unwrap_or(0))
        ));
    }
    if let Some(url) = &chat.base_url {
        out.push_str(&format!("base URL  {} (this chat's)\n", printable(url)));
    }
    out
}

/// One workspace of `/workspace`, its name and URI padded to `name_width` and `uri_width`
/// characters.
fn workspace_line(w: &WorkspaceInfo, name_width: usize, uri_width: usize) -> String {
    let place = match w.host {
        Host::Server => "server",
        Host::Client => "attached",
    };
    let network = w
        .network
        .as_deref()
        .map(|n| format!(", {}", printable(n)))
        .unwrap_or_default();
    format!(
        "{:name_width$}  {:uri_width$}  ({place}, {}{network}{})",
        printable(&w.name),
        printable(&w.uri),
        w.trust.as_str(),
        if w.online { "" } else { ", offline" }
    )
}

/// What `/context` prints.
pub fn render_context(info: &ChatInfo) -> String {
    let left_out = info
        .conversation_messages
        .saturating_sub(info.context_messages);
    let mut out = format!(
        "context: {} message{} in the context window (of {} in the conversation)",
        info.context_messages,
        if info.context_messages == 1 { "" } else { "s" },
        info.conversation_messages
    );
    if left_out > 0 {
        out.push_str(&format!(
            "; the {left_out} oldest left out to fit llm.context_budget_tokens"
        ));
    }
    out.push('\n');
    out
}

/// A tool call in one line: the tool, its workspace when the model named one, and its path or
/// command line in short; escaped.
pub fn describe_call(tool: &str, args: &Value) -> String {
    let what = match ToolName::parse(tool) {
        Some(name) => crate::approval::describe(name, args),
        None => {
            let mut text = args.to_string();
            if text.chars().count() > 60 {
                text = text.chars().take(60).collect::<String>() + "…";
            }
            printable(&text).into_owned()
        }
    };
    match args.get("workspace").and_then(Value::as_str) {
        Some(w) => format!("{} [{}] {what}", printable(tool), printable(w)),
        None => format!("{} {what}", printable(tool)),
    }
}

/// How a turn ended, in a line (`None` when it simply answered).
pub fn render_end(result: &TurnResult) -> Option<String> {
    let line = match &result.stop {
        StopReason::Answered => return None,
        StopReason::Cancelled => "cancelled".to_owned(),
        StopReason::ToolCallLimit { limit } => {
            format!(
                "stopped: more than {limit} tool calls in one turn (llm.max_tool_calls_per_turn)"
            )
        }
        StopReason::TokenLimit { limit } => {
            format!("stopped: more than {limit} tokens in one turn (llm.max_tokens_per_turn)")
        }
        StopReason::Length => "stopped: the answer reached llm.max_output_tokens".to_owned(),
        StopReason::Refused { message } => format!("the provider refused: {}", printable(message)),
        StopReason::Failed { message } => format!("failed: {}", printable(message)),
    };
    Some(line)
}

/// Turns a turn's events into text to print, keeping tool lines on lines of their own.
#[derive(Debug, Default)]
pub struct Transcript {
    /// Whether the last text printed ended a line (or nothing was printed).
    mid_line: bool,
    started: HashMap<String, (Instant, String)>,
}

impl Transcript {
    /// A transcript for a new turn.
    pub fn new() -> Transcript {
        Transcript::default()
    }

    fn line(&mut self, line: &str) -> String {
        let mut out = String::new();
        if self.mid_line {
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
        self.mid_line = false;
        out
    }

    /// The text for `event`, which happened at `now`.
    pub fn event(&mut self, event: &AgentEvent, now: Instant) -> String {
        match event {
            AgentEvent::Text { text } => {
                let text = printable_lines(text).into_owned();
                if let Some(last) = text.chars().last() {
                    self.mid_line = last != '\n';
                }
                text
            }
            AgentEvent::ToolCallStarted {
                call_id,
                tool,
                args,
            } => {
                let described = describe_call(tool, args);
                let line = self.line(&format!("⚙ {described}"));
                self.started.insert(call_id.clone(), (now, described));
                line
            }
            AgentEvent::ToolCallProgress { message, .. } => {
                self.line(&format!("  … {}", printable(message)))
            }
            AgentEvent::ToolCallEnded {
                call_id,
                tool,
                workspace,
                error,
                text,
                ..
            } => {
                let took = self
                    .started
                    .remove(call_id)
                    .map(|(t, _)| {
                        format!(" ({:.1} s)", now.saturating_duration_since(t).as_secs_f64())
                    })
                    .unwrap_or_default();
                let place = workspace
                    .as_ref()
                    .map(|w| format!(" in `{}`", printable(&w.name)))
                    .unwrap_or_default();
                // A command that ran and failed is a failure too, as `call` and the folder's
                // own lines mark it.
                let failed = monad_protocol::render::command_failure(tool, text);
                let outcome = match (error, failed) {
                    (Some(e), _) => format!("error: {}: {}", e.code, printable(&e.message)),
                    (None, Some(failed)) => failed.to_owned(),
                    (None, None) => "ok".to_owned(),
                };
                let mark = if error.is_none() && failed.is_none() {
                    '✓'
                } else {
                    '✗'
                };
                self.line(&format!(
                    "{mark} {}{place}: {outcome}{took}",
                    printable(tool)
                ))
            }
            // Only a prompt sent asking (`Agent::prompt_asking`) gets these; the chat's approvals
            // are the folder's own prompts, in this terminal.
            AgentEvent::Permission { .. } => String::new(),
            AgentEvent::Retrying { after_ms, message } => self.line(&format!(
                "  … the provider is busy ({}); asking again in {:.1} s",
                printable(message),
                *after_ms as f64 / 1000.0
            )),
        }
    }

    /// The text that ends the turn: a line break when text was left mid-line, and how the turn
    /// ended when it did not simply answer.
    pub fn end(&mut self, result: Option<&TurnResult>) -> String {
        let mut out = String::new();
        if self.mid_line {
            out.push('\n');
            self.mid_line = false;
        }
        // A call whose end the turn did not see (cancelled, a time limit, a lost connection)
        // is said to be unfinished: its `⚙` line stood alone, as if it still ran.
        let mut unfinished: Vec<String> = self.started.drain().map(|(_, (_, d))| d).collect();
        unfinished.sort();
        for described in unfinished {
            out.push_str(&format!(
                "✗ {described}: not finished, the turn ended first\n"
            ));
        }
        if let Some(line) = result.and_then(render_end) {
            out.push_str(&format!("({line})\n"));
        }
        out
    }
}

/// Held by whoever reads the terminal: the chat's input while it reads a line, an approval
/// prompt while it is up.
pub type TerminalLock = Arc<Mutex<()>>;

/// A line of input, or its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A line, without its line break.
    Text(String),
    /// Standard input ended (Ctrl-D on an empty line).
    Eof,
}

/// Reads standard input a line at a time, on its own thread, only when asked, and only while
/// holding the [`TerminalLock`] (released every 100 ms so that an approval prompt can take the
/// terminal).
#[derive(Debug)]
pub struct LineReader {
    asks: std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<Line>>,
}

impl LineReader {
    /// Starts the reading thread.
    fn start(terminal: TerminalLock, screen: Screen) -> std::io::Result<LineReader> {
        let (asks, rx) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<Line>>();
        std::thread::Builder::new()
            .name("chat-input".into())
            .spawn(move || {
                let mut buffer = Vec::new();
                while let Ok(reply) = rx.recv() {
                    let line = read_line(&terminal, &screen, &mut buffer, &reply);
                    let _ = reply.send(line);
                }
            })?;
        Ok(LineReader { asks })
    }

    /// The next line.
    pub async fn next(&self) -> Line {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.asks.send(tx).is_err() {
            return Line::Eof;
        }
        rx.await.unwrap_or(Line::Eof)
    }
}

/// Reads until a whole line is in `buffer` (or input ends); gives up quietly when `reply` is
/// gone (the chat stopped waiting).
fn read_line(
    terminal: &TerminalLock,
    screen: &Screen,
    buffer: &mut Vec<u8>,
    reply: &tokio::sync::oneshot::Sender<Line>,
) -> Line {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    loop {
        if let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            return Line::Text(String::from_utf8_lossy(&line[..end]).into_owned());
        }
        if reply.is_closed() {
            return Line::Eof;
        }
        // The lock is only ever held elsewhere by an approval prompt: once it is answered, the
        // input line's `> ` (which the prompt scrolled away) is shown again, from the line's
        // start, so that it shows once even when a folder's line reprinted it first.
        let _held = match terminal.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let held = terminal.lock().unwrap_or_else(|p| p.into_inner());
                screen.out("\r> ");
                held
            }
        };
        let stdin = std::io::stdin();
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(100u8)), Ok(n) if n > 0) {
            continue;
        }
        let mut chunk = [0u8; 4096];
        match nix::unistd::read(stdin.as_fd(), &mut chunk) {
            Ok(0) | Err(_) if buffer.is_empty() => return Line::Eof,
            Ok(0) | Err(_) => {
                let line = String::from_utf8_lossy(buffer).into_owned();
                buffer.clear();
                return Line::Text(line);
            }
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// How to start a chat.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// The session (`None`: this device's last session, else the default one).
    pub session: Option<String>,
    /// This chat's model and base URL instead of the session's.
    pub prompt: PromptOptions,
    /// How long an approval prompt of a folder attached with `/attach` waits.
    pub prompt_timeout: Duration,
    /// The approval prompts' guard time.
    pub guard: Duration,
}

/// A folder attached from the chat.
struct Attached {
    name: String,
    task: tokio::task::JoinHandle<()>,
}

/// What the chat keeps between lines.
struct Chat {
    config: ClientConfig,
    agent: Agent,
    options: ChatOptions,
    session: String,
    terminal: TerminalLock,
    approver: Option<Arc<dyn Approver>>,
    attached: Vec<Attached>,
    /// True while a turn runs (its transcript shows the turn's own tool calls).
    busy: Arc<AtomicBool>,
    /// Where everything the chat prints goes.
    screen: Screen,
    /// Held by an approval prompt while it is up: the screen waits.
    pause: LinesPause,
}

/// The line a folder attached from the chat prints for `event`, if any. During a turn the
/// transcript already shows each call with its outcome, so the folder's own start and end lines
/// are left out; between turns (a call from another agent) they are the only word of it.
fn attach_line(event: &AttachEvent, in_turn: bool) -> Option<String> {
    match event {
        AttachEvent::Decided { .. } | AttachEvent::Finished { .. } if in_turn => None,
        _ => event.line(),
    }
}

fn out(text: &str) {
    // A closed standard output ends the output quietly.
    let _ = monad_protocol::output::out(text);
}

/// What the chat prints (the model's text, the transcript, a folder's lines, the input line's
/// `> `), written in order by a task of its own that waits while an approval prompt is up
/// ([`LinesPause`]). Drawn under the prompt, a line pushed the question up, and a `> ` passed for
/// the chat waiting for a message, which the owner then typed into the prompt (its keys raw and
/// not echoed): a message starting with `y` allowed the call.
#[derive(Clone)]
struct Screen {
    shown: tokio::sync::mpsc::UnboundedSender<Shown>,
    /// Counts what is queued, for a prompt to let it out first.
    pause: LinesPause,
}

/// One thing for the [`Screen`]'s task.
enum Shown {
    Out(String),
    Err(String),
    /// Said once everything before it is written.
    Flushed(tokio::sync::oneshot::Sender<()>),
}

impl Screen {
    /// Starts the task that writes what is shown, waiting while `pause` is held.
    fn start(pause: LinesPause) -> Screen {
        let (shown, mut queued) = tokio::sync::mpsc::unbounded_channel();
        let writer = pause.clone();
        tokio::spawn(async move {
            let pause = writer;
            while let Some(item) = queued.recv().await {
                pause.until_free().await;
                match item {
                    Shown::Out(text) => out(&text),
                    Shown::Err(text) => {
                        monad_protocol::output::err(&text);
                    }
                    Shown::Flushed(done) => {
                        let _ = done.send(());
                        continue;
                    }
                }
                pause.written();
            }
        });
        Screen { shown, pause }
    }

    /// Prints `text` to standard output.
    fn out(&self, text: &str) {
        self.pause.queued();
        if self.shown.send(Shown::Out(text.to_owned())).is_err() {
            self.pause.written();
        }
    }

    /// Prints `line` and a line break to standard error.
    fn err(&self, line: String) {
        self.pause.queued();
        if self.shown.send(Shown::Err(line + "\n")).is_err() {
            self.pause.written();
        }
    }

    /// Waits until everything shown so far is written.
    async fn flush(&self) {
        let (done, written) = tokio::sync::oneshot::channel();
        if self.shown.send(Shown::Flushed(done)).is_ok() {
            let _ = written.await;
        }
    }
}

/// Runs the chat until `/quit`, Ctrl-D on an empty line or Ctrl-C at the input line. Returns
/// whether the last message sent got its answer (true when none was sent): a script that pipes
/// its messages in learns from the exit status that the model did not answer, as a shell's
/// status is its last command's. Commands and typos at the input line do not count.
pub async fn run(config: ClientConfig, options: ChatOptions) -> Result<bool, ClientError> {
    let agent = Agent::connect(&config).await?;
    let session = match &options.session {
        Some(id) => agent.open_session(Some(id)).await.map(|s| s.id),
        None => agent.chat_info(None).await.map(|info| info.session),
    };
    let session = match session {
        Ok(session) => session,
        Err(e) => {
            // Told before the process ends, as at the end of a chat: the server would hold the
            // connection, counted as one of the user's, until its idle time-out.
            agent.close("the chat could not start").await;
            return Err(e);
        }
    };
    let terminal: TerminalLock = Arc::default();
    let pause = LinesPause::default();
    let screen = Screen::start(pause.clone());
    let reader = LineReader::start(terminal.clone(), screen.clone())
        .map_err(|e| ClientError::Terminal(format!("cannot read standard input: {e}")))?;
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| ClientError::Terminal(format!("cannot catch Ctrl-C: {e}")))?;
    let mut chat = Chat {
        config,
        agent,
        options,
        session,
        terminal,
        approver: None,
        attached: Vec::new(),
        busy: Arc::default(),
        screen,
        pause,
    };
    chat.screen.out(&format!(
        "chat with the agent of session {} (/help lists the commands)\n",
        printable(&chat.session)
    ));
    let mut answered = true;
    loop {
        chat.screen.out("> ");
        let line = tokio::select! {
            line = reader.next() => line,
            _ = interrupts.recv() => {
                chat.screen.out("\n");
                break;
            }
        };
        let input = match line {
            Line::Eof => {
                chat.screen.out("\n");
                break;
            }
            Line::Text(text) => parse(&text),
        };
        match input {
            Input::Empty => {}
            Input::Invalid(message) => chat.screen.err(message),
            Input::Message(text) => answered = chat.turn(&text, &mut interrupts).await,
            Input::Command(Command::Quit) => break,
            Input::Command(command) => {
                if let Err(e) = chat.command(command).await {
                    chat.screen.err(format!("{}", printable(&e.to_string())));
                }
            }
        }
    }
    chat.detach_all().await;
    chat.screen.flush().await;
    // Told before the process ends, rather than left to the server's idle time-out.
    chat.agent.close("the chat ended").await;
    Ok(answered)
}

impl Chat {
    /// Sends `text` and prints the turn as it happens; Ctrl-C cancels it. Returns whether the
    /// model answered (not cancelled, failed, or stopped at a limit).
    async fn turn(&mut self, text: &str, interrupts: &mut tokio::signal::unix::Signal) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        let answered = self.turn_inner(text, interrupts).await;
        self.busy.store(false, Ordering::Relaxed);
        answered
    }

    async fn turn_inner(
        &mut self,
        text: &str,
        interrupts: &mut tokio::signal::unix::Signal,
    ) -> bool {
        let mut transcript = Transcript::new();
        let answer = {
            let shown = &mut transcript;
            let screen = &self.screen;
            let prompt =
                self.agent
                    .prompt_with(Some(&self.session), text, &self.options.prompt, |event| {
                        screen.out(&shown.event(&event, Instant::now()))
                    });
            // Dropping the prompt's future on Ctrl-C resets its stream: the server cancels the
            // turn (and any running tool call, withdrawing its approval prompt).
            tokio::select! {
                answer = prompt => Some(answer),
                _ = interrupts.recv() => None,
            }
        };
        match answer {
            Some(Ok(reply)) => {
                self.screen.out(&transcript.end(Some(&reply.result)));
                matches!(reply.result.stop, StopReason::Answered)
            }
            Some(Err(e)) => {
                self.screen.out(&transcript.end(None));
                self.screen.err(format!("{}", printable(&e.to_string())));
                false
            }
            None => {
                self.screen.out(&transcript.end(None));
                self.screen.out("(cancelled)\n");
                false
            }
        }
    }

    async fn command(&mut self, command: Command) -> Result<(), ClientError> {
        match command {
            Command::Workspace => {
                let info = self.agent.chat_info(Some(&self.session)).await?;
                self.screen
                    .out(&render_workspace(&info, &self.options.prompt));
            }
            Command::Context => {
                self.screen.out(&render_context(
                    &self.agent.chat_info(Some(&self.session)).await?,
                ));
            }
            Command::Clear => {
                self.agent.history_clear(Some(&self.session)).await?;
                self.screen.out(
                    "conversation cleared (session.md keeps its frontmatter; the workspaces stay)\n",
                );
            }
            Command::Help => self.screen.out(&format!("{HELP}\n")),
            Command::Quit => {}
            Command::Session(SessionChoice::Show) => {
                self.screen
                    .out(&format!("session {}\n", printable(&self.session)));
            }
            Command::Session(choice) => {
                let id = match &choice {
                    SessionChoice::Switch(id) => Some(id.as_str()),
                    _ => None,
                };
                let opened = self.agent.open_session(id).await?;
                self.detach_all().await;
                self.session = opened.id;
                self.screen
                    .out(&format!("now in session {}\n", printable(&self.session)));
            }
            Command::Attach(dir) => self.attach(dir).await?,
        }
        Ok(())
    }

    /// Attaches `dir`, restricted, to the chat's session; its prompts appear here.
    async fn attach(&mut self, dir: PathBuf) -> Result<(), ClientError> {
        let home = directories::BaseDirs::new().map(|d| d.home_dir().to_owned());
        let dir = expand_home(dir, home.as_deref());
        let canonical = dir
            .canonicalize()
            .map_err(|e| ClientError::Folder(format!("{}: {e}", dir.display())))?;
        if !canonical.is_dir() {
            return Err(ClientError::Folder(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        if self.approver.is_none() {
            self.approver = TerminalApprover::start_sharing(
                self.options.prompt_timeout,
                self.options.guard,
                self.terminal.clone(),
                self.pause.clone(),
            )
            .map(|a| Arc::new(a) as Arc<dyn Approver>);
            if self.approver.is_none() {
                let why = crate::terminal::why_no_prompts().unwrap_or("no terminal");
                self.screen.err(format!(
                    "{why}: the folder's actions will be denied (nobody to ask)"
                ));
            }
        }
        let mut options = AttachOptions::new(canonical.clone());
        options.limits = self.config.limits.clone().unwrap_or_default();
        options.exec = self.config.exec.clone().unwrap_or_default();
        options.session = Some(self.session.clone());
        options.name = canonical
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        options.prompt_timeout = self.options.prompt_timeout;
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let (first_tx, first) = tokio::sync::oneshot::channel::<Result<String, String>>();
        let config = self.config.clone();
        let approver = self.approver.clone();
        let busy = self.busy.clone();
        let screen = self.screen.clone();
        let task = tokio::spawn(async move {
            let mut first_tx = Some(first_tx);
            let serve = attach(&config, options, approver, Some(tx));
            tokio::pin!(serve);
            loop {
                tokio::select! {
                    ended = &mut serve => {
                        let message = match ended {
                            Ok(()) => "detached".to_owned(),
                            Err(e) => e.to_string(),
                        };
                        match first_tx.take() {
                            Some(tx) => { let _ = tx.send(Err(message)); }
                            None => screen.err(format!("attach: {}", printable(&message))),
                        }
                        return;
                    }
                    Some(event) = events.recv() => {
                        match (&event, first_tx.take()) {
                            (AttachEvent::Attached { workspace, .. }, Some(tx)) => {
                                let _ = tx.send(Ok(workspace.name.clone()));
                            }
                            // It never got attached: say why rather than retry unseen.
                            (AttachEvent::Disconnected { reason, .. }, Some(tx)) => {
                                let _ = tx.send(Err(reason.clone()));
                                return;
                            }
                            (_, tx) => {
                                first_tx = tx;
                                let in_turn = busy.load(Ordering::Relaxed);
                                match attach_line(&event, in_turn) {
                                    Some(line) if in_turn => screen.err(line),
                                    // Over the idle input line's `> `, which comes back after.
                                    Some(line) => {
                                        screen.err(format!("\r{line}"));
                                        screen.out("\r> ");
                                    }
                                    None => {}
                                }
                            }
                        }
                    }
                }
            }
        });
        match first.await {
            Ok(Ok(name)) => {
                self.screen.out(&format!(
                    "attached {} as `{}` (restricted: approve its actions here)\n",
                    printable(&dir.to_string_lossy()),
                    printable(&name)
                ));
                self.attached.push(Attached { name, task });
                Ok(())
            }
            Ok(Err(message)) => Err(ClientError::Folder(message)),
            Err(_) => Err(ClientError::Folder("the attachment ended".into())),
        }
    }

    /// Ends the folders attached from the chat and takes them out of its session (a connection
    /// that ends leaves its folder there, offline, as a `monad-client attach` stopped does).
    async fn detach_all(&mut self) {
        for folder in std::mem::take(&mut self.attached) {
            folder.task.abort();
            match self.agent.detach(Some(&self.session), &folder.name).await {
                Ok(_) => self
                    .screen
                    .out(&format!("detached `{}`\n", printable(&folder.name))),
                Err(e) => self.screen.err(format!(
                    "`{}` is left in session {}, offline: {}",
                    printable(&folder.name),
                    printable(&self.session),
                    printable(&e.to_string())
                )),
            }
        }
    }
}

/// `dir` with a leading `~` (alone or before a `/`) made the home directory, as a shell does
/// with what it is given to run; the chat reads its line itself.
fn expand_home(dir: PathBuf, home: Option<&std::path::Path>) -> PathBuf {
    let Some(home) = home else {
        return dir;
    };
    match dir.strip_prefix("~") {
        Ok(rest) => home.join(rest),
        Err(_) => dir,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monad_protocol::wire::{Trust, WorkspaceRef};
    use monad_protocol::{ErrorCode, ToolError};
    use serde_json::json;

    #[test]
    fn a_leading_tilde_is_the_home_directory_and_nothing_else_is() {
        let home = Some(std::path::Path::new("/home/me"));
        let expand = |dir: &str| expand_home(PathBuf::from(dir), home);
        assert_eq!(expand("~/my dir"), PathBuf::from("/home/me/my dir"));
        assert_eq!(expand("~"), PathBuf::from("/home/me/"));
        for unchanged in ["~other/x", "a/~/b", "/abs/~", "rel", "./~"] {
            assert_eq!(expand(unchanged), PathBuf::from(unchanged), "{unchanged}");
        }
        assert_eq!(
            expand_home(PathBuf::from("~/x"), None),
            PathBuf::from("~/x")
        );
    }

    #[test]
    fn slash_commands_parse_and_the_rest_is_a_message() {
        assert_eq!(parse(""), Input::Empty);
        assert_eq!(parse("   \r\n"), Input::Empty);
        assert_eq!(
            parse("hello /workspace"),
            Input::Message("hello /workspace".into())
        );
        assert_eq!(parse("/workspace"), Input::Command(Command::Workspace));
        assert_eq!(parse("  /clear  "), Input::Command(Command::Clear));
        assert_eq!(parse("/context"), Input::Command(Command::Context));
        assert_eq!(parse("/help"), Input::Command(Command::Help));
        assert_eq!(parse("/quit"), Input::Command(Command::Quit));
        assert_eq!(
            parse("/attach ~/my dir"),
            Input::Command(Command::Attach(PathBuf::from("~/my dir")))
        );
        assert_eq!(
            parse("/session"),
            Input::Command(Command::Session(SessionChoice::Show))
        );
        assert_eq!(
            parse("/session new"),
            Input::Command(Command::Session(SessionChoice::New))
        );
        assert_eq!(
            parse("/session 1234"),
            Input::Command(Command::Session(SessionChoice::Switch("1234".into())))
        );
        assert_eq!(
            parse("//etc is a path"),
            Input::Message("/etc is a path".into())
        );
    }

    #[test]
    fn wrong_commands_say_what_is_wrong() {
        for (line, says) in [
            ("/nope", "unknown command /nope"),
            ("/clear now", "takes no argument"),
            ("/attach", "usage: /attach DIR"),
            ("/session a b", "usage: /session"),
            ("/\u{1b}[2J", "\\u{1b}"),
        ] {
            match parse(line) {
                Input::Invalid(message) => assert!(message.contains(says), "{line}: {message}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    fn info() -> ChatInfo {
        ChatInfo {
            session: "default".into(),
            provider: "openai".into(),
            model: "gpt\u{1b}[2J".into(),
            messages: 5,
            context_messages: 2,
            conversation_messages: 4,
            workspaces: vec![
                WorkspaceInfo {
                    name: "primary".into(),
                    uri: "server:/sessions/default".into(),
                    trust: Trust::Full,
                    host: Host::Server,
                    online: true,
                    tools: vec![],
                    network: Some("no network".into()),
                },
                WorkspaceInfo {
                    name: "lap".into(),
                    uri: "dev:/home/me/lap".into(),
                    trust: Trust::Restricted,
                    host: Host::Client,
                    online: false,
                    tools: vec![],
                    network: None,
                },
            ],
        }
    }

    #[test]
    fn workspace_shows_the_session_provider_model_count_and_workspaces_escaped() {
        let text = render_workspace(&info(), &PromptOptions::default());
        assert!(text.contains("session   default\n"), "{text}");
        assert!(text.contains("provider  openai\n"), "{text}");
        assert!(text.contains("model     gpt\\u{1b}[2J\n"), "{text}");
        assert!(text.contains("messages  5\n"), "{text}");
        // In columns: names and URIs padded to the longest.
        assert!(
            text.contains("\n  primary  server:/sessions/default  (server, full, no network)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\n  lap      dev:/home/me/lap          (attached, restricted, offline)\n"
            ),
            "{text}"
        );
        let none = render_workspace(
            &ChatInfo {
                model: String::new(),
                ..info()
            },
            &PromptOptions::default(),
        );
        let chat = render_workspace(
            &info(),
            &PromptOptions {
                model: Some("mini".into()),
                base_url: Some("http://127.0.0.1:1/v1".into()),
            },
        );
        assert!(
            chat.contains("model     mini (this chat's; the session's: gpt\\u{1b}[2J)"),
            "{chat}"
        );
        assert!(
            chat.contains("base URL  http://127.0.0.1:1/v1 (this chat's)"),
            "{chat}"
        );
        assert!(none.contains("(none: set llm.model)"), "{none}");
    }

    #[test]
    fn context_counts_the_messages_the_next_turn_sends() {
        assert_eq!(
            render_context(&info()),
            "context: 2 messages in the context window (of 4 in the conversation); the 2 \
             oldest left out to fit llm.context_budget_tokens\n"
        );
        let all = ChatInfo {
            context_messages: 1,
            conversation_messages: 1,
            ..info()
        };
        assert_eq!(
            render_context(&all),
            "context: 1 message in the context window (of 1 in the conversation)\n"
        );
    }

    #[test]
    fn tool_calls_get_their_own_lines_with_outcome_and_duration() {
        let t0 = Instant::now();
        let mut t = Transcript::new();
        assert_eq!(
            t.event(
                &AgentEvent::Text {
                    text: "Let me look".into()
                },
                t0
            ),
            "Let me look"
        );
        assert_eq!(
            t.event(
                &AgentEvent::ToolCallStarted {
                    call_id: "c1".into(),
                    tool: "read_file".into(),
                    args: json!({"path": "a.txt", "workspace": "lap"}),
                },
                t0
            ),
            "\n⚙ read_file [lap] a.txt\n"
        );
        assert_eq!(
            t.event(
                &AgentEvent::ToolCallProgress {
                    call_id: "c1".into(),
                    message: "waiting for approval".into(),
                },
                t0
            ),
            "  … waiting for approval\n"
        );
        assert_eq!(
            t.event(
                &AgentEvent::ToolCallEnded {
                    call_id: "c1".into(),
                    tool: "read_file".into(),
                    workspace: Some(WorkspaceRef {
                        name: "lap".into(),
                        uri: "x".into()
                    }),
                    error: None,
                    text: "a".into(),
                    truncated: false,
                },
                t0 + Duration::from_millis(1500)
            ),
            "✓ read_file in `lap`: ok (1.5 s)\n"
        );
        let ended = t.event(
            &AgentEvent::ToolCallEnded {
                call_id: "c2".into(),
                tool: "run_command".into(),
                workspace: None,
                error: Some(ToolError::new(ErrorCode::Denied, "no\u{1b}[2J")),
                text: String::new(),
                truncated: false,
            },
            t0,
        );
        assert_eq!(ended, "✗ run_command: error: denied: no\\u{1b}[2J\n");
        // A command that ran and failed is marked failed, with how it ended.
        for (text, said) in [
            (
                "exit status 3 in workspace primary, after 10 ms; no output",
                Some("exit status 3"),
            ),
            (
                "killed by signal 9 in workspace primary, after 1.0 s",
                Some("killed by signal 9"),
            ),
            (
                "exit status 0 in workspace primary, after 10 ms; no output",
                None,
            ),
        ] {
            let ended = t.event(
                &AgentEvent::ToolCallEnded {
                    call_id: "c3".into(),
                    tool: "run_command".into(),
                    workspace: None,
                    error: None,
                    text: text.into(),
                    truncated: false,
                },
                t0,
            );
            let wanted = match said {
                Some(said) => format!("✗ run_command: {said}\n"),
                None => "✓ run_command: ok\n".to_owned(),
            };
            assert_eq!(ended, wanted, "{text}");
        }
        assert_eq!(
            t.event(
                &AgentEvent::Text {
                    text: "Done.".into()
                },
                t0
            ),
            "Done."
        );
        assert_eq!(
            t.end(Some(&TurnResult {
                stop: StopReason::Answered,
                tool_calls: 1,
                input_tokens: 0,
                output_tokens: 0,
            })),
            "\n"
        );
    }

    #[test]
    fn streamed_text_is_escaped_but_keeps_its_lines() {
        let mut t = Transcript::new();
        assert_eq!(
            t.event(
                &AgentEvent::Text {
                    text: "a\r\u{1b}[2Kb\n".into()
                },
                Instant::now()
            ),
            "a\\u{d}\\u{1b}[2Kb\n"
        );
        assert_eq!(t.end(None), "", "nothing left mid-line");
    }

    #[test]
    fn a_turn_that_did_not_answer_says_why() {
        let result = |stop| TurnResult {
            stop,
            tool_calls: 0,
            input_tokens: 0,
            output_tokens: 0,
        };
        assert_eq!(render_end(&result(StopReason::Answered)), None);
        assert_eq!(
            render_end(&result(StopReason::Failed {
                message: "no model".into()
            })),
            Some("failed: no model".into())
        );
        assert!(
            render_end(&result(StopReason::ToolCallLimit { limit: 3 }))
                .unwrap()
                .contains("max_tool_calls_per_turn")
        );
        let mut t = Transcript::new();
        t.event(
            &AgentEvent::Text {
                text: "half".into(),
            },
            Instant::now(),
        );
        assert_eq!(
            t.end(Some(&result(StopReason::Cancelled))),
            "\n(cancelled)\n"
        );
        // Regression: a call running when the turn was cancelled kept its `⚙` line alone.
        let mut t = Transcript::new();
        t.event(
            &AgentEvent::ToolCallStarted {
                call_id: "c1".into(),
                tool: "run_command".into(),
                args: json!({"argv": ["sleep", "30"]}),
            },
            Instant::now(),
        );
        let end = t.end(Some(&result(StopReason::Cancelled)));
        assert!(
            end.starts_with("✗ run_command")
                && end.contains("not finished, the turn ended first\n(cancelled)"),
            "{end:?}"
        );
    }

    #[test]
    fn calls_of_unknown_tools_are_shown_short_and_escaped() {
        let line = describe_call("weird\u{1b}", &json!({"x": "y".repeat(100)}));
        assert!(line.starts_with("weird\\u{1b} {\"x\":\"yyy"), "{line}");
        assert!(line.ends_with('…'), "{line}");
        assert_eq!(
            describe_call("run_command", &json!({"argv": ["ls", "-l"]})),
            "run_command $ ls -l"
        );
    }
}
