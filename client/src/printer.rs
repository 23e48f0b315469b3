//! The lines `monad-client attach` prints for its folder's events, written on a thread of their
//! own. The attachment runs on one thread, and a standard error that does not take its lines (a
//! pipe nobody reads, a terminal stopped with Ctrl-S) must hold up those lines only: never the
//! folder's calls, nor the exit when the attachment ends. While the output is stuck, at most
//! [`LinesPrinter::start`]'s `capacity` lines wait; later ones are counted and left out, and
//! the count is printed once the output takes lines again.
//!
//! While an approval prompt is up ([`LinesPause::hold_after_queued`]), the lines wait: printed under it, they
//! pushed the question off the screen (a server can make as many as it likes), and text drawn
//! there could pass for another question that the next key answered.

use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::attach::AttachEvent;

/// Holds a printer's lines while a prompt is up: a printer's own ([`LinesPrinter::pause`]), or
/// the chat's, whose writer waits on a task ([`LinesPause::until_free`]) and counts what it has
/// to write ([`LinesPause::queued`]), so that a prompt first lets out what came before it
/// ([`LinesPause::hold_after_queued`]).
#[derive(Debug, Clone, Default)]
pub struct LinesPause(Arc<Pause>);

#[derive(Debug, Default)]
struct Pause {
    state: Mutex<PauseState>,
    changed: Condvar,
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct PauseState {
    /// Prompts holding the lines.
    held: usize,
    /// Lines queued and not written yet (counted by a writer that says so).
    pending: usize,
    /// A printer's write is under way ([`LinesPause::writing`]): a prompt waits for its end.
    writing: bool,
}

/// The lines wait while this lives ([`LinesPause::hold_after_queued`]).
#[derive(Debug)]
pub struct LinesHeld(LinesPause);

impl LinesPause {
    fn state(&self) -> std::sync::MutexGuard<'_, PauseState> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits, on a task, while the lines are held.
    pub async fn until_free(&self) {
        loop {
            let freed = self.0.freed.notified();
            if self.state().held == 0 {
                return;
            }
            freed.await;
        }
    }

    /// Waits while the lines are held.
    fn wait_until_free(&self) {
        let mut state = self.state();
        while state.held > 0 {
            state = self
                .0
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Runs `write` once the lines are not held, marked as a write under way meanwhile
    /// ([`LinesPause::hold_after_queued`] waits for its end): each piece of a printer's
    /// batch is written so, so that none is written under a prompt drawn between two pieces.
    fn writing<R>(&self, write: impl FnOnce() -> R) -> R {
        {
            let mut state = self.state();
            while state.held > 0 {
                state = self
                    .0
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            state.writing = true;
        }
        let out = write();
        self.state().writing = false;
        self.0.changed.notify_all();
        out
    }

    /// A line was queued for writing.
    pub fn queued(&self) {
        self.state().pending += 1;
    }

    /// A queued line was written.
    pub fn written(&self) {
        let mut state = self.state();
        state.pending = state.pending.saturating_sub(1);
        self.0.changed.notify_all();
    }

    /// Holds the lines until the guard is dropped, once those queued so far are written
    /// (waiting at most `limit`; a printer that does not count them has none): for a
    /// prompt about to be drawn, what happened before it shows above it. The wait and the hold
    /// are one step: a line queued between them would be written under the prompt.
    pub fn hold_after_queued(&self, limit: Duration) -> LinesHeld {
        let deadline = std::time::Instant::now() + limit;
        let mut state = self.state();
        while state.pending > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .0
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.held += 1;
        // A piece being written when the hold came ends first (no later one starts): a
        // write to an output that takes nothing is waited for no longer than the limit.
        while state.writing {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .0
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        LinesHeld(self.clone())
    }
}

impl Drop for LinesHeld {
    fn drop(&mut self) {
        let pause = &self.0;
        let mut state = pause.state();
        state.held = state.held.saturating_sub(1);
        pause.0.changed.notify_all();
        pause.0.freed.notify_waiters();
    }
}

/// Prints an attachment's event lines (see the module's doc).
pub struct LinesPrinter {
    /// The queue the printing thread takes lines from (bounded).
    lines: SyncSender<String>,
    /// The task that moves the events' lines into the queue; it gives the count of the lines
    /// it left out and has not said yet.
    relay: tokio::task::JoinHandle<u64>,
    /// Said by the thread when every line is written.
    printed: oneshot::Receiver<()>,
    /// What holds the lines while a prompt is up.
    pause: LinesPause,
}

impl LinesPrinter {
    /// Starts printing to `out`, on a thread of its own, the lines of the events sent to the
    /// sender it gives (for [`crate::attach::attach`]). Must be called inside a Tokio runtime:
    /// the events are taken off their unbounded channel by a task, so that a stuck `out` never
    /// lets them pile up.
    pub fn start(
        out: impl Write + Send + 'static,
        capacity: usize,
    ) -> std::io::Result<(LinesPrinter, mpsc::UnboundedSender<AttachEvent>)> {
        let (events, mut received) = mpsc::unbounded_channel::<AttachEvent>();
        let (lines, queued) = sync_channel::<String>(capacity.max(1));
        let (done, printed) = oneshot::channel();
        let pause = LinesPause::default();
        let paused = pause.clone();
        std::thread::Builder::new()
            .name("attach-lines".into())
            .spawn(move || print(out, queued, &paused, done))?;
        let queue = lines.clone();
        let relay = tokio::spawn(async move {
            let mut left_out = 0u64;
            while let Some(event) = received.recv().await {
                if let Some(line) = event.line()
                    && !offer(&queue, &mut left_out, line)
                {
                    break;
                }
            }
            // What is still left out is said with the last line (`finish`).
            left_out
        });
        Ok((
            LinesPrinter {
                lines,
                relay,
                printed,
                pause,
            },
            events,
        ))
    }

    /// What holds this printer's lines while a prompt is up (for the prompt's thread).
    pub fn pause(&self) -> LinesPause {
        self.pause.clone()
    }

    /// Prints `last` after the events' lines, and waits at most `wait` until all of them are
    /// written. The events' sender must be gone (the attachment ended) for their lines to come
    /// first and for the wait to end early. An output that is slow, not stuck, still gets
    /// `last` (and the count of what was left out) within `wait`; a stuck one loses what it has
    /// not taken, and the caller exits anyway.
    pub async fn finish(self, last: &str, wait: Duration) {
        let LinesPrinter {
            lines,
            mut relay,
            printed,
            pause: _,
        } = self;
        let deadline = tokio::time::Instant::now() + wait;
        let left_out = tokio::time::timeout_at(deadline, &mut relay)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        let mut pending = Vec::new();
        if left_out > 0 {
            pending.push(left_out_note(left_out));
        }
        pending.push(last.to_owned());
        for mut line in pending {
            // The queue may be full of lines the output is still taking: room comes as it does.
            loop {
                match lines.try_send(line) {
                    Ok(()) => break,
                    Err(TrySendError::Full(back)) if tokio::time::Instant::now() < deadline => {
                        line = back;
                        tokio::time::sleep(FULL_RETRY).await;
                    }
                    Err(_) => break,
                }
            }
        }
        drop(lines);
        let _ = tokio::time::timeout_at(deadline, printed).await;
    }
}

/// How often `finish` looks for room in a full queue.
const FULL_RETRY: Duration = Duration::from_millis(5);

/// Queues `line` without waiting, after the count of the lines left out before it if there are
/// any; a line that finds no room is counted instead. False when the printing thread is gone.
fn offer(queue: &SyncSender<String>, left_out: &mut u64, line: String) -> bool {
    if *left_out > 0 {
        match queue.try_send(left_out_note(*left_out)) {
            Ok(()) => *left_out = 0,
            // No room for the note: none for this line either.
            Err(TrySendError::Full(_)) => {
                *left_out += 1;
                return true;
            }
            Err(TrySendError::Disconnected(_)) => return false,
        }
    }
    match queue.try_send(line) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            *left_out += 1;
            true
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// The line that says how many lines were left out.
fn left_out_note(count: u64) -> String {
    format!(
        "({count} line{} not shown: standard error was not taking them, or a prompt was up)",
        if count == 1 { "" } else { "s" }
    )
}

/// How long the printing thread rests after writing, before it waits for lines again. A thread
/// waiting on the queue is woken by every line, and on a busy machine the woken thread takes
/// the core of the attachment that queued the line, in the middle of answering a call (two
/// lines per call: `docs/benchmarks.md`, the Python SDK cases' eleventh round). Resting, it is
/// woken at most once per rest; the lines queued meanwhile are written together, a fraction of
/// a second late at most, which a person does not see.
const PRINT_REST: Duration = Duration::from_millis(10);

/// The most bytes written at once: a write to a pipe of at most this many bytes (`PIPE_BUF`)
/// is not split, so another writer's text (an approval prompt) never lands inside a line.
const WRITE_MAX: usize = 4096;

/// The printing thread: the lines as they come, those that came together in one write (a line
/// longer than [`WRITE_MAX`] in one write of its own), until every sender is gone.
fn print(
    mut out: impl Write,
    queued: Receiver<String>,
    pause: &LinesPause,
    done: oneshot::Sender<()>,
) {
    // Lines follow the calls they tell of: waking to print one must not preempt a call.
    if let Err(e) = monad_sandbox::run_as_background() {
        tracing::debug!("the line printer runs at the usual scheduling policy: {e}");
    }
    let mut batch = String::new();
    while let Ok(first) = queued.recv() {
        // Under a prompt, the lines wait in the queue (bounded: those past it are counted),
        // and each piece of a batch taken waits too.
        pause.wait_until_free();
        for line in std::iter::once(first).chain(queued.try_iter()) {
            if !batch.is_empty() && batch.len() + line.len() + 1 > WRITE_MAX {
                pause.writing(|| write_out(&mut out, &mut batch));
            }
            batch.push_str(&line);
            batch.push('\n');
        }
        pause.writing(|| write_out(&mut out, &mut batch));
        std::thread::sleep(PRINT_REST);
    }
    let _ = done.send(());
}

/// Writes `batch` (whole lines) in one write and empties it.
fn write_out(out: &mut impl Write, batch: &mut String) {
    let _ = out.write_all(batch.as_bytes());
    let _ = out.flush();
    batch.clear();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Condvar, Mutex};

    /// An output that lets through as many writes as it was allowed (all once it is opened),
    /// the others waiting; counts the writes that waited, and keeps what it is given.
    #[derive(Clone, Default)]
    struct Gate {
        allowed: Arc<(Mutex<usize>, Condvar)>,
        waited: Arc<std::sync::atomic::AtomicUsize>,
        taken: Arc<Mutex<Vec<u8>>>,
    }

    impl Gate {
        fn allow(&self, n: usize) {
            let mut allowed = self.allowed.0.lock().unwrap();
            *allowed = allowed.saturating_add(n);
            self.allowed.1.notify_all();
        }

        fn open(&self) {
            self.allow(usize::MAX);
        }

        fn waiting(&self) -> bool {
            self.waited.load(Ordering::SeqCst) > 0
        }

        fn text(&self) -> String {
            String::from_utf8(self.taken.lock().unwrap().clone()).unwrap()
        }

        fn lines(&self) -> Vec<String> {
            self.text().lines().map(str::to_owned).collect()
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (allowed, changed) = &*self.allowed;
            let mut left = allowed.lock().unwrap();
            if *left == 0 {
                self.waited.fetch_add(1, Ordering::SeqCst);
            }
            while *left == 0 {
                left = changed.wait(left).unwrap();
            }
            *left -= 1;
            self.taken.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn event(n: u64) -> AttachEvent {
        AttachEvent::Disconnected {
            reason: format!("line {n}"),
            retry_in: Duration::ZERO,
        }
    }

    /// Waits (bounded) until `done` holds, letting the relay task run meanwhile.
    async fn until(what: &str, done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    /// Lets the relay task take every event sent so far (the test's runtime has one thread).
    async fn relayed() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// A printer holding four lines on a stuck output, sent `lines` lines: the first is in the
    /// thread's hands, stuck in its write, the next four wait in the queue, the rest are left
    /// out.
    async fn stuck(lines: u64) -> (Gate, LinesPrinter, mpsc::UnboundedSender<AttachEvent>) {
        let gate = Gate::default();
        let (printer, events) = LinesPrinter::start(gate.clone(), 4).unwrap();
        events.send(event(0)).unwrap();
        until("the first write waits", || gate.waiting()).await;
        for n in 1..lines {
            events.send(event(n)).unwrap();
        }
        relayed().await;
        (gate, printer, events)
    }

    /// Regression: the printer looked at the pause once per batch, then wrote the batch's
    /// every 4 KiB piece: a prompt drawn while one piece was being written had the next
    /// pieces written under it (up to the queue's lines, which an agent's calls fill). No
    /// piece is written while a prompt holds the lines.
    #[tokio::test]
    async fn no_piece_of_a_batch_is_written_under_a_prompt() {
        let out = Gate::default();
        let (printer, events) = LinesPrinter::start(out.clone(), 16).unwrap();
        let big = |n: u64| AttachEvent::Disconnected {
            reason: format!("{n}:{}", "x".repeat(3_000)),
            retry_in: Duration::ZERO,
        };
        events.send(big(0)).unwrap();
        until("the first write waits", || {
            out.waited.load(Ordering::SeqCst) == 1
        })
        .await;
        // Under 1 KB a line (a reason is cut at 1,000 characters): four to a piece.
        for n in 1..=5 {
            events.send(big(n)).unwrap();
        }
        relayed().await;
        // The first written; the next batch's first piece waits in its write.
        out.allow(1);
        until("the second write waits", || {
            out.waited.load(Ordering::SeqCst) == 2
        })
        .await;
        let pause = printer.pause();
        let held = std::thread::spawn(move || pause.hold_after_queued(Duration::from_millis(300)))
            .join()
            .unwrap();
        out.allow(10);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(out.text().contains("4:xxx"), "{}", out.text());
        assert!(
            !out.text().contains("5:xxx"),
            "a piece was written under the prompt"
        );
        drop(held);
        until("the rest once the prompt is gone", || {
            out.text().contains("5:xxx")
        })
        .await;
        drop(events);
        printer.finish("detached", Duration::from_secs(10)).await;
    }

    /// An output that keeps, for each write, whether its thread ran as background work.
    #[cfg(target_os = "linux")]
    #[derive(Clone, Default)]
    struct BackgroundOrNot(Arc<Mutex<Vec<bool>>>);

    #[cfg(target_os = "linux")]
    impl Write for BackgroundOrNot {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(monad_sandbox::is_background()?);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn lines_are_written_by_a_thread_scheduled_as_background_work() {
        let out = BackgroundOrNot::default();
        let (printer, events) = LinesPrinter::start(out.clone(), 4).unwrap();
        events.send(event(0)).unwrap();
        drop(events);
        printer.finish("detached", Duration::from_secs(10)).await;
        let writes = out.0.lock().unwrap().clone();
        assert!(!writes.is_empty(), "nothing was written");
        // Waking the printer for a line must not preempt the call the line tells of.
        assert!(writes.iter().all(|&background| background), "{writes:?}");
    }

    /// While a prompt holds them, the lines wait (those past the queue's room are counted), and
    /// come once it is answered: printed under it, they pushed the question off the screen.
    #[tokio::test]
    async fn lines_wait_while_a_prompt_is_up() {
        let gate = Gate::default();
        gate.open();
        let (printer, events) = LinesPrinter::start(gate.clone(), 4).unwrap();
        let held = printer.pause().hold_after_queued(Duration::ZERO);
        for n in 0..20 {
            events.send(event(n)).unwrap();
        }
        relayed().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(gate.lines().is_empty(), "{:?}", gate.lines());
        drop(held);
        until("the held lines are written", || gate.lines().len() >= 4).await;
        drop(events);
        printer.finish("detached", Duration::from_secs(10)).await;
        let lines = gate.lines();
        assert!(lines[0].contains("line 0"), "{lines:?}");
        assert!(
            // 16, or 15 when the thread had taken the first line off the queue before the
            // prompt held it.
            lines
                .iter()
                .any(|l| l.contains("16 lines not shown") || l.contains("15 lines not shown")),
            "those past the queue's room are counted: {lines:?}"
        );
        assert_eq!(lines.last().unwrap(), "detached");
    }

    #[tokio::test]
    async fn a_stuck_output_holds_a_bounded_number_of_lines_and_says_how_many_it_left_out() {
        let (gate, printer, events) = stuck(20).await;
        gate.open();
        until("the five lines held are written", || {
            gate.lines().len() == 5
        })
        .await;
        // The output takes lines again: the next line brings the count first.
        events.send(event(20)).unwrap();
        drop(events);
        let started = std::time::Instant::now();
        printer.finish("detached", Duration::from_secs(10)).await;
        // Done as soon as the lines are written, not when the wait runs out.
        assert!(started.elapsed() < Duration::from_secs(5));
        let lines = gate.lines();
        let held: Vec<String> = (0..5)
            .map(|n| format!("line {n}; reconnecting in 0.0 s"))
            .collect();
        assert_eq!(lines[..5], held[..], "{lines:?}");
        assert_eq!(
            lines[5..],
            [
                "(15 lines not shown: standard error was not taking them, or a prompt was up)",
                "line 20; reconnecting in 0.0 s",
                "detached"
            ],
            "{lines:?}"
        );
    }

    /// An output that keeps each write apart.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn lines_that_come_together_are_written_together_in_whole_lines_and_pipe_sized_writes() {
        let writes = Writes::default();
        let (printer, events) = LinesPrinter::start(writes.clone(), 1000).unwrap();
        // More than one pipe-sized write's worth at once, and a line longer than one.
        for n in 0..300 {
            events.send(event(n)).unwrap();
        }
        events
            .send(AttachEvent::Disconnected {
                reason: "x".repeat(5000),
                retry_in: Duration::ZERO,
            })
            .unwrap();
        drop(events);
        printer.finish("detached", Duration::from_secs(10)).await;
        let writes = writes.0.lock().unwrap().clone();
        let text: Vec<u8> = writes.concat();
        let lines: Vec<&str> = std::str::from_utf8(&text).unwrap().lines().collect();
        assert_eq!(lines.len(), 302, "every line, in order");
        for (n, line) in lines[..300].iter().enumerate() {
            assert_eq!(*line, format!("line {n}; reconnecting in 0.0 s"));
        }
        assert_eq!(lines[301], "detached");
        // Fewer writes than lines: the lines that were waiting went out together.
        assert!(writes.len() < 100, "{} writes for 302 lines", writes.len());
        for write in &writes {
            assert!(write.ends_with(b"\n"), "a write ends a line");
            let longest_line = write.split(|b| *b == b'\n').map(<[u8]>::len).max().unwrap();
            assert!(
                write.len() <= WRITE_MAX || longest_line > WRITE_MAX,
                "a {}-byte write of short lines",
                write.len()
            );
        }
    }

    #[tokio::test]
    async fn a_slow_output_still_gets_the_count_and_the_last_line() {
        let (gate, printer, events) = stuck(10).await;
        drop(events);
        relayed().await;
        // The queue is full when the attachment ends; the output takes lines a moment later.
        let opener = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                gate.open();
            })
        };
        printer.finish("detached", Duration::from_secs(10)).await;
        opener.join().unwrap();
        let lines = gate.lines();
        assert_eq!(
            lines[5..],
            [
                "(5 lines not shown: standard error was not taking them, or a prompt was up)",
                "detached"
            ],
            "{lines:?}"
        );
    }

    #[tokio::test]
    async fn finishing_waits_no_longer_than_asked_for_an_attachment_that_has_not_let_go() {
        let gate = Gate::default();
        gate.open();
        let (printer, events) = LinesPrinter::start(gate.clone(), 4).unwrap();
        events.send(event(0)).unwrap();
        // `events` stays alive: the relay never ends.
        let started = std::time::Instant::now();
        printer.finish("detached", Duration::from_millis(200)).await;
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(5),
            "{took:?}"
        );
        until("both lines are written", || gate.lines().len() == 2).await;
        assert_eq!(gate.lines(), ["line 0; reconnecting in 0.0 s", "detached"]);
        drop(events);
    }

    #[tokio::test]
    async fn finishing_does_not_wait_longer_than_asked_for_a_stuck_output() {
        let gate = Gate::default();
        let (printer, events) = LinesPrinter::start(gate.clone(), 4).unwrap();
        for n in 0..10 {
            events.send(event(n)).unwrap();
        }
        drop(events);
        relayed().await;
        let started = std::time::Instant::now();
        printer.finish("detached", Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(gate.lines().is_empty());
        // The thread is let go, and writes what it held.
        gate.open();
    }
}
