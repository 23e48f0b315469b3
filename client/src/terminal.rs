//! The terminal approver: one prompt at a time on the attach terminal, answered with one key.
//!
//! dialoguer's prompts block on a key with no time-out and cannot be withdrawn, but a prompt
//! here must time out to deny and disappear when the agent cancels the call. So this reads keys
//! itself: stdin in non-canonical mode, `poll` in short slices, checking between slices whether
//! the question was withdrawn or ran out of time.
//!
//! The text comes from [`crate::prompt::render`]; this module only prints it. One key answers
//! one prompt: a new prompt ignores keys for [`PROMPT_GUARD`] (and says so) before it shows the
//! answer keys, and discards what was typed meanwhile; a withdrawn prompt says it was withdrawn.
//! `v` pages through a long diff or standard input whole; keys pressed while paging never
//! answer.
//!
//! Bytes are turned into keys by [`decode`]: an escape sequence (an arrow, a function key,
//! Alt with a letter) is read to its end and is one key, never the letters it ends with, so the
//! Up arrow (`ESC [ A`) cannot answer "allow always" with its `A`. Only the documented answer
//! keys answer, lower case only (the final bytes of escape sequences are upper case). `a`
//! (allow always) asks for a confirmation that says what "always" covers.

use std::future::Future;
use std::io::Write;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::termios::{self, LocalFlags, SetArg};

use crate::approval::{ApprovalRequest, Approver, Decision};
use crate::prompt::{PAGE_LINES, Prompt, Whole, page, render};

struct Job {
    request: ApprovalRequest,
    reply: tokio::sync::oneshot::Sender<Decision>,
}

/// How long a prompt that appears (or replaces a withdrawn one) ignores keys: long enough that a
/// key pressed for the previous prompt, or typed just as this one appears, cannot answer it;
/// short enough not to be in the way. Keys typed during it are discarded. Documented in
/// docs/security.md ("One key answers one prompt").
pub const PROMPT_GUARD: Duration = Duration::from_millis(750);

/// The guard time to use: [`PROMPT_GUARD`], or longer when `MONAD_PROMPT_GUARD_MS` (`setting`)
/// asks for more; never shorter.
pub fn guard_from_setting(setting: Option<&str>) -> Duration {
    setting
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map(Duration::from_millis)
        .map_or(PROMPT_GUARD, |asked| asked.max(PROMPT_GUARD))
}

/// Asks on this process's terminal. Requests queue; each waits at most `timeout`.
#[derive(Debug)]
pub struct TerminalApprover {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("request", &self.request)
            .finish()
    }
}

/// Why no approval prompt can be asked here, if none can: its keys are read from standard
/// input and its question drawn on standard error, and both must be a terminal. A question
/// drawn where its owner cannot see it (`2>attach.log`) would be answered by keys typed for
/// something else.
pub fn why_no_prompts() -> Option<&'static str> {
    let terminal = |fd: std::os::fd::BorrowedFd<'_>| nix::unistd::isatty(fd).unwrap_or(false);
    if !terminal(std::io::stdin().as_fd()) {
        Some("no terminal")
    } else if !terminal(std::io::stderr().as_fd()) {
        Some("standard error is not a terminal, so an approval prompt could not be seen")
    } else {
        None
    }
}

impl TerminalApprover {
    /// Starts the prompt thread, with `guard` as each prompt's guard time (see
    /// [`PROMPT_GUARD`]). `None` when no prompt can be asked here ([`why_no_prompts`]).
    pub fn start(timeout: Duration, guard: Duration) -> Option<TerminalApprover> {
        TerminalApprover::start_with(timeout, guard, None, None, None)
    }

    /// [`TerminalApprover::start`], holding `lines` (an attachment's event lines) while each
    /// prompt is up: printed under it, they pushed the question off the screen.
    /// `stopping` turns true when the attach itself ends (its owner's Ctrl-C): a prompt it takes
    /// down says so, not that the agent withdrew it.
    pub fn start_holding(
        timeout: Duration,
        guard: Duration,
        lines: crate::printer::LinesPause,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Option<TerminalApprover> {
        TerminalApprover::start_with(timeout, guard, None, Some(lines), Some(stopping))
    }

    /// [`TerminalApprover::start`] for a terminal another reader shares (the chat's input):
    /// each prompt holds `terminal` while it is up, and that reader reads only while it holds
    /// it, so the two never read the terminal at once; and holds `lines` (what the chat prints:
    /// the model's text, the folder's lines, its `> `), which waits for the answer.
    pub fn start_sharing(
        timeout: Duration,
        guard: Duration,
        terminal: std::sync::Arc<std::sync::Mutex<()>>,
        lines: crate::printer::LinesPause,
    ) -> Option<TerminalApprover> {
        TerminalApprover::start_with(timeout, guard, Some(terminal), Some(lines), None)
    }

    fn start_with(
        timeout: Duration,
        guard: Duration,
        terminal: Option<std::sync::Arc<std::sync::Mutex<()>>>,
        lines: Option<crate::printer::LinesPause>,
        stopping: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> Option<TerminalApprover> {
        if why_no_prompts().is_some() {
            return None;
        }
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("approval-prompt".into())
            .spawn(move || {
                // This thread alone uses the terminal from a job that may be in the background:
                // with SIGTTOU and SIGTTIN blocked here, writing (under `stty tostop`) and a read
                // that races a move to the background never make the kernel stop the whole
                // process (the read fails instead); the terminal's mode is changed and keys are
                // read only from the foreground (`in_the_foreground`, `next_key`).
                let mut stops = nix::sys::signal::SigSet::empty();
                stops.add(nix::sys::signal::Signal::SIGTTOU);
                stops.add(nix::sys::signal::Signal::SIGTTIN);
                let _ = stops.thread_block();
                while let Ok(job) = rx.recv() {
                    if job.reply.is_closed() {
                        continue; // withdrawn while queued
                    }
                    let _held = terminal
                        .as_ref()
                        .map(|t| t.lock().unwrap_or_else(|p| p.into_inner()));
                    let stopping = || stopping.as_ref().is_some_and(|s| *s.borrow());
                    if let Some(decision) = prompt(&job, timeout, guard, lines.as_ref(), &stopping)
                    {
                        let _ = job.reply.send(decision);
                    }
                }
            })
            .ok()?;
        Some(TerminalApprover { jobs })
    }
}

impl Approver for TerminalApprover {
    fn decide(&self, request: ApprovalRequest) -> Pin<Box<dyn Future<Output = Decision> + Send>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let sent = self.jobs.send(Job { request, reply }).is_ok();
        Box::pin(async move {
            if !sent {
                return Decision::Deny;
            }
            match rx.await {
                Ok(decision) => decision,
                // The prompt ran out of time without an answer: stay pending, so that the
                // caller's own time-out reports it as unanswered, not as a decision.
                Err(_) => std::future::pending().await,
            }
        })
    }
}

/// The terminal in other modes than its own, which it gets back when this drops (unless the job
/// is in the background then: the terminal is another job's), or from [`restore`] when the
/// process ends on a signal meanwhile. `None` inside: the modes were never changed.
pub struct Modes(Option<termios::Termios>);

/// The terminal's modes from before a [`Modes`] that is still on, for [`restore`]: the process
/// may exit (Ctrl-C, SIGTERM, a take-over) while it is on.
static BEFORE_RAW: std::sync::Mutex<Option<termios::Termios>> = std::sync::Mutex::new(None);

impl Modes {
    /// The prompt's mode ([`raw_of`]), with the keys typed before it discarded; the terminal
    /// left as it is when its modes cannot be changed.
    fn raw() -> Modes {
        let modes = Modes(Modes::set(raw_of).ok());
        discard_typed_keys();
        modes
    }

    /// Echo off, lines still edited, for a secret typed on it (`login`'s token); fails when
    /// standard input is not a terminal.
    pub fn unechoed() -> std::io::Result<Modes> {
        Modes::set(|saved| {
            let mut quiet = saved.clone();
            quiet.local_flags.remove(LocalFlags::ECHO);
            quiet.local_flags.insert(LocalFlags::ICANON);
            quiet
        })
        .map(|saved| Modes(Some(saved)))
    }

    /// Sets standard input's terminal to `mode` of its current modes, which it returns and
    /// keeps for [`restore`].
    fn set(
        mode: impl FnOnce(&termios::Termios) -> termios::Termios,
    ) -> std::io::Result<termios::Termios> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).map_err(std::io::Error::from)?;
        // Kept before the modes change, under the lock: a process ending meanwhile restores
        // them.
        let mut before = BEFORE_RAW.lock().unwrap_or_else(|p| p.into_inner());
        *before = Some(saved.clone());
        if let Err(e) = termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &mode(&saved)) {
            *before = None;
            return Err(e.into());
        }
        Ok(saved)
    }
}

impl Drop for Modes {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let mut before = BEFORE_RAW.lock().unwrap_or_else(|p| p.into_inner());
            // From the background the terminal is another job's (the shell put its own modes
            // back when this one stopped): it is left as it is.
            if in_the_foreground() {
                let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
            }
            *before = None;
        }
    }
}

/// Puts the terminal back in the prompt's mode (no line editing, no echo) when a prompt is up:
/// after the job came back to the foreground (`fg`), whose shell had put its own modes back.
fn raw_again() {
    let before = BEFORE_RAW.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(saved) = before.as_ref() {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &raw_of(saved));
    }
}

/// The prompt's mode made from the terminal's `saved` one: keys one at a time, not echoed.
fn raw_of(saved: &termios::Termios) -> termios::Termios {
    let mut raw = saved.clone();
    raw.local_flags
        .remove(LocalFlags::ICANON | LocalFlags::ECHO);
    raw
}

/// Gives the terminal back its modes from before a prompt that is still up (echo and line
/// editing), so that a process ending meanwhile does not leave its shell without them. Called
/// as the process exits; does nothing when no prompt is up.
pub fn restore() {
    let mut before = BEFORE_RAW.lock().unwrap_or_else(|p| p.into_inner());
    // From the background the terminal is another job's: left as it is (and setting it would
    // stop this process as it exits).
    if let Some(saved) = before.take()
        && in_the_foreground()
    {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &saved);
    }
}

/// Drops every key typed and not read yet; from the background, none (they are another job's).
fn discard_typed_keys() {
    if in_the_foreground() {
        let _ = termios::tcflush(std::io::stdin().as_fd(), termios::FlushArg::TCIFLUSH);
    }
}

/// What [`next_key`] gives when the prompt should be drawn again: the job came back to the
/// foreground, or the owner pressed Ctrl-L.
const REDRAW: u8 = 0x0c;

/// Why a prompt ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The agent cancelled the call.
    Withdrawn,
    /// The deadline passed.
    TimedOut,
    /// The terminal went away.
    Closed,
}

impl Ended {
    /// What the prompt's last line says of it.
    fn said(self) -> &'static str {
        match self {
            Ended::Withdrawn => "withdrawn: the agent cancelled this request",
            Ended::TimedOut => "nobody answered in time: refused",
            Ended::Closed => "the terminal closed: denied",
        }
    }
}

/// Waits for one key until `until` (or the request's end); `Ok(None)` when `until` passed.
fn next_key(job: &Job, deadline: Instant, until: Instant) -> Result<Option<u8>, Ended> {
    let mut away = false;
    loop {
        if job.reply.is_closed() {
            return Err(Ended::Withdrawn);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Ended::TimedOut);
        }
        if now >= until {
            return Ok(None);
        }
        let slice = until
            .min(deadline)
            .saturating_duration_since(now)
            .min(Duration::from_millis(100));
        // In the background (Ctrl-Z, then `bg`), a read would stop the whole process
        // (SIGTTIN): the prompt waits until it is in the foreground again, then puts the
        // terminal back in its mode and has the request drawn again.
        if !in_the_foreground() {
            away = true;
            std::thread::sleep(slice);
            continue;
        }
        if away {
            raw_again();
            return Ok(Some(REDRAW));
        }
        let stdin = std::io::stdin();
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        let ready = poll(
            &mut fds,
            PollTimeout::try_from(slice).unwrap_or(PollTimeout::ZERO),
        );
        if !matches!(ready, Ok(n) if n > 0) {
            continue;
        }
        let mut byte = [0u8; 1];
        match nix::unistd::read(std::io::stdin().as_fd(), &mut byte) {
            // Moved to the background since the check above: the read fails (SIGTTIN is
            // blocked in this thread), and the prompt waits as above.
            Err(nix::errno::Errno::EIO) if !in_the_foreground() => {}
            Ok(0) | Err(_) => return Err(Ended::Closed),
            Ok(_) => return Ok(Some(byte[0])),
        }
    }
}

/// How long the bytes after an Escape may take to arrive and still be one key with it (terminals
/// send a whole escape sequence at once; an Escape followed by nothing for this long is the
/// Escape key alone).
const SEQUENCE_WAIT: Duration = Duration::from_millis(100);

const ESC: u8 = 0x1b;

/// A key, as the prompt and the pager see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A key that sends one byte (a letter, space, Enter, ...).
    Byte(u8),
    /// The Escape key alone.
    Escape,
    /// The Up arrow.
    Up,
    /// The Down arrow.
    Down,
    /// Page Up.
    PageUp,
    /// Page Down.
    PageDown,
    /// Any other escape sequence: another arrow, a function key, a modified key, Alt with a
    /// key, a terminal report. It answers nothing.
    Sequence,
}

/// Reads one key that starts with `first`; `next` gives the following byte when one arrives in
/// time (`Ok(None)` when none does). An escape sequence is read to its end (ECMA-48: a CSI
/// `ESC [` with parameter and intermediate bytes up to a final byte 0x40–0x7E; an SS3 `ESC O`
/// and its final byte; an `ESC` with intermediate bytes 0x20–0x2F up to a final byte; a control
/// string `ESC ]`, `ESC P`, `ESC X`, `ESC ^`, `ESC _` up to BEL or `ESC \`; `ESC` with any other
/// byte is Alt with that key). Also returns a byte read too far (an Escape that starts the next
/// key), to be decoded next.
pub fn decode<E>(
    first: u8,
    next: &mut impl FnMut() -> Result<Option<u8>, E>,
) -> Result<(Key, Option<u8>), E> {
    if first != ESC {
        return Ok((Key::Byte(first), None));
    }
    let Some(second) = next()? else {
        return Ok((Key::Escape, None));
    };
    Ok(match second {
        // Escape twice: the first was alone; the second starts the next key.
        ESC => (Key::Escape, Some(ESC)),
        b'[' => {
            let mut params = Vec::new();
            loop {
                match next()? {
                    None => break (Key::Sequence, None),
                    Some(b @ 0x20..=0x3f) => {
                        if params.len() < 16 {
                            params.push(b);
                        }
                    }
                    Some(last @ 0x40..=0x7e) => {
                        let key = match (params.as_slice(), last) {
                            (b"", b'A') => Key::Up,
                            (b"", b'B') => Key::Down,
                            (b"5", b'~') => Key::PageUp,
                            (b"6", b'~') => Key::PageDown,
                            _ => Key::Sequence,
                        };
                        break (key, None);
                    }
                    Some(ESC) => break (Key::Sequence, Some(ESC)),
                    // A control byte inside a sequence ends it (and is dropped).
                    Some(_) => break (Key::Sequence, None),
                }
            }
        }
        b'O' => match next()? {
            Some(b'A') => (Key::Up, None),
            Some(b'B') => (Key::Down, None),
            Some(ESC) => (Key::Sequence, Some(ESC)),
            _ => (Key::Sequence, None),
        },
        b']' | b'P' | b'X' | b'^' | b'_' => {
            let mut escaped = false;
            loop {
                match next()? {
                    None | Some(0x07) => break,
                    Some(b'\\') if escaped => break,
                    Some(b) => escaped = b == ESC,
                }
            }
            (Key::Sequence, None)
        }
        0x20..=0x2f => {
            loop {
                match next()? {
                    None | Some(0x30..=0x7e) => break,
                    Some(_) => {}
                }
            }
            (Key::Sequence, None)
        }
        // Alt with a key.
        _ => (Key::Sequence, None),
    })
}

/// Keys typed on the terminal, for one prompt.
#[derive(Default)]
struct Input {
    /// A byte read as part of the previous key that starts the next one.
    pending: Option<u8>,
}

impl Input {
    /// Waits for one key until `until` (or the request's end); `Ok(None)` when `until` passed.
    fn key(&mut self, job: &Job, deadline: Instant, until: Instant) -> Result<Option<Key>, Ended> {
        let first = match self.pending.take() {
            Some(byte) => byte,
            None => match next_key(job, deadline, until)? {
                Some(byte) => byte,
                None => return Ok(None),
            },
        };
        let mut next = || next_key(job, deadline, Instant::now() + SEQUENCE_WAIT);
        let (key, pending) = decode(first, &mut next)?;
        self.pending = pending;
        Ok(Some(key))
    }

    /// Drops every key typed and not read yet.
    fn discard(&mut self) {
        self.pending = None;
        discard_typed_keys();
    }
}

/// Asks about one request; `None` when it ran out of time (the caller reports the time-out).
fn prompt(
    job: &Job,
    timeout: Duration,
    guard: Duration,
    lines: Option<&crate::printer::LinesPause>,
    stopping: &dyn Fn() -> bool,
) -> Option<Decision> {
    let r = &job.request;
    let text = render(r);
    let mut shown = String::new();
    {
        use std::fmt::Write as _;
        let _ = writeln!(shown);
        let _ = writeln!(
            shown,
            "── approval needed ───────────────────────────────────────"
        );
        for line in &text.lines {
            let _ = writeln!(shown, "  {line}");
        }
        let _ = writeln!(
            shown,
            "  [a] allow always covers {}",
            crate::prompt::scope_drawn(&r.scope)
        );
    }
    // A request that waited behind others has less than the full time-out left.
    let deadline = r.deadline.min(Instant::now() + timeout);
    if let Err(ended) = wait_for_the_foreground(job, deadline) {
        let _ = writeln!(std::io::stderr(), "{}", ended.said());
        return None;
    }
    // What was queued before the question (the chat's line for the call) shows above it; the
    // lines then wait until it is answered (or withdrawn).
    let _lines_held = lines.map(|lines| lines.hold_after_queued(Duration::from_millis(500)));
    let mut out = std::io::stderr().lock();
    let _ = out.write_all(shown.as_bytes());
    let _ = writeln!(
        out,
        "  new request — keys are ignored for {} s",
        guard.as_secs_f64()
    );
    let _ = out.flush();
    drop(out);
    let _raw = Modes::raw();
    let answer = ask(job, &text, &shown, deadline, guard);
    let said = match answer {
        Ok(Decision::AllowOnce) => "allowed once",
        Ok(Decision::AllowAlways) => "allowed always",
        Ok(Decision::Deny) => "denied",
        Ok(Decision::DenyAlways) => "denied always",
        // The request ended because the attach does (its owner's Ctrl-C), not the agent.
        Err(Ended::Withdrawn) if stopping() => "the attach is ending: not run",
        Err(ended) => ended.said(),
    };
    let _ = writeln!(std::io::stderr(), "{said}");
    match answer {
        Ok(decision) => Some(decision),
        Err(Ended::Closed) => Some(Decision::Deny),
        Err(Ended::Withdrawn | Ended::TimedOut) => None,
    }
}

/// Whether this process is in the foreground of its terminal: not a job the shell runs in the
/// background (`attach DIR &`). A terminal that is not the process's controlling one (or none)
/// counts as the foreground: nothing stops the process for using it.
fn in_the_foreground() -> bool {
    let stdin = std::io::stdin();
    nix::unistd::tcgetpgrp(stdin.as_fd()).map_or(true, |group| group == nix::unistd::getpgrp())
}

/// Waits until this process is in the foreground of its terminal, saying so once when it is
/// not: from the background, setting the terminal's mode for the prompt (and reading its keys)
/// makes the kernel stop the whole process (SIGTTOU, SIGTTIN), its pre-approved calls and its
/// connection's upkeep with it, until the shell resumes it. Meanwhile the request waits, until
/// its deadline or until it is withdrawn.
fn wait_for_the_foreground(job: &Job, deadline: Instant) -> Result<(), Ended> {
    if in_the_foreground() {
        return Ok(());
    }
    let _ = writeln!(
        std::io::stderr(),
        "  this attach runs in the background: bring it to the foreground (`fg`) to answer"
    );
    loop {
        if job.reply.is_closed() {
            return Err(Ended::Withdrawn);
        }
        if Instant::now() >= deadline {
            return Err(Ended::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(100));
        if in_the_foreground() {
            return Ok(());
        }
    }
}

/// The guard, then the question (and the pager, and the confirmation of "always") until an
/// answer.
fn ask(
    job: &Job,
    text: &Prompt,
    shown: &str,
    deadline: Instant,
    guard: Duration,
) -> Result<Decision, Ended> {
    let mut input = Input::default();
    // Keys typed while the prompt is new are read and dropped, and whatever is left is flushed.
    let guard_end = Instant::now() + guard;
    while input.key(job, deadline, guard_end)?.is_some() {}
    input.discard();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let view = if text.whole.is_some() {
            "  [v] view all"
        } else {
            ""
        };
        let mut out = std::io::stderr().lock();
        let _ = write!(
            out,
            "  [y] allow once  [a] allow always…  [n] deny  [d] deny always{view}\n  answer within {} s: ",
            left.as_secs_f64().ceil()
        );
        let _ = out.flush();
        drop(out);
        // Other keys (escape sequences included) are ignored; `v` pages and `a` asks for a
        // confirmation, then the question is asked again.
        loop {
            let Some(key) = input.key(job, deadline, deadline + Duration::from_secs(1))? else {
                continue;
            };
            match key {
                Key::Byte(b'y') => return Ok(Decision::AllowOnce),
                Key::Byte(b'n') => return Ok(Decision::Deny),
                Key::Byte(b'd') => return Ok(Decision::DenyAlways),
                Key::Byte(b'a') => {
                    if confirm_always(job, &mut input, &job.request.scope, deadline)? {
                        return Ok(Decision::AllowAlways);
                    }
                    break;
                }
                Key::Byte(b'v') => {
                    if let Some(whole) = &text.whole {
                        let _ = writeln!(std::io::stderr());
                        pager(job, &mut input, whole, deadline)?;
                        break;
                    }
                }
                // Back in the foreground (or Ctrl-L): the request, then the question, again.
                Key::Byte(REDRAW) => {
                    let mut out = std::io::stderr().lock();
                    let _ = out.write_all(shown.as_bytes());
                    let _ = out.flush();
                    break;
                }
                _ => {}
            }
        }
    }
}

/// After `a`: says what "always" covers and waits for `y`; any other key goes back to the
/// question. Keys typed before the confirmation appeared are dropped, so a key pressed twice in
/// a hurry does not confirm.
fn confirm_always(
    job: &Job,
    input: &mut Input,
    scope: &str,
    deadline: Instant,
) -> Result<bool, Ended> {
    // Dropped before the confirmation is drawn: a key typed once it is on the screen (the
    // owner's answer to it) was lost when the drop came after the drawing.
    input.discard();
    let mut out = std::io::stderr().lock();
    let _ = writeln!(out);
    let _ = writeln!(out, "  allow always: {}", crate::prompt::scope_drawn(scope));
    let _ = write!(
        out,
        "  [y] confirm \"always\"  any other key: back to the question: "
    );
    let _ = out.flush();
    drop(out);
    loop {
        let Some(key) = input.key(job, deadline, deadline + Duration::from_secs(1))? else {
            continue;
        };
        let confirmed = key == Key::Byte(b'y');
        if !confirmed {
            let _ = writeln!(std::io::stderr(), "not confirmed");
        }
        return Ok(confirmed);
    }
}

/// Pages through `whole` until the user goes back to the question (`q`, or Escape alone). Keys
/// pressed here never answer the prompt; the deadline keeps running and is shown.
fn pager(job: &Job, input: &mut Input, whole: &Whole, deadline: Instant) -> Result<(), Ended> {
    let mut top = 0usize;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (lines, status) = page(whole, top, PAGE_LINES, left.as_secs_f64().ceil() as u64);
        let mut out = std::io::stderr().lock();
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out, "{status}");
        let _ = out.flush();
        drop(out);
        loop {
            let Some(key) = input.key(job, deadline, deadline + Duration::from_secs(1))? else {
                continue;
            };
            match key {
                Key::Byte(b' ' | b'\n' | b'\r' | b'j' | b'f') | Key::Down | Key::PageDown => {
                    if top + PAGE_LINES < whole.rows() {
                        top += PAGE_LINES;
                    }
                    break;
                }
                Key::Byte(b'b' | b'k') | Key::Up | Key::PageUp => {
                    top = top.saturating_sub(PAGE_LINES);
                    break;
                }
                Key::Byte(b'q') | Key::Escape => return Ok(()),
                // Anything else, answer keys and other escape sequences included, does nothing
                // here.
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys `bytes` decode to, every byte arriving in time.
    fn keys(bytes: &[u8]) -> Vec<Key> {
        let mut rest = bytes.iter().copied();
        let mut out = Vec::new();
        let mut pending = None;
        while let Some(first) = pending.take().or_else(|| rest.next()) {
            let mut next = || Ok::<_, ()>(rest.next());
            let (key, left) = decode(first, &mut next).unwrap();
            out.push(key);
            pending = left;
        }
        out
    }

    #[test]
    fn escape_sequences_are_one_key_never_the_letters_they_end_with() {
        use Key::*;
        let cases: &[(&[u8], &[Key])] = &[
            (b"y", &[Byte(b'y')]),
            (b"\x1b[A", &[Up]),
            (b"\x1b[B", &[Down]),
            (b"\x1b[C\x1b[D", &[Sequence, Sequence]),
            (b"\x1bOA\x1bOD", &[Up, Sequence]),
            (b"\x1b[5~\x1b[6~", &[PageUp, PageDown]),
            (b"\x1b[1;2A", &[Sequence]),
            (b"\x1b[15~", &[Sequence]),
            (b"\x1b[200~", &[Sequence]),
            (b"\x1by", &[Sequence]),
            (b"\x1ba", &[Sequence]),
            (b"\x1bA", &[Sequence]),
            (b"\x1b]52;c;eQ==\x07y", &[Sequence, Byte(b'y')]),
            (b"\x1b]0;title\x1b\\n", &[Sequence, Byte(b'n')]),
            (b"\x1b(B", &[Sequence]),
            (b"\x1b", &[Escape]),
            (b"\x1b\x1b[A", &[Escape, Up]),
            (b"\x1b[\x1b[D", &[Sequence, Sequence]),
            (b"\x1b[1\x01a", &[Sequence, Byte(b'a')]),
        ];
        for (bytes, want) in cases {
            assert_eq!(&keys(bytes), want, "{bytes:?}");
        }
    }

    #[test]
    fn an_escape_with_nothing_after_it_in_time_is_the_escape_key() {
        let mut nothing = || Ok::<_, ()>(None);
        assert_eq!(decode(ESC, &mut nothing), Ok((Key::Escape, None)));
        // A sequence cut short ends where it was cut; its letter never arrives as a key.
        let mut cut = [b'['].into_iter();
        let mut next = || Ok::<_, ()>(cut.next());
        assert_eq!(decode(ESC, &mut next), Ok((Key::Sequence, None)));
    }

    #[test]
    fn the_guard_can_be_lengthened_but_never_shortened() {
        assert_eq!(guard_from_setting(None), PROMPT_GUARD);
        assert_eq!(guard_from_setting(Some("3000")), Duration::from_secs(3));
        assert_eq!(guard_from_setting(Some("0")), PROMPT_GUARD);
        assert_eq!(guard_from_setting(Some("soon")), PROMPT_GUARD);
    }
}
