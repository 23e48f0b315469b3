//! `session.md`: the conversation as human-readable markdown, exactly as the source documents
//! lay it out: a YAML frontmatter (`provider`, `model`, `created_at`), then `## User`,
//! `## Assistant` and `## System` blocks, append-only. Tool calls are never in it.
//!
//! Parsing and rendering are pure functions. The frontmatter is three flat keys, so it is read
//! and written here rather than through a YAML library.

pub use monad_protocol::wire::{History, HistoryMessage, HistoryRole as Role};

fn role_from_header(line: &str) -> Option<Role> {
    match line {
        "## User" => Some(Role::User),
        "## Assistant" => Some(Role::Assistant),
        "## System" => Some(Role::System),
        _ => None,
    }
}

/// Why a `session.md` could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line of the problem.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// An empty conversation.
pub fn empty(created_at: String, provider: Option<String>, model: Option<String>) -> History {
    History {
        provider,
        model,
        created_at,
        messages: Vec::new(),
    }
}

/// The frontmatter alone, as written when a session is created or cleared.
pub fn render_frontmatter(history: &History) -> String {
    let mut out = String::from("---\n");
    if let Some(p) = &history.provider {
        out.push_str(&format!("provider: {}\n", yaml_scalar(p)));
    }
    if let Some(m) = &history.model {
        out.push_str(&format!("model: {}\n", yaml_scalar(m)));
    }
    out.push_str(&format!(
        "created_at: {}\n",
        yaml_scalar(&history.created_at)
    ));
    out.push_str("---\n");
    out
}

/// The whole file.
pub fn render(history: &History) -> String {
    let mut out = render_frontmatter(history);
    for message in &history.messages {
        out.push_str(&render_message(message));
    }
    out
}

/// Parses a whole file.
pub fn parse(text: &str) -> Result<History, ParseError> {
    let mut lines = text.lines().enumerate().peekable();
    let err = |line: usize, message: &str| ParseError {
        line: line + 1,
        message: message.to_owned(),
    };
    match lines.next() {
        Some((_, "---")) => {}
        Some((i, _)) => return Err(err(i, "expected `---` to open the frontmatter")),
        None => return Err(err(0, "the file is empty; expected a frontmatter")),
    }
    let mut history = empty(String::new(), None, None);
    let mut closed = false;
    for (i, line) in lines.by_ref() {
        if line == "---" {
            closed = true;
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(err(i, "expected `key: value` in the frontmatter"));
        };
        let value = parse_scalar(value.trim()).map_err(|m| err(i, &m))?;
        match key.trim() {
            "provider" => history.provider = Some(value).filter(|v| !v.is_empty()),
            "model" => history.model = Some(value).filter(|v| !v.is_empty()),
            "created_at" => history.created_at = value,
            // Unknown keys are kept out rather than refused: a newer writer may add some.
            _ => {}
        }
    }
    if !closed {
        return Err(err(0, "the frontmatter is not closed with `---`"));
    }
    let mut current: Option<(Role, Vec<&str>)> = None;
    for (i, line) in lines {
        if let Some(role) = role_from_header(line) {
            if let Some((role, body)) = current.take() {
                history.messages.push(finish(role, &body));
            }
            current = Some((role, Vec::new()));
            continue;
        }
        match &mut current {
            Some((_, body)) => body.push(line),
            None if line.trim().is_empty() => {}
            None => {
                return Err(err(
                    i,
                    "text before the first `## User`/`## Assistant`/`## System` header",
                ));
            }
        }
    }
    if let Some((role, body)) = current.take() {
        history.messages.push(finish(role, &body));
    }
    Ok(history)
}

/// One message as appended to the file: a blank line, the header, a blank line, the text.
/// Lines of the text that look like a header are escaped with a backslash so they stay text.
pub fn render_message(message: &HistoryMessage) -> String {
    let mut out = format!("\n## {}\n\n", message.role.header());
    for line in message.text.lines() {
        if role_from_header(line).is_some() || is_escaped_header(line) {
            out.push('\\');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn is_escaped_header(line: &str) -> bool {
    line.strip_prefix('\\')
        .is_some_and(|rest| role_from_header(rest).is_some() || is_escaped_header(rest))
}

fn finish(role: Role, body: &[&str]) -> HistoryMessage {
    let start = body
        .iter()
        .position(|l| !l.trim().is_empty())
        .unwrap_or(body.len());
    let end = body
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .map_or(start, |e| e + 1);
    let text: Vec<&str> = body[start..end.max(start)]
        .iter()
        .map(|l| if is_escaped_header(l) { &l[1..] } else { l })
        .collect();
    HistoryMessage {
        role,
        text: text.join("\n"),
    }
}

/// A YAML scalar: plain when safe, else double-quoted.
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:+/@ ".contains(c))
        && !s.starts_with(' ')
        && !s.ends_with(' ')
        && !s.contains(": ");
    if plain {
        s.to_owned()
    } else {
        serde_json::to_string(s).expect("strings serialize")
    }
}

fn parse_scalar(s: &str) -> Result<String, String> {
    if s.starts_with('"') {
        serde_json::from_str(s).map_err(|e| format!("bad quoted value: {e}"))
    } else if let Some(inner) = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')) {
        Ok(inner.replace("''", "'"))
    } else {
        Ok(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_EXAMPLE: &str = "---
provider: claude
model: claude-sonnet-4-20250514
created_at: 2026-02-15T10:30:00Z
---

## User

What files are in the current directory?

## Assistant

I'll check the directory listing for you. Here are the files:
- src/
- Cargo.toml
- README.md
";

    #[test]
    fn the_seed_example_parses_and_renders_back_identically() {
        let h = parse(SEED_EXAMPLE).unwrap();
        assert_eq!(h.provider.as_deref(), Some("claude"));
        assert_eq!(h.model.as_deref(), Some("claude-sonnet-4-20250514"));
        assert_eq!(h.created_at, "2026-02-15T10:30:00Z");
        assert_eq!(h.messages.len(), 2);
        assert_eq!(h.messages[0].role, Role::User);
        assert!(h.messages[1].text.ends_with("- README.md"));
        assert_eq!(render(&h), SEED_EXAMPLE);
    }

    #[test]
    fn text_that_looks_like_a_header_stays_text() {
        let mut h = empty("2026-01-01T00:00:00Z".into(), None, None);
        let tricky = "Here is markdown:\n## User\n\\## Assistant\nend";
        h.messages.push(HistoryMessage {
            role: Role::Assistant,
            text: tricky.into(),
        });
        let back = parse(&render(&h)).unwrap();
        assert_eq!(back.messages.len(), 1);
        assert_eq!(back.messages[0].text, tricky);
    }

    #[test]
    fn odd_values_are_quoted_and_read_back() {
        let h = empty(
            "2026-01-01T00:00:00Z".into(),
            Some("a: \"b\"".into()),
            Some(" x".into()),
        );
        let back = parse(&render(&h)).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn corrupt_files_say_where() {
        assert_eq!(parse("").unwrap_err().line, 1);
        assert!(parse("hello\n").is_err());
        assert!(
            parse("---\nprovider: x\n")
                .unwrap_err()
                .message
                .contains("not closed")
        );
        let e = parse("---\ncreated_at: x\n---\nstray text\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(parse("---\nbad line\n---\n").is_err());
    }
}
