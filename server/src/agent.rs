//! The built-in agent loop, per session: a user message goes to the session's model with the
//! conversation and the session's tools; the model's tool calls run through the [`Executor`]
//! (routing, focus, approvals, audit: the same path as an outside agent's calls) and their
//! results go back to it until it answers. Text streams to the front as it is generated
//! ([`AgentEvent`]); `session.md` gets the user's message and each assistant message as the turn
//! goes.
//!
//! The decisions are pure and tested alone ([`plan`]: which old turns fit the context budget,
//! how many of a step's tool calls the per-turn limit allows); [`Agents::prompt`] does the I/O.
//! Cancelling is [`CancellationToken::cancel`] (or dropping the future): the model's stream and
//! any running tool call are dropped, which cancels them on every hop, and the text streamed so
//! far is kept in `session.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use monad_protocol::agent::{AgentEvent, MAX_EVENT_TEXT, StopReason, TurnResult, cut};
use monad_protocol::wire::{ChatInfo, History, HistoryMessage, HistoryRole, Outcome};
use monad_protocol::{ErrorCode, ToolError, ToolName, render};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::executor::{PermissionAsk, PermissionGate};
use crate::llm::{
    Endpoint, Event, FinishReason, HttpProvider, LlmError, Message, Provider, Request, ToolCall,
    ToolSpec,
};
use crate::server::State;
use crate::session::Session;
use crate::settings::{LlmSettings, PromptOverrides};

/// The system prompt when `llm.system_prompt` is empty.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are the agent of a Monad session. You work in the \
session's workspaces through the tools you are given: the session's primary workspace on the \
server, and folders people attached from their machines. Calls in a restricted folder wait for \
its owner's approval and may be denied; a folder whose machine is away is offline. Say briefly \
what you do, use the tools to look before you change anything, and answer in plain text.";

/// Most times a rate-limited request is asked again in one step.
const MAX_RETRIES: u32 = 3;
/// Longest `retry-after` the loop waits for; a longer one ends the turn.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(60);
/// The wait when a provider rate limits without saying for how long.
const DEFAULT_RETRY_WAIT: Duration = Duration::from_secs(1);

/// The pure decisions of the loop.
pub mod plan {
    use crate::llm::Message;

    /// A rough token count of `text` (4 bytes a token, the usual rule of thumb for English and
    /// code; a budget, not a bill).
    pub fn tokens(text: &str) -> u64 {
        (text.len() as u64).div_ceil(4)
    }

    /// The estimated tokens of one message (its text, its calls' arguments, a little framing).
    pub fn message_tokens(message: &Message) -> u64 {
        4 + match message {
            Message::User(text) => tokens(text),
            Message::Assistant { text, tool_calls } => {
                tokens(text)
                    + tool_calls
                        .iter()
                        .map(|c| tokens(&c.name) + tokens(&c.arguments.to_string()) + 4)
                        .sum::<u64>()
            }
            Message::ToolResult { call_id, text, .. } => tokens(call_id) + tokens(text),
        }
    }

    /// How many of `history`'s oldest messages to leave out so that `fixed` (the system prompt
    /// and the tools), what is kept of `history` and `current` (this turn, never trimmed) fit in
    /// `budget` tokens. Whole turns go: the kept part starts at a user message (or is empty),
    /// even when everything fits.
    /// When even `current` alone does not fit, all of `history` is left out and the rest is sent
    /// as it is (the provider says if it is too long).
    pub fn trim(fixed: u64, history: &[Message], current: &[Message], budget: u64) -> usize {
        let current: u64 = current.iter().map(message_tokens).sum();
        let mut total = fixed + current + history.iter().map(message_tokens).sum::<u64>();
        let mut start = 0;
        while total > budget && start < history.len() {
            // Drop the oldest turn: up to the next user message after `start`.
            let end = history[start + 1..]
                .iter()
                .position(|m| matches!(m, Message::User(_)))
                .map_or(history.len(), |i| start + 1 + i);
            total -= history[start..end].iter().map(message_tokens).sum::<u64>();
            start = end;
        }
        // What is kept starts at a user message, as providers require: a conversation cleared
        // while a turn ran keeps that turn's answer at its head, with no question before it.
        while start < history.len() && !matches!(history[start], Message::User(_)) {
            start += 1;
        }
        start
    }

    /// The estimated tokens of what every request carries: the system prompt and the tools.
    pub fn fixed_tokens(system: &str, tools: &[crate::llm::ToolSpec]) -> u64 {
        tokens(system)
            + tools
                .iter()
                .map(|t| {
                    tokens(&t.name) + tokens(&t.description) + tokens(&t.parameters.to_string())
                })
                .sum::<u64>()
    }

    /// Of `requested` tool calls, how many may run when `done` ran already this turn and `limit`
    /// is the most per turn.
    pub fn allowed_calls(done: u32, requested: usize, limit: u32) -> usize {
        requested.min(limit.saturating_sub(done) as usize)
    }
}

/// The tools the model is offered: the same names, descriptions and schemas as the MCP front's,
/// for the session's current workspaces.
pub fn tool_specs(session: &Session) -> Vec<ToolSpec> {
    let workspaces: Vec<_> = session.workspaces().into_iter().map(|w| w.info).collect();
    monad_protocol::mcp::tools(&workspaces)
        .into_iter()
        .map(|tool| ToolSpec {
            name: tool.name.to_string(),
            description: tool.description.map(|d| d.to_string()).unwrap_or_default(),
            parameters: Value::Object((*tool.input_schema).clone()),
        })
        .collect()
}

/// The system prompt `llm` asks for (before the conversation's `## System` blocks).
fn system_prompt(llm: &LlmSettings) -> String {
    if llm.system_prompt.is_empty() {
        DEFAULT_SYSTEM_PROMPT.to_owned()
    } else {
        llm.system_prompt.clone()
    }
}

/// `session.md`'s conversation as the model gets it: `## System` blocks added to `system`, the
/// user and assistant messages in order.
fn conversation(mut system: String, history: History) -> (String, Vec<Message>) {
    let mut messages = Vec::new();
    for m in history.messages {
        match m.role {
            HistoryRole::User => messages.push(Message::User(m.text)),
            HistoryRole::Assistant => messages.push(Message::Assistant {
                text: m.text,
                tool_calls: Vec::new(),
            }),
            HistoryRole::System => {
                system.push_str("\n\n");
                system.push_str(&m.text);
            }
        }
    }
    (system, messages)
}

/// What the chat front shows about `session`'s agent with `history` as its conversation: the
/// effective provider and model, the message counts, and how many of the conversation's
/// messages the next turn would send (the same trimming as [`Agents::prompt`], the next
/// message not counted).
pub fn chat_info(session: &Session, history: History) -> ChatInfo {
    let llm = &session.settings.llm;
    let messages = history.messages.len() as u64;
    let (system, conversation) = conversation(system_prompt(llm), history);
    let fixed = plan::fixed_tokens(&system, &tool_specs(session));
    let start = plan::trim(fixed, &conversation, &[], llm.context_budget_tokens);
    ChatInfo {
        session: session.id.clone(),
        provider: llm.provider.as_str().to_owned(),
        model: llm.model.clone(),
        messages,
        context_messages: (conversation.len() - start) as u64,
        conversation_messages: conversation.len() as u64,
        workspaces: session.workspaces().into_iter().map(|w| w.info).collect(),
    }
}

/// A call's answer as the model gets it: the text `render::text` writes, or the error sentence
/// (with the workspace, like the MCP front's).
pub fn result_text(
    tool: &str,
    workspace: Option<&monad_protocol::wire::WorkspaceRef>,
    outcome: &Outcome,
) -> (String, Option<ToolError>) {
    match outcome {
        Outcome::Ok { result } => match ToolName::parse(tool) {
            Some(name) => (render::text(name, workspace, &result.value()), None),
            None => (result.value().to_string(), None),
        },
        Outcome::Error { error } => {
            let place = render::in_workspace(workspace);
            // Said plainly for the model: the conversation goes on without that machine.
            let away = if error.code == ErrorCode::WorkspaceDisconnected {
                " That workspace is offline: its machine is away. Carry on without it, or ask \
                 the user to bring it back."
            } else {
                ""
            };
            (
                format!("{}: {}{place}{away}", error.code, error.message),
                Some(error.clone()),
            )
        }
    }
}

/// The front a turn's user works in, when it can approve or reject restricted calls itself (an
/// ACP editor through `monad-client acp`): asked, with the call's id, before a call runs in a
/// restricted workspace. `false` denies the call without asking the folder's owner; `true` lets
/// it go on to the owner's own policy and prompt.
pub trait FrontPermission: Send + Sync {
    /// Whether the front's user allows call `call_id`.
    fn ask(
        &self,
        call_id: String,
        ask: PermissionAsk,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>>;
}

/// A [`FrontPermission`] as the executor's gate for one call.
struct CallGate<'a> {
    front: &'a dyn FrontPermission,
    call_id: &'a str,
}

impl PermissionGate for CallGate<'_> {
    fn ask(
        &self,
        ask: PermissionAsk,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        self.front.ask(self.call_id.to_owned(), ask)
    }
}

/// Sessions with a turn running (one at a time per session).
#[derive(Debug, Default)]
pub struct Agents {
    turns: Mutex<HashMap<String, Arc<TurnSlot>>>,
    providers: Providers,
}

/// Provider clients kept across turns: building one (its TLS set-up loads the system's root
/// certificates) costs more than a whole turn against a local model, and a kept client reuses
/// its connections. A few endpoints at most (most recently used last).
#[derive(Default)]
struct Providers(Mutex<Vec<(Endpoint, Arc<HttpProvider>)>>);

/// Endpoints a server keeps clients for at once.
const KEPT_PROVIDERS: usize = 8;

impl std::fmt::Debug for Providers {
    // Endpoints hold keys: only their count is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Providers({})", lock(&self.0).len())
    }
}

impl Providers {
    /// The client for `endpoint`, made on first use.
    fn get(&self, endpoint: Endpoint) -> Result<Arc<HttpProvider>, LlmError> {
        let mut kept = lock(&self.0);
        if let Some(i) = kept.iter().position(|(e, _)| *e == endpoint) {
            let entry = kept.remove(i);
            let provider = entry.1.clone();
            kept.push(entry);
            return Ok(provider);
        }
        let provider = Arc::new(HttpProvider::new(endpoint.clone())?);
        if kept.len() >= KEPT_PROVIDERS {
            kept.remove(0);
        }
        kept.push((endpoint, provider.clone()));
        Ok(provider)
    }
}

/// A session's turn: held while one runs, with the running turn's cancel token.
#[derive(Debug, Default)]
struct TurnSlot {
    running: Arc<tokio::sync::Mutex<()>>,
    cancel: Mutex<Option<CancellationToken>>,
    /// A message waits for the cancelled turn to end: another is refused, as while a turn
    /// runs, rather than queued behind both.
    waiting: std::sync::atomic::AtomicBool,
}

/// A message's wait for a cancelled turn to end; its end lets another message wait.
struct Waiting(Arc<TurnSlot>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0
            .waiting
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The right to run a turn in a session; the slot is forgotten when nobody holds or waits for it.
struct Claim<'a> {
    agents: &'a Agents,
    session: String,
    slot: Arc<TurnSlot>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut turns = lock(&self.agents.turns);
        // The map's reference and this one: nobody else holds or waits for the slot.
        if Arc::strong_count(&self.slot) == 2 {
            turns.remove(&self.session);
        }
    }
}

/// Text streamed in the current step but not yet in `session.md` (kept there if the turn is
/// cancelled mid-answer).
type Pending = Arc<Mutex<String>>;

impl Agents {
    /// Claims `session` for a turn cancelled by `cancel`. `None` when a turn is running there;
    /// when that turn was cancelled and is winding down (saving what it said), waits for it, so
    /// that a message sent right after a cancel is not refused.
    async fn claim(&self, session: &str, cancel: &CancellationToken) -> Option<Claim<'_>> {
        let slot = lock(&self.turns)
            .entry(session.to_owned())
            .or_default()
            .clone();
        let mut claim = Claim {
            agents: self,
            session: session.to_owned(),
            slot,
            guard: None,
        };
        let guard = match claim.slot.running.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                let winding_down = lock(&claim.slot.cancel)
                    .as_ref()
                    .is_none_or(CancellationToken::is_cancelled);
                if !winding_down
                    || claim
                        .slot
                        .waiting
                        .swap(true, std::sync::atomic::Ordering::SeqCst)
                {
                    return None;
                }
                let _waiting = Waiting(claim.slot.clone());
                claim.slot.running.clone().lock_owned().await
            }
        };
        claim.guard = Some(guard);
        *lock(&claim.slot.cancel) = Some(cancel.clone());
        Some(claim)
    }

    /// Runs one turn of `session`'s agent for `user`'s message (its text, and the model and base
    /// URL it asks for), sending what happens to `events`, until the model answers, a limit is
    /// reached, the provider fails or `cancel` fires. Fails at once (nothing written) when a
    /// turn of this session is already running (one that was cancelled and is ending is waited
    /// for), or when the message asks for a base URL the operator did not allow. With `front`,
    /// calls routed to a restricted workspace ask it first (see [`FrontPermission`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn prompt(
        &self,
        state: &State,
        session: &Arc<Session>,
        (user, token): (&str, Option<&str>),
        (text, overrides): (String, &PromptOverrides),
        events: mpsc::Sender<AgentEvent>,
        cancel: CancellationToken,
        front: Option<&dyn FrontPermission>,
    ) -> Result<TurnResult, ToolError> {
        let llm = &session
            .settings
            .llm
            .for_prompt(overrides)
            .map_err(|message| ToolError::new(ErrorCode::Denied, message))?;
        let Some(_claim) = self.claim(&session.id, &cancel).await else {
            return Err(ToolError::new(
                ErrorCode::LimitExceeded,
                format!(
                    "session `{}` is already answering a message; wait for it or cancel it",
                    session.id
                ),
            ));
        };
        // After the claim, which waits for a cancelled turn of this session to wind down
        // (declared after it, so given back before it: the turn the claim wakes finds it free).
        let _turn = state.agent_turn(user)?;
        let provider = match llm
            .endpoint(|name| std::env::var(name).ok())
            .and_then(|endpoint| self.providers.get(endpoint))
        {
            Ok(provider) => provider,
            Err(e) => return Ok(failed(&e, &Tally::default())),
        };
        let _in_flight = state.call_in_flight();
        // A conversation is activity, as a tool call is: a session used only to talk (or
        // whose turns ran no tool) kept its old `last_active`, and retention deleted it.
        crate::requests::touch(state, session);
        let pending: Pending = Arc::default();
        // Dropped mid-turn (its connection gone, its task aborted), the turn still keeps what
        // the model said; on the paths below, `pending` is emptied first and this does nothing.
        let _keep = KeepSaid {
            store: state.registry.store().clone(),
            session: session.id.clone(),
            pending: pending.clone(),
        };
        let tally = Mutex::new(Tally::default());
        let turn = Turn {
            state,
            session,
            user,
            token,
            llm,
            provider: &*provider,
            events: &events,
            pending: pending.clone(),
            tally: &tally,
            front,
            front_ids: Mutex::default(),
        };
        let deadline = llm.max_turn_secs.max(1);
        let result = tokio::select! {
            result = turn.run(text) => result,
            () = cancel.cancelled() => TurnResult {
                stop: StopReason::Cancelled,
                ..lock(&tally).result()
            },
            () = tokio::time::sleep(Duration::from_secs(deadline)) => TurnResult {
                stop: StopReason::Failed {
                    message: format!(
                        "the turn ran for its longest, {deadline} s (llm.max_turn_secs), and was \
                         stopped; what the model said so far is kept"
                    ),
                },
                ..lock(&tally).result()
            },
        };
        // What the model said before a cancel or a broken stream stays in the conversation.
        let rest = std::mem::take(&mut *lock(&pending));
        if !rest.is_empty() {
            let _ = append(state, &session.id, HistoryRole::Assistant, rest).await;
        }
        crate::requests::touch(state, session);
        Ok(result)
    }
}

/// What the model said and nothing has saved yet, written to the session's history when the
/// turn's future is dropped before it could (see [`Agents::prompt`]). The write runs on the
/// blocking pool, so it does not depend on the dropped task; without a runtime (a test's
/// shutdown), right here.
struct KeepSaid {
    store: Arc<dyn crate::store::Store>,
    session: String,
    pending: Pending,
}

impl Drop for KeepSaid {
    fn drop(&mut self) {
        let said = std::mem::take(&mut *lock(&self.pending));
        if said.is_empty() {
            return;
        }
        let (store, session) = (self.store.clone(), self.session.clone());
        let save = move || {
            if let Err(e) = append_now(store.as_ref(), &session, HistoryRole::Assistant, said) {
                warn!(%session, "cannot keep what the model said before the turn was dropped: {e}");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(save)),
            Err(_) => save(),
        }
    }
}

/// Counts over a turn.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    tool_calls: u32,
    input_tokens: u64,
    output_tokens: u64,
}

impl Tally {
    fn result(&self) -> TurnResult {
        TurnResult {
            stop: StopReason::Answered,
            tool_calls: self.tool_calls,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
        }
    }
}

/// The answer to a call cut off by the output limit: it did not run, and what to do instead.
fn cut_short_call(limit: u32) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!(
            "this call was cut off: your answer reached its output limit ({limit} tokens, \
             llm.max_output_tokens) before the call's arguments ended, so it did not run. Send \
             less in one call: write a large file in parts (write_file a first part, then \
             edit_file to add the rest), or make several smaller edits"
        ),
    )
}

fn failed(error: &LlmError, tally: &Tally) -> TurnResult {
    TurnResult {
        stop: StopReason::Failed {
            message: error.to_string(),
        },
        ..tally.result()
    }
}

async fn append(
    state: &State,
    session: &str,
    role: HistoryRole,
    text: String,
) -> Result<(), String> {
    let store = state.registry.store().clone();
    let session = session.to_owned();
    tokio::task::spawn_blocking(move || append_now(store.as_ref(), &session, role, text))
        .await
        .map_err(|e| e.to_string())?
}

/// Appends a message to a session's history, on this thread (blocking).
fn append_now(
    store: &dyn crate::store::Store,
    session: &str,
    role: HistoryRole,
    text: String,
) -> Result<(), String> {
    store
        .append(session, &HistoryMessage { role, text })
        .map_err(|e| e.to_string())
}

struct Turn<'a> {
    state: &'a State,
    session: &'a Arc<Session>,
    user: &'a str,
    /// The hash of the token the turn was asked for with: a process its calls leave running
    /// ends when that token is revoked.
    token: Option<&'a str>,
    llm: &'a LlmSettings,
    provider: &'a dyn Provider,
    events: &'a mpsc::Sender<AgentEvent>,
    pending: Pending,
    tally: &'a Mutex<Tally>,
    front: Option<&'a dyn FrontPermission>,
    /// The ids the turn's calls went to its front by ([`Turn::front_id`]).
    front_ids: Mutex<std::collections::HashSet<String>>,
}

/// About what `value` takes in memory as a tree: [`monad_protocol::values::VALUE_BYTES`] a
/// value, and the bytes of its strings and keys.
fn tree_size(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    let mut size = 0usize;
    let mut left = vec![value];
    while let Some(value) = left.pop() {
        size = size.saturating_add(monad_protocol::values::VALUE_BYTES);
        match value {
            Value::String(s) => size = size.saturating_add(s.len()),
            Value::Array(items) => left.extend(items),
            Value::Object(map) => {
                for (key, item) in map {
                    size = size.saturating_add(key.len() + monad_protocol::values::VALUE_BYTES);
                    left.push(item);
                }
            }
            _ => {}
        }
    }
    size
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one model request gave.
struct Step {
    text: String,
    calls: Vec<ToolCall>,
    finish: FinishReason,
}

impl Turn<'_> {
    async fn run(&self, text: String) -> TurnResult {
        let tally = || *lock(self.tally);
        let (system, history) = match self.prepare().await {
            Ok(loaded) => loaded,
            Err(message) => {
                return TurnResult {
                    stop: StopReason::Failed { message },
                    ..tally().result()
                };
            }
        };
        if let Err(message) = append(
            self.state,
            &self.session.id,
            HistoryRole::User,
            text.clone(),
        )
        .await
        {
            return TurnResult {
                stop: StopReason::Failed {
                    message: format!("cannot write session.md: {message}"),
                },
                ..tally().result()
            };
        }
        let mut current = vec![Message::User(text)];
        // What the turn holds (the model's calls, the tools' answers), counted against what
        // the user's calls may hold at once: the turn is sent again whole at each step, so a
        // model writing large arguments step after step (or a provider that sends them) would
        // otherwise grow it without a bound but the step limit's.
        let turn_memory = self.state.call_bytes.holder(self.user);
        let too_large = |tally: Tally| TurnResult {
            stop: StopReason::Failed {
                message: "the turn's tool calls and their answers hold more than this server \
                          lets your calls hold at once (server.max_call_bytes_per_user): ask \
                          for less at a time"
                    .to_owned(),
            },
            ..tally.result()
        };
        loop {
            let tools = tool_specs(self.session);
            let fixed = plan::fixed_tokens(&system, &tools);
            let start = plan::trim(fixed, &history, &current, self.llm.context_budget_tokens);
            let mut messages = history[start..].to_vec();
            messages.extend(current.iter().cloned());
            let request = Request {
                model: self.llm.model.clone(),
                system: system.clone(),
                messages,
                tools,
                max_output_tokens: self.llm.max_output_tokens.max(1),
            };
            let step = match self.step(&request).await {
                Ok(step) => step,
                Err(e) => return failed(&e, &tally()),
            };
            // The step's text is now in the conversation for good.
            let said = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if !said.is_empty()
                && let Err(message) =
                    append(self.state, &self.session.id, HistoryRole::Assistant, said).await
            {
                return TurnResult {
                    stop: StopReason::Failed {
                        message: format!("cannot write session.md: {message}"),
                    },
                    ..tally().result()
                };
            }
            // The provider's numbers: saturated, so that made-up ones cannot wrap past the bound.
            let used = tally().input_tokens.saturating_add(tally().output_tokens);
            if used > self.llm.max_tokens_per_turn {
                return TurnResult {
                    stop: StopReason::TokenLimit {
                        limit: self.llm.max_tokens_per_turn,
                    },
                    ..tally().result()
                };
            }
            if step.calls.is_empty() {
                let stop = match step.finish {
                    FinishReason::Stop | FinishReason::ToolCalls | FinishReason::Other(_) => {
                        StopReason::Answered
                    }
                    FinishReason::Length => StopReason::Length,
                    FinishReason::Refused(message) => StopReason::Refused { message },
                };
                return TurnResult {
                    stop,
                    ..tally().result()
                };
            }
            let calls_size: usize = step
                .calls
                .iter()
                .map(|c| tree_size(&c.arguments) + c.name.len() + c.id.len())
                .sum();
            if !turn_memory.take(calls_size.saturating_add(step.text.len())) {
                return too_large(tally());
            }
            let allowed = plan::allowed_calls(
                tally().tool_calls,
                step.calls.len(),
                self.llm.max_tool_calls_per_turn,
            );
            // Each call goes by one id everywhere: the model's own unless it gave none or
            // reused one (a provider refuses the next request over an empty or repeated id).
            let mut calls = step.calls;
            for call in &mut calls {
                call.id = self.front_id(&call.id);
            }
            // An answer cut at the output limit ends inside its last call's arguments, which
            // do not parse, or before any of them came (read as `{}`: run, a call would do what
            // the model never asked): such a call runs nothing, and the model is told why.
            let cut_short = matches!(step.finish, FinishReason::Length);
            let last = calls.len().saturating_sub(1);
            current.push(Message::Assistant {
                text: step.text,
                tool_calls: calls.clone(),
            });
            for (i, call) in calls[..allowed].iter().enumerate() {
                lock(self.tally).tool_calls += 1;
                let whole = match &call.arguments {
                    Value::Object(fields) => i < last || !fields.is_empty(),
                    _ => false,
                };
                let refused =
                    (cut_short && !whole).then(|| cut_short_call(self.llm.max_output_tokens));
                let (text, is_error) = self.run_call(call, refused).await;
                if !turn_memory.take(text.len()) {
                    return too_large(tally());
                }
                current.push(Message::ToolResult {
                    call_id: call.id.clone(),
                    text,
                    is_error,
                });
            }
            if allowed < calls.len() {
                return TurnResult {
                    stop: StopReason::ToolCallLimit {
                        limit: self.llm.max_tool_calls_per_turn,
                    },
                    ..tally().result()
                };
            }
        }
    }

    /// The system prompt (with the conversation's `## System` blocks) and the earlier turns;
    /// records the provider and model in the session and `session.md`'s frontmatter.
    async fn prepare(&self) -> Result<(String, Vec<Message>), String> {
        let store = self.state.registry.store().clone();
        let recorder = self.state.executor.recorder.clone();
        let session = self.session.clone();
        let provider = self.provider.kind().as_str().to_owned();
        let model = self.llm.model.clone();
        let system = system_prompt(self.llm);
        let history = tokio::task::spawn_blocking(move || {
            let mut history = store.history(&session.id).map_err(|e| e.to_string())?;
            if history.provider.as_deref() != Some(&provider)
                || history.model.as_deref() != Some(&model)
            {
                let meta = session.set_model(Some(provider.clone()), Some(model.clone()));
                crate::recorder::Recorder::save_after(recorder.as_ref(), store.as_ref(), &meta)
                    .map_err(|e| e.to_string())?;
                // Only the frontmatter: a message appended since the read above stays.
                store
                    .set_history_model(&session.id, Some(&provider), Some(&model))
                    .map_err(|e| e.to_string())?;
                history.provider = Some(provider);
                history.model = Some(model);
            }
            Ok::<_, String>(history)
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok(conversation(system, history))
    }

    /// One model request, streamed; rate limits are waited out and asked again, whether the
    /// provider refuses the request (HTTP 429, Anthropic's 529) or says so in the stream before
    /// anything of the answer (Anthropic's `overloaded_error`). After some of the answer was
    /// shown, asking again would show it twice: the turn fails.
    async fn step(&self, request: &Request) -> Result<Step, LlmError> {
        let mut retries = 0;
        loop {
            let mut shown = false;
            match self.attempt(request, &mut shown).await {
                Err(LlmError::RateLimited {
                    retry_after,
                    message,
                }) if !shown
                    && retries < MAX_RETRIES
                    && retry_after.is_none_or(|d| d <= MAX_RETRY_WAIT) =>
                {
                    retries += 1;
                    let wait = retry_after.unwrap_or(DEFAULT_RETRY_WAIT);
                    let _ = self
                        .events
                        .send(AgentEvent::Retrying {
                            after_ms: wait.as_millis() as u64,
                            message,
                        })
                        .await;
                    tokio::time::sleep(wait).await;
                }
                answer => return answer,
            }
        }
    }

    /// One model request and its answer; `shown` is set once some of it went to the front.
    async fn attempt(&self, request: &Request, shown: &mut bool) -> Result<Step, LlmError> {
        let mut stream = self.provider.stream(request).await?;
        let mut step = Step {
            text: String::new(),
            calls: Vec::new(),
            finish: FinishReason::Stop,
        };
        while let Some(event) = stream.next().await {
            match event? {
                Event::Text(text) => {
                    *shown = true;
                    step.text.push_str(&text);
                    self.pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_str(&text);
                    let _ = self.events.send(AgentEvent::Text { text }).await;
                }
                // Its id goes to the front with a permission request and comes back with the
                // answer, which is read up to a bound: a longer one could never be answered.
                Event::ToolCall(call) if call.id.len() > monad_protocol::wire::MAX_CALL_ID_LEN => {
                    return Err(LlmError::Protocol(format!(
                        "a tool call whose id is over {} bytes",
                        monad_protocol::wire::MAX_CALL_ID_LEN
                    )));
                }
                Event::ToolCall(call) => {
                    *shown = true;
                    step.calls.push(call);
                }
                Event::Usage(usage) => {
                    let mut tally = lock(self.tally);
                    tally.input_tokens = tally.input_tokens.saturating_add(usage.input_tokens);
                    tally.output_tokens = tally.output_tokens.saturating_add(usage.output_tokens);
                }
                Event::Finish(reason) => step.finish = reason,
            }
        }
        Ok(step)
    }

    /// The id the call the model named `id` goes by, to the front and back to the model: the
    /// model's own, unless the model gave none or one of this turn's calls went by it already
    /// (a model's ids are its own to make): then one of the turn's own. A front's answer is
    /// matched to its question by this id, so an editor's late "allow" for one call never
    /// reaches another that reused its id.
    fn front_id(&self, id: &str) -> String {
        let mut used = lock(&self.front_ids);
        let mut front = id.to_owned();
        let mut n = used.len();
        while front.is_empty() || used.contains(&front) {
            n += 1;
            front = format!("monad-call-{n}");
        }
        used.insert(front.clone());
        front
    }

    /// Runs one tool call through the executor (or answers it with `refused`, running
    /// nothing); its text for the model and whether it failed. Its id is the turn's own
    /// ([`Turn::front_id`]).
    async fn run_call(&self, call: &ToolCall, refused: Option<ToolError>) -> (String, bool) {
        let front_id = call.id.clone();
        let _ = self
            .events
            .send(AgentEvent::ToolCallStarted {
                call_id: front_id.clone(),
                tool: call.name.clone(),
                args: call.arguments.clone(),
            })
            .await;
        // What the answer holds in memory counts until its text is made.
        let memory = Arc::new(self.state.call_bytes.holder(self.user));
        let slot = match refused {
            Some(error) => Err(error),
            None => self.state.tool_call(self.user),
        };
        let (workspace, outcome) = match slot {
            Ok(_slot) => {
                // Progress is best effort: a front that does not keep up misses some lines.
                let events = self.events.clone();
                let call_id = front_id.clone();
                let progress = move |message: &str| {
                    let _ = events.try_send(AgentEvent::ToolCallProgress {
                        call_id: call_id.clone(),
                        message: message.to_owned(),
                    });
                };
                let gate = self.front.map(|front| CallGate {
                    front,
                    call_id: &front_id,
                });
                let background = crate::state::may_outlive_its_call(&call.name, &call.arguments);
                let call = self.state.executor.call_gated(
                    self.session,
                    &call.name,
                    call.arguments.clone(),
                    &progress,
                    gate.as_ref().map(|g| g as &dyn PermissionGate),
                );
                let output = crate::executor::link::counted(&memory, call).await;
                if let Some(token) = self.token.filter(|_| background) {
                    self.state
                        .note_started(token, self.user, self.session, &output)
                        .await;
                }
                let (workspace, outcome) = output.complete().await;
                // Its text is made from a tree of the result: counted first.
                (workspace, crate::state::tree_held(&memory, outcome))
            }
            Err(error) => (None, Outcome::Error { error }),
        };
        let (text, error) = result_text(&call.name, workspace.as_ref(), &outcome);
        let (shown, truncated) = cut(&text, MAX_EVENT_TEXT);
        let is_error = error.is_some();
        let _ = self
            .events
            .send(AgentEvent::ToolCallEnded {
                call_id: front_id,
                tool: call.name.clone(),
                workspace,
                error,
                text: shown,
                truncated,
            })
            .await;
        (text, is_error)
    }
}

#[cfg(test)]
mod claim_tests {
    use super::*;

    /// Regression: two messages sent while a cancelled turn was ending both waited for it, and
    /// the second then waited for the first one's whole turn, its stream silent, instead of
    /// being refused as while a turn runs. One waits; another is refused; once the first is
    /// answered, the session takes messages again.
    #[tokio::test]
    async fn one_message_waits_for_a_cancelled_turn_and_another_is_refused() {
        let agents = Agents::default();
        let first = CancellationToken::new();
        let running = agents.claim("s", &first).await.expect("the first turn");
        first.cancel();
        let second = CancellationToken::new();
        let waits = agents.claim("s", &second);
        tokio::pin!(waits);
        assert!(
            futures_util::poll!(waits.as_mut()).is_pending(),
            "a message after a cancel waits"
        );
        let third = CancellationToken::new();
        let refused = tokio::time::timeout(Duration::from_secs(5), agents.claim("s", &third));
        assert!(
            refused.await.expect("answered at once").is_none(),
            "a second one is refused"
        );
        drop(running);
        let next = waits.await.expect("the waiting message's turn");
        drop(next);
        assert!(agents.claim("s", &CancellationToken::new()).await.is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::plan::*;
    use crate::llm::{Message, ToolCall};
    use serde_json::json;

    fn user(n: usize) -> Message {
        Message::User("u".repeat(n))
    }

    fn assistant(n: usize) -> Message {
        Message::Assistant {
            text: "a".repeat(n),
            tool_calls: vec![],
        }
    }

    #[test]
    fn everything_is_kept_when_it_fits() {
        let history = [user(40), assistant(40)];
        assert_eq!(trim(10, &history, &[user(4)], 1000), 0);
        assert_eq!(trim(10, &[], &[user(4)], 1000), 0);
    }

    #[test]
    fn the_oldest_whole_turns_go_first() {
        // Each message is 4 + 10 = 14 tokens; a turn (user, assistant, assistant) is 42.
        let history = [
            user(40),
            assistant(40),
            assistant(40),
            user(40),
            assistant(40),
            user(40),
            assistant(40),
        ];
        let current = [user(40)];
        // fixed 10 + current 14 + history 98 = 122.
        assert_eq!(trim(10, &history, &current, 122), 0);
        assert_eq!(
            trim(10, &history, &current, 121),
            3,
            "the first turn goes whole"
        );
        assert_eq!(trim(10, &history, &current, 80), 3);
        assert_eq!(trim(10, &history, &current, 79), 5);
        assert_eq!(trim(10, &history, &current, 24), 7, "all of history");
    }

    #[test]
    fn the_current_turn_and_the_system_prompt_are_never_trimmed() {
        let history = [user(40), assistant(40)];
        let current = [
            user(400),
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c".into(),
                    name: "read_file".into(),
                    arguments: json!({"path": "a"}),
                }],
            },
            Message::ToolResult {
                call_id: "c".into(),
                text: "x".repeat(4000),
                is_error: false,
            },
        ];
        // Over budget even alone: history goes, the rest is sent as it is.
        assert_eq!(trim(5000, &history, &current, 100), 2);
    }

    #[test]
    fn a_history_that_starts_with_an_assistant_message_trims_to_the_next_user_message() {
        let history = [assistant(40), assistant(40), user(40), assistant(40)];
        assert_eq!(trim(0, &history, &[], 28), 2);
        // Regression: within the budget, such a head was kept (a conversation cleared while a
        // turn ran begins with that turn's answer), and a provider refuses a request that does
        // not start with the user.
        assert_eq!(trim(0, &history, &[], 10_000), 2);
        assert_eq!(trim(0, &[assistant(4)], &[], 10_000), 1);
    }

    #[test]
    fn the_tool_call_limit_counts_over_the_turn() {
        assert_eq!(allowed_calls(0, 3, 50), 3);
        assert_eq!(allowed_calls(48, 3, 50), 2);
        assert_eq!(allowed_calls(50, 1, 50), 0);
        assert_eq!(allowed_calls(60, 1, 50), 0);
        assert_eq!(allowed_calls(0, 2, 0), 0);
    }

    #[test]
    fn results_reach_the_model_as_text_and_an_offline_workspace_says_so() {
        use super::result_text;
        use monad_protocol::wire::{Outcome, WorkspaceRef};
        use monad_protocol::{ErrorCode, ToolError};
        let lap = WorkspaceRef {
            name: "lap".into(),
            uri: "laptop:~/notes".into(),
        };
        let away = ToolError::new(
            ErrorCode::WorkspaceDisconnected,
            "workspace `lap` is disconnected",
        );
        let (text, error) = result_text(
            "read_file",
            Some(&lap),
            &Outcome::Error {
                error: away.clone(),
            },
        );
        assert_eq!(error, Some(away));
        assert!(text.starts_with("workspace_disconnected: workspace `lap` is disconnected (in workspace `lap`, laptop:~/notes)"), "{text}");
        assert!(text.contains("offline"), "{text}");
        let denied = ToolError::new(ErrorCode::Denied, "the user said no");
        let (text, _) = result_text("read_file", None, &Outcome::Error { error: denied });
        assert_eq!(text, "denied: the user said no");
        let result = json!({"path": "a.txt", "content": "alpha\n", "lines": 1, "total_lines": 1, "truncated": false});
        let ok = Outcome::Ok {
            result: result.clone().into(),
        };
        let (text, error) = result_text("read_file", Some(&lap), &ok);
        assert_eq!(error, None);
        assert_eq!(
            text,
            monad_protocol::render::text(monad_protocol::ToolName::ReadFile, Some(&lap), &result)
        );
        assert!(text.contains("alpha"), "{text}");
    }

    #[test]
    fn token_estimates_round_up() {
        assert_eq!(tokens(""), 0);
        assert_eq!(tokens("abc"), 1);
        assert_eq!(tokens("abcde"), 2);
    }
}
