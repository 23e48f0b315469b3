//! Letting go of a QUIC receive stream without telling the peer to stop.
//!
//! quinn stops a receive stream that is dropped before a read has returned its end: it sends
//! the peer a `STOP_SENDING`, even when the peer's FIN and all its data have already arrived
//! (quinn-proto's `Recv::stop` calls it spurious), and the peer acknowledges it. A request of
//! Monad's protocol is one message and its stream's end, read as a message (the frame says it
//! is the last), so every call paid two datagrams for nothing on each of its two hops. The
//! reader looks for the end once, without waiting: the peer's FIN usually travels with its
//! message; when it comes in a datagram of its own, a background task waits for it, bounded.

use std::ops::{Deref, DerefMut};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How long [`let_go`] waits, in the background, for an end that had not arrived yet.
pub const END_WAIT: Duration = Duration::from_secs(1);

/// Reads `recv`'s end if it is there, without waiting: `true` when the peer finished the stream
/// and everything it sent has been read, after which dropping `recv` sends nothing. `false`
/// otherwise: dropping it then stops the peer, as it should. Only for a stream on which nothing
/// more is expected: a byte that did arrive is consumed and lost.
pub fn read_end(recv: &mut quinn::RecvStream) -> bool {
    look(recv) == Poll::Ready(true)
}

/// One look at `recv`'s end, without waiting: `Ready(true)` at the end; `Ready(false)` when
/// there will be none to read (the stream was stopped or reset, the connection is gone) or the
/// peer sent more than it should have (a byte of it consumed); `Pending` while the end may still
/// come.
fn look(recv: &mut quinn::RecvStream) -> Poll<bool> {
    let mut byte = [0u8; 1];
    let mut read = std::pin::pin!(recv.read(&mut byte));
    let mut cx = Context::from_waker(Waker::noop());
    read.as_mut()
        .poll(&mut cx)
        .map(|read| matches!(read, Ok(None)))
}

/// Lets go of `recv`, on which nothing more is expected, without telling a peer that finished
/// it to stop: its end is read at once when it has arrived (the usual case). When it has not
/// (the peer's FIN left in a datagram of its own and is still on its way), a task waits for it,
/// at most [`END_WAIT`], in the background; only then is the stream dropped, and stopped if it
/// did not end. A stream that will have no end to read, or whose peer sent more, is dropped at
/// once, as it is outside a Tokio runtime.
pub fn let_go(mut recv: quinn::RecvStream) {
    if look(&mut recv).is_ready() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let ended = async {
            // Anything still sent is read and discarded until the end.
            while let Ok(Some(_)) = recv.read_chunk(usize::MAX, true).await {}
        };
        let _ = tokio::time::timeout(END_WAIT, ended).await;
    });
}

/// A receive stream whose end is read ([`read_end`]) when it is dropped, for a request or an
/// answer that is one message: whichever way its handling ends, a peer that finished is not
/// told to stop. Dropped before its end arrived, it stops the peer at once, as quinn does: that
/// is how a reader that gives up (an agent cancelling a call) says so. A reader that has its
/// last message calls [`QuietRecv::let_go`] instead, which also waits for a late end.
#[derive(Debug)]
pub struct QuietRecv(Option<quinn::RecvStream>);

impl QuietRecv {
    /// Wraps `recv`.
    pub fn new(recv: quinn::RecvStream) -> QuietRecv {
        QuietRecv(Some(recv))
    }

    /// Lets go of the stream once its last message is read ([`let_go`]).
    pub fn let_go(mut self) {
        if let Some(recv) = self.0.take() {
            let_go(recv);
        }
    }
}

impl Deref for QuietRecv {
    type Target = quinn::RecvStream;

    fn deref(&self) -> &quinn::RecvStream {
        self.0.as_ref().expect("taken only when let go")
    }
}

impl DerefMut for QuietRecv {
    fn deref_mut(&mut self) -> &mut quinn::RecvStream {
        self.0.as_mut().expect("taken only when let go")
    }
}

impl Drop for QuietRecv {
    fn drop(&mut self) {
        if let Some(recv) = &mut self.0 {
            read_end(recv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    const ALPN: &[u8] = b"stream-test";

    /// A server and a client endpoint on loopback, connected.
    async fn pair() -> (quinn::Endpoint, quinn::Connection, quinn::Connection) {
        let generated =
            rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
        let cert = generated.cert.der().clone();
        let key =
            rustls::pki_types::PrivateKeyDer::Pkcs8(generated.signing_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .expect("certificate and key");
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
        let server = crate::pin::endpoint(
            "127.0.0.1:0".parse().expect("address"),
            Some(quinn::ServerConfig::with_crypto(Arc::new(crypto))),
        )
        .expect("server endpoint");
        let client = crate::pin::client_endpoint(false).expect("client endpoint");
        let (config, _) =
            crate::pin::pinned_config(&crate::pin::fingerprint(&cert), ALPN).expect("config");
        let addr = server.local_addr().expect("address");
        let connecting = client
            .connect_with(config, addr, "localhost")
            .expect("connect");
        let (accepted, connected) = tokio::join!(
            async { server.accept().await.expect("incoming").await },
            connecting
        );
        (
            client,
            accepted.expect("accepted"),
            connected.expect("connected"),
        )
    }

    /// The client's request `hello` (finished when `finish`), read by the server as a framed
    /// reader reads a message: to its last byte, not to its end. The client's halves, then the
    /// server's.
    async fn hello(
        server: &quinn::Connection,
        client: &quinn::Connection,
        finish: bool,
    ) -> (
        quinn::SendStream,
        quinn::RecvStream,
        quinn::SendStream,
        quinn::RecvStream,
    ) {
        let (mut send, recv) = client.open_bi().await.expect("open");
        send.write_all(b"hello").await.expect("write");
        if finish {
            send.finish().expect("finish");
        }
        let (answer, mut asked) = server.accept_bi().await.expect("accept");
        let mut message = [0u8; 5];
        asked.read_exact(&mut message).await.expect("the message");
        assert_eq!(&message, b"hello");
        (send, recv, answer, asked)
    }

    /// A request of one message and its end; the server reads the message (not the end, as a
    /// framed reader does), lets the stream go quietly or as quinn does, and answers. How many
    /// STOP_SENDING frames the server sent by the time the client has the answer (control
    /// frames go before stream data).
    async fn stop_sendings(quiet: bool) -> u64 {
        let (_client, server, client) = pair().await;
        let (_send, mut recv, mut answer, asked) = hello(&server, &client, true).await;
        let mut asked = QuietRecv::new(asked);
        if !quiet {
            // What dropping a quinn stream before its end does.
            let plain: &mut quinn::RecvStream = &mut asked;
            plain.stop(0u32.into()).expect("stop");
        }
        // Quiet: the wrapper reads the end, which came with the message (written and finished
        // without a pause, on a runtime of one thread), as it is dropped.
        drop(asked);
        answer.write_all(b"world").await.expect("answer");
        answer.finish().expect("finish");
        assert_eq!(recv.read_to_end(64).await.expect("the answer"), b"world");
        server.stats().frame_tx.stop_sending
    }

    #[tokio::test]
    async fn a_request_read_to_its_end_is_let_go_quietly() {
        assert_eq!(stop_sendings(true).await, 0);
    }

    #[tokio::test]
    async fn a_request_dropped_before_its_end_is_stopped() {
        // The control: without its end read, the peer is told to stop.
        assert_eq!(stop_sendings(false).await, 1);
    }

    /// A request whose end comes after the reader let go: the end is waited for, and the peer
    /// is told to stop only when it does not come within [`END_WAIT`].
    async fn let_go_before_the_end(finish: bool) -> u64 {
        let (_client, server, client) = pair().await;
        let (mut send, _recv, _answer, asked) = hello(&server, &client, false).await;
        QuietRecv::new(asked).let_go();
        if finish {
            tokio::time::sleep(Duration::from_millis(50)).await;
            send.finish().expect("finish");
        }
        // The background wait has ended either way.
        tokio::time::sleep(END_WAIT + Duration::from_millis(300)).await;
        server.stats().frame_tx.stop_sending
    }

    #[tokio::test]
    async fn an_end_that_comes_late_is_waited_for() {
        assert_eq!(let_go_before_the_end(true).await, 0);
    }

    #[tokio::test]
    async fn a_peer_that_never_finishes_is_stopped_after_the_wait() {
        assert_eq!(let_go_before_the_end(false).await, 1);
    }

    #[tokio::test]
    async fn a_reader_that_gives_up_before_the_end_stops_the_peer_at_once() {
        // How an agent cancels: it drops the answer's stream while the server still sends.
        let (_client, server, client) = pair().await;
        let (send, _recv, _answer, asked) = hello(&server, &client, false).await;
        drop(QuietRecv::new(asked));
        let stopped = tokio::time::timeout(END_WAIT / 2, send.stopped())
            .await
            .expect("the peer is told well before a late end would be waited out")
            .expect("stopped");
        assert_eq!(stopped, Some(0u32.into()));
    }

    #[tokio::test]
    async fn the_end_is_read_once_the_peer_finished() {
        let (_client, server, client) = pair().await;
        let (mut send, _recv, _answer, mut asked) = hello(&server, &client, false).await;
        assert!(!read_end(&mut asked), "no end before the peer finishes");
        send.finish().expect("finish");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !read_end(&mut asked) {
            assert!(tokio::time::Instant::now() < deadline, "the end never came");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
