//! Reading and writing framed messages on any tokio byte stream (a QUIC stream in practice).
//!
//! Thin glue over the pure [`crate::frame`] codec; enabled by the `tokio` feature.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ErrorCode, ToolError};
use crate::frame::{self, FrameError, HEADER_LEN, MAX_FRAME_PAYLOAD};
use crate::wire::{Body, BodyError, Message, Outcome};

/// Why a message could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The stream failed or ended in the middle of a message.
    Io(std::io::Error),
    /// The bytes are not valid frames.
    Frame(FrameError),
    /// The message is not valid JSON for any message type.
    Json(serde_json::Error),
    /// A result's body does not fit its result.
    Body(BodyError),
    /// The reader's caller would not hold more of the message in memory
    /// ([`read_message_relayed_counted`]).
    Refused,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "stream failed: {e}"),
            ReadError::Frame(e) => write!(f, "bad frame: {e}"),
            ReadError::Json(e) => write!(f, "bad message: {e}"),
            ReadError::Body(e) => write!(f, "bad body: {e}"),
            ReadError::Refused => write!(f, "the message is more than the reader would hold"),
        }
    }
}

impl std::error::Error for ReadError {}

impl ReadError {
    /// The error to send back, when the stream can still carry one.
    pub fn to_tool_error(&self) -> ToolError {
        ToolError::new(ErrorCode::Malformed, self.to_string())
    }
}

/// Reads one message. `Ok(None)` when the stream ended cleanly before a new message began.
pub async fn read_message<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_message: usize,
) -> Result<Option<Message>, ReadError> {
    read_with(reader, max_message, Message::from_json, &mut |_| true).await
}

/// [`read_message`], with a tool's result kept as the JSON text it came in
/// ([`Message::from_json_relayed`]).
pub async fn read_message_relayed<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_message: usize,
) -> Result<Option<Message>, ReadError> {
    read_with(reader, max_message, Message::from_json_relayed, &mut |_| {
        true
    })
    .await
}

/// [`read_message_relayed`], asking `hold` before each frame's payload is read whether the
/// message may grow by that many bytes: when it says no, nothing more is read and the read
/// fails with [`ReadError::Refused`] (what was read of the message is dropped).
pub async fn read_message_relayed_counted<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_message: usize,
    hold: &mut (dyn FnMut(usize) -> bool + Send),
) -> Result<Option<Message>, ReadError> {
    read_with(reader, max_message, Message::from_json_relayed, hold).await
}

async fn read_with<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_message: usize,
    decode: fn(&[u8]) -> Result<Message, serde_json::Error>,
    hold: &mut (dyn FnMut(usize) -> bool + Send),
) -> Result<Option<Message>, ReadError> {
    match read_frames(reader, max_message, hold).await? {
        Some(message) => decode(&message).map(Some).map_err(ReadError::Json),
        None => Ok(None),
    }
}

/// Reads one message's bytes, not decoded (for a reader that looks at them first), asking
/// `hold` before each frame's payload as [`read_message_relayed_counted`] does. `Ok(None)` when
/// the stream ended cleanly before a new message began.
pub async fn read_frames<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_message: usize,
    hold: &mut (dyn FnMut(usize) -> bool + Send),
) -> Result<Option<Vec<u8>>, ReadError> {
    // Payloads are read straight into the message being assembled: no buffer per frame, no
    // copy, no zeroing (a 64 MiB result is 64 frames).
    let mut message: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let mut header = [0u8; HEADER_LEN];
        if first {
            first = false;
            let n = reader.read(&mut header).await.map_err(ReadError::Io)?;
            if n == 0 {
                return Ok(None);
            }
            reader
                .read_exact(&mut header[n..])
                .await
                .map_err(ReadError::Io)?;
        } else {
            reader
                .read_exact(&mut header)
                .await
                .map_err(ReadError::Io)?;
        }
        let header = frame::decode_header(header).map_err(ReadError::Frame)?;
        if message.len() + header.len > max_message {
            return Err(ReadError::Frame(FrameError::MessageTooLarge(max_message)));
        }
        if !hold(header.len) {
            return Err(ReadError::Refused);
        }
        message.reserve(header.len);
        let got = (&mut *reader)
            .take(header.len as u64)
            .read_to_end(&mut message)
            .await
            .map_err(ReadError::Io)?;
        if got < header.len {
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        if header.fin {
            return Ok(Some(message));
        }
    }
}

/// Reads the [`Body`] announced by a result and puts it into `outcome`. A body longer than
/// `max` is refused before anything is read; one that ends early is an I/O error.
pub async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut R,
    outcome: &mut Outcome,
    body: &Body,
    max: usize,
) -> Result<(), ReadError> {
    let len = usize::try_from(body.len)
        .ok()
        .filter(|&len| len <= max)
        .ok_or(ReadError::Frame(FrameError::MessageTooLarge(max)))?;
    if !matches!(outcome, Outcome::Ok { .. }) {
        return Err(ReadError::Body(BodyError::NotAnObject));
    }
    // Grown as bytes arrive, not reserved from the announcement: a peer that announces 256 MiB
    // and sends nothing holds no memory.
    let mut bytes = Vec::with_capacity(len.min(MAX_FRAME_PAYLOAD));
    let got = (&mut *reader)
        .take(len as u64)
        .read_to_end(&mut bytes)
        .await
        .map_err(ReadError::Io)?;
    if got < len {
        return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    outcome.join_body(body, bytes).map_err(ReadError::Body)
}

/// Writes one message, cut into frames.
pub async fn write_message<W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &Message,
) -> std::io::Result<()> {
    write_messages(writer, &[message]).await
}

/// Writes one message already encoded as JSON ([`Message::to_json`]), cut into frames: for a
/// sender that encodes a large message elsewhere than on its async task (see
/// `monad-client`'s calls).
pub async fn write_encoded<W: AsyncWrite + Unpin>(
    writer: &mut W,
    json: &[u8],
) -> std::io::Result<()> {
    if json.len() <= MAX_FRAME_PAYLOAD {
        let mut buf = Vec::with_capacity(json.len() + HEADER_LEN);
        buf.extend_from_slice(&frame::encode_header(json.len(), true));
        buf.extend_from_slice(json);
        return writer.write_all(&buf).await;
    }
    for (header, chunk) in frame::frames(json) {
        writer.write_all(&header).await?;
        writer.write_all(chunk).await?;
    }
    Ok(())
}

/// Writes several messages, in one write when each fits one frame, so that small ones share a
/// packet (a `decided` and the `result` after it); larger ones are written one by one, without
/// copying them into a common buffer.
pub async fn write_messages<W: AsyncWrite + Unpin>(
    writer: &mut W,
    messages: &[&Message],
) -> std::io::Result<()> {
    let encoded: Vec<Vec<u8>> = messages.iter().map(|m| m.to_json()).collect();
    if encoded.iter().any(|json| json.len() > MAX_FRAME_PAYLOAD) {
        for json in &encoded {
            write_encoded(writer, json).await?;
        }
        return Ok(());
    }
    let total = encoded.iter().map(|json| json.len() + HEADER_LEN).sum();
    let mut buf = Vec::with_capacity(total);
    for json in &encoded {
        buf.extend_from_slice(&frame::encode_header(json.len(), true));
        buf.extend_from_slice(json);
    }
    writer.write_all(&buf).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn messages_cross_a_pipe_small_and_large() {
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let big = "x".repeat(3 * MAX_FRAME_PAYLOAD);
        let messages = vec![
            Message::ListSessions {
                id: 1,
                limit: None,
                next: None,
            },
            Message::Call {
                id: 2,
                session: None,
                tool: "write_file".into(),
                args: json!({"path": "big", "content": big}),
            },
        ];
        let sent = messages.clone();
        let writer = tokio::spawn(async move {
            for m in &sent {
                write_message(&mut a, m).await.unwrap();
            }
            // The same again, through write_messages (the large one framed alone)...
            write_messages(&mut a, &sent.iter().collect::<Vec<_>>())
                .await
                .unwrap();
            // ...and two small ones in one buffer...
            write_messages(&mut a, &[&sent[0], &sent[0]]).await.unwrap();
            // ...and each encoded beforehand.
            for m in &sent {
                write_encoded(&mut a, &m.to_json()).await.unwrap();
            }
        });
        for m in messages
            .iter()
            .chain(&messages)
            .chain([&messages[0], &messages[0]])
            .chain(&messages)
        {
            let got = read_message(&mut b, frame::DEFAULT_MAX_MESSAGE)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&got, m);
        }
        writer.await.unwrap();
        assert!(
            read_message(&mut b, 1024).await.unwrap().is_none(),
            "clean end"
        );
    }

    #[tokio::test]
    async fn a_body_follows_its_result_and_is_checked() {
        let content = "0123456789abcde\n".repeat(crate::wire::BODY_THRESHOLD / 8);
        let mut outcome = Outcome::Ok {
            result: json!({"path": "big.txt", "content": content}).into(),
        };
        let original = outcome.clone();
        let (body, bytes) = outcome.split_body().unwrap();
        let (mut a, mut b) = tokio::io::duplex(64 * 1024);
        let head = Message::Result {
            id: 1,
            workspace: None,
            outcome,
            body: Some(body.clone()),
        };
        let writer = tokio::spawn(async move {
            write_message(&mut a, &head).await.unwrap();
            a.write_all(&bytes).await.unwrap();
            a
        });
        let Some(Message::Result {
            mut outcome,
            body: Some(got),
            ..
        }) = read_message(&mut b, 1024).await.unwrap()
        else {
            panic!("expected a result with a body");
        };
        assert_eq!(got, body);
        read_body(&mut b, &mut outcome, &got, content.len())
            .await
            .unwrap();
        assert_eq!(outcome, original);
        let mut a = writer.await.unwrap();

        // Over the cap: refused before reading; short: an error, not a hang.
        let mut empty = Outcome::Ok {
            result: json!({}).into(),
        };
        assert!(matches!(
            read_body(&mut b, &mut empty, &body, content.len() - 1).await,
            Err(ReadError::Frame(FrameError::MessageTooLarge(_)))
        ));
        a.write_all(b"short").await.unwrap();
        drop(a);
        assert!(matches!(
            read_body(&mut b, &mut empty, &body, content.len()).await,
            Err(ReadError::Io(_))
        ));
        assert_eq!(
            empty,
            Outcome::Ok {
                result: json!({}).into()
            }
        );
    }

    #[tokio::test]
    async fn garbage_and_truncation_are_errors_not_hangs() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&[0, 0, 0, 3, 1, b'{', b'x', b'}'])
            .await
            .unwrap();
        assert!(matches!(
            read_message(&mut b, 1024).await,
            Err(ReadError::Json(_))
        ));
        a.write_all(&[0xff, 0xff, 0xff, 0xff, 1]).await.unwrap();
        assert!(matches!(
            read_message(&mut b, 1024).await,
            Err(ReadError::Frame(FrameError::TooLarge(_)))
        ));
        a.write_all(&[0, 0, 0, 10, 1, b'{']).await.unwrap();
        drop(a);
        assert!(matches!(
            read_message(&mut b, 1024).await,
            Err(ReadError::Io(_))
        ));
    }
}
