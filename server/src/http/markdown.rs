//! Markdown of conversations, as HTML that cannot run anything.
//!
//! Rather than render raw HTML and sanitize it afterwards (ammonia, with an HTML parser), the
//! renderer never emits HTML that the text wrote: pulldown-cmark parses the Markdown, every raw
//! HTML block or inline tag becomes text (escaped on output like any text), link targets whose
//! scheme is not `http`, `https` or `mailto` (`javascript:`, `data:`, `vbscript:`, ...) are
//! replaced by `#`, and images become links (no request leaves the page for them). Everything
//! else pulldown-cmark writes itself, escaping text and attribute values. With no way for input
//! to produce a tag, an attribute or a dangerous URL, there is nothing left to sanitize, and no
//! HTML parser in the server.

use pulldown_cmark::{CowStr, Event, Options, Parser, Tag, TagEnd};

/// Whether a link target may be followed from a page: a relative reference, or `http`,
/// `https` or `mailto`. Browsers ignore ASCII whitespace and control characters inside a
/// scheme (`java\tscript:`), so they are ignored here too.
pub fn safe_url(url: &str) -> bool {
    let cleaned: String = url
        .chars()
        .filter(|c| !c.is_ascii_whitespace() && !c.is_control())
        .collect::<String>()
        .to_ascii_lowercase();
    let end = cleaned.find(['/', '?', '#']).unwrap_or(cleaned.len());
    match cleaned[..end].find(':') {
        None => true,
        Some(colon) => matches!(&cleaned[..colon], "http" | "https" | "mailto"),
    }
}

/// `text` (Markdown) as inert HTML.
pub fn to_html(text: &str) -> String {
    let options =
        Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    let events = Parser::new_ext(text, options).map(|event| match event {
        Event::Html(raw) | Event::InlineHtml(raw) => Event::Text(raw),
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url: checked(dest_url),
            title,
            id,
        }),
        Event::Start(Tag::Image {
            link_type,
            dest_url,
            title,
            id,
        }) => Event::Start(Tag::Link {
            link_type,
            dest_url: checked(dest_url),
            title,
            id,
        }),
        Event::End(TagEnd::Image) => Event::End(TagEnd::Link),
        other => other,
    });
    let mut html = String::with_capacity(text.len() * 3 / 2);
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

fn checked(url: CowStr<'_>) -> CowStr<'_> {
    if safe_url(&url) {
        url
    } else {
        CowStr::Borrowed("#")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_html_and_dangerous_links_render_inert() {
        for attack in [
            "<script>alert(1)</script>",
            "x <img src=x onerror=alert(1)> y",
            "[a](javascript:alert(1))",
            "[a](JaVa\tScript:alert(1))",
            "[a](data:text/html,<script>alert(1)</script>)",
            "![i](javascript:alert(1))",
            "<a href=\"javascript:alert(1)\">x</a>",
            "[a](vbscript:msgbox)",
            "<svg onload=alert(1)>",
            "<iframe src=//evil>",
            "[a]: javascript:alert(1)\n\n[a]",
        ] {
            let html = to_html(attack);
            assert!(!html.contains("<script"), "{attack} -> {html}");
            assert!(!html.contains("<img"), "{attack} -> {html}");
            assert!(!html.contains("<svg"), "{attack} -> {html}");
            assert!(!html.contains("<iframe"), "{attack} -> {html}");
            // Links pulldown-cmark writes are `<a href="...">`; any other `href=` is text.
            let lower = html.to_lowercase();
            for scheme in ["java", "data:", "vbscript:"] {
                assert!(
                    !lower.contains(&format!("<a href=\"{scheme}")),
                    "{attack} -> {html}"
                );
            }
        }
    }

    #[test]
    fn ordinary_markdown_renders() {
        let html = to_html("# Title\n\n**bold** [site](https://example.com) `code`");
        assert!(html.contains("<h1>Title</h1>"));
        assert!(html.contains("<strong>bold</strong>"));
        assert!(html.contains("<a href=\"https://example.com\">site</a>"));
        assert!(html.contains("<code>code</code>"));
        assert!(safe_url("/relative/path") && safe_url("#top") && safe_url("mailto:a@b"));
    }
}
