//! The connections a workspace's network proxy was asked for, on their two ways out: to the
//! next answer of one of the workspace's commands (`network` in `run_command` and
//! `process_read` results, for the agent), and to one reader that records them as they happen
//! (the audit log), whether or not any answer ever carries them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use monad_protocol::tools::NetworkEvent;

/// Events kept for the next answer; more are dropped (and said so in the log). A server takes
/// no more than this from one result.
pub const MAX_FOR_ANSWER: usize = 1000;

/// Events waiting for the audit reader; more are only counted.
pub const MAX_FOR_AUDIT: usize = 4096;

/// Events kept for the audit reader per second once a burst of [`MAX_FOR_AUDIT`] is spent;
/// more are only counted. A command asking the proxy for ten thousand names a second (each
/// refused) wrote 2.7 MB a second to the session's audit log, with no end for one left running
/// in the background; so its lines come at most this fast, and the rest as a count.
pub const AUDIT_PER_SECOND: u32 = 50;

/// How many lines a stream of audited events may still write at once: a bucket of
/// [`MAX_FOR_AUDIT`] that fills at [`AUDIT_PER_SECOND`]. The sandbox keeps its own reader to
/// it, and the server keeps each attached folder's reports to it as well, since it does not
/// take a client's word for how fast they come.
#[derive(Debug, Default, Clone)]
pub struct AuditAllowance {
    /// Lines it may write now, as of `filled` (`None`: full, nothing taken yet).
    left: f64,
    filled: Option<std::time::Instant>,
}

impl AuditAllowance {
    /// Takes one line's worth at `now`; `false` when none is left (the event is only counted).
    pub fn take(&mut self, now: std::time::Instant) -> bool {
        let burst = MAX_FOR_AUDIT as f64;
        self.left = match self.filled {
            None => burst,
            Some(then) => (self.left
                + now.saturating_duration_since(then).as_secs_f64() * f64::from(AUDIT_PER_SECOND))
            .min(burst),
        };
        self.filled = Some(now);
        if self.left >= 1.0 {
            self.left -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A workspace's connections (one per sandbox, shared with its proxy).
#[derive(Debug, Default)]
pub(crate) struct NetworkLog {
    state: Mutex<State>,
    ready: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    for_answer: Vec<NetworkEvent>,
    for_audit: VecDeque<NetworkEvent>,
    /// Events the audit reader will not see (the queue was full, or they came too fast), not
    /// told yet.
    dropped: u64,
    /// The events the audit reader may still be given at once.
    allowance: AuditAllowance,
    /// A reader took [`NetworkAudit`]: events are kept for it from then on.
    audited: bool,
    /// The reader was taken already.
    taken: bool,
    /// The sandbox is gone: the reader gets what is left, then the end.
    closed: bool,
    /// Events past [`MAX_FOR_ANSWER`] since an answer last took them: only counted, and the
    /// count goes with the next answer.
    answer_dropped: u64,
    /// The log said that events for the next answer are being dropped (said once a fill).
    answer_full_told: bool,
    /// When the last report came (its own time).
    last_report: Option<std::time::Instant>,
    /// The time of the last report before the reader was last told a count of dropped events.
    count_told_at: Option<std::time::Instant>,
    /// When (by the clock) the reader was last told a count.
    count_told_when: Option<std::time::Instant>,
}

/// How often, at most, the audit reader is told how many events it was not given (by the
/// reports' own times): a command refusing connections as fast as it can would otherwise have
/// a count written for each time the reader looked, a line each, thousands a second.
const COUNT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl State {
    /// Whether the reader is to be told the events dropped since it was last told.
    fn count_due(&self) -> bool {
        self.dropped > 0
            && (self.closed
                || self
                    .count_told_when
                    .is_some_and(|told| told.elapsed() >= COUNT_EVERY)
                || match (self.count_told_at, self.last_report) {
                    (Some(told), Some(last)) => last.saturating_duration_since(told) >= COUNT_EVERY,
                    _ => true,
                })
    }
}

/// What the audit reader gets at once: events in the order they happened, then how many
/// happened after the queue filled up and were dropped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetworkBatch {
    /// The connections, oldest first.
    pub events: Vec<NetworkEvent>,
    /// Connections that happened while the queue was full: not in `events`, only counted.
    pub dropped: u64,
}

impl NetworkLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The proxy reports a connection.
    pub(crate) fn report(&self, event: NetworkEvent) {
        self.report_at(event, std::time::Instant::now());
    }

    /// [`NetworkLog::report`], at `now`.
    fn report_at(&self, event: NetworkEvent, now: std::time::Instant) {
        let mut state = self.lock();
        let mut wake = true;
        if state.audited && !state.closed {
            state.last_report = Some(now);
            if state.for_audit.len() < MAX_FOR_AUDIT && state.allowance.take(now) {
                state.for_audit.push_back(event.clone());
            } else {
                state.dropped += 1;
                wake = state.count_due();
            }
        }
        if state.for_answer.len() < MAX_FOR_ANSWER {
            state.for_answer.push(event);
        } else {
            state.answer_dropped += 1;
            // Once until an answer takes them: the log is not flooded with a line a connection.
            if !std::mem::replace(&mut state.answer_full_told, true) {
                tracing::warn!(
                    "network events not reported in an answer yet are over {MAX_FOR_ANSWER}; \
                     counting the rest"
                );
            }
        }
        drop(state);
        if wake {
            self.ready.notify_one();
        }
    }

    /// The events no answer carried yet, and how many more there were past
    /// [`MAX_FOR_ANSWER`].
    pub(crate) fn take_for_answer(&self) -> (Vec<NetworkEvent>, u64) {
        let mut state = self.lock();
        state.answer_full_told = false;
        (
            std::mem::take(&mut state.for_answer),
            std::mem::take(&mut state.answer_dropped),
        )
    }

    /// The audit reader, the first time; `None` after.
    pub(crate) fn audit(self: &Arc<Self>) -> Option<NetworkAudit> {
        let mut state = self.lock();
        if state.taken {
            return None;
        }
        state.taken = true;
        state.audited = true;
        Some(NetworkAudit { log: self.clone() })
    }

    /// The sandbox is gone: nothing more is kept for the reader.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }
}

/// The one reader of a workspace's connections for the audit log (see
/// [`crate::Sandbox::take_network_audit`]).
#[derive(Debug)]
pub struct NetworkAudit {
    log: Arc<NetworkLog>,
}

impl NetworkAudit {
    /// Waits for connections (or a count of dropped ones); `None` once the sandbox is gone and
    /// everything was read.
    pub async fn next(&mut self) -> Option<NetworkBatch> {
        loop {
            // Registered before looking, so a report between the look and the wait wakes it.
            let ready = self.log.ready.notified();
            let count_at = {
                let mut state = self.log.lock();
                let due = state.count_due();
                if !state.for_audit.is_empty() || due {
                    let dropped = if due {
                        state.count_told_at = state.last_report;
                        state.count_told_when = Some(std::time::Instant::now());
                        std::mem::take(&mut state.dropped)
                    } else {
                        0
                    };
                    return Some(NetworkBatch {
                        events: state.for_audit.drain(..).collect(),
                        dropped,
                    });
                }
                if state.closed {
                    return None;
                }
                // A count not due yet is told within a second even when no report comes
                // (where a runtime's timer can say so).
                state
                    .count_told_when
                    .filter(|_| state.dropped > 0)
                    .filter(|_| tokio::runtime::Handle::try_current().is_ok())
                    .map(|told| told + COUNT_EVERY)
            };
            match count_at {
                Some(at) => tokio::select! {
                    () = ready => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                },
                None => ready.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(port: u16) -> NetworkEvent {
        NetworkEvent {
            host: "example.com".into(),
            port,
            allowed: false,
            address: None,
            reason: Some("not in the allowlist".into()),
        }
    }

    fn now<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[test]
    fn the_audit_reader_gets_every_connection_whether_or_not_an_answer_takes_them() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().expect("the first reader");
        assert!(log.audit().is_none(), "one reader only");
        log.report(event(1));
        assert_eq!(log.take_for_answer(), (vec![event(1)], 0));
        log.report(event(2));
        let batch = now(audit.next()).flatten().expect("ready at once");
        assert_eq!(batch.events, vec![event(1), event(2)]);
        assert_eq!(batch.dropped, 0);
        assert_eq!(log.take_for_answer(), (vec![event(2)], 0));
        assert!(now(audit.next()).is_none(), "nothing new: it waits");
    }

    /// Past the most an answer carries, connections are counted for it (they were dropped
    /// without the answer saying so).
    #[test]
    fn an_answer_is_told_how_many_connections_it_does_not_carry() {
        let log = NetworkLog::default();
        for n in 0..MAX_FOR_ANSWER + 7 {
            log.report(event(n as u16));
        }
        let (events, more) = log.take_for_answer();
        assert_eq!(events.len(), MAX_FOR_ANSWER);
        assert_eq!(more, 7);
        log.report(event(1));
        assert_eq!(
            log.take_for_answer(),
            (vec![event(1)], 0),
            "the count was taken"
        );
    }

    #[test]
    fn a_full_audit_queue_counts_what_it_drops_and_the_reader_is_told() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().unwrap();
        let start = std::time::Instant::now();
        for i in 0..MAX_FOR_AUDIT + 5 {
            log.report_at(event(i as u16), start);
        }
        let batch = now(audit.next()).flatten().unwrap();
        assert_eq!(batch.events.len(), MAX_FOR_AUDIT);
        assert_eq!(batch.dropped, 5);
        // A second on, there is room again.
        log.report_at(event(7), start + std::time::Duration::from_secs(1));
        let batch = now(audit.next()).flatten().unwrap();
        assert_eq!((batch.events, batch.dropped), (vec![event(7)], 0));
    }

    /// Past a burst as large as the queue, the reader is given events at most
    /// [`AUDIT_PER_SECOND`] a second, and the rest are counted, however fast it reads.
    #[test]
    fn the_audit_reader_gets_events_at_a_bounded_rate_and_a_count_of_the_rest() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().unwrap();
        let start = std::time::Instant::now();
        let mut kept = 0;
        let mut dropped = 0;
        // Ten seconds of a thousand refused connections a second, read as they come.
        for ms in 0..10_000u64 {
            let at = start + std::time::Duration::from_millis(ms);
            log.report_at(event(1), at);
            if let Some(Some(batch)) = now(audit.next()) {
                kept += batch.events.len() as u64;
                dropped += batch.dropped;
            }
        }
        log.close();
        while let Some(Some(batch)) = now(audit.next()) {
            kept += batch.events.len() as u64;
            dropped += batch.dropped;
        }
        assert_eq!(kept + dropped, 10_000);
        let most = MAX_FOR_AUDIT as u64 + 10 * u64::from(AUDIT_PER_SECOND);
        assert!(kept <= most && kept >= most - 1, "{kept}");
    }

    /// Regression: each look of the reader's took the count of events dropped since its last,
    /// so a command refusing connections as fast as it could had a count line written for each,
    /// 1,100 to 1,500 a second; now a count at most once a second, and none lost.
    #[test]
    fn the_reader_is_told_what_was_dropped_at_most_once_a_second() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().unwrap();
        let start = std::time::Instant::now();
        let (mut counts, mut kept, mut dropped) = (0, 0, 0);
        // Ten seconds of ten thousand refused connections a second, read as they come.
        for n in 0..100_000u64 {
            let at = start + std::time::Duration::from_micros(n * 100);
            log.report_at(event(1), at);
            if let Some(Some(batch)) = now(audit.next()) {
                kept += batch.events.len() as u64;
                dropped += batch.dropped;
                counts += u64::from(batch.dropped > 0);
            }
        }
        assert!(counts <= 11, "{counts} counts told");
        log.close();
        while let Some(Some(batch)) = now(audit.next()) {
            kept += batch.events.len() as u64;
            dropped += batch.dropped;
        }
        assert_eq!(
            kept + dropped,
            100_000,
            "every connection is in a line or a count"
        );
    }

    /// A count held back (told less than a second ago) is told within a second even when no
    /// report comes after it: it waited for the next report, or the sandbox's end, for ever.
    #[tokio::test]
    async fn a_count_held_back_is_told_within_a_second_without_another_report() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().unwrap();
        let start = std::time::Instant::now();
        for _ in 0..MAX_FOR_AUDIT + 1 {
            log.report_at(event(1), start);
        }
        let first = audit.next().await.unwrap();
        assert_eq!(first.dropped, 1);
        log.report_at(event(2), start);
        let later = tokio::time::timeout(std::time::Duration::from_secs(5), audit.next())
            .await
            .expect("told within a second")
            .unwrap();
        assert_eq!((later.events.len(), later.dropped), (0, 1));
    }

    #[test]
    fn the_reader_gets_what_is_left_then_the_end_once_the_sandbox_is_gone() {
        let log = Arc::new(NetworkLog::default());
        let mut audit = log.audit().unwrap();
        log.report(event(1));
        log.close();
        log.report(event(2));
        assert_eq!(now(audit.next()).flatten().unwrap().events, vec![event(1)]);
        assert_eq!(now(audit.next()), Some(None));
    }

    #[test]
    fn nothing_is_kept_for_an_audit_nobody_reads() {
        let log = Arc::new(NetworkLog::default());
        log.report(event(1));
        let mut audit = log.audit().unwrap();
        assert!(now(audit.next()).is_none());
    }
}
