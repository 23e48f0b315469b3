//! The link to attached folders' clients: it carries one request to a client and its answer
//! back, and decides nothing.
//!
//! A call is a `run` on a fresh bidirectional stream; the client answers with `progress`
//! lines (such as "waiting for approval"), a `decided` saying who allowed or denied it, then
//! its `result`, whose large field may follow as a raw body ([`PendingBody`]) that is relayed
//! to the agent as it arrives. A `probe` asks whether a path exists in the folder; a `run` with
//! `if_present` ([`run_if_present`]) carries that question, answered first, and runs only where
//! the path is.
//!
//! The link is written against [`Connection`] (open a bidirectional stream) and its halves
//! ([`SendHalf`], [`RecvHalf`]: tokio's `AsyncWrite`/`AsyncRead` plus the few stream controls
//! QUIC has). A QUIC connection implements it, and so does an in-memory pair of pipes in the
//! unit tests (`memory`), where a scripted peer speaking the real frames stands for the
//! client: the executor and the link are tested end to end without sockets. A session holds
//! its clients' connections as [`Conn`], an enum rather than a trait object, so that a call
//! costs no allocation and no indirection for the choice.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use monad_protocol::frame::FrameError;
use monad_protocol::io::{
    ReadError, read_body, read_message, read_message_relayed_counted, write_message,
};
use monad_protocol::wire::{self, Body, Message, Outcome, ToolResult, Utf8Stream, reset};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ProgressSink;
use super::record::{Tap, Verdict};
use crate::route::{Presence, Unasked};
use crate::state::over_call_memory;
use crate::store::Decider;

/// Largest answer accepted from a client (a 64 MiB file as JSON fits).
pub(crate) const MAX_CLIENT_MESSAGE: usize = 256 * 1024 * 1024;
/// Largest rest of a result whose large field comes as a body.
const MAX_BODY_HEAD: usize = 1024 * 1024;

tokio::task_local! {
    /// The bytes the call running in this task holds in memory (its request, counted as it was
    /// read, and its attached client's answer), against its user's
    /// `server.max_call_bytes_per_user` (set by
    /// [`crate::state::State::call_from`] and the built-in agent around a call, and held until
    /// its answer is written). A call outside such a scope (the executor's own tests) is not
    /// counted. One task per call: the answer is read in the calling task.
    pub(crate) static CALL_MEMORY: Arc<crate::quota::Held>;
}

/// The memory count of the call running in this task, if it is counted.
pub(crate) fn call_memory() -> Option<Arc<crate::quota::Held>> {
    CALL_MEMORY.try_with(Arc::clone).ok()
}

/// The error of an answer [`read_answer`] refused (`what`: "the answer from `lap`").
pub(crate) fn refused(memory: Option<&crate::quota::Held>, what: &str) -> ToolError {
    // Only a count refuses, so `memory` is there.
    over_call_memory(memory.map_or(usize::MAX, |m| m.limit()), what)
}

/// Runs `work` (a call) with what it reads of answers counted in `memory`.
pub(crate) async fn counted<F: Future>(memory: &Arc<crate::quota::Held>, work: F) -> F::Output {
    CALL_MEMORY.scope(memory.clone(), work).await
}

/// Reads one message of an answer, its result kept as text, each frame counted in `memory`
/// (when the call is counted) as it arrives: a result's count stays with the call, any other
/// message's (progress, a decision) is given back once read. [`ReadError::Refused`] when the
/// message would take the call's user past their bound.
pub(crate) async fn read_answer<R: tokio::io::AsyncRead + Unpin>(
    recv: &mut R,
    max: usize,
    memory: Option<&crate::quota::Held>,
) -> Result<Option<Message>, ReadError> {
    let mut held = 0;
    let mut hold = |n: usize| {
        let fits = memory.is_none_or(|m| m.take(n));
        if fits {
            held += n;
        }
        fits
    };
    let read = read_message_relayed_counted(recv, max, &mut hold).await;
    if !matches!(read, Ok(Some(Message::Result { .. })))
        && let Some(memory) = memory
    {
        memory.give_back(held);
    }
    read
}

/// How long a client has to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer to a probe.
const MAX_PROBE_ANSWER: usize = 64 * 1024;
/// Chunks taken from the client's stream per step: each is one received QUIC frame.
const RELAY_BATCH: usize = 32;

/// Why a stream stopped carrying bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamError {
    /// This server closed the connection itself: it is shutting down.
    Closed,
    /// The far end went away, reset the stream or stopped reading it.
    Lost,
}

/// A connection on which the server opens one bidirectional stream per request.
pub trait Connection: Send + Sync {
    /// The sending half of a stream.
    type Send: SendHalf;
    /// The receiving half of a stream.
    type Recv: RecvHalf;

    /// Opens a stream; an error means the connection is gone.
    fn open(&self) -> impl Future<Output = Result<(Self::Send, Self::Recv), StreamError>> + Send;
}

/// The sending half of a stream: bytes in order, then an end ([`SendHalf::finish`]) or an
/// abort with a code ([`SendHalf::reset`]).
pub trait SendHalf: AsyncWrite + Unpin + Send {
    /// Ends the stream after what was written; the far end reads to its end.
    fn finish(&mut self);
    /// Abandons the stream with `code` (one of [`reset`]).
    fn reset(&mut self, code: u32);
    /// Resolves when the far end stops reading (an agent that cancelled). A transport that
    /// cannot tell says so at the next write instead, and this never resolves.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Writes whole chunks, without copying them where the transport can.
    fn write_chunks(
        &mut self,
        chunks: &mut [Bytes],
    ) -> impl Future<Output = Result<(), StreamError>> + Send;
}

/// The receiving half of a stream.
pub trait RecvHalf: AsyncRead + Unpin + Send {
    /// Reads what has arrived as whole chunks, without copying them where the transport can:
    /// how many of `chunks` were filled, or `None` at the end of the stream.
    fn read_chunks(
        &mut self,
        chunks: &mut [Bytes],
    ) -> impl Future<Output = Result<Option<usize>, StreamError>> + Send;
    /// Tells the far end to stop sending, with `code` (one of [`reset`]).
    fn stop(&mut self, code: u32);
    /// Reads the stream's end if it has arrived, without waiting, so that letting go of a
    /// stream the far end finished does not tell it to stop (QUIC would send a `STOP_SENDING`
    /// for nothing). Only once nothing more is expected. A transport without the notion has
    /// nothing to do.
    fn read_end(&mut self) {}
    /// Lets go of the stream once nothing more is expected: like [`RecvHalf::read_end`], and
    /// an end still on its way is waited for in the background, bounded
    /// ([`monad_protocol::stream::let_go`]).
    fn let_go(self)
    where
        Self: Sized,
    {
    }
}

impl Connection for quinn::Connection {
    type Send = quinn::SendStream;
    type Recv = quinn::RecvStream;

    async fn open(&self) -> Result<(quinn::SendStream, quinn::RecvStream), StreamError> {
        self.open_bi().await.map_err(|e| match e {
            quinn::ConnectionError::LocallyClosed => StreamError::Closed,
            _ => StreamError::Lost,
        })
    }
}

impl SendHalf for quinn::SendStream {
    fn finish(&mut self) {
        let _ = quinn::SendStream::finish(self);
    }

    fn reset(&mut self, code: u32) {
        let _ = quinn::SendStream::reset(self, code.into());
    }

    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let stopped = quinn::SendStream::stopped(self);
        async move {
            let _ = stopped.await;
        }
    }

    async fn write_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), StreamError> {
        match self.write_all_chunks(chunks).await {
            Ok(()) => Ok(()),
            Err(quinn::WriteError::ConnectionLost(quinn::ConnectionError::LocallyClosed)) => {
                Err(StreamError::Closed)
            }
            Err(_) => Err(StreamError::Lost),
        }
    }
}

impl RecvHalf for quinn::RecvStream {
    async fn read_chunks(&mut self, chunks: &mut [Bytes]) -> Result<Option<usize>, StreamError> {
        match quinn::RecvStream::read_chunks(self, chunks).await {
            Ok(read) => Ok(read),
            Err(quinn::ReadError::ConnectionLost(quinn::ConnectionError::LocallyClosed)) => {
                Err(StreamError::Closed)
            }
            Err(_) => Err(StreamError::Lost),
        }
    }

    fn stop(&mut self, code: u32) {
        let _ = quinn::RecvStream::stop(self, code.into());
    }

    fn read_end(&mut self) {
        monad_protocol::stream::read_end(self);
    }

    fn let_go(self) {
        monad_protocol::stream::let_go(self);
    }
}

/// The connection to an attached folder's client, as a session keeps it.
#[derive(Debug, Clone)]
pub enum Conn {
    /// A client over QUIC.
    Quic(quinn::Connection),
    /// A scripted peer in memory (unit tests).
    #[cfg(test)]
    Memory(memory::Connection),
}

impl Conn {
    /// Closes the connection, telling the client why (`code`, `reason`).
    pub fn close(&self, code: u32, reason: &str) {
        match self {
            Conn::Quic(conn) => conn.close(code.into(), reason.as_bytes()),
            #[cfg(test)]
            Conn::Memory(_) => {}
        }
    }

    /// Tells this connection from another one to the same client.
    pub fn stable_id(&self) -> usize {
        match self {
            Conn::Quic(conn) => conn.stable_id(),
            #[cfg(test)]
            Conn::Memory(conn) => conn.id,
        }
    }
}

impl From<quinn::Connection> for Conn {
    fn from(conn: quinn::Connection) -> Conn {
        Conn::Quic(conn)
    }
}

/// The sending half of a stream of a [`Conn`].
#[derive(Debug)]
pub enum ConnSend {
    /// Over QUIC.
    Quic(quinn::SendStream),
    /// In memory (unit tests).
    #[cfg(test)]
    Memory(memory::Send),
}

/// The receiving half of a stream of a [`Conn`].
#[derive(Debug)]
pub enum ConnRecv {
    /// Over QUIC.
    Quic(quinn::RecvStream),
    /// In memory (unit tests).
    #[cfg(test)]
    Memory(memory::Recv),
}

impl Connection for Conn {
    type Send = ConnSend;
    type Recv = ConnRecv;

    async fn open(&self) -> Result<(ConnSend, ConnRecv), StreamError> {
        match self {
            Conn::Quic(conn) => {
                let (send, recv) = Connection::open(conn).await?;
                Ok((ConnSend::Quic(send), ConnRecv::Quic(recv)))
            }
            #[cfg(test)]
            Conn::Memory(conn) => {
                let (send, recv) = Connection::open(conn).await?;
                Ok((ConnSend::Memory(send), ConnRecv::Memory(recv)))
            }
        }
    }
}

impl AsyncWrite for ConnSend {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ConnSend::Quic(s) => AsyncWrite::poll_write(Pin::new(s), cx, buf),
            #[cfg(test)]
            ConnSend::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnSend::Quic(s) => AsyncWrite::poll_flush(Pin::new(s), cx),
            #[cfg(test)]
            ConnSend::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnSend::Quic(s) => AsyncWrite::poll_shutdown(Pin::new(s), cx),
            #[cfg(test)]
            ConnSend::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl SendHalf for ConnSend {
    fn finish(&mut self) {
        match self {
            ConnSend::Quic(s) => SendHalf::finish(s),
            #[cfg(test)]
            ConnSend::Memory(s) => s.finish(),
        }
    }

    fn reset(&mut self, code: u32) {
        match self {
            ConnSend::Quic(s) => SendHalf::reset(s, code),
            #[cfg(test)]
            ConnSend::Memory(s) => s.reset(code),
        }
    }

    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let quic = match self {
            ConnSend::Quic(s) => Some(SendHalf::stopped(s)),
            #[cfg(test)]
            ConnSend::Memory(_) => None,
        };
        async move {
            match quic {
                Some(stopped) => stopped.await,
                None => std::future::pending().await,
            }
        }
    }

    async fn write_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), StreamError> {
        match self {
            ConnSend::Quic(s) => SendHalf::write_chunks(s, chunks).await,
            #[cfg(test)]
            ConnSend::Memory(s) => s.write_chunks(chunks).await,
        }
    }
}

impl AsyncRead for ConnRecv {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnRecv::Quic(r) => AsyncRead::poll_read(Pin::new(r), cx, buf),
            #[cfg(test)]
            ConnRecv::Memory(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl RecvHalf for ConnRecv {
    async fn read_chunks(&mut self, chunks: &mut [Bytes]) -> Result<Option<usize>, StreamError> {
        match self {
            ConnRecv::Quic(r) => RecvHalf::read_chunks(r, chunks).await,
            #[cfg(test)]
            ConnRecv::Memory(r) => r.read_chunks(chunks).await,
        }
    }

    fn stop(&mut self, code: u32) {
        match self {
            ConnRecv::Quic(r) => RecvHalf::stop(r, code),
            #[cfg(test)]
            ConnRecv::Memory(r) => r.stop(code),
        }
    }

    fn read_end(&mut self) {
        match self {
            ConnRecv::Quic(r) => RecvHalf::read_end(r),
            #[cfg(test)]
            ConnRecv::Memory(r) => r.read_end(),
        }
    }

    fn let_go(self) {
        match self {
            ConnRecv::Quic(r) => RecvHalf::let_go(r),
            #[cfg(test)]
            ConnRecv::Memory(r) => r.let_go(),
        }
    }
}

/// What the executor is told as a call goes, while it waits for the answer.
pub(crate) trait CallWatch: Sync {
    /// The call reached the client, which now decides (it may ask its user).
    fn sent(&self);
    /// The client said who decided, and whether the call may run.
    fn decided(&self, verdict: Verdict);
}

/// The answer of a client to a `run`.
pub(crate) struct Answer<R: RecvHalf> {
    /// The result, or why there is none.
    pub result: Result<ToolResult, ToolError>,
    /// A large field of the result, still on the client's stream.
    pub body: Option<PendingBody<R>>,
    /// Who decided, as the client reported it.
    pub verdict: Verdict,
}

impl<R: RecvHalf> Answer<R> {
    fn failed(error: ToolError, verdict: Verdict) -> Answer<R> {
        Answer {
            result: Err(error),
            body: None,
            verdict,
        }
    }
}

/// The error of a call whose client's connection or stream went away.
pub(crate) fn disconnected(name: &str) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceDisconnected,
        format!("workspace `{name}` disconnected; its client must reconnect"),
    )
}

fn call_timed_out() -> ToolError {
    ToolError::new(
        ErrorCode::Timeout,
        "the call did not finish within its time limit",
    )
}

/// Asks a client whether `path` exists in the folder its attach request `attachment` named.
/// A connection that is gone, or drops before the answer, is
/// [`Unasked::Disconnected`]; no answer within [`PROBE_TIMEOUT`] (a busy client, or one whose
/// streams are all taken by long calls) is [`Unasked::TimedOut`]; neither counts as "no".
pub(crate) async fn probe<C: Connection>(conn: &C, attachment: u64, path: &str) -> Presence {
    let asked = async {
        let Ok((mut send, mut recv)) = conn.open().await else {
            return Presence::Unknown(Unasked::Disconnected);
        };
        let message = Message::Probe {
            id: REQUEST_ID,
            attachment,
            path: path.to_owned(),
        };
        if write_message(&mut send, &message).await.is_err() {
            return Presence::Unknown(Unasked::Disconnected);
        }
        send.finish();
        let answer = read_message(&mut recv, MAX_PROBE_ANSWER).await;
        recv.let_go();
        presence(answer)
    };
    tokio::time::timeout(PROBE_TIMEOUT, asked)
        .await
        .unwrap_or(Presence::Unknown(Unasked::TimedOut(PROBE_TIMEOUT)))
}

/// A call for an attached folder's client.
pub(crate) struct RunRequest<'a> {
    /// The attachment on the client's connection (the id of its `attach`).
    pub attachment: u64,
    /// The session the call comes from.
    pub session: &'a str,
    /// The folder's name in the session, for errors.
    pub name: &'a str,
    /// Whether the folder was attached with full trust (its client may then say that trust
    /// decided).
    pub full_trust: bool,
    /// The tool.
    pub tool: ToolName,
    /// Its arguments.
    pub args: Value,
}

/// Runs a tool in the folder a client attached: one stream to the client, progress relayed,
/// the result read back; a large field of it is left on the stream as a [`PendingBody`]. A
/// connection that drops mid-call is `workspace_disconnected`, at once. Who decided, as the
/// client reported it, goes to `watch` as soon as it arrives.
pub(crate) async fn run<C: Connection>(
    conn: &C,
    request: RunRequest<'_>,
    progress: &dyn ProgressSink,
    watch: &dyn CallWatch,
) -> Answer<C::Recv> {
    let (name, full_trust) = (request.name, request.full_trust);
    let Ok((_send, recv)) = send(conn, request, None).await else {
        return Answer::failed(disconnected(name), Verdict::NOBODY);
    };
    watch.sent();
    answer(recv, name, full_trust, progress, watch).await
}

/// [`run`], only if `path` exists in the folder: the client says so first, as to a [`probe`], and
/// runs nothing where it does not. A probe and then a run take two round trips to the client;
/// this takes one. Until the client has said, it is a probe: the path absent, the client gone,
/// saying something else (it is told to stop) or not saying within [`PROBE_TIMEOUT`] (its stream
/// is dropped, which stops it too), is that [`Presence`]. Once it has, it is a run. A client
/// whose "yes" crosses the time-out may still run the call, whose answer nobody reads: so this
/// is for tools that change nothing. A write or an edit is probed first, so that it never runs
/// where routing would not send it.
pub(crate) async fn run_if_present<C: Connection>(
    conn: &C,
    request: RunRequest<'_>,
    path: &str,
    progress: &dyn ProgressSink,
    watch: &dyn CallWatch,
) -> Result<Answer<C::Recv>, Presence> {
    let (name, full_trust) = (request.name, request.full_trust);
    let asked = async {
        let Ok((send, mut recv)) = send(conn, request, Some(path)).await else {
            return Err(Presence::Unknown(Unasked::Disconnected));
        };
        match presence(read_message(&mut recv, MAX_PROBE_ANSWER).await) {
            Presence::Present => Ok((send, recv)),
            // Not the probe's answer first (a client that runs the call regardless): it is
            // told to stop.
            failed @ Presence::Unknown(Unasked::Failed) => {
                recv.stop(reset::MALFORMED);
                Err(failed)
            }
            absent_or_gone => {
                recv.let_go();
                Err(absent_or_gone)
            }
        }
    };
    let (_send, recv) = tokio::time::timeout(PROBE_TIMEOUT, asked)
        .await
        .unwrap_or(Err(Presence::Unknown(Unasked::TimedOut(PROBE_TIMEOUT))))?;
    watch.sent();
    Ok(answer(recv, name, full_trust, progress, watch).await)
}

/// Opens a stream, writes `request` as a `run` (with `if_present` when given) and finishes the
/// stream's sending side. `Err` when the connection is gone.
async fn send<C: Connection>(
    conn: &C,
    request: RunRequest<'_>,
    if_present: Option<&str>,
) -> Result<(C::Send, C::Recv), ()> {
    let (mut send, recv) = conn.open().await.map_err(drop)?;
    let message = Message::Run {
        id: REQUEST_ID,
        attachment: request.attachment,
        session: request.session.to_owned(),
        tool: request.tool,
        args: request.args,
        if_present: if_present.map(str::to_owned),
    };
    write_message(&mut send, &message).await.map_err(drop)?;
    send.finish();
    Ok((send, recv))
}

/// The id of the one request (a run or a probe) on each stream the server opens to a client.
const REQUEST_ID: u64 = 1;

/// What a client's answer to a probe of a path says.
fn presence(answer: Result<Option<Message>, ReadError>) -> Presence {
    match answer {
        Ok(Some(Message::Probed { exists: true, .. })) => Presence::Present,
        Ok(Some(Message::Probed { exists: false, .. })) => Presence::Absent,
        Ok(None) | Err(ReadError::Io(_)) => Presence::Unknown(Unasked::Disconnected),
        Ok(Some(_)) | Err(_) => Presence::Unknown(Unasked::Failed),
    }
}

/// Reads a client's answer to a run: its progress relayed, who decided, the result.
async fn answer<R: RecvHalf>(
    mut recv: R,
    name: &str,
    full_trust: bool,
    progress: &dyn ProgressSink,
    watch: &dyn CallWatch,
) -> Answer<R> {
    // Until the client says who decided (a client refuses a call that cannot run without
    // deciding anything).
    let mut decided_by = Verdict {
        by: Decider::Client,
        allowed: None,
    };
    let malformed = |what: String| {
        ToolError::new(
            ErrorCode::Malformed,
            format!("the client of `{name}` answered with {what}"),
        )
    };
    let memory = call_memory();
    loop {
        // The result is relayed and recorded as the client wrote it, not decoded here; what
        // it holds in memory is counted as it arrives.
        match read_answer(&mut recv, MAX_CLIENT_MESSAGE, memory.as_deref()).await {
            Ok(Some(Message::Progress { message, .. })) => {
                progress.progress(wire::progress_line(&message))
            }
            Ok(Some(Message::Decided { by, allowed, .. })) => {
                decided_by = Verdict {
                    by: by.said_by_client(full_trust),
                    allowed: Some(allowed),
                };
                watch.decided(decided_by);
            }
            Ok(Some(Message::Result {
                outcome,
                body: None,
                ..
            })) => {
                // The whole answer is in: the stream's end follows.
                recv.let_go();
                return match outcome {
                    Outcome::Ok { result } => Answer {
                        result: Ok(result),
                        body: None,
                        verdict: decided_by,
                    },
                    Outcome::Error { error } => Answer::failed(error, decided_by),
                };
            }
            Ok(Some(Message::Result {
                outcome,
                body: Some(body),
                ..
            })) => {
                return match outcome {
                    Outcome::Ok { result } => {
                        // The rest of a result whose large field comes as a body is small: it
                        // is looked at only up to a bound, and for its names alone (a tree of
                        // a client's answer could be many times its size).
                        let fits = result.text_len().is_none_or(|len| len <= MAX_BODY_HEAD)
                            && result
                                .decode::<std::collections::HashMap<String, serde::de::IgnoredAny>>(
                                )
                                .is_ok_and(|head| !head.contains_key(&body.field));
                        if !fits {
                            let error = malformed(format!(
                                "a body for `{}` that does not fit its result",
                                body.field
                            ));
                            return Answer::failed(error, decided_by);
                        }
                        if body.len > MAX_CLIENT_MESSAGE as u64 {
                            let error = ToolError::new(
                                ErrorCode::LimitExceeded,
                                format!(
                                    "the result from `{name}` is {} bytes, over the {MAX_CLIENT_MESSAGE}-byte maximum",
                                    body.len
                                ),
                            );
                            return Answer::failed(error, decided_by);
                        }
                        let pending = PendingBody {
                            body,
                            recv: Some(recv),
                            name: name.to_owned(),
                            deadline: None,
                            received: 0,
                            tap: None,
                            memory: memory.clone(),
                        };
                        Answer {
                            result: Ok(result),
                            body: Some(pending),
                            verdict: decided_by,
                        }
                    }
                    Outcome::Error { .. } => {
                        Answer::failed(malformed("a body after an error".into()), decided_by)
                    }
                };
            }
            Ok(Some(other)) => {
                let error = malformed(format!("a `{}`", other.kind()));
                return Answer::failed(error, decided_by);
            }
            Ok(None) | Err(ReadError::Io(_)) => {
                return Answer::failed(disconnected(name), decided_by);
            }
            Err(ReadError::Refused) => {
                recv.stop(reset::CANCELLED);
                let error = refused(memory.as_deref(), &format!("the answer from `{name}`"));
                return Answer::failed(error, decided_by);
            }
            Err(ReadError::Frame(FrameError::MessageTooLarge(max))) => {
                recv.stop(reset::MALFORMED);
                let error = ToolError::new(
                    ErrorCode::LimitExceeded,
                    format!(
                        "the client of `{name}` answered with a message over the {max}-byte maximum"
                    ),
                );
                return Answer::failed(error, decided_by);
            }
            Err(
                e @ (ReadError::Frame(FrameError::TooLarge(_) | FrameError::UnknownFlags(_))
                | ReadError::Json(_)
                | ReadError::Body(_)),
            ) => {
                // Not the protocol: nothing more is read from this stream.
                recv.stop(reset::MALFORMED);
                return Answer::failed(malformed(format!("a {e}")), decided_by);
            }
        }
    }
}

/// The body of a client's result, not read yet: the client's stream, positioned just after the
/// result message. Relaying it chunk by chunk keeps a 64 MiB read from being held whole on the
/// server, and lets both hops run at once. The call is recorded when the body is done with,
/// relayed or not (on drop).
pub struct PendingBody<R: RecvHalf = ConnRecv> {
    /// What follows.
    pub body: Body,
    /// Taken only when the body is dropped, to be let go of.
    recv: Option<R>,
    name: String,
    /// When the call's time runs out.
    pub(super) deadline: Option<tokio::time::Instant>,
    received: u64,
    /// What records the call once the body is done with.
    pub(super) tap: Option<Tap>,
    /// What the call's answers hold in memory, when counted: a body read whole is.
    memory: Option<Arc<crate::quota::Held>>,
}

impl<R: RecvHalf> std::fmt::Debug for PendingBody<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingBody")
            .field("body", &self.body)
            .field("workspace", &self.name)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// Why a relay stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayError {
    /// The attached client went away, or reset its stream; the agent's stream is reset with
    /// [`reset::WORKSPACE_DISCONNECTED`].
    Source,
    /// The body is not what the result announced: it ended short, ran long, or is not UTF-8
    /// text; the agent's stream is reset with [`reset::MALFORMED`].
    Malformed(&'static str),
    /// The call's time ran out; the agent's stream is reset with [`reset::TIMEOUT`].
    Timeout,
    /// The agent stopped reading (it cancelled) or went away; the client's stream is stopped.
    Sink,
    /// The server is shutting down and closed the connections.
    Shutdown,
}

impl<R: RecvHalf> PendingBody<R> {
    /// The client's stream the body comes on; it is taken only when the body is dropped.
    fn recv(&mut self) -> &mut R {
        self.recv
            .as_mut()
            .expect("the stream is taken only on drop")
    }

    /// Relays the body to an agent's stream as it arrives, chunk by chunk, without copying or
    /// parsing it, within the call's time limit. On failure the side that is still there is
    /// told (see [`RelayError`]).
    pub async fn relay<S: SendHalf>(mut self, send: &mut S) -> Result<(), RelayError> {
        let result = match self.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.relay_inner(send))
                .await
                .unwrap_or(Err(RelayError::Timeout)),
            None => self.relay_inner(send).await,
        };
        if let Err(e) = result {
            let (code, error) = match e {
                RelayError::Source => (
                    Some(reset::WORKSPACE_DISCONNECTED),
                    disconnected(&self.name),
                ),
                RelayError::Malformed(why) => (
                    Some(reset::MALFORMED),
                    ToolError::new(
                        ErrorCode::Malformed,
                        format!(
                            "the client of `{}` sent a result whose `{}` {why}",
                            self.name, self.body.field
                        ),
                    ),
                ),
                RelayError::Timeout => (Some(reset::TIMEOUT), call_timed_out()),
                RelayError::Sink => (
                    None,
                    ToolError::new(ErrorCode::Cancelled, "the agent cancelled the call"),
                ),
                RelayError::Shutdown => (
                    None,
                    ToolError::new(ErrorCode::Cancelled, "the server shut down"),
                ),
            };
            if let Some(code) = code {
                send.reset(code);
            }
            self.recv().stop(reset::CANCELLED);
            self.fail(error);
        }
        result
    }

    async fn relay_inner<S: SendHalf>(&mut self, send: &mut S) -> Result<(), RelayError> {
        // Checked as it passes, so that what reaches the agent, and the audit log, is what the
        // agent will make of it.
        let mut text = Utf8Stream::default();
        let stopped = send.stopped();
        tokio::pin!(stopped);
        let mut chunks: [Bytes; RELAY_BATCH] = Default::default();
        while self.received < self.body.len {
            let read = tokio::select! {
                read = self.recv().read_chunks(&mut chunks) => read,
                _ = &mut stopped => return Err(RelayError::Sink),
            };
            let n = match read {
                Ok(Some(n)) => n,
                Ok(None) => return Err(RelayError::Malformed("ended before its announced length")),
                Err(StreamError::Closed) => return Err(RelayError::Shutdown),
                Err(StreamError::Lost) => return Err(RelayError::Source),
            };
            for chunk in &chunks[..n] {
                if self.received + chunk.len() as u64 > self.body.len {
                    return Err(RelayError::Malformed("runs past its announced length"));
                }
                if !text.feed(chunk) {
                    return Err(RelayError::Malformed("is not UTF-8 text"));
                }
                self.see(chunk);
            }
            match send.write_chunks(&mut chunks[..n]).await {
                Ok(()) => {}
                Err(StreamError::Closed) => return Err(RelayError::Shutdown),
                Err(StreamError::Lost) => return Err(RelayError::Sink),
            }
        }
        if text.finish() {
            Ok(())
        } else {
            Err(RelayError::Malformed("is not UTF-8 text"))
        }
    }

    /// Reads the whole body into `outcome` (for callers that need the result as one value),
    /// within the call's time limit. On failure the call is recorded with the error returned.
    pub(super) async fn read_into(mut self, outcome: &mut Outcome) -> Result<(), ToolError> {
        let announced = self.body.clone();
        // Counted as announced (a body longer than the bound is refused before this).
        let len = usize::try_from(announced.len).unwrap_or(usize::MAX);
        if let Some(memory) = &self.memory
            && len <= MAX_CLIENT_MESSAGE
            && !memory.take(len)
        {
            let what = format!("the answer from `{}`", self.name);
            let error = over_call_memory(memory.limit(), &what);
            self.recv().stop(reset::CANCELLED);
            self.fail(error.clone());
            return Err(error);
        }
        let deadline = self.deadline;
        let read = {
            let mut tapped = Tapped(&mut self);
            let read = read_body(&mut tapped, outcome, &announced, MAX_CLIENT_MESSAGE);
            match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, read)
                    .await
                    .unwrap_or(Err(ReadError::Io(std::io::ErrorKind::TimedOut.into()))),
                None => read.await,
            }
        };
        let Err(e) = read else {
            return Ok(());
        };
        let error = match e {
            ReadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => call_timed_out(),
            ReadError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => ToolError::new(
                ErrorCode::Malformed,
                format!(
                    "the client of `{}` sent a result whose `{}` ended before its announced length",
                    self.name, announced.field
                ),
            ),
            ReadError::Io(_) => disconnected(&self.name),
            other => ToolError::new(
                ErrorCode::Malformed,
                format!("the client of `{}` sent a bad result: {other}", self.name),
            ),
        };
        self.fail(error.clone());
        Err(error)
    }

    /// Counts received bytes and keeps the head of them for the call's artifact.
    fn see(&mut self, bytes: &[u8]) {
        self.received += bytes.len() as u64;
        if let Some(tap) = &mut self.tap {
            tap.keep(bytes);
        }
    }

    /// Records the call as failed with `error` (instead of as it was announced).
    fn fail(&mut self, error: ToolError) {
        if let Some(tap) = &mut self.tap {
            tap.failed = Some(error);
        }
    }
}

impl<R: RecvHalf> Drop for PendingBody<R> {
    fn drop(&mut self) {
        if let Some(tap) = self.tap.take() {
            tap.finish(&self.body, self.received);
        }
        // A body read whole is followed by the stream's end: a relay's last batch of chunks
        // usually takes it along, and one still on its way is waited for in the background,
        // bounded, so that the client is not told to stop a stream it finished (a stream
        // stopped on a failure has none to read).
        if let Some(recv) = self.recv.take() {
            recv.let_go();
        }
    }
}

/// Reads a pending body through its tap, so that [`PendingBody::read_into`] keeps the same head
/// for the artifact as a relay.
struct Tapped<'a, R: RecvHalf>(&'a mut PendingBody<R>);

impl<R: RecvHalf> AsyncRead for Tapped<'_, R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let pending = &mut *self.0;
        let polled = Pin::new(pending.recv()).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            pending.see(&buf.filled()[before..]);
        }
        polled
    }
}

/// Streams in memory, for the unit tests: each stream the server opens is two
/// [`tokio::io::duplex`] pipes, one each way, whose far ends a scripted peer takes with
/// [`Peer::accept`] and speaks the real frames on.
#[cfg(test)]
pub(crate) mod memory {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::{Bytes, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
    use tokio::sync::mpsc;

    use super::*;

    /// Bytes a pipe holds before its writer waits.
    const PIPE: usize = 64 * 1024;

    /// The codes the server's receiving halves were stopped with, in order.
    type Stops = std::sync::Arc<std::sync::Mutex<Vec<u32>>>;

    /// The server's side of an in-memory connection.
    #[derive(Debug, Clone)]
    pub struct Connection {
        streams: mpsc::UnboundedSender<(DuplexStream, DuplexStream)>,
        pub(super) id: usize,
        stops: Stops,
    }

    /// The client's side: the streams the server opened.
    #[derive(Debug)]
    pub struct Peer {
        streams: mpsc::UnboundedReceiver<(DuplexStream, DuplexStream)>,
        stops: Stops,
    }

    /// A connection and its far end. Dropping the [`Peer`] is the client going away.
    pub fn pair() -> (Connection, Peer) {
        static IDS: AtomicUsize = AtomicUsize::new(1);
        let (streams, rx) = mpsc::unbounded_channel();
        let id = IDS.fetch_add(1, Ordering::Relaxed);
        let stops = Stops::default();
        let peer = Peer {
            streams: rx,
            stops: stops.clone(),
        };
        (Connection { streams, id, stops }, peer)
    }

    impl Peer {
        /// The codes the server stopped its streams' receiving halves with (QUIC's
        /// `STOP_SENDING`), in order; a stream let go of is not among them.
        pub fn stops(&self) -> Vec<u32> {
            self.stops.lock().unwrap().clone()
        }

        /// The next stream the server opened: what the server sends (`.0`, read it) and what
        /// goes back to it (`.1`, write it; drop it to end the stream). `None` once the
        /// server's side is gone.
        pub async fn accept(&mut self) -> Option<(DuplexStream, DuplexStream)> {
            self.streams.recv().await
        }
    }

    /// One way of a stream, as the writer holds it: a sink for the relay in tests, with the
    /// reader's end to check what arrived.
    pub fn pipe() -> (Send, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(PIPE);
        (Send::new(ours), theirs)
    }

    impl super::Connection for Connection {
        type Send = Send;
        type Recv = Recv;

        async fn open(&self) -> Result<(Send, Recv), StreamError> {
            let (to_peer, peer_reads) = tokio::io::duplex(PIPE);
            let (from_peer, peer_writes) = tokio::io::duplex(PIPE);
            self.streams
                .send((peer_reads, peer_writes))
                .map_err(|_| StreamError::Lost)?;
            let recv = Recv {
                pipe: Some(from_peer),
                stops: self.stops.clone(),
            };
            Ok((Send::new(to_peer), recv))
        }
    }

    /// The sending half; finishing or resetting it drops the pipe, so the reader reads to the
    /// end of what was written.
    #[derive(Debug)]
    pub struct Send {
        pipe: Option<DuplexStream>,
        /// The code it was reset with.
        pub reset: Option<u32>,
    }

    impl Send {
        fn new(pipe: DuplexStream) -> Send {
            Send {
                pipe: Some(pipe),
                reset: None,
            }
        }
    }

    fn gone() -> std::io::Error {
        std::io::ErrorKind::BrokenPipe.into()
    }

    impl AsyncWrite for Send {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            match &mut self.get_mut().pipe {
                Some(pipe) => Pin::new(pipe).poll_write(cx, buf),
                None => Poll::Ready(Err(gone())),
            }
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            match &mut self.get_mut().pipe {
                Some(pipe) => Pin::new(pipe).poll_flush(cx),
                None => Poll::Ready(Err(gone())),
            }
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            match &mut self.get_mut().pipe {
                Some(pipe) => Pin::new(pipe).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            }
        }
    }

    impl SendHalf for Send {
        fn finish(&mut self) {
            self.pipe = None;
        }

        fn reset(&mut self, code: u32) {
            self.reset = Some(code);
            self.pipe = None;
        }

        fn stopped(&self) -> impl Future<Output = ()> + std::marker::Send + 'static {
            std::future::pending()
        }

        async fn write_chunks(&mut self, chunks: &mut [Bytes]) -> Result<(), StreamError> {
            for chunk in chunks.iter() {
                self.write_all(chunk).await.map_err(|_| StreamError::Lost)?;
            }
            Ok(())
        }
    }

    /// The receiving half; stopping it drops the pipe, so the peer's next write fails, and
    /// notes the code for [`Peer::stops`].
    #[derive(Debug)]
    pub struct Recv {
        pipe: Option<DuplexStream>,
        stops: Stops,
    }

    impl AsyncRead for Recv {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match &mut self.get_mut().pipe {
                Some(pipe) => Pin::new(pipe).poll_read(cx, buf),
                None => Poll::Ready(Err(gone())),
            }
        }
    }

    impl RecvHalf for Recv {
        async fn read_chunks(
            &mut self,
            chunks: &mut [Bytes],
        ) -> Result<Option<usize>, StreamError> {
            let Some(first) = chunks.first_mut() else {
                return Ok(Some(0));
            };
            let mut buf = BytesMut::with_capacity(PIPE);
            match self.read_buf(&mut buf).await {
                Ok(0) => Ok(None),
                Ok(_) => {
                    *first = buf.freeze();
                    Ok(Some(1))
                }
                Err(_) => Err(StreamError::Lost),
            }
        }

        fn stop(&mut self, code: u32) {
            self.stops.lock().unwrap().push(code);
            self.pipe = None;
        }
    }
}
