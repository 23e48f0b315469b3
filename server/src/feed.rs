//! The live feed of what happens in sessions: tool calls (with who decided and how they ended),
//! conversation changes and new artifacts, as the store writes them. The HTTP front streams it
//! as server-sent events (`GET /api/v1/sessions/{id}/events`) and the web view follows it.
//!
//! [`crate::store::observed::Observed`] publishes here after each write succeeds, so a
//! subscriber that reads the store on an event sees what the event announced. Calls in
//! progress are published by the executor as they go ([`LiveCall`]), before their record.
//!
//! A session nobody follows costs a look-up per event and nothing else: events are built only
//! for a session with a follower ([`Feed::publish_with`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use monad_protocol::ToolName;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::session::Session;
use crate::store::{ArtifactMeta, AuditRecord, Decider, HistoryMessage};

/// Events a subscriber may fall behind by before it is told it lagged.
const BACKLOG: usize = 256;

/// Longest text of a message event, in bytes. A session's channel holds its last [`BACKLOG`]
/// events for as long as one follower has not read them: with messages of up to 8 MiB whole,
/// a follower that stopped reading held 2 GiB per session it followed. Past it, the event says
/// how much was cut off, and the conversation has it all.
pub const MAX_MESSAGE_TEXT: usize = 16 * 1024;

/// Most bytes of an upload's metadata (as JSON) an artifact's event carries; past it the event
/// leaves the metadata out, and says so. A session's last [`BACKLOG`] events stay in memory
/// until every follower has read them: events of uploads with 64 KiB of metadata each (a tree
/// of a megabyte in memory) held gigabytes for a few followed sessions.
pub const MAX_EVENT_METADATA: usize = 4 * 1024;

/// Longest target of a call's events (its steps and its record), in bytes: a command line may
/// be megabytes, which a session's channel would hold [`BACKLOG`] times over for a follower
/// that stopped reading. The audit log keeps more of it (`executor::record::MAX_TARGET`).
pub const MAX_EVENT_TARGET: usize = 4096;

/// A call's target as its events carry it: its first [`MAX_EVENT_TARGET`] bytes, then how many
/// more the recorded target has (the audit record has them, and says how much more the call's
/// whole target had). The same for a call's steps and its record, so that a follower matches
/// them.
pub fn event_target(target: &str) -> String {
    let head = monad_protocol::text::head(target, MAX_EVENT_TARGET);
    if head.len() == target.len() {
        target.to_owned()
    } else {
        format!("{head}\u{2026} ({} bytes more)", target.len() - head.len())
    }
}

impl Event {
    /// The event of a call's record: its target as [`event_target`] cuts it.
    pub fn call(record: &AuditRecord) -> Event {
        Event::Call {
            record: AuditRecord {
                target: event_target(&record.target),
                ..record.clone()
            },
        }
    }

    /// The event of an artifact stored: its record, without an upload's metadata past
    /// [`MAX_EVENT_METADATA`] bytes as JSON (its listing has it).
    pub fn artifact(meta: &ArtifactMeta) -> Event {
        let mut meta = meta.clone();
        let large = meta.upload.as_ref().is_some_and(|upload| {
            !upload.metadata.is_empty()
                && serde_json::to_vec(&upload.metadata)
                    .map_or(true, |json| json.len() > MAX_EVENT_METADATA)
        });
        if large && let Some(upload) = meta.upload.as_mut() {
            upload.metadata = serde_json::Map::new();
        }
        Event::Artifact {
            meta: Box::new(meta),
            metadata_left_out: large,
        }
    }

    /// The event of a message appended: its text cut to [`MAX_MESSAGE_TEXT`].
    pub fn message(message: &HistoryMessage) -> Event {
        let text = monad_protocol::text::head(&message.text, MAX_MESSAGE_TEXT);
        Event::Message {
            left_out: message.text.len() - text.len(),
            message: HistoryMessage {
                role: message.role,
                text: text.to_owned(),
            },
        }
    }
}

/// One thing that happened in a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A tool call ended (or was refused): its audit line.
    Call {
        /// The audit record.
        record: AuditRecord,
    },
    /// A message was appended to the conversation.
    Message {
        /// The message, its text cut to [`MAX_MESSAGE_TEXT`] bytes.
        message: HistoryMessage,
        /// How many bytes of its text were cut off (the conversation holds them).
        left_out: usize,
    },
    /// The whole conversation was replaced (a snapshot, a clear).
    History,
    /// An artifact was stored ([`Event::artifact`]).
    Artifact {
        /// Its record.
        meta: Box<ArtifactMeta>,
        /// Its upload's metadata was left out (past [`MAX_EVENT_METADATA`]).
        metadata_left_out: bool,
    },
    /// A call in progress moved on (started, waits for a decision, was decided, ended).
    Progress {
        /// Where it is.
        call: Box<Progress>,
    },
}

impl Event {
    /// The event's name in a server-sent event stream.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Call { .. } => "call",
            Event::Message { .. } => "message",
            Event::History => "history",
            Event::Artifact { .. } => "artifact",
            Event::Progress { call } => match call.phase {
                Phase::Started => "call_started",
                Phase::Waiting => "call_waiting",
                Phase::Decided => "call_decided",
                Phase::Ended => "call_ended",
            },
        }
    }
}

/// Per-session broadcast channels, made on the first subscription and dropped with the last.
#[derive(Debug, Clone, Default)]
pub struct Feed {
    channels: Arc<Mutex<HashMap<String, broadcast::Sender<Event>>>>,
}

impl Feed {
    /// A feed nobody follows yet.
    pub fn new() -> Feed {
        Feed::default()
    }

    /// Follows a session: everything published for it from now on.
    pub fn subscribe(&self, session: &str) -> broadcast::Receiver<Event> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels
            .entry(session.to_owned())
            .or_insert_with(|| broadcast::channel(BACKLOG).0)
            .subscribe()
    }

    /// Stops following: drops `rx`, and the session's channel with it when that was its last
    /// follower (a session nobody follows keeps no channel, even if it never has another event).
    pub fn release(&self, session: &str, rx: broadcast::Receiver<Event>) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        drop(rx);
        if channels
            .get(session)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            channels.remove(session);
        }
    }

    /// Publishes an event of a session to its followers (nothing, when it has none).
    pub fn publish(&self, session: &str, event: Event) {
        self.publish_with(session, || event);
    }

    /// Publishes the event `make` builds to the session's followers; `make` is not called when
    /// the session has none.
    pub fn publish_with(&self, session: &str, make: impl FnOnce() -> Event) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = channels.get(session) {
            if sender.receiver_count() == 0 {
                channels.remove(session);
            } else {
                let _ = sender.send(make());
            }
        }
    }

    /// Whether someone follows a session now.
    pub fn followed(&self, session: &str) -> bool {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
            .is_some_and(|sender| sender.receiver_count() > 0)
    }

    /// How many sessions have a channel (followed now, or until their next event).
    pub fn channels(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// What a call in progress is doing, as its followers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Routed to a workspace and running there (or about to be asked about).
    Started,
    /// Sent to an attached folder's client, which decides whether it runs: its owner is asked
    /// when the folder is restricted and its policy does not already allow the call.
    Waiting,
    /// The workspace decided (trust, policy, its owner, ...): it runs, or was refused.
    Decided,
    /// It ended; its `call` record follows once written.
    Ended,
}

/// A call in progress: what its followers are told at each [`Phase`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// A number of the call for as long as it runs (not its audit `call_id`, which is made
    /// when it is recorded); every event of one call has the same.
    pub live_id: u64,
    /// What it is doing now.
    pub phase: Phase,
    /// The tool.
    pub tool: &'static str,
    /// When it started, RFC 3339: the `time` its audit record will have (with `tool` and
    /// `target`, how a follower finds the record that ends it). Absent when the call was not
    /// followed when it started.
    pub time: Option<String>,
    /// What it acts on, in one line, as in the audit log. Absent as `time` is.
    pub target: Option<String>,
    /// The workspace it runs in, once routed.
    pub workspace: Option<String>,
    /// That workspace's URI (`<device>:<path>` for an attached folder).
    pub uri: Option<String>,
    /// Who decided, once decided.
    pub decided_by: Option<Decider>,
    /// Whether it was allowed to run, once decided.
    pub allowed: Option<bool>,
}

/// Numbers of calls in progress ([`Progress::live_id`]).
static LIVE_IDS: AtomicU64 = AtomicU64::new(1);

/// A tool call as it goes, told to its session's followers: made when the call starts, told
/// where it was routed, when it waits for a folder's decision and when it is decided; dropped
/// (or [`LiveCall::ended`]) when it ends. A call of a session nobody follows costs a look-up
/// per step and allocates nothing.
#[derive(Debug, Default)]
pub struct LiveCall {
    /// `None`: an inert call (no feed, or a tool that is not one).
    on: Option<On>,
}

#[derive(Debug)]
struct On {
    feed: Feed,
    session: Arc<Session>,
    id: u64,
    tool: &'static str,
    /// What has been told so far (kept only while followed).
    told: Mutex<Option<Progress>>,
}

impl LiveCall {
    /// A call of `tool` in `session`, started at `time` on `target` (as its audit record will
    /// say).
    pub fn start(
        feed: &Feed,
        session: &Arc<Session>,
        tool: &str,
        time: &str,
        target: &str,
    ) -> LiveCall {
        let Some(tool) = ToolName::parse(tool) else {
            return LiveCall::default();
        };
        let id = LIVE_IDS.fetch_add(1, Ordering::Relaxed);
        // Its time and target are kept only when someone follows the session now.
        let told = feed.followed(&session.id).then(|| Progress {
            live_id: id,
            phase: Phase::Started,
            tool: tool.as_str(),
            time: Some(time.to_owned()),
            target: Some(event_target(target)),
            workspace: None,
            uri: None,
            decided_by: None,
            allowed: None,
        });
        LiveCall {
            on: Some(On {
                feed: feed.clone(),
                session: Arc::clone(session),
                id,
                tool: tool.as_str(),
                told: Mutex::new(told),
            }),
        }
    }

    /// Moves the call to `phase` with `change`, and tells the followers, if any.
    fn step(&self, phase: Phase, change: impl FnOnce(&mut Progress)) {
        let Some(on) = &self.on else { return };
        if !on.feed.followed(&on.session.id) {
            return;
        }
        let mut told = on.told.lock().unwrap_or_else(|p| p.into_inner());
        let progress = told.get_or_insert_with(|| Progress {
            live_id: on.id,
            phase,
            tool: on.tool,
            time: None,
            target: None,
            workspace: None,
            uri: None,
            decided_by: None,
            allowed: None,
        });
        if progress.phase == Phase::Ended {
            return;
        }
        progress.phase = phase;
        change(progress);
        let event = Event::Progress {
            call: Box::new(progress.clone()),
        };
        on.feed.publish_with(&on.session.id, || event);
    }

    /// Routed to `workspace` (`name`, `uri`): it starts there.
    pub fn routed(&self, name: &str, uri: &str) {
        self.step(Phase::Started, |p| {
            p.workspace = Some(name.to_owned());
            p.uri = Some(uri.to_owned());
        });
    }

    /// Sent to an attached folder's client, which decides (asking its owner when it must).
    pub fn waiting(&self) {
        self.step(Phase::Waiting, |_| {});
    }

    /// Decided by `by`: allowed to run, or refused (`allowed` is `None` when nobody could say).
    pub fn decided(&self, by: Decider, allowed: Option<bool>) {
        self.step(Phase::Decided, |p| {
            p.decided_by = Some(by);
            p.allowed = allowed;
        });
    }

    /// It ended (told once; also told when the call is dropped unfinished).
    pub fn ended(&self) {
        self.step(Phase::Ended, |_| {});
    }
}

impl Drop for LiveCall {
    fn drop(&mut self) {
        self.ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_gets_its_session_events_only_and_a_channel_goes_with_its_last_follower() {
        let feed = Feed::new();
        let mut mine = feed.subscribe("a");
        feed.publish("b", Event::History);
        feed.publish("a", Event::History);
        assert_eq!(mine.try_recv().unwrap(), Event::History);
        assert!(mine.try_recv().is_err());
        drop(mine);
        feed.publish("a", Event::History);
        assert_eq!(feed.channels(), 0);
    }

    #[test]
    fn an_event_is_built_only_for_a_session_someone_follows() {
        let feed = Feed::new();
        feed.publish_with("a", || unreachable!("nobody follows `a`"));
        assert!(!feed.followed("a"));
        let mut rx = feed.subscribe("a");
        assert!(feed.followed("a"));
        feed.publish_with("a", || Event::History);
        assert_eq!(rx.try_recv().unwrap(), Event::History);
    }

    #[test]
    fn a_channel_goes_when_its_last_follower_is_released_even_without_another_event() {
        let feed = Feed::new();
        let first = feed.subscribe("a");
        let second = feed.subscribe("a");
        feed.release("a", first);
        assert_eq!(feed.channels(), 1, "one follower is left");
        feed.release("a", second);
        assert_eq!(feed.channels(), 0);
    }
}
