//! Framing: how messages are cut into frames on a QUIC stream, as pure functions on byte slices.
//!
//! A frame is a 5-byte header, a big-endian `u32` payload length and a flags byte, followed by the
//! payload. A message is the payload of one frame with [`FLAG_FIN`] set, or the payloads of
//! several frames concatenated, the last with [`FLAG_FIN`]: large results (a 64 MiB file) travel
//! as a sequence of chunks without any frame exceeding [`MAX_FRAME_PAYLOAD`]. A message that grows
//! past its receiver's cap is an error, and so is a frame with unknown flags or an oversized
//! length: the stream is closed, never read on a guess.

/// Largest payload of one frame.
pub const MAX_FRAME_PAYLOAD: usize = 1024 * 1024;
/// Length of a frame header.
pub const HEADER_LEN: usize = 5;
/// Set on the last frame of a message.
pub const FLAG_FIN: u8 = 0b0000_0001;
/// Default cap on one reassembled message (JSON), for receivers that take large results.
pub const DEFAULT_MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// A frame header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bytes of payload that follow the header.
    pub len: usize,
    /// True on the last frame of a message.
    pub fin: bool,
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The header announces more than [`MAX_FRAME_PAYLOAD`] bytes.
    TooLarge(usize),
    /// The flags byte has bits this version does not know.
    UnknownFlags(u8),
    /// A message grew past the receiver's cap.
    MessageTooLarge(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge(n) => write!(
                f,
                "frame of {n} bytes is larger than the {MAX_FRAME_PAYLOAD}-byte maximum"
            ),
            FrameError::UnknownFlags(b) => write!(f, "frame has unknown flags {b:#04x}"),
            FrameError::MessageTooLarge(cap) => {
                write!(f, "message is larger than the {cap}-byte maximum")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Decodes a frame header.
pub fn decode_header(bytes: [u8; HEADER_LEN]) -> Result<Header, FrameError> {
    let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let flags = bytes[4];
    if flags & !FLAG_FIN != 0 {
        return Err(FrameError::UnknownFlags(flags));
    }
    if len > MAX_FRAME_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    Ok(Header {
        len,
        fin: flags & FLAG_FIN != 0,
    })
}

/// Encodes a frame header.
pub fn encode_header(len: usize, fin: bool) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_FRAME_PAYLOAD);
    let l = (len as u32).to_be_bytes();
    [l[0], l[1], l[2], l[3], if fin { FLAG_FIN } else { 0 }]
}

/// Cuts a message into frames: yields `(header, payload)` pairs, at least one (an empty message
/// is one empty frame with FIN).
pub fn frames(message: &[u8]) -> impl Iterator<Item = ([u8; HEADER_LEN], &[u8])> {
    let count = message.len().div_ceil(MAX_FRAME_PAYLOAD).max(1);
    (0..count).map(move |i| {
        let start = i * MAX_FRAME_PAYLOAD;
        let end = (start + MAX_FRAME_PAYLOAD).min(message.len());
        let chunk = &message[start..end];
        (encode_header(chunk.len(), i + 1 == count), chunk)
    })
}

/// The result of feeding bytes to a [`Decoder`].
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// More bytes are needed; at least this many.
    Incomplete(usize),
    /// A whole message, and how many input bytes it used.
    Message(Vec<u8>, usize),
}

/// Reassembles messages from a byte slice that holds zero or more frames. Pure: it holds the
/// partial message between calls, never the input.
#[derive(Debug)]
pub struct Decoder {
    partial: Vec<u8>,
    max_message: usize,
}

impl Decoder {
    /// A decoder that refuses messages larger than `max_message` bytes.
    pub fn new(max_message: usize) -> Decoder {
        Decoder {
            partial: Vec::new(),
            max_message,
        }
    }

    /// Decodes from the start of `buf`. On [`Decoded::Message`], the caller drops the used bytes
    /// and may call again with the rest; on [`Decoded::Incomplete`] it keeps them, and calls
    /// again with more after them: what this call assembled of the message is let go (it read
    /// the same frames again, and repeated them in the message).
    pub fn decode(&mut self, buf: &[u8]) -> Result<Decoded, FrameError> {
        let before = self.partial.len();
        let mut used = 0;
        loop {
            let rest = &buf[used..];
            let header = match rest.first_chunk::<HEADER_LEN>() {
                Some(header) => Some(decode_header(*header)?),
                None => None,
            };
            let wanted = match &header {
                Some(header) => (HEADER_LEN + header.len).saturating_sub(rest.len()),
                None => HEADER_LEN - rest.len(),
            };
            let Some(header) = header.filter(|_| wanted == 0) else {
                self.partial.truncate(before);
                return Ok(Decoded::Incomplete(wanted));
            };
            self.push(&rest[HEADER_LEN..HEADER_LEN + header.len])?;
            used += HEADER_LEN + header.len;
            if header.fin {
                return Ok(Decoded::Message(std::mem::take(&mut self.partial), used));
            }
        }
    }

    /// Adds one frame's payload to the message being assembled.
    pub fn push(&mut self, payload: &[u8]) -> Result<(), FrameError> {
        if self.partial.len() + payload.len() > self.max_message {
            self.partial = Vec::new();
            return Err(FrameError::MessageTooLarge(self.max_message));
        }
        self.partial.extend_from_slice(payload);
        Ok(())
    }

    /// Takes the assembled message (after a frame with FIN).
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.partial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(message: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (header, chunk) in frames(message) {
            out.extend_from_slice(&header);
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn small_message_is_one_frame() {
        let bytes = encode(b"hello");
        assert_eq!(bytes.len(), HEADER_LEN + 5);
        let mut d = Decoder::new(1024);
        assert_eq!(
            d.decode(&bytes).unwrap(),
            Decoded::Message(b"hello".to_vec(), bytes.len())
        );
    }

    #[test]
    fn empty_message_is_one_empty_frame() {
        let bytes = encode(b"");
        assert_eq!(bytes, [0, 0, 0, 0, FLAG_FIN]);
        let mut d = Decoder::new(1024);
        assert_eq!(d.decode(&bytes).unwrap(), Decoded::Message(Vec::new(), 5));
    }

    #[test]
    fn large_message_is_chunked_and_reassembled() {
        let message: Vec<u8> = (0..(MAX_FRAME_PAYLOAD * 2 + 17)).map(|i| i as u8).collect();
        let bytes = encode(&message);
        assert_eq!(bytes.len(), message.len() + 3 * HEADER_LEN);
        let mut d = Decoder::new(DEFAULT_MAX_MESSAGE);
        assert_eq!(
            d.decode(&bytes).unwrap(),
            Decoded::Message(message, bytes.len())
        );
    }

    #[test]
    fn partial_input_says_incomplete() {
        let bytes = encode(b"hello");
        let mut d = Decoder::new(1024);
        assert_eq!(d.decode(&bytes[..3]).unwrap(), Decoded::Incomplete(2));
        assert_eq!(d.decode(&bytes[..7]).unwrap(), Decoded::Incomplete(3));
    }

    /// Regression: a message of several frames, given a few bytes more at each call (the caller
    /// keeps what an incomplete call did not use), came out with its first frames repeated.
    #[test]
    fn a_message_of_several_frames_fed_a_little_at_a_time_comes_out_once() {
        let message: Vec<u8> = (0..MAX_FRAME_PAYLOAD * 2 + 100).map(|i| i as u8).collect();
        let bytes = encode(&message);
        let mut d = Decoder::new(DEFAULT_MAX_MESSAGE);
        let mut got = None;
        for end in (1..=bytes.len()).step_by(4099).chain([bytes.len()]) {
            match d.decode(&bytes[..end]).unwrap() {
                Decoded::Incomplete(n) => assert!(n > 0),
                Decoded::Message(m, used) => {
                    assert_eq!(used, bytes.len());
                    got = Some(m);
                    break;
                }
            }
        }
        assert_eq!(got.as_deref(), Some(&message[..]));
    }

    #[test]
    fn oversized_frames_and_unknown_flags_are_errors() {
        let mut d = Decoder::new(1024);
        let too_big = encode_header(0, true);
        let mut header = too_big;
        header[..4].copy_from_slice(&((MAX_FRAME_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(matches!(d.decode(&header), Err(FrameError::TooLarge(_))));
        assert_eq!(
            d.decode(&[0, 0, 0, 0, 0x80]),
            Err(FrameError::UnknownFlags(0x80))
        );
    }

    #[test]
    fn messages_over_the_cap_are_refused() {
        let bytes = encode(&[7u8; 2000]);
        let mut d = Decoder::new(1000);
        assert_eq!(d.decode(&bytes), Err(FrameError::MessageTooLarge(1000)));
    }

    /// A small deterministic generator, so the property test needs no extra crate.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics_and_never_over_reads() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..20_000 {
            let len = (rng.next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Make valid-looking headers common, so deep paths are reached too.
            if round % 3 == 0 && bytes.len() >= HEADER_LEN {
                let n = (rng.next() % 40) as u32;
                bytes[..4].copy_from_slice(&n.to_be_bytes());
                bytes[4] &= FLAG_FIN;
            }
            let mut d = Decoder::new(128);
            match d.decode(&bytes) {
                Ok(Decoded::Message(_, used)) => assert!(used <= bytes.len()),
                Ok(Decoded::Incomplete(n)) => assert!(n > 0),
                Err(_) => {}
            }
        }
    }
}
