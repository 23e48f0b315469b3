//! Commands as processes: every `run_command` starts a [`Proc`] whose output a task pumps into
//! buffers. A foreground call waits for it; a background one (`background: true`, or still
//! running after `background_after_ms`) stays in the workspace's [`Table`], where
//! `process_read`, `process_write`, `process_kill` and `process_list` find it.
//!
//! A process is ended through its [`Supervisor`], which takes the whole tree (see
//! [`super::child`]): when its time runs out, when `process_kill` says so, when a foreground call
//! is cancelled, and when the table is dropped (the workspace detached, the session unloaded).

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monad_protocol::tools::{
    NetworkEvent, OutputGap, ProcessInfo, ProcessKillArgs, ProcessKillResult, ProcessListResult,
    ProcessReadArgs, ProcessReadResult, ProcessWriteArgs, ProcessWriteResult, RunCommandArgs,
    RunCommandResult,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::{child, netpolicy};
use crate::error::SandboxError;
use crate::limits::{ExecPolicy, Limits};

/// A callback that shows a caller how a foreground command is going.
pub type Progress<'a> = dyn Fn(&str) + Send + Sync + 'a;

/// Grace given to output readers after the command's tree is gone.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// How long a supervisor gets to end its tree before it is killed itself (unless, without
/// namespaces, it is still making progress: see [`keep_waiting`]).
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How often a supervisor that is still ending its tree after [`KILL_GRACE`] is looked at.
const PROGRESS_CHECK: Duration = Duration::from_secs(1);
/// Longest a supervisor that keeps making progress may take to end its tree.
const KILL_HARD_LIMIT: Duration = Duration::from_secs(60);
/// How often a foreground command reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// Longest `wait_ms` of `process_read`.
const MAX_READ_WAIT: Duration = Duration::from_secs(300);
/// Longest a `process_write` waits for the process to take its input.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a pipe takes whole or not at all, in bytes.
const PIPE_BUF: usize = nix::libc::PIPE_BUF;
/// Characters of the latest output line shown in progress.
const PROGRESS_LINE_CHARS: usize = 200;

/// The process the caller's `Child` names (the supervisor of the command's tree), reached
/// through a pidfd so that a signal never lands on a recycled pid.
#[derive(Debug, Clone)]
pub(crate) struct Supervisor {
    pid: i32,
    pidfd: Arc<OwnedFd>,
    /// Its tree is in namespaces of its own: killing it kills the tree (init dies with it).
    namespaced: bool,
}

/// What a supervisor asked to end its tree is seen doing (from `/proc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// Stopped (`SIGSTOP`, traced): it makes no progress whatever its tree does.
    pub stopped: bool,
    /// CPU time it has used, in clock ticks.
    pub cpu_ticks: u64,
    /// Its children (the fallback's orphans, re-parented to it, until it has reaped them).
    pub children: usize,
}

/// Whether to give a supervisor that was asked to end its tree `waited` ago, and has not, more
/// time rather than `SIGKILL` it: only without namespaces (where killing it would leave the
/// orphans it is still killing), while it makes progress between two looks (`before`, `now`:
/// `None` when it could not be seen), and within [`KILL_HARD_LIMIT`]. Pure.
pub(crate) fn keep_waiting(
    namespaced: bool,
    before: Option<Sample>,
    now: Option<Sample>,
    waited: Duration,
) -> bool {
    if namespaced || waited >= KILL_HARD_LIMIT {
        return false;
    }
    match (before, now) {
        (Some(before), Some(now)) => {
            !now.stopped && (now.cpu_ticks > before.cpu_ticks || now.children < before.children)
        }
        _ => false,
    }
}

impl Supervisor {
    /// Takes hold of the supervisor `pid`, which must not have been reaped yet. Without its
    /// pidfd (descriptors used up) it is asked to end its tree, by its pid, which cannot have
    /// been recycled yet, and the error is returned: a supervisor held by its pid alone could
    /// be signalled, once reaped, as another process of the host.
    pub(crate) fn new(pid: u32, namespaced: bool) -> std::io::Result<Supervisor> {
        let pid = pid as i32;
        match child::pidfd_open(pid) {
            Ok(fd) => Ok(Supervisor {
                pid,
                pidfd: Arc::new(fd),
                namespaced,
            }),
            Err(e) => {
                // The `Child` the caller drops is reaped by tokio once the supervisor has ended
                // the tree and exited.
                child::kill_tree_unwatched(pid);
                Err(e)
            }
        }
    }

    /// What it is doing now; `None` when it has exited (or cannot be seen).
    fn sample(&self) -> Option<Sample> {
        // Through the pidfd first: once the supervisor is reaped its pid may name another
        // process, and the pidfd says so.
        if child::pidfd_signal(&self.pidfd, 0).is_err() {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
        let state = *fields.first()?;
        if state == "Z" || state == "X" {
            return None;
        }
        let ticks = |n: usize| fields.get(n).and_then(|f| f.parse::<u64>().ok());
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
            .map(|list| list.split_whitespace().count())
            .unwrap_or(0);
        Some(Sample {
            stopped: state == "T" || state == "t",
            cpu_ticks: ticks(11)?.saturating_add(ticks(12)?),
            children,
        })
    }

    /// Sends `signal`; false when the supervisor is gone.
    fn signal(&self, signal: i32) -> bool {
        child::pidfd_signal(&self.pidfd, signal).is_ok()
    }

    /// Asks the supervisor to kill the whole tree now.
    pub(crate) fn kill_tree(&self) {
        self.signal(child::KILL_TREE);
    }

    fn kill_hard(&self) {
        self.signal(nix::libc::SIGKILL);
    }
}

/// Kills the tree when dropped while armed (a cancelled call, an aborted task): asks the
/// supervisor at once, and makes sure it ends as [`end`] does (on the runtime, when there is
/// one).
pub(crate) struct TreeGuard(Option<Supervisor>);

impl TreeGuard {
    /// Armed for `supervisor`.
    pub(crate) fn armed(supervisor: Supervisor) -> TreeGuard {
        TreeGuard(Some(supervisor))
    }

    /// The tree ended (or someone else ends it): dropping does nothing now.
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        let Some(supervisor) = self.0.take() else {
            return;
        };
        supervisor.kill_tree();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let gone = async {
                    while supervisor.sample().is_some() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                end_tree(&supervisor, gone).await;
            });
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    /// The kernel killed a process of the user's commands at their memory bound meanwhile.
    memory_bound: bool,
    duration: Duration,
}

/// One output stream's bytes: in the foreground, those not yet taken; in the background, the
/// newest up to the cap, read or not (`seen` says how many of them were read), so that a read
/// can show the last lines again.
#[derive(Debug)]
struct Output {
    /// Background: the newest bytes. Foreground: the first bytes, up to half the cap.
    bytes: VecDeque<u8>,
    /// Background: how many of `bytes`, from the front, an earlier read returned.
    seen: usize,
    /// Background: whether the cap pushed out the start of `bytes`'s first line.
    cut: bool,
    /// Foreground: the newest bytes once the first half is full, up to the other half.
    tail: VecDeque<u8>,
    cap: usize,
    /// Keep the newest bytes (background) rather than the first and the last (foreground).
    keep_tail: bool,
    /// Foreground: how many bytes were dropped between the first and the last (the output
    /// was cut when there are some).
    omitted: u64,
    /// Background: bytes dropped, oldest first, since the last read.
    dropped: u64,
}

impl Output {
    fn new(cap: usize) -> Output {
        Output {
            bytes: VecDeque::new(),
            seen: 0,
            cut: false,
            tail: VecDeque::new(),
            cap,
            keep_tail: false,
            omitted: 0,
            dropped: 0,
        }
    }

    /// How many of the oldest bytes to drop so that at most `max` stay, starting with a whole
    /// character: a character the cut would split goes with them (at most three bytes more),
    /// rather than showing as U+FFFD.
    fn overflow(&self, max: usize) -> usize {
        let over = self.bytes.len().saturating_sub(max);
        if over == 0 {
            return 0;
        }
        over + self
            .bytes
            .range(over..)
            .take(3)
            .take_while(|&&b| b & 0xc0 == 0x80)
            .count()
    }

    /// Background: drops the oldest bytes so that at most `max` stay ([`Output::overflow`]),
    /// noting whether the first line kept was cut; how many of them had not been read.
    fn drop_oldest(&mut self, max: usize) -> usize {
        let over = self.overflow(max);
        if over == 0 {
            return 0;
        }
        self.cut = self.bytes[over - 1] != b'\n';
        self.bytes.drain(..over);
        let unread = over.saturating_sub(self.seen);
        self.seen = self.seen.saturating_sub(over);
        unread
    }

    fn push(&mut self, data: &[u8]) {
        if self.keep_tail {
            self.bytes.extend(data);
            // Bytes already read go first; only unread ones count as dropped.
            self.dropped += self.drop_oldest(self.cap) as u64;
        } else {
            // The first half of the cap holds the start; the rest rolls through the second
            // half, so that the end (where a build or a test run says what failed) is kept.
            let head_cap = self.cap - self.cap / 2;
            let room = head_cap.saturating_sub(self.bytes.len());
            let (head, rest) = data.split_at(data.len().min(room));
            self.bytes.extend(head);
            self.tail.extend(rest);
            let over = self.tail.len().saturating_sub(self.cap / 2);
            if over > 0 {
                self.tail.drain(..over);
                self.omitted += over as u64;
            }
        }
    }

    /// Bytes not read yet (background), or not taken yet (foreground).
    fn unread(&self) -> usize {
        self.bytes.len() - self.seen
    }

    /// How many of the unread bytes a read takes: all of them, but while the process runs, a
    /// character cut in the middle stays for the next read instead of becoming a replacement
    /// character.
    fn readable(&self, finished: bool) -> usize {
        let unread = self.unread();
        if finished {
            return unread;
        }
        let end: Vec<u8> = self
            .bytes
            .range(self.bytes.len() - unread.min(4)..)
            .copied()
            .collect();
        unread - (end.len() - crate::decode::complete_utf8_len(&end))
    }

    /// Background: what was written since the last read, as text, marked read (and kept for
    /// [`Output::last_lines`]).
    fn take_new(&mut self, finished: bool) -> String {
        let n = self.readable(finished);
        let new: Vec<u8> = self
            .bytes
            .range(self.seen..self.seen + n)
            .copied()
            .collect();
        self.seen += n;
        lossy(new)
    }

    /// Background: the last `lines` lines of what is kept, read before or not, as text; what is
    /// new is marked read. A first line the cap cut is left out, unless it is all there is.
    fn last_lines(&mut self, lines: u64, finished: bool) -> String {
        let end = self.seen + self.readable(finished);
        self.seen = end;
        // Where the last `lines` lines start: after the `lines`-th line break from the end, not
        // counting one that ends the text. Found in place: only those lines are copied (this
        // runs under the process's lock, which its output waits for).
        let body = if end > 0 && self.bytes[end - 1] == b'\n' {
            end - 1
        } else {
            end
        };
        let breaks = |range: std::ops::Range<usize>| {
            self.bytes
                .range(range.clone())
                .enumerate()
                .filter(|&(_, &b)| b == b'\n')
                .map(move |(i, _)| range.start + i)
        };
        let skip = usize::try_from(lines.saturating_sub(1)).unwrap_or(usize::MAX);
        let mut start = breaks(0..body).rev().nth(skip).map_or(0, |i| i + 1);
        if start == 0
            && self.cut
            && let Some(i) = breaks(0..body).next()
        {
            start = i + 1;
        }
        lossy(self.bytes.range(start..end).copied().collect())
    }

    /// Keeps the newest `max` bytes at most, for a process read to its end (see [`Ended`]).
    fn keep_last(&mut self, max: usize) {
        self.drop_oldest(max);
        self.bytes.shrink_to_fit();
        self.tail = VecDeque::new();
    }

    /// Switches a foreground output to the background once an answer took it whole (`shown`,
    /// its text, and the `gap` in it): the end of what it showed is kept as read, after the gap
    /// only, so that [`Output::last_lines`] can show it again. Nothing changes for an output
    /// that is in the background already.
    fn move_to_background(&mut self, shown: &str, gap: Option<OutputGap>) {
        if self.keep_tail {
            return;
        }
        self.keep_tail = true;
        // What the answer did not take: a character its end cut, still unread.
        let rest: Vec<u8> = self.bytes.drain(..).collect();
        let after_gap = gap.map_or(0, |g| usize::try_from(g.at).unwrap_or(usize::MAX));
        let shown = shown.as_bytes().get(after_gap..).unwrap_or_default();
        let from = shown
            .len()
            .saturating_sub(self.cap.saturating_sub(rest.len()));
        // The first kept line is whole when it starts the output or follows a line break.
        self.cut = match from.checked_sub(1) {
            Some(before) => shown[before] != b'\n',
            None => gap.is_some(),
        };
        self.bytes.extend(&shown[from..]);
        self.seen = self.bytes.len();
        self.bytes.extend(rest);
    }

    /// What a `process_read` returns of this stream: with `last_lines`, its last lines
    /// ([`Output::last_lines`]); else what is new ([`Output::take`]).
    fn read(&mut self, last_lines: Option<u64>, finished: bool) -> String {
        match last_lines {
            Some(n) => self.last_lines(n, finished),
            None => self.take(finished),
        }
    }

    /// Takes what is there as text (in the background, [`Output::take_new`]); a character cut
    /// in the middle stays, as [`Output::readable`] says.
    fn take(&mut self, finished: bool) -> String {
        if self.keep_tail {
            return self.take_new(finished);
        }
        let n = self.readable(finished);
        lossy(self.bytes.drain(..n).collect())
    }

    /// A foreground output taken whole: its first and last bytes, and where the dropped ones
    /// were. The cut falls between characters: a character the cut split is dropped with the
    /// rest, not turned into a replacement character.
    fn take_whole(&mut self, finished: bool) -> (String, Option<OutputGap>) {
        if self.omitted == 0 {
            self.bytes.extend(self.tail.drain(..));
            return (self.take(finished), None);
        }
        let mut head: Vec<u8> = self.bytes.drain(..).collect();
        let mut tail: Vec<u8> = self.tail.drain(..).collect();
        let mut dropped = self.omitted;
        let whole = crate::decode::complete_utf8_len(&head);
        dropped += (head.len() - whole) as u64;
        head.truncate(whole);
        // A character's continuation bytes (`10xxxxxx`), at most three.
        let split = tail
            .iter()
            .take(3)
            .take_while(|&&b| b & 0xc0 == 0x80)
            .count();
        dropped += split as u64;
        tail.drain(..split);
        let head = lossy(head);
        let at = head.len() as u64;
        // The kept end, an unfinished last character kept for later as `take` keeps it.
        self.bytes.extend(tail);
        let text = head + &self.take(finished);
        self.omitted = 0;
        (text, Some(OutputGap { at, dropped }))
    }
}

/// Bytes as text, invalid sequences as U+FFFD.
fn lossy(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[derive(Debug)]
struct State {
    stdout: Output,
    stderr: Output,
    exit: Option<Exit>,
    /// The last bytes written to either stream, for progress lines.
    tail: VecDeque<u8>,
    /// A read told its end and its output moved to the table's [`Ended`]: a read that waited
    /// meanwhile answers from there.
    retired: bool,
}

/// What the task driving a process is told: when its time runs out, and whether to end it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Control {
    /// When the process is killed as timed out; `None`: no time limit.
    deadline: Option<tokio::time::Instant>,
    /// End it now (a cancelled call, the table dropped).
    abort: bool,
}

/// A running (or exited, not yet read) command.
pub(crate) struct Proc {
    id: String,
    argv: Vec<String>,
    cwd: String,
    started: Instant,
    sandbox: &'static str,
    supervisor: Supervisor,
    state: Mutex<State>,
    /// Ticks on every change: output, network, exit.
    activity: watch::Sender<u64>,
    /// Its standard input while open (held by the writer of the initial `stdin` until that is
    /// written, then by each `process_write` in turn).
    stdin: Arc<tokio::sync::Mutex<Option<tokio::process::ChildStdin>>>,
    /// Its standard input is closed (seen without waiting for the pipe's lock).
    stdin_closed: std::sync::atomic::AtomicBool,
    /// The connections the workspace's proxy was asked for.
    network: Arc<crate::netlog::NetworkLog>,
    /// It has no network (`network = "off"`).
    network_off: bool,
    /// What the task driving it is told.
    control: watch::Sender<Control>,
    /// The workspace's shared namespaces it runs in, when namespaced: held, so they (and the
    /// proxy) live as long as it is kept.
    _shared: Option<Arc<super::shared::Shared>>,
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proc")
            .field("id", &self.id)
            .field("argv", &self.argv)
            .finish_non_exhaustive()
    }
}

impl Proc {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touched(&self) {
        self.activity.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn output(&self, stderr: bool, data: &[u8]) {
        let mut state = self.lock();
        if stderr {
            state.stderr.push(data);
        } else {
            state.stdout.push(data);
        }
        let keep = data.len().min(PROGRESS_LINE_CHARS * 4);
        state.tail.extend(&data[data.len() - keep..]);
        let over = state.tail.len().saturating_sub(PROGRESS_LINE_CHARS * 4);
        state.tail.drain(..over);
        drop(state);
        self.touched();
    }

    /// The connections the workspace's proxy was asked for since the last report (of any of
    /// the workspace's commands: the proxy cannot tell them apart).
    /// With how many more there were than an answer carries.
    fn take_events(&self) -> (Vec<NetworkEvent>, u64) {
        self.network.take_for_answer()
    }

    fn exit(&self) -> Option<Exit> {
        self.lock().exit
    }

    /// Closes its standard input (the pipe in `slot`, whose lock the caller holds).
    fn close_stdin(&self, slot: &mut Option<tokio::process::ChildStdin>) {
        *slot = None;
        self.stdin_closed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn elapsed(&self, exit: Option<Exit>) -> Duration {
        exit.map_or_else(|| self.started.elapsed(), |e| e.duration)
    }

    /// The latest non-empty output line, cut to a readable length.
    fn last_line(&self) -> Option<String> {
        let state = self.lock();
        let tail: Vec<u8> = state.tail.iter().copied().collect();
        drop(state);
        let text = String::from_utf8_lossy(&tail);
        text.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(PROGRESS_LINE_CHARS).collect())
    }

    /// Kills the tree now, and has the task driving it make sure it ends (see [`end`]).
    fn abort(&self) {
        self.supervisor.kill_tree();
        self.control.send_modify(|c| c.abort = true);
    }
}

/// How many background processes read to their end a workspace still keeps (the newest), so
/// that `process_read` with `last_lines` shows their last lines again.
pub(crate) const ENDED_KEPT: usize = 8;

/// Bytes of each stream a process read to its end keeps, at most.
pub(crate) const ENDED_KEPT_BYTES: usize = 64 * 1024;

/// A background process read to its end: how it ended and its last output, nothing else (its
/// namespaces and its supervisor are let go).
#[derive(Debug)]
struct Ended {
    id: String,
    exit: Exit,
    stdout: Output,
    stderr: Output,
}

/// Where a [`Table`] keeps a process.
enum Kept {
    /// Running, or exited and not read to its end.
    Live(Arc<Proc>),
    /// Read to its end: see [`Ended`].
    Ended,
    /// Nowhere.
    Not,
}

/// There is no process `id`.
pub(crate) fn not_kept(id: &str) -> SandboxError {
    SandboxError::NotFound(format!(
        "there is no background process `{}` in this workspace: it may run in another (leave \
         `workspace` out, and the call goes where the process runs), or it was read to its end \
         before {ENDED_KEPT} others were (`process_list` lists what runs here)",
        crate::error::shown(id)
    ))
}

/// A workspace's background processes, oldest first; bounded. Dropping it kills them all.
#[derive(Debug)]
pub(crate) struct Table {
    procs: Mutex<Vec<Arc<Proc>>>,
    /// The last [`ENDED_KEPT`] processes read to their end, oldest first.
    ended: Mutex<VecDeque<Ended>>,
    max: usize,
    /// The namespaces the workspace's commands share (made on the first one).
    pub(crate) shared: super::shared::Slot,
}

impl Table {
    /// An empty table for at most `max` processes.
    pub(crate) fn new(max: usize) -> Table {
        Table {
            procs: Mutex::new(Vec::new()),
            ended: Mutex::new(VecDeque::new()),
            max,
            shared: super::shared::Slot::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Proc>>> {
        self.procs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `LimitExceeded` unless there is room for one more background process.
    pub(crate) fn check_room(&self) -> Result<(), SandboxError> {
        if self.lock().len() >= self.max {
            return Err(SandboxError::LimitExceeded(format!(
                "this workspace already keeps {} background processes (running, or exited with \
                 output not read yet); read the finished ones with `process_read` or end some \
                 with `process_kill`",
                self.max
            )));
        }
        Ok(())
    }

    /// Moves a foreground process here when there is room: its answer so far (what it printed,
    /// taken under the table's lock, so that nothing is taken when there is no room), or `None`
    /// when the table is full (then nothing about it changed).
    fn adopt_moving(&self, proc: &Arc<Proc>) -> Option<RunCommandResult> {
        let mut procs = self.lock();
        if procs.len() >= self.max {
            return None;
        }
        let answer = result_of(proc, None, Some(proc.id.clone()));
        procs.push(proc.clone());
        Some(answer)
    }

    fn adopt(&self, proc: Arc<Proc>) -> Result<(), SandboxError> {
        let mut procs = self.lock();
        if procs.len() >= self.max {
            return Err(SandboxError::LimitExceeded(format!(
                "this workspace already keeps {} background processes",
                self.max
            )));
        }
        procs.push(proc);
        Ok(())
    }

    fn lock_ended(&self) -> std::sync::MutexGuard<'_, VecDeque<Ended>> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the table keeps process `id`.
    fn find(&self, id: &str) -> Kept {
        if let Some(proc) = self.lock().iter().find(|p| p.id == id) {
            return Kept::Live(proc.clone());
        }
        if self.lock_ended().iter().any(|e| e.id == id) {
            return Kept::Ended;
        }
        Kept::Not
    }

    /// Whether the table keeps process `id`, running, exited, or read to its end.
    pub(crate) fn keeps(&self, id: &str) -> bool {
        !matches!(self.find(id), Kept::Not)
    }

    /// Whether process `id` is kept and still running.
    pub(crate) fn runs(&self, id: &str) -> bool {
        matches!(self.find(id), Kept::Live(proc) if proc.exit().is_none())
    }

    /// Process `id`, running or exited but not read to its end; else why there is none.
    fn get(&self, id: &str) -> Result<Arc<Proc>, SandboxError> {
        match self.find(id) {
            Kept::Live(proc) => Ok(proc),
            Kept::Ended => Err(SandboxError::InvalidArguments(format!(
                "process `{id}` has exited, and a read told its end; `process_read` with \
                 `last_lines` shows its last lines again"
            ))),
            Kept::Not => Err(not_kept(id)),
        }
    }

    /// `NotFound` unless the table keeps process `id`, running, exited, or read to its end
    /// (`process_read`'s check).
    pub(crate) fn check_exists(&self, id: &str) -> Result<(), SandboxError> {
        match self.find(id) {
            Kept::Not => Err(not_kept(id)),
            Kept::Live(_) | Kept::Ended => Ok(()),
        }
    }

    /// Process `id`, when it still runs (`process_kill`); else why it cannot be signalled.
    fn running(&self, id: &str) -> Result<Arc<Proc>, SandboxError> {
        let proc = self.get(id)?;
        if proc.exit().is_some() {
            return Err(SandboxError::InvalidArguments(format!(
                "process `{}` has exited; read what is left with `process_read`",
                proc.id
            )));
        }
        Ok(proc)
    }

    /// Forgets `proc`, read to its end (`exit`), but for how it ended and its last output (see
    /// [`Ended`]); the oldest such one goes when more than [`ENDED_KEPT`] are kept. Nothing
    /// when another read did so first.
    fn retire(&self, proc: &Proc, exit: Exit) {
        // Under the table's lock throughout, so that the id is in one of the two lists at every
        // moment, and a second read that told the end meanwhile finds it gone.
        let mut procs = self.lock();
        let Some(at) = procs.iter().position(|p| p.id == proc.id) else {
            return;
        };
        procs.remove(at);
        let mut state = proc.lock();
        let cap = state.stdout.cap;
        let take = |output: &mut Output| {
            let mut kept = std::mem::replace(output, Output::new(cap));
            kept.keep_last(ENDED_KEPT_BYTES);
            kept
        };
        let ended = Ended {
            id: proc.id.clone(),
            exit,
            stdout: take(&mut state.stdout),
            stderr: take(&mut state.stderr),
        };
        state.retired = true;
        drop(state);
        let mut kept = self.lock_ended();
        kept.push_back(ended);
        if kept.len() > ENDED_KEPT {
            kept.pop_front();
        }
    }

    /// `process_read` of a process read to its end: how it ended, nothing new, and with
    /// `last_lines` its last lines again; `None` when the table does not keep it so.
    fn read_ended(&self, args: &ProcessReadArgs) -> Option<ProcessReadResult> {
        let mut kept = self.lock_ended();
        let ended = kept.iter_mut().find(|e| e.id == args.process)?;
        let exit = ended.exit;
        Some(ProcessReadResult {
            process: ended.id.clone(),
            running: false,
            exit_code: exit.code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            memory_bound: exit.memory_bound,
            // All of it was read: nothing is new.
            stdout: ended.stdout.read(args.last_lines, true),
            stderr: ended.stderr.read(args.last_lines, true),
            last_lines: args.last_lines,
            stdout_dropped: 0,
            stderr_dropped: 0,
            duration_ms: exit.duration.as_millis() as u64,
            network: Vec::new(),
            network_not_shown: 0,
            // Said by the read that told its end.
            network_off: false,
        })
    }

    /// `process_kill`'s check: process `id` runs.
    pub(crate) fn check_running(&self, id: &str) -> Result<(), SandboxError> {
        self.running(id).map(drop)
    }

    /// Process `id`, when it runs with its standard input open (`process_write`); else why it
    /// takes no input.
    fn writable(&self, id: &str) -> Result<Arc<Proc>, SandboxError> {
        let proc = self.running(id)?;
        if proc.stdin_closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(stdin_closed(&proc));
        }
        Ok(proc)
    }

    /// `process_write`'s check: process `id` runs and takes input.
    pub(crate) fn check_writable(&self, id: &str) -> Result<(), SandboxError> {
        self.writable(id).map(drop)
    }

    /// A fresh id, unique in this table.
    fn new_id(&self) -> String {
        use std::hash::{BuildHasher, Hasher};
        loop {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(Instant::now().elapsed().as_nanos());
            let id = format!("proc-{:08x}", hasher.finish() as u32);
            if self.lock().iter().all(|p| p.id != id)
                && self.lock_ended().iter().all(|e| e.id != id)
            {
                return id;
            }
        }
    }

    /// Kills every process of the table (each whole tree) and forgets them, output included,
    /// and those read to their end; returns how many there were (not counting those).
    pub(crate) fn end_all(&self) -> usize {
        self.lock_ended().clear();
        let procs: Vec<Arc<Proc>> = self.lock().drain(..).collect();
        for proc in &procs {
            proc.abort();
        }
        procs.len()
    }

    /// Whether a background process still runs (a workspace with one is in use).
    /// Whether it keeps any process: running, or exited with output not read yet.
    pub(crate) fn any(&self) -> bool {
        !self.lock().is_empty()
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // The workspace is gone: its audit reader gets what is left, then the end.
        self.shared.network.close();
        self.end_all();
    }
}

/// Kills the foreground process when the call waiting for it is dropped (cancelled), unless it
/// finished or moved to the background.
struct Foreground(Option<Arc<Proc>>);

impl Drop for Foreground {
    fn drop(&mut self) {
        if let Some(proc) = self.0.take() {
            proc.abort();
        }
    }
}

/// What a `run_command` call's arguments say, checked against the limits and the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Validated {
    /// Answer at once, leaving it in the table.
    pub background: bool,
    /// Its wall-clock limit to begin with (the default one goes when it moves to the
    /// background).
    pub timeout: Option<Duration>,
    /// The limit its CPU time (`RLIMIT_CPU`, which cannot be lifted later) is derived from:
    /// none when it may move to the background without a limit of its own.
    pub cpu_limit: Option<Duration>,
    /// When it moves to the background if it still runs.
    pub after: Option<Duration>,
}

/// Checks `run_command`'s arguments (argv, time limits, how it goes to the background) and the
/// policy's allowlist: the one check before approval ([`crate::Sandbox::check`]) and before the
/// run. Pure.
pub(crate) fn validate(
    args: &RunCommandArgs,
    limits: &Limits,
    policy: &ExecPolicy,
) -> Result<Validated, SandboxError> {
    super::check_argv(&args.argv)?;
    let background = args.background.unwrap_or(false);
    let max = limits.command_max_timeout_ms;
    let timeout_ms = match (args.timeout_ms, background) {
        (Some(ms), _) => Some(ms),
        (None, false) => Some(limits.command_default_timeout_ms),
        (None, true) => None,
    };
    if let Some(ms) = timeout_ms
        && (ms == 0 || ms > max)
    {
        return Err(SandboxError::InvalidArguments(format!(
            "`timeout_ms` must be between 1 and {max}"
        )));
    }
    let after = match args.background_after_ms {
        Some(0) => {
            return Err(SandboxError::InvalidArguments(
                "`background_after_ms` must be at least 1 (or use `background: true`)".into(),
            ));
        }
        Some(ms) if background => {
            return Err(SandboxError::InvalidArguments(format!(
                "`background_after_ms` ({ms}) makes no sense with `background: true`, which \
                 answers at once"
            )));
        }
        other => other.map(Duration::from_millis),
    };
    if policy.network == crate::limits::NetworkMode::Allowlist {
        netpolicy::NetPolicy::parse(&policy.allow, &policy.deny)
            .map_err(SandboxError::InvalidArguments)?;
    }
    let timeout = timeout_ms.map(Duration::from_millis);
    Ok(Validated {
        background,
        timeout,
        // The default limit ends when the command moves to the background; so must the CPU
        // limit derived from it.
        cpu_limit: if after.is_some() && args.timeout_ms.is_none() {
            None
        } else {
            timeout
        },
        after,
    })
}

/// `run_command`: starts the command with `start` (given the CPU limit and whether its standard
/// input is a pipe; [`super::start`] on the calling task, or on the blocking pool), then answers
/// at once (`background`), when it exits, or when `background_after_ms` has passed (leaving it in
/// `table`).
pub(crate) async fn run<S, F>(
    limits: &Limits,
    policy: &ExecPolicy,
    table: &Table,
    args: &RunCommandArgs,
    progress: Option<&Progress<'_>>,
    start: S,
) -> Result<RunCommandResult, SandboxError>
where
    S: FnOnce(Option<Duration>, bool) -> F,
    F: std::future::Future<Output = Result<super::Started, SandboxError>>,
{
    let Validated {
        background,
        timeout,
        cpu_limit,
        after,
    } = validate(args, limits, policy)?;
    if background {
        table.check_room()?;
    }
    let mut started = start(cpu_limit, background || args.stdin.is_some()).await?;
    started.started(&args.argv[0]).await?;
    let stdin = started.child.stdin.take();
    let (activity, _) = watch::channel(0u64);
    let output = || {
        let mut output = Output::new(limits.output_max_bytes);
        // In the background, the newest output is what matters (the end of a build).
        output.keep_tail = background;
        output
    };
    let proc = Arc::new(Proc {
        id: table.new_id(),
        argv: args.argv.clone(),
        cwd: args.cwd.clone().unwrap_or_else(|| ".".to_owned()),
        started: Instant::now(),
        sandbox: started.sandbox,
        supervisor: started.supervisor.clone(),
        state: Mutex::new(State {
            stdout: output(),
            stderr: output(),
            exit: None,
            tail: VecDeque::new(),
            retired: false,
        }),
        activity,
        stdin: Arc::default(),
        stdin_closed: std::sync::atomic::AtomicBool::new(stdin.is_none()),
        network: table.shared.network.clone(),
        network_off: policy.network == crate::limits::NetworkMode::Off,
        control: watch::Sender::new(Control {
            deadline: timeout.map(|t| tokio::time::Instant::now() + t),
            abort: false,
        }),
        _shared: started.shared.clone(),
    });
    // From here on, a failure or a cancellation kills the tree.
    let mut foreground = Foreground(Some(proc.clone()));
    let mut changes = proc.activity.subscribe();
    tokio::spawn(drive(proc.clone(), started, proc.control.subscribe()));

    if let Some(mut pipe) = stdin {
        let input = args.stdin.clone();
        if background {
            // Kept open for `process_write`. The initial text goes first: its writer holds the
            // pipe from now until it is written (a `process_write` waits its turn, bounded).
            let mut slot = proc
                .stdin
                .clone()
                .try_lock_owned()
                .expect("nobody else has seen this process yet");
            *slot = Some(pipe);
            if let Some(input) = input {
                let proc = proc.clone();
                tokio::spawn(async move {
                    if let Some(pipe) = slot.as_mut()
                        && pipe.write_all(input.as_bytes()).await.is_err()
                    {
                        proc.close_stdin(&mut slot);
                    }
                });
            }
        } else if let Some(input) = input {
            tokio::spawn(async move {
                // A program that does not read its input closes the pipe: not an error.
                let _ = pipe.write_all(input.as_bytes()).await;
            });
        }
    }

    if background {
        table.adopt(proc.clone())?;
        foreground.0 = None;
        // Its output, even what it has printed already, is for `process_read`.
        return Ok(RunCommandResult {
            exit_code: None,
            signal: None,
            timed_out: false,
            memory_bound: false,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_gap: None,
            stderr_gap: None,
            duration_ms: 0,
            sandbox: proc.sandbox.to_owned(),
            process: Some(proc.id.clone()),
            network: Vec::new(),
            network_not_shown: 0,
            network_off: proc.network_off,
        });
    }
    let mut moving_at = after.map(|after| tokio::time::Instant::now() + after);
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        if proc.exit().is_some() {
            break;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = async {
                match moving_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                // Still running: leave it in the background, with what it printed so far.
                match table.adopt_moving(&proc) {
                    Some(answer) => {
                        foreground.0 = None;
                        if args.timeout_ms.is_none() {
                            // Moved so as not to be killed at the default limit.
                            proc.control.send_modify(|c| c.deadline = None);
                        }
                        return Ok(answer);
                    }
                    // No room: it stays in the foreground, untouched.
                    None => moving_at = None,
                }
            }
            _ = tick.tick(), if progress.is_some() => {
                if let Some(progress) = progress {
                    let secs = proc.started.elapsed().as_secs();
                    let line = match proc.last_line() {
                        Some(line) => format!("`{}` running for {secs} s: {line}", args.argv[0]),
                        None => format!("`{}` running for {secs} s", args.argv[0]),
                    };
                    progress(&line);
                }
            }
        }
    }
    foreground.0 = None;
    let exit = proc.exit();
    Ok(result_of(&proc, exit, None))
}

/// The answer of `run_command`: what the process printed (and has not been read), how it ended
/// when it has, and its id when it goes on in the background.
///
/// With a `process` id, the process goes on in the background: a foreground one that moves
/// there keeps the end of what this answer shows, as read, under the same lock (so that no
/// output comes in between), for `process_read`'s `last_lines`.
fn result_of(proc: &Proc, exit: Option<Exit>, process: Option<String>) -> RunCommandResult {
    let mut guard = proc.lock();
    let state = &mut *guard;
    let finished = exit.is_some();
    let (stdout, stdout_gap) = state.stdout.take_whole(finished);
    let (stderr, stderr_gap) = state.stderr.take_whole(finished);
    if process.is_some() {
        state.stdout.move_to_background(&stdout, stdout_gap);
        state.stderr.move_to_background(&stderr, stderr_gap);
    }
    drop(guard);
    let (network, network_not_shown) = proc.take_events();
    RunCommandResult {
        exit_code: exit.and_then(|e| e.code),
        signal: exit.and_then(|e| e.signal),
        timed_out: exit.is_some_and(|e| e.timed_out),
        memory_bound: exit.is_some_and(|e| e.memory_bound),
        stdout,
        stderr,
        stdout_truncated: stdout_gap.is_some(),
        stderr_truncated: stderr_gap.is_some(),
        stdout_gap,
        stderr_gap,
        duration_ms: proc.elapsed(exit).as_millis() as u64,
        sandbox: proc.sandbox.to_owned(),
        process,
        network,
        network_not_shown,
        network_off: proc.network_off,
    }
}

/// Pumps the output, waits for the end (killing the tree at the deadline, or when told to),
/// and records how it ended.
async fn drive(
    proc: Arc<Proc>,
    mut started: super::Started,
    mut control: watch::Receiver<Control>,
) {
    let mut pumps = tokio::task::JoinSet::new();
    if let Some(out) = started.child.stdout.take() {
        pumps.spawn(pump(out, proc.clone(), false));
    }
    if let Some(err) = started.child.stderr.take() {
        pumps.spawn(pump(err, proc.clone(), true));
    }
    let mut timed_out = false;
    let status = loop {
        let now = *control.borrow_and_update();
        if now.abort {
            break end(&mut started.child, &proc.supervisor).await;
        }
        tokio::select! {
            status = started.child.wait() => break status,
            () = async {
                match now.deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                timed_out = true;
                break end(&mut started.child, &proc.supervisor).await;
            }
            // The process holds the sender: it is there for as long as this runs.
            _ = control.changed() => {}
        }
    };
    let duration = proc.started.elapsed();
    // The tree is gone with its supervisor, and with it every writer of the pipes; the grace
    // only guards against the unexpected.
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        while pumps.join_next().await.is_some() {}
    })
    .await;
    pumps.abort_all();
    started.guard.disarm();
    if let Some(said) = started.git.as_mut().and_then(super::GitGuard::check) {
        tracing::warn!(process = %proc.id, "{}", said.trim_end());
        proc.output(true, said.as_bytes());
    }
    let memory_bound = started.killed_at_memory_bound();
    let exit = match status {
        Ok(status) => Exit {
            code: status.code(),
            signal: status.signal(),
            timed_out,
            memory_bound,
            duration,
        },
        Err(e) => {
            tracing::warn!("cannot wait for process {}: {e}", proc.id);
            Exit {
                code: None,
                signal: None,
                timed_out,
                memory_bound,
                duration,
            }
        }
    };
    proc.lock().exit = Some(exit);
    proc.touched();
    drop(started.tmp);
}

/// Ends the tree: asks the supervisor, and kills it if it has not ended the tree within
/// [`KILL_GRACE`] (or, without namespaces, as soon as it stops making progress; see
/// [`keep_waiting`]).
pub(crate) async fn end(
    child: &mut tokio::process::Child,
    supervisor: &Supervisor,
) -> std::io::Result<std::process::ExitStatus> {
    end_tree(supervisor, child.wait()).await
}

/// [`end`], for any future `exited` that completes when the supervisor has exited.
async fn end_tree<T>(supervisor: &Supervisor, exited: impl std::future::Future<Output = T>) -> T {
    supervisor.kill_tree();
    tokio::pin!(exited);
    let mut waited = Duration::ZERO;
    let mut step = KILL_GRACE;
    let mut before = supervisor.sample();
    loop {
        if let Ok(done) = tokio::time::timeout(step, &mut exited).await {
            return done;
        }
        waited += step;
        let now = supervisor.sample();
        if !keep_waiting(supervisor.namespaced, before, now, waited) {
            supervisor.kill_hard();
            return exited.await;
        }
        before = now;
        step = PROGRESS_CHECK;
    }
}

async fn pump(mut pipe: impl AsyncRead + Unpin, proc: Arc<Proc>, stderr: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => proc.output(stderr, &buf[..n]),
        }
    }
}

/// `process_read`.
pub(crate) async fn read(
    table: &Table,
    args: &ProcessReadArgs,
) -> Result<ProcessReadResult, SandboxError> {
    if args.last_lines == Some(0) {
        return Err(SandboxError::InvalidArguments(
            "`last_lines` must be at least 1".into(),
        ));
    }
    let ended = || {
        table
            .read_ended(args)
            .ok_or_else(|| not_kept(&args.process))
    };
    let proc = match table.find(&args.process) {
        Kept::Live(proc) => proc,
        Kept::Ended => return ended(),
        Kept::Not => return Err(not_kept(&args.process)),
    };
    let wait = Duration::from_millis(args.wait_ms.unwrap_or(0)).min(MAX_READ_WAIT);
    let mut changes = proc.activity.subscribe();
    let has_news = |proc: &Proc| {
        let state = proc.lock();
        state.exit.is_some() || state.stdout.readable(false) > 0 || state.stderr.readable(false) > 0
    };
    if !wait.is_zero() && !has_news(&proc) {
        let _ = tokio::time::timeout(wait, async {
            while changes.changed().await.is_ok() {
                if has_news(&proc) {
                    return;
                }
            }
        })
        .await;
    }
    let exit = proc.exit();
    let mut state = proc.lock();
    if state.retired {
        // Another read told its end while this one waited.
        drop(state);
        return ended();
    }
    let finished = exit.is_some();
    let (network, network_not_shown) = proc.take_events();
    let result = ProcessReadResult {
        process: proc.id.clone(),
        running: !finished,
        exit_code: exit.and_then(|e| e.code),
        signal: exit.and_then(|e| e.signal),
        timed_out: exit.is_some_and(|e| e.timed_out),
        memory_bound: exit.is_some_and(|e| e.memory_bound),
        stdout: state.stdout.read(args.last_lines, finished),
        stderr: state.stderr.read(args.last_lines, finished),
        last_lines: args.last_lines,
        stdout_dropped: std::mem::take(&mut state.stdout.dropped),
        stderr_dropped: std::mem::take(&mut state.stderr.dropped),
        duration_ms: proc.elapsed(exit).as_millis() as u64,
        network,
        network_not_shown,
        network_off: proc.network_off,
    };
    drop(state);
    if let Some(exit) = exit {
        // Read to the end: it goes, but for how it ended and its last output.
        table.retire(&proc, exit);
    }
    Ok(result)
}

/// `process_write`.
pub(crate) async fn write(
    table: &Table,
    args: &ProcessWriteArgs,
) -> Result<ProcessWriteResult, SandboxError> {
    let proc = table.writable(&args.process)?;
    let deadline = tokio::time::Instant::now() + WRITE_TIMEOUT;
    let not_reading = |why: &str| {
        SandboxError::Timeout(format!(
            "process `{}` did not take its input within {} s ({why})",
            proc.id,
            WRITE_TIMEOUT.as_secs(),
        ))
    };
    let mut slot = match tokio::time::timeout_at(deadline, proc.stdin.lock()).await {
        Ok(slot) => slot,
        Err(_) => {
            return Err(not_reading(
                "earlier input is still being written to it: it is not reading its standard \
                 input",
            ));
        }
    };
    let Some(pipe) = slot.as_mut() else {
        return Err(stdin_closed(&proc));
    };
    // Written in pieces the pipe takes whole or not at all (at most `PIPE_BUF` bytes, ending on
    // a character's end), so that what it took when the time runs out is known, and is whole
    // characters: the answer says where the rest starts, and nothing is written twice when the
    // caller sends only the rest.
    let text = args.text.as_str();
    let mut taken = 0;
    let written = tokio::time::timeout_at(deadline, async {
        while taken < text.len() {
            let piece = &text.as_bytes()[taken..piece_end(text, taken)];
            match pipe.write(piece).await? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                n => taken += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            proc.close_stdin(&mut slot);
            return Err(SandboxError::InvalidArguments(format!(
                "process `{}` closed its standard input{}",
                proc.id,
                taken_part(text, taken),
            )));
        }
        Err(_) if taken == 0 => return Err(not_reading("it is not reading its standard input")),
        Err(_) => {
            return Err(not_reading(&format!(
                "it is not reading its standard input{}",
                taken_part(text, taken)
            )));
        }
    }
    if args.close_stdin.unwrap_or(false) {
        proc.close_stdin(&mut slot);
    }
    Ok(ProcessWriteResult {
        process: proc.id.clone(),
        bytes_written: args.text.len() as u64,
        stdin_closed: slot.is_none(),
    })
}

/// Where the piece of `text` that starts at `from` ends: at most [`PIPE_BUF`] bytes later (what a
/// pipe takes whole or not at all), on a character's end. (A short write that left `from` inside
/// a character, which a pipe never makes, goes on to that character's end.)
fn piece_end(text: &str, from: usize) -> usize {
    let start = (from..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    start + monad_protocol::text::head(&text[start..], PIPE_BUF).len()
}

/// How the error of a `process_write` that stopped midway says what the process took
/// (`; it took the first N of M bytes (...) and the rest was not written: send only ...`): the
/// folder's owner is told that part ([`taken_part`]).
pub const WRITE_TOOK: &str = "it took the first ";

/// What a write that stopped midway took, for its error: nothing when it took nothing.
fn taken_part(text: &str, taken: usize) -> String {
    if taken == 0 {
        return String::new();
    }
    let chars = monad_protocol::text::head(text, taken).chars().count();
    format!(
        "; {WRITE_TOOK}{taken} of {} bytes (the first {chars} characters) and the rest \
         was not written: send only the text from character {} on (counting from 1)",
        text.len(),
        chars + 1
    )
}

fn stdin_closed(proc: &Proc) -> SandboxError {
    SandboxError::InvalidArguments(format!(
        "the standard input of process `{}` is closed (by a `close_stdin`, by the program, or \
         from its start: only a command started with `background: true` keeps its standard \
         input open for process_write; one moved to the background by `background_after_ms` \
         had `stdin`'s text only)",
        proc.id
    ))
}

/// `process_kill`: only a running process (one that exits meanwhile is not `delivered`).
pub(crate) fn kill(
    table: &Table,
    args: &ProcessKillArgs,
) -> Result<ProcessKillResult, SandboxError> {
    let (signal, name) = super::parse_signal(args.signal.as_deref())?;
    let proc = table.running(&args.process)?;
    let delivered = proc.exit().is_none()
        && if signal == nix::libc::SIGKILL {
            proc.supervisor.signal(child::KILL_TREE)
        } else {
            proc.supervisor.signal(signal)
        };
    Ok(ProcessKillResult {
        process: proc.id.clone(),
        signal: name.to_owned(),
        delivered,
    })
}

/// `process_list`.
pub(crate) fn list(table: &Table) -> ProcessListResult {
    let procs = table.lock().clone();
    ProcessListResult {
        processes: procs
            .iter()
            .map(|proc| {
                let exit = proc.exit();
                let state = proc.lock();
                ProcessInfo {
                    process: proc.id.clone(),
                    argv: proc.argv.clone(),
                    cwd: proc.cwd.clone(),
                    running: exit.is_none(),
                    exit_code: exit.and_then(|e| e.code),
                    signal: exit.and_then(|e| e.signal),
                    duration_ms: proc.elapsed(exit).as_millis() as u64,
                    unread_bytes: (state.stdout.unread() + state.stderr.unread()) as u64,
                    workspace: None,
                }
            })
            .collect(),
        unavailable: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_output_keeps_its_last_bytes_from_a_whole_line_on() {
        let ended = |max: usize| {
            let mut out = Output::new(1024);
            out.keep_tail = true;
            out.push(b"one\ntwo\nthree\n");
            assert_eq!(out.take(true), "one\ntwo\nthree\n");
            out.keep_last(max);
            out
        };
        // Cut inside `two`: that line is left out.
        assert_eq!(ended(9).last_lines(10, true), "three\n");
        // Cut after a line break: nothing is cut.
        let mut whole = ended(10);
        assert_eq!(whole.last_lines(10, true), "two\nthree\n");
        assert_eq!((whole.unread(), whole.cut), (0, false));
        assert_eq!(ended(100).last_lines(2, true), "two\nthree\n");
        // A cut inside a character drops all of it: a line of one, cut, shows no U+FFFD.
        let mut out = Output::new(1024);
        out.keep_tail = true;
        out.push("é日本".as_bytes());
        out.take(true);
        out.keep_last(7);
        assert_eq!(out.last_lines(1, true), "日本");
        // So does the cap of a running one.
        let mut running = Output::new(3);
        running.keep_tail = true;
        running.push("a日b".as_bytes());
        assert_eq!(running.take(false), "b");
        assert_eq!(running.dropped, 4);
    }

    #[test]
    fn process_reads_schema_says_what_a_process_read_to_its_end_keeps() {
        let schema = monad_protocol::ToolName::ProcessRead
            .input_schema()
            .to_string();
        let kept = format!(
            "last {} KiB of each stream of its last {ENDED_KEPT} processes",
            ENDED_KEPT_BYTES / 1024
        );
        assert!(schema.contains(&kept), "{schema}");
    }
    use crate::jail::Jail;

    /// Polls `done` every 10 ms for up to `limit`; whether it came true.
    fn within(limit: Duration, done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        done()
    }

    #[test]
    fn a_supervisor_gets_more_time_only_while_it_makes_progress_without_namespaces() {
        let at = |cpu_ticks, children, stopped| {
            Some(Sample {
                stopped,
                cpu_ticks,
                children,
            })
        };
        let second = Duration::from_secs(3);
        // Busy killing and reaping thousands of orphans: more time.
        assert!(keep_waiting(
            false,
            at(10, 2000, false),
            at(40, 1500, false),
            second
        ));
        assert!(keep_waiting(
            false,
            at(10, 2000, false),
            at(40, 2000, false),
            second
        ));
        assert!(keep_waiting(
            false,
            at(10, 2000, false),
            at(10, 1999, false),
            second
        ));
        // Idle, stopped, gone from sight, past the hard limit, or namespaced: killed.
        assert!(!keep_waiting(
            false,
            at(10, 2000, false),
            at(10, 2000, false),
            second
        ));
        assert!(!keep_waiting(
            false,
            at(10, 2000, false),
            at(90, 10, true),
            second
        ));
        assert!(!keep_waiting(false, None, at(90, 10, false), second));
        assert!(!keep_waiting(false, at(10, 2000, false), None, second));
        assert!(!keep_waiting(
            false,
            at(10, 2000, false),
            at(40, 1500, false),
            KILL_HARD_LIMIT
        ));
        assert!(!keep_waiting(
            true,
            at(10, 2000, false),
            at(40, 1500, false),
            second
        ));
    }

    /// Regression: a call cancelled after the spawn but before the task that drives the command
    /// took it (while `started()` waited for `exec`) left the whole tree running, with no time
    /// limit: `Started` had no guard and its child is not killed on drop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_started_command_dropped_before_it_is_driven_is_killed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        if nix::unistd::geteuid().is_root() {
            // Commands run as `nobody` then: the workspace is theirs.
            std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
        }
        let jail = Jail::open_ambient(&root).unwrap();
        let table = Table::new(4);
        let args = RunCommandArgs {
            argv: [
                "sh",
                "-c",
                "exec 9>>held.lock; flock 9; echo held > held.ready; exec sleep 60",
            ]
            .map(String::from)
            .to_vec(),
            ..Default::default()
        };
        let started = super::super::start(
            &jail,
            &ExecPolicy::default(),
            &table.shared,
            &args,
            None,
            false,
            None,
        )
        .unwrap();
        let ready = root.join("held.ready");
        assert!(
            within(Duration::from_secs(20), || ready.exists()),
            "the command did not start"
        );
        drop(started);
        let lock = root.join("held.lock");
        let free = within(Duration::from_secs(20), || {
            let file = std::fs::File::open(&lock).unwrap();
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
        });
        assert!(free, "the command outlived its dropped start");
    }

    /// What a foreground output of `cap` bytes keeps whole of `pieces` pushed in turn.
    fn kept(cap: usize, pieces: &[&[u8]]) -> (String, Option<OutputGap>) {
        let mut output = Output::new(cap);
        for piece in pieces {
            output.push(piece);
        }
        output.take_whole(true)
    }

    #[test]
    fn foreground_output_keeps_its_two_ends_and_background_the_tail() {
        let gap = |at, dropped| Some(OutputGap { at, dropped });
        assert_eq!(kept(4, &[b"abc", b"def", b"g"]), ("abfg".into(), gap(2, 3)));
        assert_eq!(kept(4, &[b"ab", b"cd"]), ("abcd".into(), None));
        // A cut inside a character drops the character with the rest.
        // A stray byte earlier does not hide a character cut at the end of the kept start.
        assert_eq!(
            kept(6, &[b"\xffa", "é".as_bytes(), b"xyzw"]),
            ("\u{fffd}ayzw".into(), gap(4, 3))
        );
        // 61 c3 | a9: the first half ends inside `é`.
        assert_eq!(
            kept(4, &["aé".as_bytes(), b"xyz"]),
            ("ayz".into(), gap(1, 3))
        );
        // The kept end starts inside `é`: a9 64.
        assert_eq!(
            kept(4, &[b"ab", "cé".as_bytes(), b"d"]),
            ("abd".into(), gap(2, 3))
        );
        let mut tail = Output::new(4);
        tail.keep_tail = true;
        tail.push(b"abc");
        tail.push(b"def");
        assert_eq!(tail.take(false), "cdef");
        assert_eq!(tail.dropped, 2);
    }

    #[test]
    fn a_character_cut_by_a_read_waits_for_its_end() {
        let mut out = Output::new(100);
        let e_acute = "é".as_bytes();
        out.push(b"caf");
        out.push(&e_acute[..1]);
        assert_eq!(out.take(false), "caf");
        out.push(&e_acute[1..]);
        assert_eq!(out.take(false), "é");
        out.push(&[0xff, b'x']);
        assert_eq!(out.take(true), "\u{fffd}x");
        // The same in the background, where what was read is kept.
        let mut out = Output::new(100);
        out.keep_tail = true;
        out.push(b"caf");
        out.push(&e_acute[..1]);
        assert_eq!(out.take(false), "caf");
        assert_eq!(out.last_lines(5, false), "caf");
        assert_eq!(out.unread(), 1);
        out.push(&e_acute[1..]);
        assert_eq!(out.take(false), "é");
        assert_eq!(out.last_lines(1, true), "café");
    }

    #[test]
    fn an_output_moved_to_the_background_keeps_what_its_answer_showed_as_read() {
        let mut out = Output::new(100);
        out.push(b"one\ntwo\n");
        let (shown, gap) = out.take_whole(false);
        out.move_to_background(&shown, gap);
        assert_eq!(out.unread(), 0);
        out.push(b"three\n");
        assert_eq!(out.take(false), "three\n");
        assert_eq!(out.last_lines(5, false), "one\ntwo\nthree\n");
        // An answer with a gap: only what follows it is kept, its first line taken as cut.
        let mut out = Output::new(8);
        out.push(b"ab\ncd\nef\ngh\n");
        let (shown, gap) = out.take_whole(false);
        assert_eq!(
            (shown.as_str(), gap),
            ("ab\nc\ngh\n", Some(OutputGap { at: 4, dropped: 4 }))
        );
        out.move_to_background(&shown, gap);
        assert_eq!(out.last_lines(5, false), "gh\n");
        // A character the answer's end cut stays unread.
        let mut out = Output::new(100);
        out.push(b"caf\xc3");
        let (shown, gap) = out.take_whole(false);
        out.move_to_background(&shown, gap);
        assert_eq!((shown.as_str(), out.unread()), ("caf", 1));
        out.push(b"\xa9\n");
        assert_eq!(out.take(false), "é\n");
        assert_eq!(out.last_lines(1, false), "café\n");
    }

    #[test]
    fn a_background_output_shows_its_last_lines_again_as_far_as_the_cap_keeps_them() {
        let mut out = Output::new(20);
        out.keep_tail = true;
        out.push(b"one\ntwo\nthree\n");
        assert_eq!(out.take(false), "one\ntwo\nthree\n");
        assert_eq!(out.take(false), "");
        // Read before: shown again, the last lines only, a final line break not counted.
        assert_eq!(out.last_lines(2, false), "two\nthree\n");
        assert_eq!(out.last_lines(10, false), "one\ntwo\nthree\n");
        // What is new comes with them, and is read by it.
        out.push(b"four");
        assert_eq!(out.last_lines(2, false), "three\nfour");
        assert_eq!((out.unread(), out.take(false).as_str()), (0, ""));
        // Past the cap, read bytes go first and are not counted as dropped; a first line the
        // cap cut is left out, a whole one stays.
        out.push(b"\nfive\n");
        assert_eq!(out.dropped, 0);
        assert_eq!(out.bytes.len(), 20);
        assert_eq!(out.last_lines(10, false), "two\nthree\nfour\nfive\n");
        out.push(b"6");
        assert_eq!(out.last_lines(10, false), "three\nfour\nfive\n6");
        // Unread bytes pushed out are: 25 new bytes, 20 kept, of which the 5 read ones went
        // first.
        out.push(b"0123456789abcdefghijklmnopqrstuvwxy");
        assert_eq!(out.dropped, 15);
        // A cut line that is all there is stays.
        assert_eq!(out.last_lines(3, false), "fghijklmnopqrstuvwxy");
    }
}
