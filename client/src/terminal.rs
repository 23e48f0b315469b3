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

use std::future::Future;
use std::io::Write;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::termios::{self, LocalFlags, SetArg};

use monad_protocol::text::printable_lines;

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

impl TerminalApprover {
    /// Starts the prompt thread, with `guard` as each prompt's guard time (see
    /// [`PROMPT_GUARD`]). `None` when stdin is not a terminal.
    pub fn start(timeout: Duration, guard: Duration) -> Option<TerminalApprover> {
        if !nix::unistd::isatty(std::io::stdin()).unwrap_or(false) {
            return None;
        }
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("approval-prompt".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    if job.reply.is_closed() {
                        continue; // withdrawn while queued
                    }
                    if let Some(decision) = prompt(&job, timeout, guard) {
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

/// Restores the terminal's mode when dropped.
struct RawMode(Option<termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        raw.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO);
        let _ = termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw);
        discard_typed_keys();
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

/// Drops every key typed and not read yet.
fn discard_typed_keys() {
    let _ = termios::tcflush(std::io::stdin().as_fd(), termios::FlushArg::TCIFLUSH);
}

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

/// Waits for one key until `until` (or the request's end); `Ok(None)` when `until` passed.
fn next_key(job: &Job, deadline: Instant, until: Instant) -> Result<Option<u8>, Ended> {
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
            Ok(0) | Err(_) => return Err(Ended::Closed),
            Ok(_) => return Ok(Some(byte[0])),
        }
    }
}

/// Asks about one request; `None` when it ran out of time (the caller reports the time-out).
fn prompt(job: &Job, timeout: Duration, guard: Duration) -> Option<Decision> {
    let r = &job.request;
    let text = render(r);
    let mut out = std::io::stderr().lock();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "── approval needed ───────────────────────────────────────"
    );
    for line in &text.lines {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "  [a] allow always covers {}",
        printable_lines(&r.scope)
    );
    let _ = writeln!(
        out,
        "  new request — keys are ignored for {} s",
        guard.as_secs_f64()
    );
    let _ = out.flush();
    drop(out);

    // A request that waited behind others has less than the full time-out left.
    let deadline = r.deadline.min(Instant::now() + timeout);
    let _raw = RawMode::enter();
    let answer = ask(job, &text, deadline, guard);
    let said = match answer {
        Ok(Decision::AllowOnce) => "allowed once",
        Ok(Decision::AllowAlways) => "allowed always",
        Ok(Decision::Deny) => "denied",
        Ok(Decision::DenyAlways) => "denied always",
        Err(Ended::Withdrawn) => "withdrawn: the agent cancelled this request",
        Err(Ended::TimedOut) => "nobody answered in time: refused",
        Err(Ended::Closed) => "the terminal closed: denied",
    };
    let _ = writeln!(std::io::stderr(), "{said}");
    match answer {
        Ok(decision) => Some(decision),
        Err(Ended::Closed) => Some(Decision::Deny),
        Err(Ended::Withdrawn | Ended::TimedOut) => None,
    }
}

/// The guard, then the question (and the pager) until an answer.
fn ask(job: &Job, text: &Prompt, deadline: Instant, guard: Duration) -> Result<Decision, Ended> {
    // Keys typed while the prompt is new are read and dropped, and whatever is left is flushed.
    let guard_end = Instant::now() + guard;
    while next_key(job, deadline, guard_end)?.is_some() {}
    discard_typed_keys();
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
            "  [y] allow once  [a] allow always  [n] deny  [d] deny always{view}\n  answer within {} s: ",
            left.as_secs_f64().ceil()
        );
        let _ = out.flush();
        drop(out);
        // Other keys are ignored; `v` pages, then the question is asked again.
        loop {
            let Some(key) = next_key(job, deadline, deadline + Duration::from_secs(1))? else {
                continue;
            };
            match key {
                b'y' | b'Y' | b'o' => return Ok(Decision::AllowOnce),
                b'a' | b'A' => return Ok(Decision::AllowAlways),
                b'n' | b'N' => return Ok(Decision::Deny),
                b'd' | b'D' => return Ok(Decision::DenyAlways),
                b'v' | b'V' => {
                    if let Some(whole) = &text.whole {
                        let _ = writeln!(std::io::stderr());
                        pager(job, whole, deadline)?;
                        break;
                    }
                }
                _ => {}
            }
        }
    }
}

/// Pages through `whole` until the user goes back to the question. Keys pressed here never
/// answer the prompt; the deadline keeps running and is shown.
fn pager(job: &Job, whole: &Whole, deadline: Instant) -> Result<(), Ended> {
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
            let Some(key) = next_key(job, deadline, deadline + Duration::from_secs(1))? else {
                continue;
            };
            match key {
                b' ' | b'\n' | b'\r' | b'j' | b'f' => {
                    if top + PAGE_LINES < whole.lines.len() {
                        top += PAGE_LINES;
                    }
                    break;
                }
                b'b' | b'k' => {
                    top = top.saturating_sub(PAGE_LINES);
                    break;
                }
                b'q' | b'Q' | 0x1b => return Ok(()),
                // Anything else, answer keys included, does nothing here.
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_can_be_lengthened_but_never_shortened() {
        assert_eq!(guard_from_setting(None), PROMPT_GUARD);
        assert_eq!(guard_from_setting(Some("3000")), Duration::from_secs(3));
        assert_eq!(guard_from_setting(Some("0")), PROMPT_GUARD);
        assert_eq!(guard_from_setting(Some("soon")), PROMPT_GUARD);
    }
}
