//! The live feed of what happens in sessions: tool calls (with who decided and how they ended),
//! conversation changes and new artifacts, as the store writes them. The HTTP front streams it
//! as server-sent events (`GET /api/v1/sessions/{id}/events`) and the web view follows it.
//!
//! [`crate::store::observed::Observed`] publishes here after each write succeeds, so a
//! subscriber that reads the store on an event sees what the event announced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::store::{ArtifactMeta, AuditRecord, HistoryMessage};

/// Events a subscriber may fall behind by before it is told it lagged.
const BACKLOG: usize = 256;

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
        /// The message.
        message: HistoryMessage,
    },
    /// The whole conversation was replaced (a snapshot, a clear).
    History,
    /// An artifact was stored.
    Artifact {
        /// Its metadata.
        meta: Box<ArtifactMeta>,
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
