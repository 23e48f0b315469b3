//! MCP roots as hosts send them (`roots/list`): the absolute path a `file:` URI names, parsed
//! the same way by the server that matches roots to attached folders and by `monad-client mcp`,
//! which resolves them on the device first.

use std::path::{Component, Path, PathBuf};

/// Why a root cannot name a folder on this device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootError {
    /// Not a `file:` URI (`https:`, a bare path, ...).
    NotFile,
    /// A `file:` URI of another machine (`file://host/...`).
    OtherHost(String),
    /// Its path is not absolute.
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// The decoded path is not UTF-8 text (or contains NUL).
    NotText,
    /// A `..` component: the path would not name the folder it seems to.
    DotDot,
    /// A query or fragment, which a folder does not have.
    QueryOrFragment,
    /// Longer than [`crate::wire::MAX_ROOT_LEN`].
    TooLong,
}

impl std::fmt::Display for RootError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootError::NotFile => f.write_str("not a file: URI"),
            RootError::OtherHost(host) => write!(f, "names another machine (`{host}`)"),
            RootError::NotAbsolute => f.write_str("its path is not absolute"),
            RootError::BadEscape => f.write_str("a malformed percent escape"),
            RootError::NotText => f.write_str("its path is not UTF-8 text"),
            RootError::DotDot => f.write_str("its path contains `..`"),
            RootError::QueryOrFragment => f.write_str("it has a query or fragment"),
            RootError::TooLong => {
                write!(f, "it is longer than {} bytes", crate::wire::MAX_ROOT_LEN)
            }
        }
    }
}

impl std::error::Error for RootError {}

/// The absolute path a root names: `file:///a/b` or `file://localhost/a/b`, percent-decoded,
/// with `.` and empty components dropped. Anything else is refused with the reason.
pub fn parse_root(uri: &str) -> Result<PathBuf, RootError> {
    if uri.len() > crate::wire::MAX_ROOT_LEN {
        return Err(RootError::TooLong);
    }
    let rest = uri
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("file:"))
        .map(|_| &uri[5..])
        .ok_or(RootError::NotFile)?;
    if rest.contains(['?', '#']) {
        return Err(RootError::QueryOrFragment);
    }
    // `file://HOST/PATH`, or without an authority `file:/PATH` (RFC 8089's minimal form).
    let (host, path) = match rest.strip_prefix("//") {
        Some(rest) => match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        },
        None => ("", rest),
    };
    if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
        return Err(RootError::OtherHost(host.to_owned()));
    }
    if !path.starts_with('/') {
        return Err(RootError::NotAbsolute);
    }
    let decoded = percent_decode(path)?;
    let text = String::from_utf8(decoded).map_err(|_| RootError::NotText)?;
    if text.contains('\0') {
        return Err(RootError::NotText);
    }
    let mut clean = PathBuf::from("/");
    for component in Path::new(&text).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(RootError::DotDot),
            Component::Normal(part) => clean.push(part),
            Component::Prefix(_) => return Err(RootError::NotAbsolute),
        }
    }
    Ok(clean)
}

fn percent_decode(text: &str) -> Result<Vec<u8>, RootError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            // Exactly two hex digits (`from_str_radix` alone would take a sign: `%+1`).
            let (Some(high), Some(low)) = (
                bytes.get(i + 1).copied().and_then(hex_digit),
                bytes.get(i + 2).copied().and_then(hex_digit),
            ) else {
                return Err(RootError::BadEscape);
            };
            out.push((high << 4) | low);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// The value of one ASCII hex digit.
fn hex_digit(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_name_absolute_paths_percent_decoded() {
        let ok = |uri: &str| parse_root(uri).unwrap().to_string_lossy().into_owned();
        assert_eq!(ok("file:///home/ana/proj"), "/home/ana/proj");
        assert_eq!(ok("file:///home/ana/proj/"), "/home/ana/proj");
        assert_eq!(ok("file://localhost/home/ana/proj"), "/home/ana/proj");
        assert_eq!(ok("FILE:///a/./b//c"), "/a/b/c");
        assert_eq!(ok("file:///a/my%20proj/%C3%A9t%C3%A9"), "/a/my proj/été");
        assert_eq!(ok("file:///"), "/");
        // RFC 8089's form without an authority.
        assert_eq!(ok("file:/home/ana/proj"), "/home/ana/proj");
    }

    #[test]
    fn roots_that_name_no_folder_here_are_refused_with_the_reason() {
        for (uri, why) in [
            ("https://example.com/a", RootError::NotFile),
            ("/home/ana/proj", RootError::NotFile),
            ("file:", RootError::NotAbsolute),
            ("file:home/ana", RootError::NotAbsolute),
            ("", RootError::NotFile),
            (
                "file://laptop/home/ana",
                RootError::OtherHost("laptop".into()),
            ),
            ("file://", RootError::NotAbsolute),
            ("file:///a/%zz", RootError::BadEscape),
            ("file:///a/%4", RootError::BadEscape),
            // Regression: `u8::from_str_radix` takes a sign, so `%+1` was read as byte 1.
            ("file:///a/%+1", RootError::BadEscape),
            ("file:///a/%-1", RootError::BadEscape),
            ("file:///a/% 1", RootError::BadEscape),
            ("file:///a/%ff%fe", RootError::NotText),
            ("file:///a/%00b", RootError::NotText),
            ("file:///a/../etc", RootError::DotDot),
            ("file:///a/%2e%2e/etc", RootError::DotDot),
            ("file:///a?x=1", RootError::QueryOrFragment),
            ("file:///a#top", RootError::QueryOrFragment),
        ] {
            assert_eq!(parse_root(uri), Err(why), "{uri}");
        }
        let long = format!("file:///{}", "a".repeat(crate::wire::MAX_ROOT_LEN));
        assert_eq!(parse_root(&long), Err(RootError::TooLong));
        // Multi-byte text cut anywhere never panics.
        assert_eq!(parse_root("fil\u{e9}:///a"), Err(RootError::NotFile));
    }
}
