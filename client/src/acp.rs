//! `monad-client acp`: an Agent Client Protocol agent on stdio for editors (Zed, and others) and
//! mobile clients, bridged to the Monad server over QUIC as an agent, like `monad-client mcp`.
//! The agent is the session's built-in agent ([`Agent::prompt_asking`]); this module only
//! translates.
//!
//! - `initialize`: protocol v1, `loadSession` advertised; text and resource links in prompts.
//! - `session/new`: without `_meta.sessionId`, a new session (a fresh UUID); its `cwd` is told to
//!   the server like a `sessions --new` run in a folder, so when this device attached the folder
//!   that contains it, that folder serves the new session. With `_meta.sessionId` (seed 001's
//!   mobile clients): that session is resumed (same primary workspace, settings and files) and
//!   its conversation cleared (`session.md` keeps its frontmatter). `mcpServers` are not
//!   supported: Monad's tools are the session's; the answer's `_meta.monad` says so.
//! - `session/load`: the session's conversation from `session.md` is replayed as
//!   `user_message_chunk` / `agent_message_chunk`, then the request is answered.
//! - `session/prompt`: the turn's text as `agent_message_chunk`s, its tool calls as `tool_call`
//!   and `tool_call_update`; before a call runs in a restricted folder, `session/request_permission`
//!   asks the editor: a rejection denies it without asking the folder's owner, an approval lets
//!   it go on to the owner's own policy and prompt, which still decide.
//! - `session/cancel`: the turn's QUIC stream is reset, which cancels it on every hop; the prompt
//!   answers `cancelled`.
//!
//! The decisions are pure functions (`translate`), tested alone; [`serve`] does the I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, SessionNotification, SessionUpdate,
};
use agent_client_protocol::{ByteStreams, Client, Error};
use monad_protocol::agent::AgentEvent;
use monad_protocol::wire::HistoryRole;
use tokio::sync::oneshot;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tracing::{debug, info};

use crate::ClientError;
use crate::agent::Agent;
use crate::config::ClientConfig;
use crate::interrupts::Signal;

pub mod translate;

/// The ACP front's state: one agent connection to the server (made when first needed, re-made
/// when it drops), the sessions opened on this ACP connection, and each one's running turn.
#[derive(Debug)]
struct Front {
    config: ClientConfig,
    agent: tokio::sync::Mutex<Option<Agent>>,
    sessions: Mutex<HashMap<String, Turn>>,
    /// Turns started here: each turn's tool calls go to the editor under ids it prefixes
    /// ([`translate::in_turn`]).
    turns: std::sync::atomic::AtomicU64,
}

/// A session opened here; `cancel` is set while a turn runs.
#[derive(Debug, Default)]
struct Turn {
    cancel: Option<oneshot::Sender<()>>,
}

impl Front {
    async fn agent(&self) -> Result<Agent, Error> {
        let mut agent = self.agent.lock().await;
        if let Some(live) = agent.as_ref().filter(|a| a.quic().close_reason().is_none()) {
            return Ok(live.clone());
        }
        let fresh = Agent::connect(&self.config)
            .await
            .map_err(|e| client_error(&self.config, e))?;
        info!(server = %fresh.server(), "connected to the Monad server");
        *agent = Some(fresh.clone());
        Ok(fresh)
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Turn>> {
        lock(&self.sessions)
    }

    fn known(&self, session: &str) -> Result<(), Error> {
        if self.sessions().contains_key(session) {
            Ok(())
        } else {
            Err(Error::invalid_params().data(format!(
                "unknown session `{session}`: open it with session/new or session/load first"
            )))
        }
    }

    async fn new_session(&self, request: NewSessionRequest) -> Result<NewSessionResponse, Error> {
        let wanted = translate::requested_session(request.meta.as_ref())
            .map_err(|why| Error::invalid_params().data(why))?;
        let agent = self.agent().await?;
        let id = match wanted {
            Some(id) => {
                // Seed 001: the same session (its workspace, files, settings), a fresh
                // conversation.
                let opened = agent
                    .open_session(Some(&id))
                    .await
                    .map_err(|e| client_error(&self.config, e))?;
                agent
                    .history_clear(Some(&opened.id))
                    .await
                    .map_err(|e| client_error(&self.config, e))?;
                opened.id
            }
            None => {
                let cwd = request.cwd.to_str().filter(|_| request.cwd.is_absolute());
                agent
                    .open_session_in(None, cwd)
                    .await
                    .map_err(|e| client_error(&self.config, e))?
                    .id
            }
        };
        self.sessions().entry(id.clone()).or_default();
        let mut response = NewSessionResponse::new(id);
        if !request.mcp_servers.is_empty() {
            response = response.meta(translate::mcp_servers_ignored());
        }
        Ok(response)
    }

    async fn load_session(
        &self,
        request: LoadSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, Error> {
        let id = request.session_id.0.to_string();
        let agent = self.agent().await?;
        // Only an existing session of this user loads (opening would create one).
        let exists = agent
            .sessions()
            .await
            .map_err(|e| client_error(&self.config, e))?
            .iter()
            .any(|s| s.id == id);
        if !exists {
            let missing: Error =
                agent_client_protocol::v1::schema::Error::resource_not_found(Some(id.clone()))
                    .into();
            return Err(missing.data(format!("no session `{id}` to load")));
        }
        agent
            .open_session(Some(&id))
            .await
            .map_err(|e| client_error(&self.config, e))?;
        let (_, history) = agent
            .history(Some(&id))
            .await
            .map_err(|e| client_error(&self.config, e))?;
        for message in history.messages {
            let chunk = ContentChunk::new(ContentBlock::from(message.text));
            let update = match message.role {
                HistoryRole::User => SessionUpdate::UserMessageChunk(chunk),
                HistoryRole::Assistant => SessionUpdate::AgentMessageChunk(chunk),
                // The system prompt's additions are the agent's, not the conversation's.
                HistoryRole::System => continue,
            };
            cx.send_notification(SessionNotification::new(id.clone(), update))?;
        }
        self.sessions().entry(id).or_default();
        Ok(LoadSessionResponse::new())
    }

    /// Claims `session` for a prompt: the receiver fires on `session/cancel`. Called on the
    /// dispatch loop, before the turn is spawned, so that a cancel sent right after the prompt
    /// finds it.
    fn begin(&self, session: &str) -> Result<oneshot::Receiver<()>, Error> {
        self.known(session)?;
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let mut sessions = self.sessions();
        let turn = sessions.entry(session.to_owned()).or_default();
        if turn.cancel.as_ref().is_some_and(|c| !c.is_closed()) {
            return Err(Error::invalid_request()
                .data(format!("session `{session}` is already answering a prompt")));
        }
        turn.cancel = Some(cancel_tx);
        Ok(cancel_rx)
    }

    /// Runs a prompt's turn; answers when it ends or is cancelled.
    async fn prompt(
        self: Arc<Self>,
        request: PromptRequest,
        cancel_rx: oneshot::Receiver<()>,
        cx: ConnectionTo<Client>,
    ) -> Result<PromptResponse, Error> {
        let id = request.session_id.0.to_string();
        let text = translate::prompt_text(&request.prompt)
            .map_err(|why| Error::invalid_params().data(why));
        let answer = match text {
            Ok(text) => self.turn(&id, &text, cancel_rx, cx).await,
            Err(e) => Err(e),
        };
        // This turn's own sender only (its receiver is gone with the turn): after a cancel, the
        // editor's next prompt may have begun already, and its sender must stay, or a cancel
        // of that turn would do nothing.
        if let Some(turn) = self.sessions().get_mut(&id)
            && turn.cancel.as_ref().is_some_and(|c| c.is_closed())
        {
            turn.cancel = None;
        }
        answer
    }

    async fn turn(
        &self,
        id: &str,
        text: &str,
        mut cancel_rx: oneshot::Receiver<()>,
        cx: ConnectionTo<Client>,
    ) -> Result<PromptResponse, Error> {
        let id = id.to_owned();
        let cancelled = || {
            Ok(PromptResponse::new(
                agent_client_protocol::v1::schema::StopReason::Cancelled,
            ))
        };
        // A cancel while the server is being reached is answered at once (ACP: a cancelled
        // prompt answers `cancelled`), whether the connection would have come or failed.
        let agent = tokio::select! {
            biased;
            Ok(()) = &mut cancel_rx => return cancelled(),
            agent = self.agent() => agent?,
        };
        let turn_no = 1 + self
            .turns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Which of the session's workspaces are folders of this device, for the locations an
        // editor follows (none when the list cannot be had: the calls run all the same).
        let home = crate::config::canonical_home();
        let mut places = translate::Places::new(&self.config.client_name, home);
        // A cancel meanwhile is answered at once, as above.
        let listed = tokio::select! {
            biased;
            Ok(()) = &mut cancel_rx => return cancelled(),
            listed = agent.workspaces(Some(&id)) => listed,
        };
        match listed {
            Ok((_, workspaces)) => places.learn(&workspaces),
            Err(e) => debug!("no workspaces for the calls' locations: {e}"),
        }
        // Each call's arguments from its start to its end: its permission question shows them.
        let started: Arc<Mutex<HashMap<String, serde_json::Value>>> = Arc::default();
        let events = {
            let cx = cx.clone();
            let id = id.clone();
            let started = started.clone();
            let places = places.clone();
            move |event: AgentEvent| {
                let args = match &event {
                    AgentEvent::ToolCallStarted { call_id, args, .. } => {
                        lock(&started).insert(call_id.clone(), args.clone());
                        None
                    }
                    AgentEvent::ToolCallEnded { call_id, .. } => lock(&started).remove(call_id),
                    _ => None,
                };
                let event = translate::in_turn(&event, turn_no);
                let mut updates = translate::updates(&event);
                places.locate(&mut updates, &event, args.as_ref());
                for update in updates {
                    if let Err(e) =
                        cx.send_notification(SessionNotification::new(id.clone(), update))
                    {
                        debug!("cannot send a session update: {e}");
                    }
                }
            }
        };
        let permission = {
            let cx = cx.clone();
            let id = id.clone();
            let started = started.clone();
            move |event: &AgentEvent| {
                let args = match event {
                    AgentEvent::Permission { call_id, .. } => lock(&started).get(call_id).cloned(),
                    _ => None,
                };
                let event = translate::in_turn(event, turn_no);
                let asked = translate::permission_request(&id, &event, args.as_ref(), &places);
                let cx = cx.clone();
                async move {
                    let Some(asked) = asked else { return false };
                    // An editor that fails to answer rejects: the owner is not asked for it.
                    match cx.send_request(asked).block_task().await {
                        Ok(answer) => translate::allowed(&answer.outcome),
                        Err(e) => {
                            debug!("the editor did not answer a permission request: {e}");
                            false
                        }
                    }
                }
            }
        };
        let turn = agent.prompt_asking(Some(&id), text, events, permission);
        // The cancel first: one already sent is not raced by the prompt's start, which would
        // write the prompt to the server (and the conversation) after the editor cancelled it.
        let (answer, why) = tokio::select! {
            biased;
            // Dropping the turn resets its stream: the server stops the model and the tool.
            Ok(()) = &mut cancel_rx => (cancelled(), "the turn was cancelled"),
            reply = turn => match reply {
                Ok(reply) => (
                    translate::stop_reason(&reply.result.stop)
                        .map(PromptResponse::new)
                        .map_err(|why| Error::internal_error().data(why)),
                    "the turn ended",
                ),
                Err(e) => (Err(client_error(&self.config, e)), "the turn failed"),
            },
        };
        // A call the turn did not see to its end (cancelled, a time limit, a lost connection)
        // is shown ended, failed, before the prompt is answered: its card would stay pending.
        let unfinished: Vec<String> = lock(&started).drain().map(|(call, _)| call).collect();
        for call in unfinished {
            let update = translate::unfinished(turn_no, &call, why);
            if let Err(e) = cx.send_notification(SessionNotification::new(id.clone(), update)) {
                debug!("cannot send a session update: {e}");
            }
        }
        answer
    }

    fn cancel(&self, notification: &CancelNotification) {
        let id = notification.session_id.0.to_string();
        if let Some(cancel) = self.sessions().get_mut(&id).and_then(|t| t.cancel.take()) {
            let _ = cancel.send(());
        }
    }
}

/// The lock's guard, poisoned or not (what it guards stays whole: each change is one insert or
/// removal).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client failure as an ACP error, with a sentence for the editor's user.
fn client_error(config: &ClientConfig, error: ClientError) -> Error {
    match error {
        ClientError::Refused(e) => {
            Error::invalid_params().data(format!("{}: {}", e.code, e.message))
        }
        ClientError::Unreachable(why) => Error::internal_error().data(format!(
            "cannot reach the Monad server at {}: {why}",
            config.shown_servers()
        )),
        other => Error::internal_error().data(other.to_string()),
    }
}

/// Serves ACP on `output` / `input` (stdio for `monad-client acp`) until the editor closes its
/// side, or `interrupted` ends first (a signal, which this returns).
/// Either way the connection to the server is closed before this returns, so that the server
/// ends at once a turn still running and its calls (see [`crate::interrupts`]).
pub async fn serve(
    config: ClientConfig,
    output: impl tokio::io::AsyncWrite + Send + 'static,
    input: impl tokio::io::AsyncRead + Send + 'static,
    interrupted: impl std::future::Future<Output = Signal>,
) -> Result<Option<Signal>, ClientError> {
    let front = Arc::new(Front {
        config,
        agent: tokio::sync::Mutex::new(None),
        sessions: Mutex::default(),
        turns: std::sync::atomic::AtomicU64::new(0),
    });
    let ended = tokio::select! {
        served = serve_front(front.clone(), output, input) => served.map(|()| None),
        signal = interrupted => Ok(Some(signal)),
    };
    crate::agent::close_held(
        &front.agent,
        &crate::interrupts::ending(&ended, "the editor"),
    )
    .await;
    ended
}

async fn serve_front(
    front: Arc<Front>,
    output: impl tokio::io::AsyncWrite + Send + 'static,
    input: impl tokio::io::AsyncRead + Send + 'static,
) -> Result<(), ClientError> {
    let transport = ByteStreams::new(output.compat_write(), input.compat());
    let (new, load, prompt, cancel) = (front.clone(), front.clone(), front.clone(), front);
    agent_client_protocol::Agent
        .v1()
        .name("monad-client acp")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(translate::protocol_version(request.protocol_version))
                        .agent_capabilities(AgentCapabilities::new().load_session(true))
                        .agent_info(Implementation::new("monad", env!("CARGO_PKG_VERSION"))),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx| {
                let front = new.clone();
                // Off the dispatch loop: it waits on the server.
                cx.spawn(async move {
                    let _ = responder.respond_with_result(front.new_session(request).await);
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                let front = load.clone();
                let task_cx = cx.clone();
                cx.spawn(async move {
                    let _ =
                        responder.respond_with_result(front.load_session(request, &task_cx).await);
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let front = prompt.clone();
                let cancel_rx = match front.begin(&request.session_id.0) {
                    Ok(rx) => rx,
                    Err(e) => return responder.respond_with_error(e),
                };
                let task_cx = cx.clone();
                cx.spawn(async move {
                    let answer = front.prompt(request, cancel_rx, task_cx).await;
                    let _ = responder.respond_with_result(answer);
                    Ok(())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                cancel.cancel(&notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await
        .map_err(|e| ClientError::Protocol(format!("ACP connection: {e}")))
}

/// `monad-client acp`: ACP over this process's stdin and stdout; `interrupted` ends it as in
/// [`serve`] (SIGINT, SIGTERM and SIGHUP, see [`crate::interrupts`]).
pub async fn serve_stdio(
    config: ClientConfig,
    interrupted: impl std::future::Future<Output = Signal>,
) -> Result<Option<Signal>, ClientError> {
    serve(config, tokio::io::stdout(), tokio::io::stdin(), interrupted).await
}

// Keep the permission option ids in one place for the request and its answer.
pub(crate) const ALLOW: &str = "allow";
pub(crate) const REJECT: &str = "reject";

pub(crate) fn options() -> Vec<PermissionOption> {
    vec![
        PermissionOption::new(ALLOW, "Allow", PermissionOptionKind::AllowOnce),
        PermissionOption::new(REJECT, "Reject", PermissionOptionKind::RejectOnce),
    ]
}
