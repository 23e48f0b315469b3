//! Text that is not UTF-8: `read_file` decodes a UTF-16 or Latin-1 file instead of calling it
//! binary, and says why a file it does not show is binary. Pure functions of the bytes.

use std::borrow::Cow;

/// How much of a file the guess looks at.
pub(crate) const SNIFF: usize = 8 * 1024;

/// A text encoding `read_file` decodes besides UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// UTF-16, little-endian (a `FF FE` byte order mark, or NULs in the odd bytes).
    Utf16Le,
    /// UTF-16, big-endian (a `FE FF` byte order mark, or NULs in the even bytes).
    Utf16Be,
    /// Windows-1252, the superset of ISO 8859-1 (Latin-1) that such files use in practice.
    Latin1,
    /// UTF-8 with a few bytes that are not (a stray byte in a UTF-8 file): those become U+FFFD,
    /// the rest reads as written.
    Utf8,
}

impl Encoding {
    /// The name in the result's `encoding`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Encoding::Utf16Le => "utf-16le",
            Encoding::Utf16Be => "utf-16be",
            Encoding::Latin1 => "windows-1252",
            Encoding::Utf8 => "utf-8",
        }
    }
}

/// What the bytes of a file that is not UTF-8 are: text in an encoding, or binary (why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Guess {
    /// Text in this encoding.
    Text(Encoding),
    /// Not text; why, in a few words.
    Binary(String),
}

/// Guesses what `bytes` (the start of a file that is not valid UTF-8) are; mostly from their
/// first [`SNIFF`] bytes, but UTF-8 with stray bytes from all of them, since those may come
/// after a header of plain ASCII.
pub(crate) fn guess(bytes: &[u8]) -> Guess {
    let head = &bytes[..bytes.len().min(SNIFF)];
    match head {
        [0xFF, 0xFE, ..] => return Guess::Text(Encoding::Utf16Le),
        [0xFE, 0xFF, ..] => return Guess::Text(Encoding::Utf16Be),
        _ => {}
    }
    if let Some(encoding) = utf16_by_its_nuls(head) {
        return Guess::Text(encoding);
    }
    if let Some(at) = head.iter().position(|&b| b == 0) {
        return Guess::Binary(format!("it has a NUL byte (at byte {at})"));
    }
    let controls = head.iter().filter(|&&b| is_control(b.into())).count();
    if controls * 20 > head.len() {
        return Guess::Binary(format!(
            "{controls} of its first {} bytes are control characters",
            head.len()
        ));
    }
    if mostly_utf8(&bytes[..complete_utf8_len(bytes)]) {
        return Guess::Text(Encoding::Utf8);
    }
    Guess::Text(Encoding::Latin1)
}

/// Guesses what a part of a file further in is, when the file's head was plain ASCII and so
/// said nothing of it: binary only for a NUL byte (a short part of text may well hold a control
/// character, a DOS file's final Ctrl-Z, or start with `ÿþ`), else UTF-8 when it mostly is,
/// else windows-1252.
pub(crate) fn guess_part(bytes: &[u8]) -> Guess {
    if let Some(at) = bytes.iter().position(|&b| b == 0) {
        return Guess::Binary(format!("it has a NUL byte (at byte {at} of it)"));
    }
    if mostly_utf8(&bytes[..complete_utf8_len(bytes)]) {
        Guess::Text(Encoding::Utf8)
    } else {
        Guess::Text(Encoding::Latin1)
    }
}

/// The length of `bytes` without a UTF-8 character cut at its end (one to three bytes of a
/// sequence whose lead byte says it goes on), whatever comes before.
pub(crate) fn complete_utf8_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    // The last byte that is not a continuation byte (`10xxxxxx`), among the last four.
    let Some(lead_at) = (len.saturating_sub(4)..len)
        .rev()
        .find(|&i| bytes[i] & 0xc0 != 0x80)
    else {
        return len;
    };
    let wants = match bytes[lead_at] {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 1,
    };
    if len - lead_at < wants { lead_at } else { len }
}

/// Whether text that is not valid UTF-8 is UTF-8 all the same, with a few stray bytes: it has
/// more characters beyond ASCII correctly encoded in UTF-8 than bytes that are not UTF-8. A
/// Latin-1 file's accented letters are single bytes, which UTF-8 never takes alone; read as
/// Latin-1, a UTF-8 file's every such character became two or three wrong ones, and a
/// `write_file` of what was read made that for good.
fn mostly_utf8(head: &[u8]) -> bool {
    let (mut encoded, mut stray) = (0usize, 0usize);
    for chunk in head.utf8_chunks() {
        encoded += chunk.valid().chars().filter(|c| !c.is_ascii()).count();
        stray += chunk.invalid().len();
    }
    encoded > stray
}

/// UTF-16 without a mark: text in the ASCII range has a NUL in every other byte. At least two
/// such characters, at least 30% of the pairs (text mixing scripts), the other byte of a pair
/// NUL in at most a tenth as many (a CJK character such as U+4E00 has one there), and the
/// decoded text is text: no NUL, and control characters no more than in a Latin-1 file
/// (little-endian integers have NULs in the odd bytes too). Without the last two, a six-byte
/// file with one NUL was shown as three CJK characters; a file shorter than that (two CJK
/// characters and a line break, say) needs its byte order mark to be read as UTF-16.
fn utf16_by_its_nuls(head: &[u8]) -> Option<Encoding> {
    let pairs = head.len() / 2;
    let zero_odd = head
        .chunks_exact(2)
        .filter(|p| p[1] == 0 && p[0] != 0)
        .count();
    let zero_even = head
        .chunks_exact(2)
        .filter(|p| p[0] == 0 && p[1] != 0)
        .count();
    let likely = |n: usize, other: usize| n >= 2 && n * 10 >= pairs * 3 && other * 10 <= n;
    let encoding = if likely(zero_odd, zero_even) {
        Encoding::Utf16Le
    } else if likely(zero_even, zero_odd) {
        Encoding::Utf16Be
    } else {
        return None;
    };
    let text = decode(&head[..pairs * 2], encoding);
    let (mut chars, mut controls) = (0usize, 0usize);
    for c in text.chars() {
        if c == '\0' {
            return None;
        }
        chars += 1;
        controls += usize::from(is_control(c));
    }
    (controls * 20 <= chars).then_some(encoding)
}

/// A control character besides tab, the line breaks, form feed and escape: not in text.
fn is_control(c: char) -> bool {
    c < ' ' && !matches!(c, '\t' | '\n' | '\r' | '\x0c' | '\x1b')
}

/// Windows-1252's characters for 0x80-0x9F (where Latin-1 has C1 controls); the five bytes it
/// leaves undefined are the C1 controls of the same value, as the WHATWG Encoding Standard has
/// them, so that they are written back as they were (as U+FFFD, every edit of a file holding
/// one was refused: U+FFFD has no byte to go back to).
const CP1252_HIGH: [char; 32] = [
    '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8D}', 'Ž', '\u{8F}',
    '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9D}', 'ž', 'Ÿ',
];

/// How a file that is not UTF-8 holds its text: what a write keeps when it replaces the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub encoding: Encoding,
    /// It starts with a UTF-16 byte order mark.
    pub bom: bool,
}

/// How `bytes` (a whole file) hold text in an encoding a write keeps (windows-1252, UTF-16);
/// `None` for UTF-8, for UTF-8 with stray bytes (which are U+FFFD in the text already: written
/// back, it is UTF-8) and for binary.
pub(crate) fn held(bytes: &[u8]) -> Option<Held> {
    // Valid UTF-8 is UTF-8, unless it has NULs: ASCII text in UTF-16 without a mark is valid
    // UTF-8 too, and `guess` reads it as UTF-16, as `read_file` shows it.
    if std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0) {
        return None;
    }
    match guess(bytes) {
        Guess::Text(Encoding::Utf8) | Guess::Binary(_) => None,
        Guess::Text(encoding) => Some(Held {
            encoding,
            bom: matches!(bytes, [0xFF, 0xFE, ..] | [0xFE, 0xFF, ..])
                && matches!(encoding, Encoding::Utf16Le | Encoding::Utf16Be),
        }),
    }
}

/// `text` as the bytes of a file that holds it as `held` says (UTF-8 when `None`), its byte
/// order mark kept; `Err` with `held` when its encoding cannot hold one of the characters
/// (windows-1252 holds 251).
pub(crate) fn encode(text: &str, held: Option<Held>) -> Result<Cow<'_, [u8]>, Held> {
    let Some(held) = held else {
        return Ok(Cow::Borrowed(text.as_bytes()));
    };
    let bytes = match held.encoding {
        Encoding::Utf8 => Some(text.as_bytes().to_vec()),
        Encoding::Latin1 => text
            .chars()
            .map(|c| match u32::from(c) {
                n @ (0..=0x7F | 0xA0..=0xFF) => u8::try_from(n).ok(),
                _ => CP1252_HIGH
                    .iter()
                    .position(|&h| h == c)
                    .and_then(|i| u8::try_from(0x80 + i).ok()),
            })
            .collect(),
        Encoding::Utf16Le | Encoding::Utf16Be => {
            let le = held.encoding == Encoding::Utf16Le;
            let mut out = Vec::with_capacity(2 + text.len() * 2);
            if held.bom {
                out.extend(if le { [0xFF, 0xFE] } else { [0xFE, 0xFF] });
            }
            for unit in text.encode_utf16() {
                out.extend(if le {
                    unit.to_le_bytes()
                } else {
                    unit.to_be_bytes()
                });
            }
            Some(out)
        }
    };
    bytes.map(Cow::Owned).ok_or(held)
}

/// Decodes `bytes` (a byte order mark dropped); what cannot be decoded (an unpaired UTF-16
/// surrogate, an odd last byte) becomes U+FFFD.
pub(crate) fn decode(bytes: &[u8], encoding: Encoding) -> String {
    decode_part(bytes, encoding, true)
}

/// How many of `bytes` (a whole file in UTF-16) are no UTF-16 text: each unit of a lone
/// surrogate, and an odd last byte. [`decode`] shows each as U+FFFD, and a write of the text
/// back writes U+FFFD's bytes in their place.
pub(crate) fn not_utf16(bytes: &[u8], encoding: Encoding) -> usize {
    let big = match encoding {
        Encoding::Utf16Le => false,
        Encoding::Utf16Be => true,
        Encoding::Utf8 | Encoding::Latin1 => return 0,
    };
    let units = bytes.chunks_exact(2).map(|p| {
        if big {
            u16::from_be_bytes([p[0], p[1]])
        } else {
            u16::from_le_bytes([p[0], p[1]])
        }
    });
    let lone = char::decode_utf16(units).filter(Result::is_err).count();
    2 * lone + bytes.len() % 2
}

/// [`decode`] for bytes that may not be the start of the file (`at_start` false): a UTF-16 byte
/// order mark there is the character U+FEFF, kept, not a mark.
pub(crate) fn decode_part(bytes: &[u8], encoding: Encoding, at_start: bool) -> String {
    match encoding {
        Encoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
        Encoding::Latin1 => bytes
            .iter()
            .map(|&b| match b {
                0x80..=0x9F => CP1252_HIGH[usize::from(b - 0x80)],
                _ => char::from(b),
            })
            .collect(),
        Encoding::Utf16Le | Encoding::Utf16Be => {
            let bom: &[u8] = if encoding == Encoding::Utf16Le {
                &[0xFF, 0xFE]
            } else {
                &[0xFE, 0xFF]
            };
            let bytes = match bytes.strip_prefix(bom) {
                Some(rest) if at_start => rest,
                _ => bytes,
            };
            let units = bytes.chunks_exact(2).map(|p| match encoding {
                Encoding::Utf16Le => u16::from_le_bytes([p[0], p[1]]),
                _ => u16::from_be_bytes([p[0], p[1]]),
            });
            let mut text: String = char::decode_utf16(units)
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect();
            if bytes.len() % 2 == 1 {
                text.push(char::REPLACEMENT_CHARACTER);
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16le(text: &str, bom: bool) -> Vec<u8> {
        let mut out = if bom { vec![0xFF, 0xFE] } else { Vec::new() };
        out.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        out
    }

    #[test]
    fn utf16_is_found_by_its_mark_or_its_nuls_and_decoded() {
        let text = "Grüße, 世界\r\nline two\r\n";
        for bom in [true, false] {
            let bytes = utf16le(text, bom);
            assert_eq!(guess(&bytes), Guess::Text(Encoding::Utf16Le), "bom {bom}");
            assert_eq!(decode(&bytes, Encoding::Utf16Le), text);
        }
        let mut be = vec![0xFE, 0xFF];
        be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        assert_eq!(guess(&be), Guess::Text(Encoding::Utf16Be));
        assert_eq!(decode(&be, Encoding::Utf16Be), text);
        // An unpaired surrogate and an odd last byte: replaced, not dropped.
        assert_eq!(
            decode(&[0x41, 0, 0x00, 0xD8, 0x42], Encoding::Utf16Le),
            "A\u{FFFD}\u{FFFD}"
        );
    }

    #[test]
    fn utf8_with_a_stray_byte_is_read_as_utf8_not_latin1() {
        let mut bytes = "# 日本語のコメント\nprint(\"héllo\")\n# stray byte: "
            .as_bytes()
            .to_vec();
        bytes.extend(b"\xff\n");
        assert_eq!(guess(&bytes), Guess::Text(Encoding::Utf8));
        let decoded = decode(&bytes, Encoding::Utf8);
        assert!(
            decoded.starts_with("# 日本語のコメント\nprint(\"héllo\")"),
            "{decoded}"
        );
        assert!(decoded.ends_with("\u{fffd}\n"));
        // Latin-1's accented letters are single bytes, never UTF-8 alone.
        assert_eq!(
            guess(b"caf\xe9 cr\xe8me br\xfbl\xe9e\n"),
            Guess::Text(Encoding::Latin1)
        );
        // One valid character and two stray bytes: not UTF-8.
        let mut two_stray = "é ".as_bytes().to_vec();
        two_stray.extend(b"\xff \xfe");
        assert_eq!(guess(&two_stray), Guess::Text(Encoding::Latin1));
    }

    #[test]
    fn a_character_cut_at_the_end_is_found_whatever_comes_before() {
        let e = "é".as_bytes(); // c3 a9
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(complete_utf8_len(b"abc"), 3);
        assert_eq!(complete_utf8_len(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_len(&[b'a', e[0], e[1]]), 3);
        assert_eq!(complete_utf8_len(&[b'a', euro[0], euro[1]]), 1);
        // A stray byte before does not hide the cut at the end.
        assert_eq!(complete_utf8_len(&[0xff, b'a', euro[0]]), 2);
        assert_eq!(complete_utf8_len(&[]), 0);
        // A UTF-8 file whose first 8 KiB are ASCII is still found to be UTF-8.
        let mut bytes = "# licence\n".repeat(1_000).into_bytes();
        bytes.extend("日本語 é\n".as_bytes());
        bytes.push(0xff);
        bytes.extend(&euro[..2]);
        assert_eq!(guess(&bytes), Guess::Text(Encoding::Utf8));
    }

    #[test]
    fn text_is_written_back_in_the_encoding_it_was_read_from() {
        let latin1 = b"caf\xe9 \x80 cr\xe8me\n";
        let held_latin1 = held(latin1).unwrap();
        assert_eq!(held_latin1.encoding, Encoding::Latin1);
        let text = decode(latin1, Encoding::Latin1);
        assert_eq!(text, "café € crème\n");
        assert_eq!(*encode(&text, Some(held_latin1)).unwrap(), latin1[..]);
        assert_eq!(
            encode("日本", Some(held_latin1)),
            Err(held_latin1),
            "not in windows-1252"
        );
        assert_eq!(*encode("é", None).unwrap(), *"é".as_bytes());
        let mut utf16 = vec![0xFF, 0xFE];
        utf16.extend("hé\n".encode_utf16().flat_map(u16::to_le_bytes));
        let held_utf16 = held(&utf16).unwrap();
        assert_eq!(
            (held_utf16.encoding, held_utf16.bom),
            (Encoding::Utf16Le, true)
        );
        assert_eq!(
            *encode(&decode(&utf16, Encoding::Utf16Le), Some(held_utf16)).unwrap(),
            utf16[..]
        );
        assert_eq!(held("plain UTF-8 é\n".as_bytes()), None);
        assert_eq!(held(b"\0\x01\x02binary"), None);
        let mut stray = "é ".as_bytes().to_vec();
        stray.extend(b"\xff ");
        stray.extend("日本\n".as_bytes());
        assert_eq!(
            held(&stray),
            None,
            "UTF-8 with a stray byte is written as UTF-8"
        );
    }

    #[test]
    fn latin1_text_is_decoded_as_windows_1252() {
        let bytes = b"caf\xe9 cr\xe8me \x80 5\n\x93quoted\x94\n";
        assert_eq!(guess(bytes), Guess::Text(Encoding::Latin1));
        assert_eq!(
            decode(bytes, Encoding::Latin1),
            "café crème € 5\n\u{201c}quoted\u{201d}\n"
        );
    }

    #[test]
    fn binary_says_why() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        match guess(png) {
            Guess::Binary(why) => assert!(why.contains("NUL byte (at byte 8)"), "{why}"),
            other => panic!("{other:?}"),
        }
        let noise: Vec<u8> = (0..200u8).map(|i| (i % 7) + 1).collect();
        match guess(&noise) {
            Guess::Binary(why) => assert!(why.contains("control characters"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_few_nuls_in_a_small_file_do_not_make_it_utf16() {
        // One NUL in three pairs, and a NUL then a control character: binary, not text decoded
        // as UTF-16 (which showed `慢c搊`, and a NUL and U+0001 to the model).
        for bytes in [&b"ab\0cd\n"[..], b"\0\0\0\x01"] {
            match guess(bytes) {
                Guess::Binary(why) => assert!(why.contains("NUL byte"), "{bytes:?}: {why}"),
                other => panic!("{bytes:?}: {other:?}"),
            }
        }
        // Little-endian integers have NULs in the odd bytes, as UTF-16 text does; decoded,
        // they are control characters.
        let ints: Vec<u8> = (1..=40u16).flat_map(u16::to_le_bytes).collect();
        assert!(
            matches!(guess(&ints), Guess::Binary(_)),
            "{:?}",
            guess(&ints)
        );
        // Two characters are enough for text that is UTF-16.
        assert_eq!(guess(b"h\0i\0"), Guess::Text(Encoding::Utf16Le));
        assert_eq!(guess(b"\0h\0i"), Guess::Text(Encoding::Utf16Be));
        // A character whose low byte is 0 (U+4E00) among ASCII-range text is still UTF-16.
        let mixed = "一 is one; 一二三 are one, two, three\r\n";
        let le: Vec<u8> = mixed.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(guess(&le), Guess::Text(Encoding::Utf16Le));
        let be: Vec<u8> = mixed.encode_utf16().flat_map(u16::to_be_bytes).collect();
        assert_eq!(guess(&be), Guess::Text(Encoding::Utf16Be));
    }
}
