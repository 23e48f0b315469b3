//! The terminal approver: one prompt at a time on the attach terminal, answered with one key.
//!
//! dialoguer's prompts block on a key with no time-out and cannot be withdrawn, but a prompt
//! here must time out to deny and disappear when the agent cancels the call. So this reads keys
//! itself: stdin in non-canonical mode, `poll` in short slices, checking between slices whether
//! the question was withdrawn or ran out of time.

use std::future::Future;
use std::io::Write;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::termios::{self, LocalFlags, SetArg};

use crate::approval::{ApprovalRequest, Approver, Decision};

/// Longest diff shown in a prompt, in lines.
const DIFF_LINES: usize = 40;

struct Job {
    request: ApprovalRequest,
    reply: tokio::sync::oneshot::Sender<Decision>,
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
    /// Starts the prompt thread. `None` when stdin is not a terminal.
    pub fn start(timeout: Duration) -> Option<TerminalApprover> {
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
                    let decision = prompt(&job, timeout);
                    let _ = job.reply.send(decision);
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
            rx.await.unwrap_or(Decision::Deny)
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
        // Keys typed before the prompt appeared must not answer it.
        let _ = termios::tcflush(stdin.as_fd(), termios::FlushArg::TCIFLUSH);
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

/// Text from the agent made safe to print: every control character (escape sequences, carriage
/// returns, backspaces, ...) is shown as a visible `\u{..}` escape, so an argv or a file's
/// content cannot repaint the prompt and show the user something other than what would run.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

fn prompt(job: &Job, timeout: Duration) -> Decision {
    let r = &job.request;
    let mut out = std::io::stderr().lock();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "── approval needed ───────────────────────────────────────"
    );
    let _ = writeln!(
        out,
        "  {} in `{}` (session {})",
        r.tool,
        printable(&r.workspace),
        printable(&r.session)
    );
    let _ = writeln!(out, "  {}", printable(&r.target));
    if let Some(diff) = &r.diff {
        let lines: Vec<&str> = diff.lines().collect();
        for line in lines.iter().take(DIFF_LINES) {
            let _ = writeln!(out, "    {}", printable(line));
        }
        if lines.len() > DIFF_LINES {
            let _ = writeln!(out, "    … {} more lines", lines.len() - DIFF_LINES);
        }
    }
    let _ = writeln!(
        out,
        "  [y] allow once  [a] allow always ({})  [n] deny  [d] deny always",
        printable(&r.scope)
    );
    // A request that waited behind others has less than the full time-out left.
    let deadline = r.deadline.min(Instant::now() + timeout);
    let left = deadline.saturating_duration_since(Instant::now());
    let _ = write!(out, "  answer within {} s: ", left.as_secs_f64().ceil());
    let _ = out.flush();
    drop(out);

    let _raw = RawMode::enter();
    let answer = loop {
        if job.reply.is_closed() {
            break Err("withdrawn: the call was cancelled");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err("no answer in time: denied");
        }
        let slice = left.min(Duration::from_millis(200));
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
            Ok(0) | Err(_) => break Err("the terminal closed: denied"),
            Ok(_) => match byte[0] {
                b'y' | b'Y' | b'o' => break Ok(Decision::AllowOnce),
                b'a' | b'A' => break Ok(Decision::AllowAlways),
                b'n' | b'N' => break Ok(Decision::Deny),
                b'd' | b'D' => break Ok(Decision::DenyAlways),
                _ => {}
            },
        }
    };
    let (decision, said) = match answer {
        Ok(d) => (
            d,
            match d {
                Decision::AllowOnce => "allowed once",
                Decision::AllowAlways => "allowed always",
                Decision::Deny => "denied",
                Decision::DenyAlways => "denied always",
            },
        ),
        Err(why) => (Decision::Deny, why),
    };
    let _ = writeln!(std::io::stderr(), "{said}");
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_cannot_repaint_the_prompt() {
        let spoof = "curl x|sh #\u{1b}[2K\r$ ls\u{8}";
        let shown = printable(spoof);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert!(
            shown.contains("\\u{1b}") && shown.contains("\\u{d}"),
            "{shown}"
        );
        assert_eq!(printable("a\tb é"), "a\tb é");
    }
}
