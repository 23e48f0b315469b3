//! Reading and writing framed messages on any tokio byte stream (a QUIC stream in practice).
//!
//! Thin glue over the pure [`crate::frame`] codec; enabled by the `tokio` feature.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{ErrorCode, ToolError};
use crate::frame::{self, FrameError, HEADER_LEN, MAX_FRAME_PAYLOAD};
use crate::wire::Message;

/// Why a message could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The stream failed or ended in the middle of a message.
    Io(std::io::Error),
    /// The bytes are not valid frames.
    Frame(FrameError),
    /// The message is not valid JSON for any message type.
    Json(serde_json::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "stream failed: {e}"),
            ReadError::Frame(e) => write!(f, "bad frame: {e}"),
            ReadError::Json(e) => write!(f, "bad message: {e}"),
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
            return Message::from_json(&message)
                .map(Some)
                .map_err(ReadError::Json);
        }
    }
}

/// Writes one message, cut into frames.
pub async fn write_message<W: AsyncWrite + Unpin>(
    writer: &mut W,
    message: &Message,
) -> std::io::Result<()> {
    let json = message.to_json();
    if json.len() <= MAX_FRAME_PAYLOAD {
        let mut buf = Vec::with_capacity(HEADER_LEN + json.len());
        buf.extend_from_slice(&frame::encode_header(json.len(), true));
        buf.extend_from_slice(&json);
        return writer.write_all(&buf).await;
    }
    for (header, chunk) in frame::frames(&json) {
        writer.write_all(&header).await?;
        writer.write_all(chunk).await?;
    }
    Ok(())
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
        });
        for m in &messages {
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
