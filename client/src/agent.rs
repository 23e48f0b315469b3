//! Calling tools as an agent: `monad-client call`, `sessions`, and the library path the MCP
//! bridge uses.

use monad_protocol::agent::{AgentEvent, TurnResult};
use monad_protocol::io::{
    ReadError, read_body, read_message, read_message_relayed, write_encoded, write_message,
};
use monad_protocol::stream::QuietRecv;
use monad_protocol::wire::{
    self, ChatInfo, History, HistoryMessage, Message, Outcome, ROOTS_MINOR, Role, SessionInfo,
    WorkspaceInfo, WorkspaceRecord, WorkspaceRef, WorkspaceSession, reset,
};
use monad_protocol::{ErrorCode, ToolError};
use serde_json::Value;

use crate::ClientError;
use crate::config::ClientConfig;
use crate::connect::{Connection, connect};

/// Largest answer accepted (a 64 MiB file as JSON fits).
const MAX_ANSWER: usize = 256 * 1024 * 1024;

/// A call whose arguments hold more text than this is encoded on the blocking pool, not on the
/// task that sends it. `monad-client mcp` runs on one thread, which also answers its QUIC
/// connection's packets: encoding a `write_file` of 16 MiB there (escaping every line break)
/// kept the connection silent for as long as it took (45 ms in a release build, 0.7 s in a
/// debug one: on a loaded machine, past the 8 s idle time-out, and the call ended with
/// `connection lost`); meanwhile the answers of the host's other calls waited too.
const ENCODE_ON_POOL: usize = 1024 * 1024;

/// How many bytes of text (strings and keys) `value` holds; walked without recursion, so any
/// depth is fine.
fn text_bytes(value: &Value) -> usize {
    let mut total = 0usize;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) => total = total.saturating_add(s.len()),
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                for (key, item) in map {
                    total = total.saturating_add(key.len());
                    stack.push(item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    total
}

/// The answer to a call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallReply {
    /// The workspace that ran it, when one was reached.
    pub workspace: Option<WorkspaceRef>,
    /// How it ended.
    pub outcome: Outcome,
}

/// A prompt's own choices, instead of the session's `[llm]` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptOptions {
    /// The model for this turn.
    pub model: Option<String>,
    /// The API base URL for this turn (the server's operator must allow it).
    pub base_url: Option<String>,
}

/// How a prompt's turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptReply {
    /// The session the turn ran in.
    pub session: String,
    /// Why it ended and what it used.
    pub result: TurnResult,
}

/// The workspace a call named in its arguments, if it named one.
fn targeted(args: &Value) -> Option<String> {
    args.get("workspace")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The workspace a failed body is blamed on: the one its result came from, else the one the call
/// named.
fn blamed<'a>(result: Option<&'a WorkspaceRef>, targeted: Option<&'a str>) -> Option<&'a str> {
    result.map(|w| w.name.as_str()).or(targeted)
}

/// The call's error when the server reset the answer's stream with a code that says why: it does
/// so when a result's body fails mid-way (the result message has already gone, so no error
/// message can follow). The reset can overtake the result message itself (a reset discards what
/// the stream has not sent yet), so `workspace` is the result's if it arrived, else the one the
/// call named, else unknown.
fn reset_error(e: &ReadError, workspace: Option<&str>) -> Option<ToolError> {
    let ReadError::Io(io) = e else {
        return None;
    };
    let code = match io.get_ref()?.downcast_ref::<quinn::ReadError>()? {
        quinn::ReadError::Reset(code) => code.into_inner(),
        _ => return None,
    };
    let name = workspace.map_or_else(
        || "the workspace".to_owned(),
        |name| format!("workspace `{name}`"),
    );
    let (code, message) = match u32::try_from(code).ok()? {
        reset::WORKSPACE_DISCONNECTED => (
            ErrorCode::WorkspaceDisconnected,
            format!("{name} disconnected while sending the result; its client must reconnect"),
        ),
        reset::TIMEOUT => (
            ErrorCode::Timeout,
            format!("the result from {name} did not arrive within the call's time limit"),
        ),
        reset::MALFORMED => (
            ErrorCode::Malformed,
            format!(
                "{name} sent a result whose body is not what it announced \
                 (shorter, longer, or not UTF-8 text)"
            ),
        ),
        _ => return None,
    };
    Some(ToolError::new(code, message))
}

/// Where an MCP host landed ([`Agent::land`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landing {
    /// The session to work in.
    pub session: String,
    /// The folder (absolute path on this device) a root matched.
    pub folder: Option<String>,
    /// The session's focus workspace after landing.
    pub focus: Option<String>,
    /// Whether that focus is a folder offline now.
    pub focus_offline: bool,
    /// With `folder`: whether it is the focus (`None` from a server older than minor 11).
    pub folder_focus: Option<bool>,
}

/// An agent's connection: one QUIC connection, one stream per request.
#[derive(Debug, Clone)]
pub struct Agent {
    connection: Connection,
}

/// Closes the agent connection `slot` holds, if any, taking it out (see [`Agent::close`]): the
/// MCP and ACP fronts keep their connection this way and close it as they end.
pub(crate) async fn close_held(slot: &tokio::sync::Mutex<Option<Agent>>, reason: &str) {
    if let Some(agent) = slot.lock().await.take() {
        agent.close(reason).await;
    }
}

impl Agent {
    /// Connects and authenticates as an agent.
    pub async fn connect(config: &ClientConfig) -> Result<Agent, ClientError> {
        Ok(Agent {
            connection: connect(config, Role::Agent).await?,
        })
    }

    /// Closes the connection and waits (briefly) until the server has been told: it cancels the
    /// calls still running on it at once.
    pub async fn close(&self, reason: &str) {
        self.connection.close(reason).await;
    }

    /// The user the token authenticated as.
    pub fn user(&self) -> &str {
        &self.connection.user
    }

    /// The host it is connected to (`HOST:PORT`, one of the config's addresses).
    pub fn server(&self) -> &str {
        &self.connection.server
    }

    /// Opens a stream and sends `request` on it, finished. The answer's stream, dropped, has its
    /// end read if it arrived, so that the server is not told to stop a stream it finished
    /// (dropped earlier, it stops the server: a cancel).
    async fn request(
        &self,
        request: &Message,
    ) -> Result<(quinn::SendStream, QuietRecv), ClientError> {
        self.request_encoded(&request.to_json()).await
    }

    /// [`Agent::request`] for a request already encoded ([`Message::to_json`]).
    async fn request_encoded(
        &self,
        json: &[u8],
    ) -> Result<(quinn::SendStream, QuietRecv), ClientError> {
        let (mut send, recv) = self
            .connection
            .conn
            .open_bi()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        write_encoded(&mut send, json)
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        let _ = send.finish();
        Ok((send, QuietRecv::new(recv)))
    }

    /// Runs `tool` with `args` in `session` (`None`: the default). `progress` sees each progress
    /// line while the call waits (for an approval, say). Dropping the future cancels the call:
    /// the stream is reset, and the server withdraws the prompt or kills the command.
    pub async fn call(
        &self,
        session: Option<&str>,
        tool: &str,
        args: Value,
        mut progress: impl FnMut(&str),
    ) -> Result<CallReply, ClientError> {
        // Named in an error if the server's reset overtakes its result (see `reset_error`).
        let targeted = targeted(&args);
        let large = text_bytes(&args) > ENCODE_ON_POOL;
        let request = Message::Call {
            id: 1,
            session: session.map(str::to_owned),
            tool: tool.to_owned(),
            args,
        };
        let json = if large {
            tokio::task::spawn_blocking(move || request.to_json())
                .await
                .map_err(|e| ClientError::Protocol(format!("encoding the call failed: {e}")))?
        } else {
            request.to_json()
        };
        let (_send, mut recv) = self.request_encoded(&json).await?;
        drop(json);
        loop {
            // The result stays the text it came in until its reader decodes it: the MCP front
            // decodes a listing straight into its type, not through a tree.
            match read_message_relayed(&mut *recv, MAX_ANSWER).await {
                Ok(Some(Message::Progress { message, .. })) => progress(&message),
                Ok(Some(Message::Result {
                    workspace,
                    mut outcome,
                    body,
                    ..
                })) => {
                    if let Some(body) = body
                        && let Err(e) = read_body(&mut *recv, &mut outcome, &body, MAX_ANSWER).await
                    {
                        let named = blamed(workspace.as_ref(), targeted.as_deref());
                        let error = match (reset_error(&e, named), &e) {
                            (Some(error), _) => error,
                            (None, ReadError::Body(_) | ReadError::Frame(_)) => ToolError::new(
                                ErrorCode::Malformed,
                                format!("the result's body is malformed: {e}"),
                            ),
                            (None, _) => return Err(ClientError::Unreachable(e.to_string())),
                        };
                        outcome = Outcome::Error { error };
                    }
                    recv.let_go();
                    return Ok(CallReply { workspace, outcome });
                }
                Ok(Some(Message::Error { error, .. })) => return Err(ClientError::Refused(error)),
                Ok(Some(other)) => {
                    return Err(ClientError::Protocol(format!(
                        "unexpected `{}` in answer to a call",
                        other.kind()
                    )));
                }
                Ok(None) => {
                    return Err(ClientError::Unreachable(
                        "the server closed the call without an answer".into(),
                    ));
                }
                Err(e) => {
                    return match reset_error(&e, targeted.as_deref()) {
                        Some(error) => Ok(CallReply {
                            workspace: None,
                            outcome: Outcome::Error { error },
                        }),
                        None => Err(ClientError::Unreachable(e.to_string())),
                    };
                }
            }
        }
    }

    /// Sends `text` to the built-in agent of `session` (`None`: the default) and returns the
    /// turn's result; `event` sees each [`AgentEvent`] as it happens (text as the model
    /// generates it, tool calls starting and ending). Dropping the future cancels the turn: the
    /// stream is reset, and the server stops the model and any running tool call. A server
    /// older than the agent (minor version below [`wire::AGENT_MINOR`]) is refused here.
    pub async fn prompt(
        &self,
        session: Option<&str>,
        text: &str,
        event: impl FnMut(AgentEvent),
    ) -> Result<PromptReply, ClientError> {
        self.prompt_inner(
            session,
            text,
            &PromptOptions::default(),
            event,
            None::<fn(&AgentEvent) -> std::future::Ready<bool>>,
        )
        .await
    }

    /// [`Agent::prompt`] with this turn's own model and API base URL (`options`). A server older
    /// than [`wire::CHAT_MINOR`] cannot take them: asking for either there is refused here. The
    /// server refuses a base URL its operator did not allow.
    pub async fn prompt_with(
        &self,
        session: Option<&str>,
        text: &str,
        options: &PromptOptions,
        event: impl FnMut(AgentEvent),
    ) -> Result<PromptReply, ClientError> {
        self.prompt_inner(
            session,
            text,
            options,
            event,
            None::<fn(&AgentEvent) -> std::future::Ready<bool>>,
        )
        .await
    }

    /// Like [`Agent::prompt`], and the front approves or rejects each call before it runs in a
    /// restricted workspace: `permission` gets the [`AgentEvent::Permission`] (which `event`
    /// sees too) and answers whether the front's user allows it. A rejection denies the call
    /// without asking the folder's owner; an approval lets it go on to the owner's own policy
    /// and prompt, which still decide. Events keep coming while a question waits. A server older
    /// than [`wire::PERMISSION_MINOR`] never asks: its restricted calls go to the owner alone.
    pub async fn prompt_asking<F>(
        &self,
        session: Option<&str>,
        text: &str,
        event: impl FnMut(AgentEvent),
        permission: impl FnMut(&AgentEvent) -> F,
    ) -> Result<PromptReply, ClientError>
    where
        F: std::future::Future<Output = bool>,
    {
        self.prompt_inner(
            session,
            text,
            &PromptOptions::default(),
            event,
            Some(permission),
        )
        .await
    }

    async fn prompt_inner<F>(
        &self,
        session: Option<&str>,
        text: &str,
        options: &PromptOptions,
        mut event: impl FnMut(AgentEvent),
        mut permission: Option<impl FnMut(&AgentEvent) -> F>,
    ) -> Result<PromptReply, ClientError>
    where
        F: std::future::Future<Output = bool>,
    {
        if (options.model.is_some() || options.base_url.is_some())
            && self.connection.minor < wire::CHAT_MINOR
        {
            return Err(ClientError::Refused(ToolError::new(
                ErrorCode::Unsupported,
                "this server cannot take a model or base URL per prompt (it is older than this \
                 client); upgrade it or leave out --model and --base-url",
            )));
        }
        if self.connection.minor < wire::AGENT_MINOR {
            return Err(ClientError::Refused(ToolError::new(
                ErrorCode::Unsupported,
                "this server has no built-in agent (it is older than this client); upgrade it",
            )));
        }
        let ask = permission.is_some() && self.connection.minor >= wire::PERMISSION_MINOR;
        let request = Message::Prompt {
            id: 1,
            session: session.map(str::to_owned),
            text: text.to_owned(),
            ask,
            model: options.model.clone(),
            base_url: options.base_url.clone(),
        };
        // A front that answers keeps its side of the stream open for the answers.
        let (mut send, mut recv) = if ask {
            let (mut send, recv) = self
                .connection
                .conn
                .open_bi()
                .await
                .map_err(|e| ClientError::Unreachable(e.to_string()))?;
            write_message(&mut send, &request)
                .await
                .map_err(|e| ClientError::Unreachable(e.to_string()))?;
            (send, QuietRecv::new(recv))
        } else {
            self.request(&request).await?
        };
        let permission = if ask { permission.as_mut() } else { None };
        answer_turn(&mut *recv, &mut send, &mut event, permission).await
    }

    /// What the chat front shows about `session`'s agent (`None`: the default): provider,
    /// model, message counts, the messages the next turn would send, the workspaces.
    pub async fn chat_info(&self, session: Option<&str>) -> Result<ChatInfo, ClientError> {
        if self.connection.minor < wire::CHAT_MINOR {
            return Err(ClientError::Refused(ToolError::new(
                ErrorCode::Unsupported,
                "this server cannot describe its agent (it is older than this client); upgrade it",
            )));
        }
        match self
            .ask(&Message::ChatInfo {
                id: 1,
                session: session.map(str::to_owned),
            })
            .await?
        {
            Message::ChatInfoIs { info, .. } => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// The user's sessions, most recently active first, all of them.
    pub async fn sessions(&self) -> Result<Vec<SessionInfo>, ClientError> {
        Ok(self.sessions_page(None, None).await?.0)
    }

    /// One page of the user's sessions (`limit` 1-100; `None`: all of them), most recently
    /// active first, and the next page's token.
    pub async fn sessions_page(
        &self,
        limit: Option<u32>,
        next: Option<&str>,
    ) -> Result<(Vec<SessionInfo>, Option<String>), ClientError> {
        let request = Message::ListSessions {
            id: 1,
            limit,
            next: next.map(str::to_owned),
        };
        let (_send, mut recv) = self.request(&request).await?;
        match read_message(&mut *recv, MAX_ANSWER).await {
            Ok(Some(Message::Sessions { sessions, next, .. })) => Ok((sessions, next)),
            Ok(Some(Message::Error { error, .. })) => Err(ClientError::Refused(error)),
            Ok(Some(other)) => Err(ClientError::Protocol(format!(
                "unexpected `{}` in answer to list_sessions",
                other.kind()
            ))),
            Ok(None) => Err(ClientError::Unreachable("no answer".into())),
            Err(e) => Err(ClientError::Unreachable(e.to_string())),
        }
    }

    /// The workspaces of `session` (`None`: the default).
    pub async fn workspaces(
        &self,
        session: Option<&str>,
    ) -> Result<(String, Vec<WorkspaceInfo>), ClientError> {
        let (_send, mut recv) = self
            .request(&Message::ListWorkspaces {
                id: 1,
                session: session.map(str::to_owned),
            })
            .await?;
        read_workspaces(&mut recv).await
    }

    /// Watches the workspaces of `session`: the receiver gets the list at once and after every
    /// change (a folder attached, detached, gone offline). Dropping the receiver ends the watch.
    pub async fn watch(
        &self,
        session: Option<&str>,
    ) -> Result<tokio::sync::mpsc::Receiver<(String, Vec<WorkspaceInfo>)>, ClientError> {
        let (mut send, mut recv) = self
            .request(&Message::Watch {
                id: 1,
                session: session.map(str::to_owned),
            })
            .await?;
        let first = read_workspaces(&mut recv).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let _ = tx.send(first).await;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    next = read_workspaces(&mut recv) => match next {
                        Ok(update) => if tx.send(update).await.is_err() { break },
                        Err(_) => break,
                    },
                    () = tx.closed() => break,
                }
            }
            let _ = send.reset(reset::CANCELLED.into());
            let _ = recv.stop(reset::CANCELLED.into());
        });
        Ok(rx)
    }

    /// Sends a request and reads its one answer; an `error` answer becomes `Refused`.
    async fn ask(&self, request: &Message) -> Result<Message, ClientError> {
        let (_send, mut recv) = self.request(request).await?;
        match read_message(&mut *recv, MAX_ANSWER).await {
            Ok(Some(Message::Error { error, .. })) => Err(ClientError::Refused(error)),
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(ClientError::Unreachable("no answer".into())),
            Err(e) => Err(ClientError::Unreachable(e.to_string())),
        }
    }

    /// Opens a session (resuming or creating it); `None` creates a new one with a fresh id.
    /// The device is bound to it.
    pub async fn open_session(&self, session: Option<&str>) -> Result<SessionInfo, ClientError> {
        self.open_session_in(session, None).await
    }

    /// Like [`Agent::open_session`]; a new session (`session: None`) opened with `folder` (an
    /// absolute path on this device, `sessions --new` run in a folder) becomes the active
    /// session of the attached folder that contains it, which then serves it too. A server
    /// older than [`ROOTS_MINOR`] is not told the folder.
    pub async fn open_session_in(
        &self,
        session: Option<&str>,
        folder: Option<&str>,
    ) -> Result<SessionInfo, ClientError> {
        self.open(session, folder, None).await
    }

    /// Creates a new session (as [`Agent::open_session_in`] with no id) with a human `name`.
    /// A server older than [`wire::CLI_MINOR`] cannot keep a name: refused here.
    pub async fn new_named_session(
        &self,
        folder: Option<&str>,
        name: &str,
    ) -> Result<SessionInfo, ClientError> {
        if self.connection.minor < wire::CLI_MINOR {
            return Err(ClientError::Refused(ToolError::new(
                ErrorCode::Unsupported,
                "this server cannot name sessions (it is older than this client); upgrade it, \
                 or leave out --name",
            )));
        }
        self.open(None, folder, Some(name)).await
    }

    async fn open(
        &self,
        session: Option<&str>,
        folder: Option<&str>,
        name: Option<&str>,
    ) -> Result<SessionInfo, ClientError> {
        let folder = folder
            .filter(|_| session.is_none() && self.connection.minor >= ROOTS_MINOR)
            .map(str::to_owned);
        match self
            .ask(&Message::OpenSession {
                id: 1,
                session: session.map(str::to_owned),
                folder,
                name: name.map(str::to_owned),
            })
            .await?
        {
            Message::SessionOpened { session, .. } => Ok(session),
            other => Err(unexpected(&other)),
        }
    }

    /// Detaches the folder named `workspace` (short name or URI) from `session` (`None`: the
    /// default) and forgets it there: its `attach` stops; an offline one is no longer listed.
    /// Returns the session's id. A server older than [`wire::CLI_MINOR`] cannot: refused here.
    pub async fn detach(
        &self,
        session: Option<&str>,
        workspace: &str,
    ) -> Result<String, ClientError> {
        if self.connection.minor < wire::CLI_MINOR {
            return Err(ClientError::Refused(ToolError::new(
                ErrorCode::Unsupported,
                "this server cannot detach folders by name (it is older than this client); \
                 stop the folder's `monad-client attach` instead, or upgrade the server",
            )));
        }
        done(
            self.ask(&Message::Detach {
                id: 1,
                session: session.map(str::to_owned),
                workspace: workspace.to_owned(),
            })
            .await?,
        )
    }

    /// Appends a message to a session's conversation; returns the session's id.
    pub async fn history_append(
        &self,
        session: Option<&str>,
        message: HistoryMessage,
    ) -> Result<String, ClientError> {
        done(
            self.ask(&Message::HistoryAppend {
                id: 1,
                session: session.map(str::to_owned),
                message,
            })
            .await?,
        )
    }

    /// A session's conversation, with the session's id.
    pub async fn history(&self, session: Option<&str>) -> Result<(String, History), ClientError> {
        match self
            .ask(&Message::HistoryGet {
                id: 1,
                session: session.map(str::to_owned),
            })
            .await?
        {
            Message::HistoryIs {
                session, history, ..
            } => Ok((session, history)),
            other => Err(unexpected(&other)),
        }
    }

    /// Replaces a session's conversation with a snapshot.
    pub async fn history_replace(
        &self,
        session: Option<&str>,
        history: History,
    ) -> Result<String, ClientError> {
        done(
            self.ask(&Message::HistoryReplace {
                id: 1,
                session: session.map(str::to_owned),
                history,
            })
            .await?,
        )
    }

    /// Clears a session's conversation (its frontmatter and workspace stay).
    pub async fn history_clear(&self, session: Option<&str>) -> Result<String, ClientError> {
        done(
            self.ask(&Message::HistoryClear {
                id: 1,
                session: session.map(str::to_owned),
            })
            .await?,
        )
    }

    /// The protocol's minor version on this connection.
    pub fn minor(&self) -> u32 {
        self.connection.minor
    }

    /// Tells the server an MCP host's `roots` and returns where to work: `(session, folder the
    /// roots matched, focus)`. `session` is one the host asked for, which wins over the roots.
    /// `Ok(None)` from a server older than [`ROOTS_MINOR`], which cannot land by roots.
    pub async fn land(
        &self,
        roots: Vec<String>,
        session: Option<&str>,
    ) -> Result<Option<Landing>, ClientError> {
        if self.connection.minor < ROOTS_MINOR {
            return Ok(None);
        }
        match self
            .ask(&Message::Land {
                id: 1,
                roots,
                session: session.map(str::to_owned),
            })
            .await?
        {
            Message::Landed {
                session,
                folder,
                focus,
                focus_offline,
                folder_focus,
                ..
            } => Ok(Some(Landing {
                session,
                folder,
                focus,
                focus_offline,
                folder_focus,
            })),
            other => Err(unexpected(&other)),
        }
    }

    /// The user's workspace records, most recently active first.
    pub async fn records(&self) -> Result<Vec<WorkspaceRecord>, ClientError> {
        match self.ask(&Message::ListRecords { id: 1 }).await? {
            Message::Records { records, .. } => Ok(records),
            other => Err(unexpected(&other)),
        }
    }

    /// One page of the sessions a workspace record was used in, and the next page's token.
    pub async fn record_sessions(
        &self,
        record: &str,
        limit: Option<u32>,
        next: Option<&str>,
    ) -> Result<(Vec<WorkspaceSession>, Option<String>), ClientError> {
        match self
            .ask(&Message::RecordSessions {
                id: 1,
                record: record.to_owned(),
                limit,
                next: next.map(str::to_owned),
            })
            .await?
        {
            Message::RecordSessionsPage { sessions, next, .. } => Ok((sessions, next)),
            other => Err(unexpected(&other)),
        }
    }

    /// The underlying QUIC connection (for tests that misbehave on purpose).
    pub fn quic(&self) -> &quinn::Connection {
        &self.connection.conn
    }
}

async fn read_workspaces(
    recv: &mut quinn::RecvStream,
) -> Result<(String, Vec<WorkspaceInfo>), ClientError> {
    match read_message(recv, MAX_ANSWER).await {
        Ok(Some(Message::Workspaces {
            session,
            workspaces,
            ..
        })) => Ok((session, workspaces)),
        Ok(Some(Message::Error { error, .. })) => Err(ClientError::Refused(error)),
        Ok(Some(other)) => Err(ClientError::Protocol(format!(
            "unexpected `{}` in answer to a workspace listing",
            other.kind()
        ))),
        Ok(None) => Err(ClientError::Unreachable("no answer".into())),
        Err(e) => Err(ClientError::Unreachable(e.to_string())),
    }
}

fn unexpected(answer: &Message) -> ClientError {
    ClientError::Protocol(format!("unexpected `{}` in the answer", answer.kind()))
}

fn done(answer: Message) -> Result<String, ClientError> {
    match answer {
        Message::Done { session, .. } => Ok(session),
        other => Err(unexpected(&other)),
    }
}

/// What `login` found on the hosts of the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginCheck {
    /// The user the token authenticated as (on the first host that answered).
    pub user: String,
    /// The hosts that did not answer, with why: kept in the config, and tried when the others
    /// do not answer.
    pub unreachable: Vec<(String, String)>,
}

/// Checks a login: connects to every host of the config with the given fingerprint and token,
/// and returns the user. A changed certificate or a refused token on any host is the error; so
/// is no host answering (naming every host tried).
pub async fn check_login(config: &ClientConfig) -> Result<LoginCheck, ClientError> {
    let (answered, unreachable) = crate::connect::check_each(config, Role::Agent).await?;
    match answered.into_iter().next() {
        Some(first) => Ok(LoginCheck {
            user: first.user,
            unreachable,
        }),
        None => Err(crate::connect::unreachable(&unreachable)),
    }
}

/// Reads a prompt's answer to its end: events go to `event`; a permission question, when
/// `permission` is given, to `permission`, whose answers are written back on `send` as they come,
/// in whatever order, while events keep coming.
///
/// The answer's messages are read by one future that lives across the loop's turns (an
/// `unfold` stream): an answer written while a message is half read must not drop what was read
/// of it, or the stream would be read from the middle of a frame on.
async fn answer_turn<R, W, F>(
    recv: R,
    send: &mut W,
    event: &mut impl FnMut(AgentEvent),
    mut permission: Option<&mut impl FnMut(&AgentEvent) -> F>,
) -> Result<PromptReply, ClientError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
    F: std::future::Future<Output = bool>,
{
    use futures_util::StreamExt;
    let messages = futures_util::stream::unfold(recv, |mut recv| async move {
        let next = read_message(&mut recv, MAX_ANSWER).await;
        Some((next, recv))
    });
    let mut messages = std::pin::pin!(messages);
    let mut asked = futures_util::stream::FuturesUnordered::new();
    loop {
        let next = tokio::select! {
            Some(next) = messages.next() => next,
            Some((call_id, allow)) = asked.next(), if !asked.is_empty() => {
                let answer = Message::PermissionAnswer { id: 1, call_id, allow };
                write_message(send, &answer)
                    .await
                    .map_err(|e| ClientError::Unreachable(e.to_string()))?;
                continue;
            }
        };
        match next {
            Ok(Some(Message::AgentEvent { event: e, .. })) => {
                if let (AgentEvent::Permission { call_id, .. }, Some(permission)) =
                    (&e, permission.as_mut())
                {
                    let call_id = call_id.clone();
                    let answer = permission(&e);
                    asked.push(async move { (call_id, answer.await) });
                }
                event(e)
            }
            Ok(Some(Message::TurnDone {
                session, result, ..
            })) => return Ok(PromptReply { session, result }),
            Ok(Some(Message::Error { error, .. })) => return Err(ClientError::Refused(error)),
            Ok(Some(other)) => {
                return Err(ClientError::Protocol(format!(
                    "unexpected `{}` in answer to a prompt",
                    other.kind()
                )));
            }
            Ok(None) => {
                return Err(ClientError::Unreachable(
                    "the server closed the prompt without an answer".into(),
                ));
            }
            Err(e) => return Err(ClientError::Unreachable(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permission answered while an event is half read: the event is still read whole, and
    /// the answer goes out. (The answer's future used to drop the half-read message, and the
    /// stream was read from the middle of its frame on.)
    #[tokio::test]
    async fn an_answer_written_while_an_event_is_half_read_loses_none_of_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, mut server) = tokio::io::duplex(1 << 20);
        let (client_read, mut client_write) = tokio::io::split(client);
        let (allow, allowed) = tokio::sync::oneshot::channel::<bool>();
        let mut allowed = Some(allowed);
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = events.clone();
        let turn = tokio::spawn(async move {
            let mut event = |e: AgentEvent| seen.lock().unwrap().push(e);
            let mut permission = |_: &AgentEvent| {
                let allowed = allowed.take().expect("one question");
                async move { allowed.await.unwrap_or(false) }
            };
            answer_turn(
                client_read,
                &mut client_write,
                &mut event,
                Some(&mut permission),
            )
            .await
        });
        let frame = |message: &Message| {
            let mut bytes = Vec::new();
            futures_util::FutureExt::now_or_never(write_message(&mut bytes, message))
                .expect("a Vec never waits")
                .unwrap();
            bytes
        };
        let question = frame(&Message::AgentEvent {
            id: 1,
            event: AgentEvent::Permission {
                call_id: "c1".into(),
                tool: "write_file".into(),
                workspace: WorkspaceRef {
                    name: "lap".into(),
                    uri: "monad://lap".into(),
                },
                what: "a.txt".into(),
            },
        });
        let long = "x".repeat(200_000);
        let text = frame(&Message::AgentEvent {
            id: 1,
            event: AgentEvent::Text { text: long.clone() },
        });
        server.write_all(&question).await.unwrap();
        // Half of the long event, read by the turn before the answer is given.
        server.write_all(&text[..text.len() / 2]).await.unwrap();
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        allow.send(true).unwrap();
        let answer = read_message(&mut server, MAX_ANSWER).await.unwrap();
        assert!(
            matches!(
                answer,
                Some(Message::PermissionAnswer { ref call_id, allow: true, .. }) if call_id == "c1"
            ),
            "{answer:?}"
        );
        server.write_all(&text[text.len() / 2..]).await.unwrap();
        let done = frame(&Message::TurnDone {
            id: 1,
            session: "s".into(),
            result: TurnResult {
                stop: monad_protocol::agent::StopReason::Answered,
                tool_calls: 1,
                input_tokens: 0,
                output_tokens: 0,
            },
        });
        server.write_all(&done).await.unwrap();
        let reply = turn.await.unwrap().expect("the turn ends with its answer");
        assert_eq!(reply.session, "s");
        let events = std::mem::take(&mut *events.lock().unwrap());
        assert_eq!(events.len(), 2);
        assert!(matches!(&events[1], AgentEvent::Text { text } if *text == long));
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    /// What reading an answer's stream gives when the server reset it with `code`.
    fn reset(code: u32) -> ReadError {
        // quinn's own conversion, as the stream's reader gives it.
        let reset = quinn::ReadError::Reset(quinn::VarInt::from_u32(code));
        ReadError::Io(std::io::Error::from(reset))
    }

    #[test]
    fn a_reset_is_the_error_its_code_says_and_names_the_workspace_it_is_given() {
        let error = reset_error(&reset(reset::WORKSPACE_DISCONNECTED), Some("lap")).unwrap();
        assert_eq!(error.code, ErrorCode::WorkspaceDisconnected);
        assert!(error.message.contains("workspace `lap`"), "{error}");
        let error = reset_error(&reset(reset::TIMEOUT), None).unwrap();
        assert_eq!(error.code, ErrorCode::Timeout);
        assert!(error.message.contains("the workspace"), "{error}");
        let error = reset_error(&reset(reset::MALFORMED), Some("lap")).unwrap();
        assert_eq!(error.code, ErrorCode::Malformed);
        // Another code, or another failure, is not a reset that says why.
        assert!(reset_error(&reset(reset::CANCELLED), Some("lap")).is_none());
        let eof = ReadError::Io(std::io::ErrorKind::UnexpectedEof.into());
        assert!(reset_error(&eof, Some("lap")).is_none());
    }

    #[test]
    fn a_failed_body_is_blamed_on_its_result_s_workspace_else_on_the_one_the_call_named() {
        let result = WorkspaceRef {
            name: "desk".into(),
            uri: "monad://workspace/desk".into(),
        };
        let named = targeted(&serde_json::json!({"path": "a", "workspace": "lap"}));
        assert_eq!(named.as_deref(), Some("lap"));
        assert_eq!(blamed(Some(&result), named.as_deref()), Some("desk"));
        // The result overtaken by the reset: the call's own target names it.
        let error = reset_error(
            &reset(reset::WORKSPACE_DISCONNECTED),
            blamed(None, named.as_deref()),
        )
        .unwrap();
        assert!(error.message.contains("workspace `lap`"), "{error}");
        // A call that named none, or named one with something that is not a name.
        assert_eq!(targeted(&serde_json::json!({"path": "a"})), None);
        assert_eq!(targeted(&serde_json::json!({"workspace": 3})), None);
        assert_eq!(blamed(None, None), None);
    }
}
