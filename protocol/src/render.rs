//! Tool results as text written for a model, and for a person at a terminal: pure functions.
//!
//! [`text`] turns a tool's JSON result into what an MCP host puts before its model (the `text`
//! block of the result) and what `monad-client call` prints: a file's lines numbered like
//! `cat -n` under a one-line header that says where they come from and how to read on; a listing
//! one entry per line with `/` after directories; matches as `path:line: text`, grouped by file
//! like ripgrep; a command's exit status, then its output. Programs get the JSON itself
//! (`structuredContent`, `--json`); the text does not repeat it.
//!
//! The text is the data as it is (a file's bytes are not altered): whoever prints it to a terminal
//! passes it through [`crate::text::printable_lines`] first.
//!
//! [`tool_help`] and [`tool_summary`] describe a tool's arguments from its JSON Schema, for
//! `monad-client tools` and `monad-client call TOOL --help`.

use std::fmt::Write;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::tools::{
    EntryKind, GlobResult, ListDirResult, MemoryRecallResult, MemoryStoreResult, NetworkEvent,
    OutputGap, ProcessKillResult, ProcessListResult, ProcessReadResult, ProcessWriteResult,
    ReadFileResult, RunCommandResult, SearchMatch, SearchResult, StatResult, ToolName, Truncation,
    WorkspacesResult, WriteResult,
};
use crate::wire::{Host, Trust, WorkspaceRef};

/// The text of a successful call of `tool` that ran in `workspace` and returned `result`.
///
/// A result that does not have the tool's result type (a peer of another version, say) is shown
/// as indented JSON rather than lost.
pub fn text(tool: ToolName, workspace: Option<&WorkspaceRef>, result: &Value) -> String {
    let ws = Where(workspace);
    let rendered = match tool {
        ToolName::ReadFile => typed(result, |r| read_file(&ws, r)),
        ToolName::ListDir => typed(result, |r: ListDirResult| listing(&ws, &r)),
        ToolName::Stat => typed(result, |r| stat(&ws, r)),
        ToolName::Search => typed(result, |r| search(&ws, r)),
        ToolName::Glob => typed(result, |r: GlobResult| found(&ws, &r)),
        ToolName::WriteFile | ToolName::EditFile => typed(result, |r| write(&ws, r)),
        ToolName::RunCommand => typed(result, |r| run_command(&ws, r)),
        ToolName::ProcessRead => typed(result, |r| process_read(&ws, r)),
        ToolName::ProcessWrite => typed(result, |r| process_write(&ws, r)),
        ToolName::ProcessKill => typed(result, |r| process_kill(&ws, r)),
        ToolName::ProcessList => typed(result, |r| process_list(&ws, r)),
        ToolName::Workspaces => typed(result, workspaces),
        ToolName::MemoryStore => typed(result, memory_store),
        ToolName::MemoryRecall => typed(result, memory_recall),
    };
    rendered.unwrap_or_else(|| {
        serde_json::to_string_pretty(result).unwrap_or_else(|_| result.to_string())
    })
}

fn typed<T: DeserializeOwned>(result: &Value, render: impl FnOnce(T) -> String) -> Option<String> {
    T::deserialize(result).ok().map(render)
}

/// ` in workspace `name``, or nothing when the workspace is unknown.
struct Where<'a>(Option<&'a WorkspaceRef>);

impl std::fmt::Display for Where<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(w) => write!(f, " in workspace {}", w.name),
            None => Ok(()),
        }
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// A duration for people: `850 ms`, `12.3 s`, `4 min 5 s`.
fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

fn read_file(ws: &Where<'_>, r: ReadFileResult) -> String {
    let mut out = format!("{}{ws}: ", shown(&r.path));
    if r.binary {
        let _ = write!(out, "binary file, {} bytes, not shown", r.size);
        if let Some(why) = &r.binary_reason {
            let _ = write!(out, ": {why}");
        }
        return out;
    }
    if let Some(encoding) = &r.encoding {
        match encoding.as_str() {
            "utf-8" => {
                out.push_str("UTF-8 text with bytes that are not UTF-8 (shown as \u{fffd}), ")
            }
            _ => {
                let _ = write!(out, "text decoded from {encoding}, ");
            }
        }
    }
    // Numbers from a peer of another version, or a client that lies: what they say is shown,
    // and nothing is sized by them.
    let first = r.start_line;
    let last = first.saturating_add(r.lines.saturating_sub(1));
    match (r.lines, r.total_lines) {
        (0, Some(0)) => out.push_str("empty file"),
        (0, Some(total)) => {
            let _ = write!(
                out,
                "no lines from line {first}: the file has {}",
                plural(total, "line", "lines")
            );
        }
        (0, None) => {
            let _ = write!(out, "no lines from line {first}");
        }
        (_, Some(total)) => {
            let _ = write!(out, "lines {first}-{last} of {total}");
        }
        // How long the rest is, in lines, is not known (counting them would read the whole
        // file); its size is.
        (_, None) => {
            let _ = write!(
                out,
                "lines {first}-{last} (the file goes on: {} in all)",
                plural(r.size, "byte", "bytes")
            );
        }
    }
    // Lines that all end with CRLF are shown without the CR, which a terminal would show as
    // `\u{d}` on every line and a model copy into an edit: an edit's LF stands for CRLF in such
    // a file. In a file of both endings, the CRs stay.
    let crlf = r.content.contains('\r')
        && r.content.contains('\n')
        && r.content
            .split_inclusive('\n')
            .all(|line| !line.ends_with('\n') || line.ends_with("\r\n"));
    if crlf && first == 1 && !r.truncated {
        out.push_str(", CRLF line endings (not shown; an edit's LF stands for CRLF)");
    } else if crlf {
        // A page: `edit_file` decides from the whole file, which may end lines both ways.
        out.push_str(", the lines shown end with CRLF (the CR not shown)");
    }
    // A byte order mark is not text: it is not shown, as an editor does not show it, and a
    // whole-file write keeps it (`WriteResult::bom_kept`).
    let bom = first == 1 && r.content.starts_with('\u{feff}');
    if bom {
        out.push_str(", starts with a byte order mark (not shown; a write keeps it)");
    }
    // A line longer than the byte cap: its head alone is shown, without its line ending.
    let line_cut =
        r.lines > 0 && r.truncation == Some(Truncation::Bytes) && !r.content.ends_with('\n');
    if r.truncated {
        if line_cut {
            let _ = write!(
                out,
                ", line {last} cut at the byte cap after {} bytes (the rest of it cannot be shown)",
                r.content.len()
            );
        } else if r.truncation == Some(Truncation::Bytes) {
            out.push_str(", cut at the byte cap");
        }
        if let Some(next) = r.next_offset {
            // Each read is cut at the byte cap again and says where to go on: the offset is
            // all a model needs, whatever `limit` it gave.
            let _ = write!(out, "; read on with offset={next}");
        }
    }
    if r.lines == 0 {
        return out;
    }
    let width = digits(last);
    // Sized by the content, which is here: a result saying `lines: 10^12` asked for 15 TB.
    out.reserve(r.content.len().saturating_add(r.content.len() / 4));
    for (n, line) in (first..=u64::MAX).zip(r.content.split_inclusive('\n')) {
        // The CR of a line ending only: a last line's own final CR stays.
        let line = match line.strip_suffix('\n') {
            Some(ended) if crlf => ended.strip_suffix('\r').unwrap_or(ended),
            Some(ended) => ended,
            None => line,
        };
        let line = match line.strip_prefix('\u{feff}') {
            Some(rest) if bom && n == 1 => rest,
            _ => line,
        };
        out.push('\n');
        push_right_aligned(&mut out, n, width);
        out.push('\t');
        if line.len() > READ_LINE_MAX_BYTES {
            let shown = crate::text::head(line, READ_LINE_MAX_BYTES);
            out.push_str(shown);
            if line_cut && n == last {
                // Only the head of this line was read (the byte cap): how long the rest is,
                // the read does not know.
                out.push_str(
                    " \u{2026} [the rest of this line not shown: `search` finds text in it]",
                );
            } else {
                let _ = write!(
                    out,
                    " \u{2026} [{} more bytes of this line not shown: `search` finds text in it]",
                    line.len() - shown.len()
                );
            }
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Bytes of one line a read shows a model: a minified bundle's single line of 200 KB would fill
/// its context with what it cannot use. The JSON's `content` keeps the line whole, and `search`
/// shows the part of it around a match.
const READ_LINE_MAX_BYTES: usize = 2000;

/// How many decimal digits `n` has.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Appends `n` in decimal, right-aligned in `width` columns, like `{n:>width$}`, through
/// `itoa` rather than `write!`: `write!` per line was a third of the time `monad-client mcp`
/// spent on a 248 KiB read (4,000 lines).
fn push_right_aligned(out: &mut String, n: u64, width: usize) {
    let mut buf = itoa::Buffer::new();
    let shown = buf.format(n);
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(shown.len())));
    out.push_str(shown);
}

/// The text of a listing that ran in `workspace`, as [`text`] writes it.
pub fn list_dir(workspace: Option<&WorkspaceRef>, r: &ListDirResult) -> String {
    listing(&Where(workspace), r)
}

fn listing(ws: &Where<'_>, r: &ListDirResult) -> String {
    let dir = if r.path == "." || r.path.is_empty() {
        "./".to_owned()
    } else {
        format!("{}/", listed(shown(r.path.trim_end_matches('/'))))
    };
    let hidden = match r.hidden {
        0 => String::new(),
        1 => " (1 entry whose name starts with `.` not listed: include_hidden lists it)".into(),
        n => format!(
            " ({n} entries whose names start with `.` not listed: include_hidden lists them)"
        ),
    };
    if r.entries.is_empty() {
        return format!("{dir}{ws}: empty{hidden}");
    }
    let mut out = format!(
        "{dir}{ws}: {}{hidden}",
        plural(r.entries.len() as u64, "entry", "entries")
    );
    // Taken off each entry's own path, before it is shown.
    let prefix = if dir == "./" {
        String::new()
    } else {
        format!("{}/", r.path.trim_end_matches('/'))
    };
    // What the header must explain, found in one pass over the entries: links (`@` after the
    // name), a name's own final `@` (escaped, so that `@` after a name always marks a link; a
    // directory's on the way too, so that a name reads the same in every line), a name that is
    // not UTF-8 (U+FFFD for its stray bytes), and a name's own `\u{`.
    let (mut links, mut own_at, mut lossy, mut own_escape) = (false, false, false, false);
    for e in &r.entries {
        links |= e.kind == EntryKind::Symlink;
        if plain(&e.path) {
            continue;
        }
        let name = e.path.strip_prefix(&prefix).unwrap_or(&e.path);
        own_at |= name.ends_with('@') || name.contains("@/");
        lossy |= name.contains('\u{FFFD}');
        own_escape |= name.contains("\\u{");
    }
    lossy |= r.path.contains('\u{FFFD}');
    own_escape |= r.path.contains("\\u{");
    own_at |= dir.contains("\\u{40}/")
        || r.unreadable
            .iter()
            .any(|u| u.ends_with('@') || u.contains("@/"));
    match (links, own_at) {
        (true, false) => out.push_str(" (`@`: symbolic link)"),
        (true, true) => {
            out.push_str(" (`@`: symbolic link; a name's own final `@` shows as `\\u{40}`)")
        }
        (false, true) => out.push_str(" (a name's own final `@` shows as `\\u{40}`)"),
        (false, false) => {}
    }
    if lossy {
        out.push_str(LOSSY_NOTE);
    }
    if own_escape {
        out.push_str(" (a name's own `\\u{` shows as `\\u{5c}u{`)");
    }
    if r.truncated {
        out.push_str(
            ", cut at the entry cap: list a subdirectory or a smaller depth, or find names \
             with glob",
        );
    }

    out.reserve(r.entries.iter().map(|e| e.path.len() + 2).sum());
    for e in &r.entries {
        let name = e.path.strip_prefix(&prefix).unwrap_or(&e.path);
        out.push('\n');
        if plain(name) {
            out.push_str(name);
        } else {
            out.push_str(&listed(shown(name)));
        }
        match e.kind {
            EntryKind::File => {}
            EntryKind::Dir => out.push('/'),
            EntryKind::Symlink => out.push('@'),
            EntryKind::Other => out.push_str(" (device, FIFO or socket)"),
        }
    }
    for unreadable in &r.unreadable {
        let name = unreadable.strip_prefix(&prefix).unwrap_or(unreadable);
        let _ = write!(
            out,
            "\n(could not read the entries of {}: no permission)",
            listed(shown(name))
        );
    }
    out
}

/// ` (in workspace `NAME`, URI)` after an error's message, escaped as paths are ([`shown`]: a
/// folder's path is the attaching user's to choose); nothing without a workspace.
pub fn in_workspace(workspace: Option<&WorkspaceRef>) -> String {
    match workspace {
        Some(w) => format!(" (in workspace `{}`, {})", shown(&w.name), shown(&w.uri)),
        None => String::new(),
    }
}

/// A path for the text, which puts one per line: a name may hold a line break or another
/// control character, which would break that layout, so such a name is shown as
/// [`crate::text::printable_name`] shows it (`\u{a}`, as the diff's header and the terminal
/// do; a tab too, `\u{9}`, which would read as spaces).
/// A name's own `\u{` has its backslash shown so too (`\u{5c}u{`), so that every `\u{..}` in a
/// path shown is an escape: a file named `a\u{40}` is not taken for `a@`. A final space shows
/// as `\u{20}`: at the end of a line (a listing's file, a glob's path) it cannot be seen, and a
/// model would name the file without it. Programs get it exact in the JSON. A name of plain
/// ASCII without these, as most are, is not scanned again.
pub fn shown(path: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let mut shown = if path.contains('\\') && path.contains("\\u{") {
        let own = path.replace("\\u{", "\\u{5c}u{");
        Cow::Owned(crate::text::printable_name(&own).into_owned())
    } else if path.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        crate::text::printable_name(path)
    } else {
        Cow::Borrowed(path)
    };
    if shown.ends_with(' ') {
        let own = shown.to_mut();
        own.pop();
        own.push_str("\\u{20}");
    }
    shown
}

/// What a listing's, a glob's or a search's header says when a path shown holds U+FFFD.
const LOSSY_NOTE: &str = " (`\u{FFFD}`: bytes of a name that are not UTF-8; a path spelled as \
                          shown reaches the name, unless two read the same)";

/// Whether a name is shown in a listing as it is: printable ASCII with no `\\` and no `@`, not
/// ending with a space, as most are. One pass over its bytes, which a listing of many names
/// makes on each.
fn plain(name: &str) -> bool {
    !name.ends_with(' ')
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'\\' && b != b'@')
}

/// A name of a listing as shown ([`shown`]), with a name's own final `@`, and a directory's on
/// the way, as `\u{40}`: in a listing, `@` after a name marks a symbolic link.
fn listed(name: std::borrow::Cow<'_, str>) -> std::borrow::Cow<'_, str> {
    if !name.contains('@') {
        return name;
    }
    let mut out = name.replace("@/", "\\u{40}/");
    if out.ends_with('@') {
        out.pop();
        out.push_str("\\u{40}");
    }
    out.into()
}

fn kind_word(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Dir => "directory",
        EntryKind::Symlink => "symbolic link",
        EntryKind::Other => "device, FIFO or socket",
    }
}

/// A UTC calendar date and time of day (proleptic Gregorian calendar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    /// The year (0 is 1 BC, as astronomers count).
    pub year: i64,
    /// 1 to 12.
    pub month: i64,
    /// 1 to 31.
    pub day: i64,
    /// 0 to 23.
    pub hour: i64,
    /// 0 to 59.
    pub minute: i64,
    /// 0 to 59.
    pub second: i64,
}

impl Civil {
    /// The UTC date and time `secs` seconds after (or before) the Unix epoch: Howard Hinnant's
    /// days-to-civil algorithm, written out instead of pulling a date crate into the build for
    /// the two formats Monad prints (here and the server's RFC 3339 stamps).
    pub fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rest = secs.rem_euclid(86_400);
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        Civil {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day,
            hour: rest / 3600,
            minute: rest % 3600 / 60,
            second: rest % 60,
        }
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(secs: i64) -> String {
    let Civil {
        year,
        month,
        day,
        hour,
        minute,
        second,
    } = Civil::from_unix(secs);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC")
}

fn stat(ws: &Where<'_>, r: StatResult) -> String {
    let mut out = format!("{}{ws}: {}", shown(&r.path), kind_word(r.kind));
    if let Some(target) = &r.link_target {
        let _ = write!(out, " to {}", shown(target));
    }
    let _ = write!(
        out,
        ", {}, mode {}",
        plural(r.size, "byte", "bytes"),
        r.mode
    );
    if r.readonly {
        out.push_str(" (read-only)");
    }
    if let Some(modified) = r.modified_unix {
        let _ = write!(out, ", modified {}", utc(modified));
    }
    out
}

fn search(ws: &Where<'_>, r: SearchResult) -> String {
    let mut searched = plural(r.files_searched, "file", "files");
    if r.binary_skipped > 0 {
        let _ = write!(
            searched,
            ", of which {} skipped as binary",
            plural(r.binary_skipped, "file", "files")
        );
    }
    let mut stopped = String::new();
    for path in &r.stopped_at_binary {
        let _ = write!(
            stopped,
            "\n(the search of {} stopped at a NUL byte past its start: what follows it was not \
             searched; read_file shows it)",
            shown(path)
        );
    }
    for path in &r.stopped_at_long_line {
        let _ = write!(
            stopped,
            "\n(the search of {} stopped at a line too long to search (over 16 MiB): what \
             follows it was not searched)",
            shown(path)
        );
    }
    if r.matches.is_empty() {
        return format!("No matches{ws} (searched {searched}).{stopped}");
    }
    // A file's matches come together: one group each.
    let groups: Vec<&[SearchMatch]> = r.matches.chunk_by(|a, b| a.path == b.path).collect();
    let found = r.matches.iter().filter(|m| !m.context).count();
    let mut out = if r.files_only {
        format!(
            "{} with matches{ws} (searched {searched})",
            plural(groups.len() as u64, "file", "files"),
        )
    } else {
        format!(
            "{} in {}{ws} (searched {searched})",
            plural(found as u64, "match", "matches"),
            plural(groups.len() as u64, "file", "files"),
        )
    };
    // Every match in one file: `path` and `glob` cannot narrow it further.
    let narrow = if groups.len() == 1 {
        "use a more specific pattern, or read_file the file around these lines"
    } else {
        "narrow with `path` or `glob`"
    };
    if r.at_cap {
        let _ = write!(
            out,
            ", stopped at the workspace's cap (more cannot be asked for): {narrow}"
        );
    } else if r.truncated {
        let _ = write!(out, ", stopped at `max_results`: raise it, or {narrow}");
    }
    if r.matches.iter().any(|m| m.path.contains('\u{FFFD}')) {
        out.push_str(LOSSY_NOTE);
    }
    out.push(':');
    if r.files_only {
        for group in &groups {
            out.push('\n');
            out.push_str(&shown(&group[0].path));
        }
    }
    // Files with several lines are set apart by a blank line, as ripgrep's headings are;
    // files with one follow each other line by line (a blank line each doubled the lines of a
    // search that found one match in each of 600 files). A line around a match (`context`) is
    // written `path-N- line`, as grep does, and `--` stands between runs of lines that do not
    // follow each other.
    //
    // A path that holds the marks themselves (`app-10:12:33.log:5: ERROR` reads as line 12 of
    // `app-10`, `2024-01-15-post.md-9- text` as line 1 of `2024`) would make such lines
    // ambiguous: then every file's path is a heading of its own, its lines `N: text` under it,
    // and files are set apart by a blank line, as ripgrep's `--heading` does.
    let with_context = r.matches.iter().any(|m| m.context);
    let headings = groups.iter().any(|group| {
        let path = &group[0].path;
        path.contains(':') || (with_context && path.contains('-'))
    });
    for (i, group) in groups.iter().enumerate().filter(|_| !r.files_only) {
        if i > 0 && (headings || group.len() > 1 || groups[i - 1].len() > 1) {
            out.push('\n');
        }
        if headings {
            out.push('\n');
            out.push_str(&heading(&group[0].path));
        }
        for (j, m) in group.iter().enumerate() {
            // Checked: the numbers come from a peer (a client that lies sends any).
            if with_context
                && j > 0
                && group[j - 1].line_number.checked_add(1) != Some(m.line_number)
            {
                out.push_str("\n--");
            }
            let mark = if m.context { '-' } else { ':' };
            out.push('\n');
            if !headings {
                out.push_str(&shown(&m.path));
                out.push(mark);
            }
            let _ = write!(out, "{}{mark} {}", m.line_number, m.line);
        }
    }
    if !stopped.is_empty() {
        out.push('\n');
        out.push_str(&stopped);
    }
    out
}

/// A search's file path as a heading of its own ([`shown`]); one that would read as a line of
/// it (`12: TODO`, `3- x`, `4:`, `--`) begins with `./`, which names the same file.
fn heading(path: &str) -> std::borrow::Cow<'_, str> {
    let digits = path.bytes().take_while(u8::is_ascii_digit).count();
    let like_a_line = path == "--"
        || (digits > 0
            && matches!(path.as_bytes().get(digits), Some(b':' | b'-'))
            && matches!(path.as_bytes().get(digits + 1), None | Some(b' ')));
    if like_a_line {
        format!("./{}", shown(path)).into()
    } else {
        shown(path)
    }
}

/// The text of a glob's paths found in `workspace`, as [`text`] writes it.
pub fn glob(workspace: Option<&WorkspaceRef>, r: &GlobResult) -> String {
    found(&Where(workspace), r)
}

fn found(ws: &Where<'_>, r: &GlobResult) -> String {
    if r.paths.is_empty() {
        return format!("No paths match{ws}.");
    }
    let mut out = format!("{}{ws}", plural(r.paths.len() as u64, "path", "paths"));
    if r.truncated {
        out.push_str(", cut at the result cap: narrow the pattern or `path`");
    }
    if r.paths.iter().any(|p| p.contains('\u{FFFD}')) {
        out.push_str(LOSSY_NOTE);
    }
    out.push(':');
    for p in &r.paths {
        out.push('\n');
        out.push_str(&shown(p));
    }
    out
}

fn write(ws: &Where<'_>, r: WriteResult) -> String {
    let bytes = plural(r.bytes_written, "byte", "bytes");
    let mut out = match (r.replacements, r.created) {
        (Some(n), _) => format!(
            "Edited {}{ws}: {}, {bytes} now",
            shown(&r.path),
            plural(n, "replacement", "replacements")
        ),
        (None, true) => {
            // Each directory made is the one before it and one more name: the outermost and
            // the innermost say it all.
            let dir = |d: &String| format!("{}/", shown(d));
            let dirs = match r.created_dirs.as_slice() {
                [] => String::new(),
                [one] => format!("; made the directory {}", dir(one)),
                [first, second] => {
                    format!("; made the directories {}, {}", dir(first), dir(second))
                }
                [first, .., last] => format!(
                    "; made {} directories, {} down to {}",
                    r.created_dirs.len(),
                    dir(first),
                    dir(last)
                ),
            };
            format!("Created {}{ws} ({bytes}{dirs})", shown(&r.path))
        }
        (None, false) => format!("Wrote {}{ws} ({bytes})", shown(&r.path)),
    };
    if let Some(encoding) = &r.encoding {
        let _ = write!(out, ", in {encoding} as the file was");
    }
    if let Some(was) = &r.reencoded_from {
        let _ = write!(
            out,
            ", in UTF-8: the file was {was}, which cannot hold all of the new content"
        );
    }
    if r.crlf_kept {
        out.push_str(", its lines ending with CRLF as the file's did");
    }
    if r.bom_kept {
        out.push_str(", its byte order mark kept as the file had it");
    }
    // A new file's diff is the content the model just sent, every line of it again: said
    // only in the JSON.
    if r.diff.is_empty() || r.created {
        out.push_str(if r.created { "." } else { ": no change." });
        return out;
    }
    out.push(':');
    let diff = r.diff.trim_end_matches('\n');
    let shown = crate::text::head(diff, DIFF_TEXT_MAX_BYTES);
    // Whole lines: a cut inside one would read as a change that is not there.
    let shown = if shown.len() < diff.len() {
        shown.rfind('\n').map_or(shown, |at| &shown[..at])
    } else {
        shown
    };
    let left_out = &diff[shown.len()..];
    if r.diff_truncated && left_out.is_empty() {
        out.push_str(" (the diff is cut at the cap; read_file shows the file as it is now)");
    }
    out.push('\n');
    out.push_str(shown);
    if !left_out.is_empty() {
        let _ = write!(
            out,
            "\n[... the diff goes on for {} ({} bytes){}; read_file shows the file as it is \
             now ...]",
            plural(
                count_lines(left_out.trim_start_matches('\n')),
                "line",
                "lines"
            ),
            left_out.len(),
            if r.diff_truncated {
                ", then it was cut at the cap"
            } else {
                ""
            }
        );
    }
    out
}

/// Most bytes of a write's diff its text shows: a write that replaced every line of a large
/// file would otherwise hand a model its old and new content, up to the diff's own cap.
const DIFF_TEXT_MAX_BYTES: usize = 16 * 1024;

/// Said after how a command ended when the kernel killed a process of its user's commands at
/// their memory bound while it ran.
fn memory_bound(hit: bool) -> &'static str {
    if hit {
        " (meanwhile the kernel killed a process of this user's commands at their memory bound \
         on the server, server.max_memory_per_user: end other commands that hold memory, or use \
         less)"
    } else {
        ""
    }
}

/// How a command ended, read back from the text [`text`] made of a `run_command` or
/// `process_read` result, when it did not end well: `exit status 3`, `killed by signal 9`,
/// `timed out and was killed`. `None` for one that exited with status 0, runs on, or runs in
/// the background, and for any other tool (`tool` is its name, as the built-in agent's events
/// carry it). For a front that has only the text and marks a call that failed as failed.
pub fn command_failure<'a>(tool: &str, text: &'a str) -> Option<&'a str> {
    let first = text.lines().next().unwrap_or("");
    let said = match ToolName::parse(tool)? {
        ToolName::RunCommand => first,
        // `Process ID in workspace W: ENDING after …` once it ended.
        ToolName::ProcessRead => first.split_once(": ").map_or("", |(_, rest)| rest),
        _ => return None,
    };
    if let Some(rest) = said.strip_prefix("exit status ") {
        let code: &str = rest.split([' ', ',']).next().unwrap_or("");
        let end = "exit status ".len() + code.len();
        return (code != "0" && code.parse::<i32>().is_ok()).then(|| &said[..end]);
    }
    if let Some(rest) = said.strip_prefix("killed by signal ") {
        let signal = rest.split([' ', ',']).next().unwrap_or("");
        return Some(&said[.."killed by signal ".len() + signal.len()]);
    }
    said.starts_with("timed out and was killed")
        .then_some("timed out and was killed")
}

/// How a process ended, or that it runs.
fn ending(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> String {
    match (timed_out, exit_code, signal) {
        (true, _, _) => "timed out and was killed".to_owned(),
        (false, Some(code), _) => format!("exit status {code}"),
        (false, None, Some(signal)) => format!("killed by signal {signal}"),
        (false, None, None) => "ended".to_owned(),
    }
}

/// One of a command's streams as its result gives it.
struct Stream<'a> {
    name: &'static str,
    text: &'a str,
    /// Said after the name (`(10 older bytes were dropped)`, or nothing).
    note: String,
    /// Where the bytes dropped at the output cap were, when some were.
    gap: Option<OutputGap>,
}

/// Standard output and error as sections; nothing when both are empty. A long stream is shown
/// by its first and last lines ([`abridge`]), with `read_all` saying how to read the rest.
fn streams(out: &mut String, streams: [Stream<'_>; 2], read_all: &str) {
    for Stream {
        name,
        text,
        note,
        gap,
    } in streams
    {
        if text.is_empty() && note.is_empty() {
            continue;
        }
        if looks_binary(text) {
            // Counted as the program wrote it: a byte that was not UTF-8 is one U+FFFD here,
            // three bytes of text, and past the output cap the bytes dropped between its two
            // ends count too (the text says that not all of it is held).
            let replaced = text.matches('\u{fffd}').count();
            let about = if replaced > 0 { "about " } else { "" };
            let dropped = gap.map_or(0, |gap| gap.dropped);
            let held = if dropped > 0 {
                format!(
                    "its first and last bytes only, {dropped} between them dropped at the output \
                     cap, "
                )
            } else {
                "it ".to_owned()
            };
            let _ = write!(
                out,
                "\n--- {name}{note}: binary data, {about}{} bytes, not shown (the result's \
                 `{name}` field holds {held}as UTF-8, each byte that is not UTF-8 as U+FFFD; \
                 send it to a file to keep it)",
                ((text.len() - 2 * replaced) as u64).saturating_add(dropped)
            );
            continue;
        }
        if let Some(gap) = gap {
            cut_at_the_cap(out, name, text, gap, read_all);
            continue;
        }
        // The size is the stream's own (what `wc -c` counts); the last line break is not shown.
        let size = text.len();
        let text = text.strip_suffix('\n').unwrap_or(text);
        let Some(parts) = abridge(text) else {
            let _ = write!(out, "\n--- {name}{note}");
            if !text.is_empty() {
                out.push('\n');
                out.push_str(text);
            }
            continue;
        };
        let _ = write!(
            out,
            "\n--- {name}{note}: {}, {} bytes; its first and last lines are shown here\n{}\n\
             [... {} left out of this text; {read_all} ...]\n{}",
            plural(count_lines(text), "line", "lines"),
            size,
            parts.head,
            match parts.left_out_lines {
                0 => plural(parts.left_out_bytes, "byte", "bytes"),
                lines => format!(
                    "{} ({} bytes)",
                    plural(lines, "line", "lines"),
                    parts.left_out_bytes
                ),
            },
            parts.tail,
        );
    }
}

/// Whether a command's output is binary data rather than text: a NUL, or more than one
/// character in ten a replacement character (a byte that was not UTF-8) or a control character
/// other than a tab or a line break. Such bytes read as noise to a model (`head -c 300
/// /bin/ls`), at up to three bytes of text each.
fn looks_binary(text: &str) -> bool {
    let mut odd = 0usize;
    let mut all = 0usize;
    for c in text.chars() {
        if c == '\0' {
            return true;
        }
        all += 1;
        if c == char::REPLACEMENT_CHARACTER
            || (c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\u{1b}'))
        {
            odd += 1;
        }
    }
    odd * 10 > all
}

/// How to read what a command's text leaves out.
const READ_IT_ALL: &str = "to read them, run the command again with its output sent to a \
                           file, then read_file or search that file";

/// What a background process's read leaves out is gone for a model (a read takes what it
/// shows): running it again is no answer for a long build or a server, so the advice is for
/// the next start.
const READ_IT_ALL_NEXT_TIME: &str = "a read takes them, so they cannot be read again; to \
                                     keep all of a long-running command's output, start it \
                                     with its output sent to a file (`... > out.log 2>&1`), \
                                     then read_file or search that file";

/// A stream that went over the output cap: what was kept of its start, then of its end (`text`
/// holds both, split at `gap.at`), each shown by its own end.
fn cut_at_the_cap(out: &mut String, name: &str, text: &str, gap: OutputGap, read_all: &str) {
    let at = usize::try_from(gap.at)
        .ok()
        .filter(|&at| text.is_char_boundary(at))
        .unwrap_or(text.len());
    let (first, last) = text.split_at(at);
    let last = last.strip_suffix('\n').unwrap_or(last);
    let head_end = head_end(first);
    let tail_start = tail_start(last);
    let left_out = ((first.len() - head_end) as u64)
        .saturating_add(gap.dropped)
        .saturating_add(tail_start as u64);
    let _ = write!(
        out,
        "\n--- {name}: {} bytes, more than the output cap keeps; its first and last lines are \
         shown here\n{}\n[... {} left out of this text, {} of them not kept at all (the \
         output cap); {read_all} ...]\n{}",
        (text.len() as u64).saturating_add(gap.dropped),
        first[..head_end]
            .strip_suffix('\n')
            .unwrap_or(&first[..head_end]),
        plural(left_out, "byte", "bytes"),
        gap.dropped,
        &last[tail_start..],
    );
}

/// Most lines a command's stream shows from each end of it.
const STREAM_END_LINES: usize = 128;
/// Most bytes a command's stream shows from each end of it.
const STREAM_END_BYTES: usize = 8 * 1024;
/// Fewest bytes a stream's text leaves out between its two ends: about the notice that says
/// so, which would otherwise stand for less than it takes.
const LEFT_OUT_MIN_BYTES: usize = 256;

/// The two ends of a stream too long for a model to be given whole.
#[derive(Debug, PartialEq)]
struct Abridged<'a> {
    head: &'a str,
    tail: &'a str,
    left_out_lines: u64,
    left_out_bytes: u64,
}

/// A command's output reaches the text whole up to `2 × STREAM_END_LINES` lines and
/// `2 × STREAM_END_BYTES` bytes; past either, its first and last lines (at most
/// [`STREAM_END_LINES`] and [`STREAM_END_BYTES`] each) with what was left out counted between
/// them: a build or a test run says what matters at its start and its end, and a megabyte of
/// output (the default output cap) in a model's context would crowd out everything else.
/// Programs get every byte in the JSON. `None` when `text` is shown whole, also when no more
/// than [`LEFT_OUT_MIN_BYTES`] would be left out. A line longer than the bytes allowed is cut
/// inside, at a character boundary.
fn abridge(text: &str) -> Option<Abridged<'_>> {
    if text.len() <= 2 * STREAM_END_BYTES && count_lines(text) <= 2 * STREAM_END_LINES as u64 {
        return None;
    }
    let head_end = head_end(text);
    // The line break that ends the head is shown as the break before the marker; the one
    // before the tail is left out with the lines between.
    let tail_start = tail_start(text).max(head_end);
    let middle = &text[head_end..tail_start];
    if middle.len() <= LEFT_OUT_MIN_BYTES {
        // The notice would be longer than what it stands for.
        return None;
    }
    Some(Abridged {
        head: text[..head_end]
            .strip_suffix('\n')
            .unwrap_or(&text[..head_end]),
        tail: &text[tail_start..],
        left_out_lines: middle.bytes().filter(|&b| b == b'\n').count() as u64,
        left_out_bytes: middle.len() as u64,
    })
}

/// Where the head of `text` shown to a model ends: whole lines while they fit (with their line
/// breaks), or the first line's start.
fn head_end(text: &str) -> usize {
    let mut end = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if n == STREAM_END_LINES || end + line.len() > STREAM_END_BYTES {
            if n == 0 {
                end = crate::text::head(text, STREAM_END_BYTES).len();
            }
            break;
        }
        end += line.len();
    }
    end
}

/// Where the tail of `text` (without a final line break) shown to a model starts: the same way
/// from the end.
fn tail_start(text: &str) -> usize {
    let mut start = text.len();
    for (n, line) in text.rsplit('\n').enumerate() {
        let taken = line.len() + usize::from(n > 0);
        if n == STREAM_END_LINES || text.len() - start + taken > STREAM_END_BYTES {
            if n == 0 {
                start = text.len() - crate::text::tail(text, STREAM_END_BYTES).len();
            }
            break;
        }
        start -= taken;
    }
    start
}

/// Lines in a text without its final line break: line breaks plus one, none when empty.
fn count_lines(text: &str) -> u64 {
    if text.is_empty() {
        0
    } else {
        text.bytes().filter(|&b| b == b'\n').count() as u64 + 1
    }
}

fn network(out: &mut String, events: &[NetworkEvent], not_shown: u64) {
    if events.is_empty() && not_shown == 0 {
        return;
    }
    out.push_str("\n--- network");
    for e in events {
        // Each event one line: what a command asked for (a host name, a refusal's reason
        // quoting it) is escaped, so it cannot forge more lines.
        let verdict = if e.allowed { "allowed" } else { "refused" };
        let _ = write!(
            out,
            "\n{verdict} {}:{}",
            crate::text::printable(&e.host),
            e.port
        );
        if let Some(address) = &e.address {
            let _ = write!(out, " ({})", crate::text::printable(address));
        }
        if let Some(reason) = &e.reason {
            let _ = write!(out, ": {}", crate::text::printable(reason));
        }
    }
    if not_shown > 0 {
        let _ = write!(
            out,
            "\n... and {} not shown (too many for one answer)",
            plural(not_shown, "more connection", "more connections")
        );
    }
}

fn run_command(ws: &Where<'_>, r: RunCommandResult) -> String {
    let mut out = match &r.process {
        Some(id) => format!(
            "Running in the background{ws} as process {id} (for {}): read its output with \
             process_read {{\"process\": \"{id}\"}}, stop it with process_kill",
            duration(r.duration_ms)
        ),
        None => format!(
            "{}{ws}, after {}{}",
            ending(r.exit_code, r.signal, r.timed_out),
            duration(r.duration_ms),
            memory_bound(r.memory_bound)
        ),
    };
    if r.sandbox == "none" {
        out.push_str(" (ran without a sandbox)");
    }
    // A peer of an earlier version cut the output at the cap and kept its start only.
    let cut = |truncated: bool, gap: Option<OutputGap>| {
        if truncated && gap.is_none() {
            " (cut at the output cap)".to_owned()
        } else {
            String::new()
        }
    };
    if r.stdout.is_empty() && r.stderr.is_empty() && r.process.is_none() {
        out.push_str("; no output");
    }
    streams(
        &mut out,
        [
            Stream {
                name: "stdout",
                text: &r.stdout,
                note: cut(r.stdout_truncated, r.stdout_gap),
                gap: r.stdout_gap,
            },
            Stream {
                name: "stderr",
                text: &r.stderr,
                note: cut(r.stderr_truncated, r.stderr_gap),
                gap: r.stderr_gap,
            },
        ],
        READ_IT_ALL,
    );
    network(&mut out, &r.network, r.network_not_shown);
    let failed = r.process.is_none() && (r.exit_code != Some(0) || r.timed_out);
    no_network(&mut out, r.network_off && failed, [&r.stdout, &r.stderr]);
    out
}

/// What programs print when they cannot reach the network, lowercase: resolvers (curl and git,
/// glibc, Node, Go, Rust's), and a destination with no route. Not a refused connection: the
/// workspace's own loopback works without network, and a local service that is not running
/// (a test's) is refused there for its own reason.
const NO_NETWORK_SAYINGS: &[&str] = &[
    "could not resolve",
    "name resolution",
    "name or service not known",
    "getaddrinfo",
    "eai_again",
    "enotfound",
    "no such host",
    "failed to lookup address",
    "dns error",
    "network is unreachable",
];

/// After a command that failed in a workspace whose commands have no network, and whose
/// output says it could not reach something ([`NO_NETWORK_SAYINGS`]), says why: that output
/// ("could not resolve host") does not, and a model would try again, or look for the fault in
/// the project. A failure that says nothing of the network (a failing test) gets no such line,
/// which would send the model looking there.
fn no_network(out: &mut String, failed_without: bool, output: [&str; 2]) {
    let says = |text: &str| {
        let text = text.to_ascii_lowercase();
        NO_NETWORK_SAYINGS.iter().any(|s| text.contains(s))
    };
    if failed_without && output.iter().any(|text| says(text)) {
        out.push_str(
            "\n(this workspace's commands have no network: its network policy is \"off\"; \
             a command that downloads, or connects to another machine, fails here)",
        );
    }
}

fn process_read(ws: &Where<'_>, r: ProcessReadResult) -> String {
    let mut out = if r.running {
        format!(
            "Process {}{ws}: running for {}",
            r.process,
            duration(r.duration_ms)
        )
    } else {
        format!(
            "Process {}{ws}: {} after {}{}",
            r.process,
            ending(r.exit_code, r.signal, r.timed_out),
            duration(r.duration_ms),
            memory_bound(r.memory_bound)
        )
    };
    match r.last_lines {
        Some(_) if r.stdout.is_empty() && r.stderr.is_empty() => {
            out.push_str("; no output kept");
        }
        Some(n) => {
            out.push_str(&format!(
                "; each stream's last {}, read before or not",
                plural(n, "line", "lines")
            ));
        }
        None if r.stdout.is_empty() && r.stderr.is_empty() => out.push_str("; no new output"),
        None => {}
    }
    if r.running {
        out.push_str(" (read again for more; `wait_ms` waits for it)");
    }
    let dropped = |n: u64| {
        if n == 0 {
            String::new()
        } else {
            format!(" ({n} older bytes were dropped)")
        }
    };
    streams(
        &mut out,
        [
            Stream {
                name: "stdout",
                text: &r.stdout,
                note: dropped(r.stdout_dropped),
                gap: None,
            },
            Stream {
                name: "stderr",
                text: &r.stderr,
                note: dropped(r.stderr_dropped),
                gap: None,
            },
        ],
        READ_IT_ALL_NEXT_TIME,
    );
    network(&mut out, &r.network, r.network_not_shown);
    let failed = !r.running && (r.exit_code != Some(0) || r.timed_out);
    no_network(&mut out, r.network_off && failed, [&r.stdout, &r.stderr]);
    out
}

fn process_write(ws: &Where<'_>, r: ProcessWriteResult) -> String {
    let mut out = format!(
        "Wrote {} to the standard input of process {}{ws}",
        plural(r.bytes_written, "byte", "bytes"),
        r.process
    );
    if r.stdin_closed {
        out.push_str(", and closed it");
    }
    out.push('.');
    out
}

fn process_kill(ws: &Where<'_>, r: ProcessKillResult) -> String {
    if r.delivered {
        format!("Sent {} to process {}{ws}.", r.signal, r.process)
    } else {
        format!(
            "Process {}{ws} had already exited; nothing was sent.",
            r.process
        )
    }
}

fn process_list(ws: &Where<'_>, r: ProcessListResult) -> String {
    // A list gathered from several workspaces names each process's, not one for all.
    let gathered = r.processes.iter().any(|p| p.workspace.is_some()) || !r.unavailable.is_empty();
    let ws = if gathered { &Where(None) } else { ws };
    let mut out = if r.processes.is_empty() {
        format!("No background processes{ws}.")
    } else {
        format!(
            "{}{ws}:",
            plural(
                r.processes.len() as u64,
                "background process",
                "background processes"
            )
        )
    };
    for p in &r.processes {
        let state = if p.running {
            format!("running for {}", duration(p.duration_ms))
        } else {
            ending(p.exit_code, p.signal, false)
        };
        let _ = write!(out, "\n{}: {state}", p.process);
        if let Some(w) = &p.workspace {
            let _ = write!(out, ", workspace {w}");
        }
        if p.cwd != "." {
            let _ = write!(out, ", in {}", shown(&p.cwd));
        }
        if p.unread_bytes > 0 {
            let _ = write!(out, ", {} unread", plural(p.unread_bytes, "byte", "bytes"));
        }
        let _ = write!(out, ": {}", crate::text::shell_words(&p.argv));
    }
    for u in &r.unavailable {
        let _ = write!(
            out,
            "\nnot listed: workspace {}: {}: {}",
            u.workspace, u.code, u.message
        );
    }
    out
}

fn workspaces(r: WorkspacesResult) -> String {
    let mut out = format!(
        "Session {}: {}",
        r.session,
        plural(r.workspaces.len() as u64, "workspace", "workspaces")
    );
    for w in &r.workspaces {
        let host = match w.host {
            Host::Server => "on the server",
            Host::Client => "attached from a user's machine",
        };
        let trust = match w.trust {
            Trust::Full => "trusted (runs at once)",
            Trust::Restricted => "restricted (each action needs its user's approval)",
        };
        let online = if w.online { "" } else { ", offline" };
        let focus = if r.focus.as_ref() == Some(&w.name) {
            ", the focus"
        } else {
            ""
        };
        let network = w
            .network
            .as_deref()
            .map(|n| format!(", commands get {}", crate::text::printable(n)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "\n{} ({}): {host}, {trust}{network}{online}{focus}",
            shown(&w.name),
            shown(&w.uri)
        );
    }
    if !r.routing.is_empty() {
        let _ = write!(out, "\n{}", r.routing);
    }
    out
}

fn memory_store(r: MemoryStoreResult) -> String {
    format!("Stored the note `{}`.", r.key)
}

fn memory_recall(r: MemoryRecallResult) -> String {
    let left_out = match r.not_shown {
        0 => String::new(),
        n => format!(
            "{} not shown: one recall holds at most {} KiB of notes and reads at most {} MiB \
             (`read_file` of `memory/KEY.md` in the primary workspace reads any note; `list_dir` \
             of `memory` lists them)",
            plural(n, "note", "notes"),
            crate::tools::MEMORY_RECALL_MAX_BYTES / 1024,
            crate::tools::MEMORY_RECALL_SCAN_MAX_BYTES / (1024 * 1024)
        ),
    };
    if r.notes.is_empty() {
        return match (r.not_matching, left_out.is_empty()) {
            (0, true) => "No notes.".to_owned(),
            (0, false) => format!("{left_out}."),
            (n, true) => format!(
                "No note matches the query; the memory holds {} (without `query`, every note).",
                plural(n, "note", "notes")
            ),
            (n, false) => format!(
                "No note shown: {} the query did not match; {left_out}.",
                plural(n, "note", "notes")
            ),
        };
    }
    let mut out = plural(r.notes.len() as u64, "note", "notes");
    if r.not_matching > 0 {
        let _ = write!(
            out,
            " ({} the query did not match; without `query`, every note)",
            plural(r.not_matching, "other note", "other notes")
        );
    }
    if !left_out.is_empty() {
        let _ = write!(out, "; {left_out}");
    }
    out.push(':');
    for n in &r.notes {
        let _ = write!(out, "\n\n## {}\n{}", n.key, n.text.trim_end_matches('\n'));
    }
    out
}

/// The first sentence of a tool's description: a one-line summary.
pub fn tool_summary(tool: ToolName) -> &'static str {
    let d = tool.description();
    match d.find(". ") {
        Some(end) => &d[..=end],
        None => d,
    }
}

/// A tool's description and arguments, from its JSON Schema, for people: name, type, required
/// or not, and what each is for.
pub fn tool_help(tool: ToolName) -> String {
    let schema = tool.input_schema();
    let mut out = format!("{tool} ({} tool)\n\n", tool.class().as_str());
    out.push_str(&wrap(tool.description(), 96, ""));
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else {
        return out;
    };
    out.push_str(&format!(
        "\n\nArguments, as one JSON object (monad-client call {tool} '{{\"name\": value, ...}}'):\n"
    ));
    // Required ones first, then the rest, each in schema order.
    let mut names: Vec<&String> = properties.keys().collect();
    names.sort_by_key(|n| !required.contains(&n.as_str()));
    for name in names {
        let p = &properties[name.as_str()];
        let need = if required.contains(&name.as_str()) {
            "required"
        } else {
            "optional"
        };
        let _ = writeln!(out, "\n  {name}: {}, {need}", type_name(p));
        if let Some(d) = p["description"].as_str() {
            out.push_str(&wrap(d, 92, "      "));
            out.push('\n');
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// The type of a schema property in words: `string`, `integer`, `list of string`, ...
fn type_name(p: &Value) -> String {
    let one = |t: &Value| -> Option<String> {
        let t = t.as_str()?;
        Some(match t {
            "array" => match p["items"]["type"].as_str() {
                Some(item) => format!("list of {item}"),
                None => "list".to_owned(),
            },
            "null" => return None,
            other => other.to_owned(),
        })
    };
    match &p["type"] {
        Value::String(_) => one(&p["type"]).unwrap_or_else(|| "null".to_owned()),
        Value::Array(types) => {
            let names: Vec<String> = types.iter().filter_map(one).collect();
            names.join(" or ")
        }
        _ => "any".to_owned(),
    }
}

/// Words wrapped at `width` columns, each line after `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = write!(out, "{indent}{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn line_numbers_are_aligned_as_format_aligns_them() {
        for n in [0, 1, 9, 10, 99, 100, 4_242, 65_535, 1 << 40, u64::MAX] {
            assert_eq!(digits(n), n.to_string().len(), "{n}");
            for width in [0, 1, 3, 7, 25] {
                let mut out = String::from("x");
                push_right_aligned(&mut out, n, width);
                assert_eq!(out, format!("x{n:>width$}"), "{n} in {width}");
            }
        }
    }

    fn laptop() -> WorkspaceRef {
        WorkspaceRef {
            name: "laptop".into(),
            uri: "macbook:~/dev/monad".into(),
        }
    }

    fn render(tool: ToolName, result: Value) -> String {
        text(tool, Some(&laptop()), &result)
    }

    #[test]
    fn a_read_is_numbered_like_cat_n_under_a_header() {
        let content: String = (1..=12).map(|i| format!("line {i}\n")).collect();
        let shown = render(
            ToolName::ReadFile,
            json!({"path": "src/a.txt", "content": content, "start_line": 1, "lines": 12,
                   "total_lines": 12, "size": 200, "binary": false, "truncated": false}),
        );
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines[0], "src/a.txt in workspace laptop: lines 1-12 of 12");
        assert_eq!(lines[1], " 1\tline 1");
        assert_eq!(lines[12], "12\tline 12");
        assert_eq!(lines.len(), 13);
    }

    /// Numbers a client sends are shown, never trusted to size or count anything: `lines:
    /// 10^12` made the text reserve 15 TB (the process aborted), `start_line` and `dropped`
    /// near `u64::MAX` overflowed.
    #[test]
    fn numbers_a_peer_made_up_are_shown_not_trusted() {
        for (start, lines) in [(1, 1_000_000_000_000u64), (u64::MAX, 3), (1, u64::MAX)] {
            let shown = render(
                ToolName::ReadFile,
                json!({"path": "a", "content": "x\ny\n", "start_line": start, "lines": lines,
                       "size": 4, "binary": false, "truncated": false}),
            );
            assert!(shown.contains("\tx"), "{shown}");
            assert!(shown.len() < 200, "{shown}");
        }
        let mut result = ran("start\nend\n");
        result["stdout_truncated"] = json!(true);
        result["stdout_gap"] = json!({"at": 6, "dropped": u64::MAX});
        let shown = render(ToolName::RunCommand, result.clone());
        assert!(shown.contains(&format!("{} bytes", u64::MAX)), "{shown}");
        result["stdout"] = json!("\u{0}\u{0}bin");
        assert!(render(ToolName::RunCommand, result).contains("binary data"));
    }

    #[test]
    fn a_cut_read_says_how_to_read_on_with_the_real_argument_name() {
        let shown = render(
            ToolName::ReadFile,
            json!({"path": "big.log", "content": "a\r\nb\n", "start_line": 99, "lines": 2,
                   "size": 9000, "binary": false, "truncated": true, "truncation": "lines",
                   "next_offset": 101}),
        );
        assert_eq!(
            shown,
            "big.log in workspace laptop: lines 99-100 (the file goes on: 9000 bytes in all); \
             read on with offset=101\n 99\ta\r\n100\tb"
        );
        assert!(ToolName::ReadFile.input_schema()["properties"]["offset"].is_object());
        let bytes = render(
            ToolName::ReadFile,
            json!({"path": "x", "content": "a\n", "start_line": 1, "lines": 1,
                   "size": 9, "binary": false, "truncated": true, "truncation": "bytes",
                   "next_offset": 2}),
        );
        assert!(
            bytes.starts_with(
                "x in workspace laptop: lines 1-1 (the file goes on: 9 bytes in all), cut at the \
                 byte cap; read on with offset=2\n"
            ),
            "{bytes}"
        );
    }

    #[test]
    fn a_write_says_which_directories_it_made() {
        let base = json!({"path": "a/b/c/f.rs", "created": true, "bytes_written": 2,
                          "diff": "", "diff_truncated": false});
        assert_eq!(
            render(ToolName::WriteFile, base.clone()),
            "Created a/b/c/f.rs in workspace laptop (2 bytes)."
        );
        let mut made = base.clone();
        made["created_dirs"] = json!(["a/b"]);
        assert!(render(ToolName::WriteFile, made.clone()).starts_with(
            "Created a/b/c/f.rs in workspace laptop (2 bytes; made the directory a/b/)"
        ));
        made["created_dirs"] = json!(["a", "a/b", "a/b/c"]);
        assert!(render(ToolName::WriteFile, made).starts_with(
            "Created a/b/c/f.rs in workspace laptop (2 bytes; made 3 directories, a/ down to \
                 a/b/c/)"
        ));
    }

    /// A new file's diff is the model's own content again: not in the text. A long diff is
    /// shown to a bound, in whole lines, with what it leaves out counted.
    #[test]
    fn a_writes_text_leaves_out_a_new_files_content_and_bounds_a_long_diff() {
        let diff: String = (0..2_000).map(|n| format!("+line {n}\n")).collect();
        let created = render(
            ToolName::WriteFile,
            json!({"path": "new.txt", "created": true, "bytes_written": 9000, "diff": diff,
                   "diff_truncated": false}),
        );
        assert_eq!(created, "Created new.txt in workspace laptop (9000 bytes).");
        let replaced = render(
            ToolName::WriteFile,
            json!({"path": "old.txt", "created": false, "bytes_written": 9000, "diff": diff,
                   "diff_truncated": true}),
        );
        let (shown, notice) = replaced.rsplit_once("\n[... ").expect(&replaced);
        assert!(shown.len() <= DIFF_TEXT_MAX_BYTES + 100, "{}", shown.len());
        assert!(
            shown.ends_with(&format!("+line {}", shown.lines().count() - 2)),
            "{shown}"
        );
        let left = 2_000 - (shown.lines().count() - 1);
        assert!(
            notice.starts_with(&format!(
                "the diff goes on for {left} lines ({} bytes), then it was cut at the cap; \
                 read_file shows the file as it is now ...]",
                diff.trim_end().len() - (shown.len() - shown.find('\n').unwrap() - 1)
            )),
            "{notice}"
        );
        let small = render(
            ToolName::WriteFile,
            json!({"path": "old.txt", "created": false, "bytes_written": 4,
                   "diff": "-a\n+b\n", "diff_truncated": false}),
        );
        assert_eq!(
            small,
            "Wrote old.txt in workspace laptop (4 bytes):\n-a\n+b"
        );
    }

    #[test]
    fn a_line_longer_than_the_byte_cap_says_it_was_cut() {
        let mut long = json!({"path": "min.js", "content": "abcd", "start_line": 1, "lines": 1,
                              "size": 9000, "binary": false, "truncated": true,
                              "truncation": "bytes", "next_offset": 2});
        assert_eq!(
            render(ToolName::ReadFile, long.clone()),
            "min.js in workspace laptop: lines 1-1 (the file goes on: 9000 bytes in all), line 1 \
             cut at the byte cap after 4 bytes (the rest of it cannot be shown); read on with \
             offset=2\n1\tabcd"
        );
        // The only line of its file: nothing to read on to.
        long["next_offset"] = Value::Null;
        long["total_lines"] = json!(1);
        assert_eq!(
            render(ToolName::ReadFile, long),
            "min.js in workspace laptop: lines 1-1 of 1, line 1 cut at the byte cap after 4 \
             bytes (the rest of it cannot be shown)\n1\tabcd"
        );
    }

    #[test]
    fn a_long_line_is_shown_by_its_start_and_the_rest_counted() {
        let long = format!("{}\u{e9}{}", "a".repeat(1999), "b".repeat(5000));
        let content = format!("short\n{long}\nend\n");
        let shown = render(
            ToolName::ReadFile,
            json!({"path": "min.js", "content": content, "start_line": 1, "lines": 3,
                   "total_lines": 3, "size": content.len(), "binary": false, "truncated": false}),
        );
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1], "1\tshort");
        // The cut is before the two-byte character that would cross 2,000 bytes.
        assert_eq!(
            lines[2],
            format!(
                "2\t{} \u{2026} [5002 more bytes of this line not shown: `search` finds text in it]",
                "a".repeat(1999)
            )
        );
        assert_eq!(lines[3], "3\tend");
        // A line longer than the read's byte cap, of which the read has only a head: what is
        // left of it in the file is not known, so no count is given (it said the 2 bytes past
        // the 2,000 shown of a 262,144-byte head of a 15 MiB line were all there was).
        let head = "c".repeat(READ_LINE_MAX_BYTES + 2);
        let shown = render(
            ToolName::ReadFile,
            json!({"path": "big.js", "content": head, "start_line": 1, "lines": 1,
                   "size": 15_000_000, "binary": false, "truncated": true,
                   "truncation": "bytes", "next_offset": 2}),
        );
        let line = shown.lines().nth(1).unwrap();
        assert!(
            line.ends_with("\u{2026} [the rest of this line not shown: `search` finds text in it]"),
            "{line}"
        );
        // A line of exactly the cap is shown whole.
        let exact = "x".repeat(READ_LINE_MAX_BYTES);
        let shown = render(
            ToolName::ReadFile,
            json!({"path": "a", "content": exact, "start_line": 1, "lines": 1,
                   "total_lines": 1, "size": READ_LINE_MAX_BYTES, "binary": false,
                   "truncated": false}),
        );
        assert!(shown.ends_with(&format!("1\t{exact}")), "{shown}");
        // The tool's description says the same cap.
        let cap = format!(
            "A line over {},{:03} bytes",
            READ_LINE_MAX_BYTES / 1000,
            READ_LINE_MAX_BYTES % 1000
        );
        assert!(ToolName::ReadFile.description().contains(&cap), "{cap}");
    }

    #[test]
    fn empty_binary_and_past_the_end_reads_say_so() {
        let base = json!({"path": "e", "content": "", "start_line": 1, "lines": 0,
                          "total_lines": 0, "size": 0, "binary": false, "truncated": false});
        assert_eq!(
            render(ToolName::ReadFile, base.clone()),
            "e in workspace laptop: empty file"
        );
        let mut past = base.clone();
        past["start_line"] = json!(50);
        past["total_lines"] = json!(3);
        assert_eq!(
            render(ToolName::ReadFile, past),
            "e in workspace laptop: no lines from line 50: the file has 3 lines"
        );
        let mut binary = base;
        binary["binary"] = json!(true);
        binary["size"] = json!(1234);
        assert_eq!(
            render(ToolName::ReadFile, binary.clone()),
            "e in workspace laptop: binary file, 1234 bytes, not shown"
        );
        binary["binary_reason"] = json!("it has a NUL byte (at byte 3)");
        assert_eq!(
            render(ToolName::ReadFile, binary),
            "e in workspace laptop: binary file, 1234 bytes, not shown: it has a NUL byte (at \
             byte 3)"
        );
    }

    #[test]
    fn a_listing_is_one_entry_per_line_relative_to_the_directory() {
        let shown = render(
            ToolName::ListDir,
            json!({"path": "src", "truncated": false, "entries": [
                {"path": "src/bin", "kind": "dir"},
                {"path": "src/bin/main.rs", "kind": "file"},
                {"path": "src/lib.rs", "kind": "file"},
                {"path": "src/link", "kind": "symlink"},
            ]}),
        );
        assert_eq!(
            shown,
            "src/ in workspace laptop: 4 entries (`@`: symbolic link)\nbin/\nbin/main.rs\nlib.rs\n\
             link@"
        );
        // A file whose name ends with `@` is not taken for a link, nor a link so named for a
        // link without it.
        let at = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "mail@", "kind": "file"},
                {"path": "mail", "kind": "symlink"},
                {"path": "to@", "kind": "symlink"},
            ]}),
        );
        assert_eq!(
            at,
            "./ in workspace laptop: 3 entries (`@`: symbolic link; a name's own final `@` shows \
             as `\\u{40}`)\nmail\\u{40}\nmail@\nto\\u{40}@"
        );
        // A name that is not UTF-8, shown with U+FFFD: what that is, and that it can be named so.
        let lossy = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "caf\u{FFFD}.txt", "kind": "file"},
            ]}),
        );
        assert_eq!(
            lossy,
            "./ in workspace laptop: 1 entry (`\u{FFFD}`: bytes of a name that are not UTF-8; a \
             path spelled as shown reaches the name, unless two read the same)\ncaf\u{FFFD}.txt"
        );
        // A directory's own final `@` reads the same in the lines below it.
        let nested = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "Dat@", "kind": "dir"},
                {"path": "Dat@/f", "kind": "file"},
            ]}),
        );
        assert_eq!(
            nested,
            "./ in workspace laptop: 2 entries (a name's own final `@` shows as `\\u{40}`)\n\
             Dat\\u{40}/\nDat\\u{40}/f"
        );
        // And the same in the header and in a directory that could not be read.
        let inside = render(
            ToolName::ListDir,
            json!({"path": "Dat@", "truncated": false, "entries": [
                {"path": "Dat@/f", "kind": "file"},
            ], "unreadable": ["Dat@/no@"]}),
        );
        assert_eq!(
            inside,
            "Dat\\u{40}/ in workspace laptop: 1 entry (a name's own final `@` shows as \
             `\\u{40}`)\nf\n(could not read the entries of no\\u{40}: no permission)"
        );
        // A directory shown escaped still lists its entries by their names.
        let odd_dir = render(
            ToolName::ListDir,
            json!({"path": "d\\u{1}\u{1}", "truncated": false, "entries": [
                {"path": "d\\u{1}\u{1}/x", "kind": "file"},
            ]}),
        );
        assert_eq!(
            odd_dir,
            "d\\u{5c}u{1}\\u{1}/ in workspace laptop: 1 entry (a name's own `\\u{` shows as \
             `\\u{5c}u{`)\nx"
        );
        // A name's own `\u{` cannot be taken for an escape.
        let literal = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "a\\u{40}", "kind": "file"},
                {"path": "b\\u{a}\n", "kind": "file"},
                {"path": "c\\x", "kind": "file"},
            ]}),
        );
        assert_eq!(
            literal,
            "./ in workspace laptop: 3 entries (a name's own `\\u{` shows as `\\u{5c}u{`)\n\
             a\\u{5c}u{40}\nb\\u{5c}u{a}\\u{a}\nc\\x"
        );
        let own = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [{"path": "a@", "kind": "file"}]}),
        );
        assert_eq!(
            own,
            "./ in workspace laptop: 1 entry (a name's own final `@` shows as `\\u{40}`)\na\\u{40}"
        );
        let root = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": true, "entries": [{"path": "a", "kind": "file"}]}),
        );
        assert_eq!(
            root,
            "./ in workspace laptop: 1 entry, cut at the entry cap: list a subdirectory or a \
             smaller depth, or find names with glob\na"
        );
        let empty = render(
            ToolName::ListDir,
            json!({"path": "d", "truncated": false, "entries": []}),
        );
        assert_eq!(empty, "d/ in workspace laptop: empty");
        // Entries left out for their names' starting with `.` are counted, so that a model
        // knows to ask for them.
        let hidden = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "hidden": 2,
                   "entries": [{"path": "a", "kind": "file"}]}),
        );
        assert_eq!(
            hidden,
            "./ in workspace laptop: 1 entry (2 entries whose names start with `.` not listed: \
             include_hidden lists them)\na"
        );
        let only_hidden = render(
            ToolName::ListDir,
            json!({"path": "d", "truncated": false, "hidden": 1, "entries": []}),
        );
        assert_eq!(
            only_hidden,
            "d/ in workspace laptop: empty (1 entry whose name starts with `.` not listed: \
             include_hidden lists it)"
        );
    }

    /// Regression: context lines whose numbers a peer sent at the top of the range overflowed
    /// (a panic in a debug build) when the gap between two was looked for.
    #[test]
    fn context_lines_numbered_at_the_end_of_the_range_are_shown() {
        let shown = render(
            ToolName::Search,
            json!({"files_searched": 1, "truncated": false, "matches": [
                {"path": "a.rs", "line_number": u64::MAX, "line": "x", "context": true},
                {"path": "a.rs", "line_number": 1, "line": "y"},
            ]}),
        );
        assert!(shown.contains(&format!("{}- x", u64::MAX)), "{shown}");
        assert!(shown.contains("\n--\n"), "not consecutive: {shown}");
    }

    #[test]
    fn matches_are_path_line_text_grouped_by_file() {
        let shown = render(
            ToolName::Search,
            json!({"files_searched": 7, "truncated": true, "matches": [
                {"path": "a.rs", "line_number": 3, "line": "fn main() {"},
                {"path": "a.rs", "line_number": 9, "line": "    main();"},
                {"path": "b.rs", "line_number": 1, "line": "// main"},
            ]}),
        );
        assert_eq!(
            shown,
            "3 matches in 2 files in workspace laptop (searched 7 files), stopped at \
             `max_results`: raise it, or narrow with `path` or `glob`:\na.rs:3: fn main() {\n\
             a.rs:9:     main();\n\nb.rs:1: // main"
        );
        // Files of one match each follow each other without a blank line; a file of several
        // is set apart.
        let one_each = render(
            ToolName::Search,
            json!({"files_searched": 4, "truncated": false, "matches": [
                {"path": "a.rs", "line_number": 1, "line": "x"},
                {"path": "b.rs", "line_number": 2, "line": "x"},
                {"path": "c.rs", "line_number": 3, "line": "x"},
                {"path": "c.rs", "line_number": 4, "line": "x"},
                {"path": "d.rs", "line_number": 5, "line": "x"},
                {"path": "e.rs", "line_number": 6, "line": "x"},
            ]}),
        );
        assert_eq!(
            one_each,
            "6 matches in 5 files in workspace laptop (searched 4 files):\na.rs:1: x\nb.rs:2: x\n\n\
             c.rs:3: x\nc.rs:4: x\n\nd.rs:5: x\ne.rs:6: x"
        );
        // At the workspace's own cap, asking for more is no advice.
        let capped = render(
            ToolName::Search,
            json!({"files_searched": 7, "truncated": true, "at_cap": true, "matches": [
                {"path": "a.rs", "line_number": 3, "line": "fn main() {"},
            ]}),
        );
        assert!(
            capped.contains(
                "stopped at the workspace's cap (more cannot be asked for): use a more specific \
                 pattern, or read_file the file around these lines"
            ),
            "{capped}"
        );
        assert!(!capped.contains("raise"), "{capped}");
        let capped_in_two = render(
            ToolName::Search,
            json!({"files_searched": 7, "truncated": true, "at_cap": true, "matches": [
                {"path": "a.rs", "line_number": 3, "line": "fn main() {"},
                {"path": "b.rs", "line_number": 3, "line": "fn main() {"},
            ]}),
        );
        assert!(
            capped_in_two.contains("(more cannot be asked for): narrow with `path` or `glob`"),
            "{capped_in_two}"
        );
        assert_eq!(
            render(
                ToolName::Search,
                json!({"files_searched": 1, "truncated": false, "matches": []})
            ),
            "No matches in workspace laptop (searched 1 file)."
        );
        assert!(ToolName::Search.input_schema()["properties"]["max_results"].is_object());
    }

    #[test]
    fn a_path_holding_the_marks_of_a_match_line_is_a_heading_of_its_own() {
        // `app-10:12:33.log:5: ERROR` would read as line 12 of `app-10`.
        let colons = render(
            ToolName::Search,
            json!({"files_searched": 2, "truncated": false, "matches": [
                {"path": "app-10:12:33.log", "line_number": 5, "line": "ERROR"},
                {"path": "b.log", "line_number": 2, "line": "ERROR"},
            ]}),
        );
        assert_eq!(
            colons,
            "2 matches in 2 files in workspace laptop (searched 2 files):\napp-10:12:33.log\n\
             5: ERROR\n\nb.log\n2: ERROR"
        );
        // With lines around the matches, `2024-01-15-post.md-9- text` would read as line 1 of
        // `2024`.
        let dashes = render(
            ToolName::Search,
            json!({"files_searched": 1, "truncated": false, "matches": [
                {"path": "2024-01-15-post.md", "line_number": 8, "line": "before", "context": true},
                {"path": "2024-01-15-post.md", "line_number": 9, "line": "the match"},
                {"path": "2024-01-15-post.md", "line_number": 20, "line": "again"},
            ]}),
        );
        assert_eq!(
            dashes,
            "2 matches in 1 file in workspace laptop (searched 1 file):\n2024-01-15-post.md\n\
             8- before\n9: the match\n--\n20: again"
        );
        // Without them, a dash is no mark: the usual lines.
        let plain = render(
            ToolName::Search,
            json!({"files_searched": 1, "truncated": false, "matches": [
                {"path": "my-file.rs", "line_number": 3, "line": "x"},
            ]}),
        );
        assert!(plain.ends_with(":\nmy-file.rs:3: x"), "{plain}");
        // A heading that would read as a line of the file before it names the file by `./`.
        let spoof = render(
            ToolName::Search,
            json!({"files_searched": 3, "truncated": false, "matches": [
                {"path": "a:b", "line_number": 1, "line": "x"},
                {"path": "12: TODO", "line_number": 4, "line": "y"},
                {"path": "--", "line_number": 2, "line": "z"},
                {"path": "7-up", "line_number": 3, "line": "w"},
                {"path": "7- up", "line_number": 3, "line": "w"},
                {"path": "8:", "line_number": 1, "line": "u"},
                {"path": "v1:x", "line_number": 5, "line": "v"},
            ]}),
        );
        assert_eq!(
            spoof,
            "7 matches in 7 files in workspace laptop (searched 3 files):\na:b\n1: x\n\n\
             ./12: TODO\n4: y\n\n./--\n2: z\n\n7-up\n3: w\n\n./7- up\n3: w\n\n./8:\n1: u\n\n\
             v1:x\n5: v"
        );
    }

    #[test]
    fn a_name_with_a_line_break_stays_on_its_line() {
        // A file name may hold a line break: shown raw, a 2-entry listing printed 3 lines.
        let listing = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "nl\nname.txt", "kind": "file"},
                {"path": "b", "kind": "dir"},
            ]}),
        );
        assert_eq!(listing.lines().count(), 3, "{listing}");
        assert!(listing.contains("\nnl\\u{a}name.txt\nb/"), "{listing}");
        let globbed = render(
            ToolName::Glob,
            json!({"paths": ["nl\nname.txt"], "truncated": false}),
        );
        assert_eq!(globbed.lines().count(), 2, "{globbed}");
        let written = render(
            ToolName::WriteFile,
            json!({"path": "nl\nname.txt", "bytes_written": 1, "created": true, "diff": "",
                   "diff_truncated": false}),
        );
        assert_eq!(written.lines().count(), 1, "{written}");
        let made = render(
            ToolName::WriteFile,
            json!({"path": "a\nb/c.txt", "bytes_written": 1, "created": true, "diff": "",
                   "diff_truncated": false, "created_dirs": ["a\nb"]}),
        );
        assert_eq!(made.lines().count(), 1, "{made}");
    }

    #[test]
    fn a_file_of_crlf_lines_is_shown_without_its_crs_and_says_so() {
        let read = |content: &str| {
            render(
                ToolName::ReadFile,
                json!({"path": "w.txt", "content": content, "start_line": 1,
                       "lines": content.lines().count(), "total_lines": content.lines().count(),
                       "size": content.len(), "binary": false, "truncated": false}),
            )
        };
        assert_eq!(
            read("a\r\nb\r\n"),
            "w.txt in workspace laptop: lines 1-2 of 2, CRLF line endings (not shown; an edit's \
             LF stands for CRLF)\n1\ta\n2\tb"
        );
        // Both endings: as they are (an edit's LF is then an LF), and no word of CRLF.
        let mixed = read("a\r\nb\n");
        assert!(mixed.ends_with("\n1\ta\r\n2\tb"), "{mixed:?}");
        assert!(!mixed.contains("CRLF"), "{mixed}");
        // A CR inside a line is the line's own, and so is a last line's without a line end.
        let inside = read("a\rb\n");
        assert!(inside.ends_with("\n1\ta\rb"), "{inside:?}");
        let last = read("a\r\nb\r");
        assert!(last.ends_with("\n1\ta\n2\tb\r"), "{last:?}");
        // A page of a file says what it saw, not what an edit of the whole file takes.
        let page = render(
            ToolName::ReadFile,
            json!({"path": "w.txt", "content": "c\r\nd\r\n", "start_line": 3, "lines": 2,
                   "size": 99, "binary": false, "truncated": true, "next_offset": 5}),
        );
        assert!(
            page.contains(
                "lines 3-4 (the file goes on: 99 bytes in all), the lines shown end with CRLF \
                 (the CR not shown); read on with offset=5\n3\tc\n4\td"
            ),
            "{page:?}"
        );
    }

    #[test]
    fn a_tab_in_a_name_is_shown_as_its_escape_not_as_spaces() {
        let listing = render(
            ToolName::ListDir,
            json!({"path": "d\tir", "truncated": false, "entries": [
                {"path": "d\tir/a\tb.txt", "kind": "file"},
            ]}),
        );
        assert!(
            listing.starts_with("d\\u{9}ir/ in workspace laptop: 1 entry\na\\u{9}b.txt"),
            "{listing}"
        );
        let globbed = render(
            ToolName::Glob,
            json!({"paths": ["x\ty.rs"], "truncated": false}),
        );
        assert!(globbed.ends_with("\nx\\u{9}y.rs"), "{globbed}");
        let found = render(
            ToolName::Search,
            json!({"matches": [{"path": "t\tab.rs", "line_number": 3, "line": "\tindented"}],
                   "truncated": false, "files_searched": 1}),
        );
        // The path escaped; the line's own tab is text, kept.
        assert!(found.ends_with("\nt\\u{9}ab.rs:3: \tindented"), "{found}");
        let listed = render(
            ToolName::ProcessList,
            json!({"processes": [{"process": "p1", "argv": ["sh", "-c", "a\tb"], "cwd": "t\tx",
                   "running": true, "duration_ms": 5, "unread_bytes": 0}]}),
        );
        assert!(
            listed.ends_with("p1: running for 5 ms, in t\\u{9}x: sh -c 'a\\u{9}b'"),
            "{listed}"
        );
    }

    #[test]
    fn a_names_final_space_is_shown_where_a_line_would_hide_it() {
        let listing = render(
            ToolName::ListDir,
            json!({"path": ".", "truncated": false, "entries": [
                {"path": "notes ", "kind": "file"},
                {"path": "notes", "kind": "file"},
                {"path": "odd \u{1} ", "kind": "file"},
                {"path": "spaced dir ", "kind": "dir"},
                {"path": "a b", "kind": "file"},
            ]}),
        );
        assert_eq!(
            listing,
            "./ in workspace laptop: 5 entries\nnotes\\u{20}\nnotes\nodd \\u{1}\\u{20}\n\
             spaced dir\\u{20}/\na b"
        );
        let globbed = render(
            ToolName::Glob,
            json!({"paths": ["src/a.rs ", "src/a.rs"], "truncated": false}),
        );
        assert!(
            globbed.ends_with(":\nsrc/a.rs\\u{20}\nsrc/a.rs"),
            "{globbed}"
        );
        // A name's own `\u{20}` is not taken for the escape.
        assert_eq!(shown("x\\u{20}"), "x\\u{5c}u{20}");
        assert_eq!(shown("x\\u{20} "), "x\\u{5c}u{20}\\u{20}");
    }

    #[test]
    fn a_glob_or_a_search_says_what_the_replacement_character_stands_for() {
        let globbed = render(
            ToolName::Glob,
            json!({"paths": ["bad\u{FFFD}x.txt"], "truncated": false}),
        );
        assert!(globbed.contains(LOSSY_NOTE), "{globbed}");
        let found = render(
            ToolName::Search,
            json!({"matches": [{"path": "bad\u{FFFD}x.txt", "line_number": 1, "line": "n"}],
                   "truncated": false, "files_searched": 1}),
        );
        assert!(found.contains(LOSSY_NOTE), "{found}");
        let plain = render(
            ToolName::Glob,
            json!({"paths": ["good.txt"], "truncated": false}),
        );
        assert!(!plain.contains("UTF-8"), "{plain}");
    }

    #[test]
    fn glob_is_one_path_per_line() {
        assert_eq!(
            render(
                ToolName::Glob,
                json!({"paths": ["a.rs", "src/b.rs"], "truncated": false})
            ),
            "2 paths in workspace laptop:\na.rs\nsrc/b.rs"
        );
        assert_eq!(
            render(ToolName::Glob, json!({"paths": [], "truncated": false})),
            "No paths match in workspace laptop."
        );
    }

    #[test]
    fn a_command_shows_its_exit_status_then_its_output() {
        let shown = render(
            ToolName::RunCommand,
            json!({"exit_code": 1, "timed_out": false, "stdout": "built\n", "stderr": "oops\n",
                   "stdout_truncated": false, "stderr_truncated": true, "duration_ms": 1500,
                   "sandbox": "landlock"}),
        );
        assert_eq!(
            shown,
            "exit status 1 in workspace laptop, after 1.5 s\n--- stdout\nbuilt\n--- stderr (cut \
             at the output cap)\noops"
        );
        let quiet = render(
            ToolName::RunCommand,
            json!({"signal": 9, "timed_out": true, "stdout": "", "stderr": "",
            "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 30000,
            "sandbox": "none", "network": [
                {"host": "example.com", "port": 443, "allowed": false, "reason": "not in the allowlist"}
            ]}),
        );
        assert_eq!(
            quiet,
            "timed out and was killed in workspace laptop, after 30.0 s (ran without a \
             sandbox); no output\n--- network\nrefused example.com:443: not in the allowlist"
        );
        // Past what an answer carries, connections are counted.
        let counted = render(
            ToolName::RunCommand,
            json!({"exit_code": 0, "timed_out": false, "stdout": "", "stderr": "",
            "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 10,
            "sandbox": "landlock", "network": [
                {"host": "example.com", "port": 443, "allowed": true}
            ], "network_not_shown": 2500}),
        );
        assert!(
            counted.ends_with(
                "\n--- network\nallowed example.com:443\n... and 2500 more connections not shown \
                 (too many for one answer)"
            ),
            "{counted}"
        );
        // A reason quoting what a command asked for stays on its line.
        let forged = render(
            ToolName::RunCommand,
            json!({"exit_code": 0, "timed_out": false, "stdout": "", "stderr": "",
            "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 10,
            "sandbox": "none", "network": [
                {"host": "a\nallowed b", "port": 80, "allowed": false,
                 "reason": "`x\nallowed evil.com:443` is not a host name\u{1b}[2K"}
            ]}),
        );
        assert!(
            forged.ends_with(
                "\n--- network\nrefused a\\u{a}allowed b:80: `x\\u{a}allowed evil.com:443` is \
                 not a host name\\u{1b}[2K"
            ),
            "{forged}"
        );
        let killed = render(
            ToolName::RunCommand,
            json!({"signal": 9, "timed_out": false, "memory_bound": true, "stdout": "",
            "stderr": "", "stdout_truncated": false, "stderr_truncated": false,
            "duration_ms": 300, "sandbox": "landlock"}),
        );
        assert!(
            killed.starts_with(
                "killed by signal 9 in workspace laptop, after 300 ms (meanwhile the kernel \
                 killed a process of this user's commands at their memory bound on the server, \
                 server.max_memory_per_user:"
            ),
            "{killed}"
        );
    }

    /// A command's result with `stdout` (and nothing on stderr).
    fn ran(stdout: &str) -> Value {
        json!({"exit_code": 0, "timed_out": false, "stdout": stdout, "stderr": "",
               "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 10,
               "sandbox": "landlock"})
    }

    #[test]
    fn a_commands_failure_is_read_back_from_its_text() {
        let failure = |tool: ToolName, result: Value| {
            command_failure(tool.as_str(), &render(tool, result)).map(str::to_owned)
        };
        let mut run = ran("out\n");
        assert_eq!(failure(ToolName::RunCommand, run.clone()), None);
        run["exit_code"] = json!(3);
        assert_eq!(
            failure(ToolName::RunCommand, run.clone()).as_deref(),
            Some("exit status 3")
        );
        run["exit_code"] = Value::Null;
        run["signal"] = json!(9);
        assert_eq!(
            failure(ToolName::RunCommand, run.clone()).as_deref(),
            Some("killed by signal 9")
        );
        run["timed_out"] = json!(true);
        assert_eq!(
            failure(ToolName::RunCommand, run).as_deref(),
            Some("timed out and was killed")
        );
        let read = |exit_code: i32, running: bool| {
            json!({"process": "proc-0000000a", "running": running, "exit_code": exit_code,
                   "stdout": "", "stderr": "", "duration_ms": 10})
        };
        assert_eq!(failure(ToolName::ProcessRead, read(0, false)), None);
        assert_eq!(failure(ToolName::ProcessRead, read(0, true)), None);
        assert_eq!(
            failure(ToolName::ProcessRead, read(2, false)).as_deref(),
            Some("exit status 2")
        );
        // Another tool's text that reads alike is no command's.
        assert_eq!(command_failure("read_file", "exit status 3"), None);
        assert_eq!(command_failure("no_such_tool", "exit status 3"), None);
    }

    #[test]
    fn a_long_output_shows_its_first_and_last_lines_and_counts_the_rest() {
        let output: String = (1..=10_000).map(|n| format!("line {n}\n")).collect();
        let shown = render(ToolName::RunCommand, ran(&output));
        let head: String = (1..=128).map(|n| format!("line {n}\n")).collect();
        let tail: String = (9_873..=10_000).map(|n| format!("line {n}\n")).collect();
        let left_out = output.len() - head.len() - tail.len();
        assert_eq!(
            shown,
            format!(
                "exit status 0 in workspace laptop, after 10 ms\n--- stdout: 10000 lines, {} \
                 bytes; its first and last lines are shown here\n{head}[... 9744 lines \
                 ({left_out} bytes) left out of this text; to read them, run the command again \
                 with its output sent to a file, then read_file or search that file ...]\n{}",
                output.len(),
                tail.trim_end()
            )
        );
        // Up to 256 lines and 16 KiB, the output is shown whole.
        let fits: String = (1..=256).map(|n| format!("{n}\n")).collect();
        assert!(render(ToolName::RunCommand, ran(&fits)).ends_with(&fits[..fits.len() - 1]));
        assert!(!render(ToolName::RunCommand, ran(&fits)).contains("left out"));
        // Past it, a few bytes more are shown rather than a notice longer than they are.
        let one_more = format!("{fits}257\n");
        assert!(render(ToolName::RunCommand, ran(&one_more)).ends_with("256\n257"));
        let more: String = (1..=400).map(|n| format!("{n}\n")).collect();
        assert!(render(ToolName::RunCommand, ran(&more)).contains("[... 144 lines (576 bytes)"));
    }

    #[test]
    fn an_output_over_the_cap_shows_its_kept_start_and_end_and_counts_what_was_dropped() {
        let first: String = (1..=1_000).map(|n| format!("{n}\n")).collect();
        let last: String = (99_001..=100_000).map(|n| format!("{n}\n")).collect();
        let mut result = ran(&format!("{first}{last}"));
        result["stdout_truncated"] = json!(true);
        result["stdout_gap"] = json!({"at": first.len(), "dropped": 600_000});
        let shown = render(ToolName::RunCommand, result);
        let head: String = (1..=128).map(|n| format!("{n}\n")).collect();
        let tail: String = (99_873..=100_000).map(|n| format!("{n}\n")).collect();
        let left_out = first.len() - head.len() + 600_000 + last.len() - tail.len();
        assert_eq!(
            shown,
            format!(
                "exit status 0 in workspace laptop, after 10 ms\n--- stdout: {} bytes, more \
                 than the output cap keeps; its first and last lines are shown here\n{head}\
                 [... {left_out} bytes left out of this text, 600000 of them not kept at all \
                 (the output cap); to read them, run the command again with its output sent \
                 to a file, then read_file or search that file ...]\n{}",
                first.len() + last.len() + 600_000,
                tail.trim_end()
            )
        );
        // A peer of an earlier version kept the start only, and said so.
        let mut old = ran("start\n");
        old["stdout_truncated"] = json!(true);
        assert!(render(ToolName::RunCommand, old).contains("--- stdout (cut at the output cap)"));
    }

    #[test]
    fn binary_output_is_counted_not_shown() {
        let garbage: String = "\u{7f}ELF\u{2}\u{1}\u{1}\u{fffd}\u{fffd}\u{3}".repeat(20);
        let shown = render(ToolName::RunCommand, ran(&garbage));
        assert_eq!(
            shown,
            format!(
                "exit status 0 in workspace laptop, after 10 ms\n--- stdout: binary data, \
                 about {} bytes, not shown (the result's `stdout` field holds it as UTF-8, each \
                 byte that is not UTF-8 as U+FFFD; send it to a file to keep it)",
                // The bytes the program wrote: each U+FFFD was one.
                garbage.len() - 2 * 40
            )
        );
        assert!(render(ToolName::RunCommand, ran("a\0b\n")).contains("binary data, 4 bytes"));
        // Cut at the output cap: the program's whole size, and that only its ends are held.
        let mut cut = json!({"exit_code": 0, "timed_out": false, "stdout": "a\0b\nc\0d\n",
                             "stderr": "", "stdout_truncated": true, "stderr_truncated": false,
                             "stdout_gap": {"at": 4, "dropped": 1000}, "duration_ms": 10,
                             "sandbox": "landlock"});
        assert_eq!(
            render(ToolName::RunCommand, cut.clone()),
            "exit status 0 in workspace laptop, after 10 ms\n--- stdout: binary data, 1008 \
             bytes, not shown (the result's `stdout` field holds its first and last bytes only, \
             1000 between them dropped at the output cap, as UTF-8, each byte that is not UTF-8 \
             as U+FFFD; send it to a file to keep it)"
        );
        cut["stdout_gap"] = Value::Null;
        assert!(
            render(ToolName::RunCommand, cut)
                .contains("--- stdout (cut at the output cap): binary data, 8 bytes")
        );
        // Text with a few odd characters, and colours, is text.
        let text = "build \u{1b}[32mok\u{1b}[0m\ncaf\u{fffd}\n";
        assert!(render(ToolName::RunCommand, ran(text)).ends_with("caf\u{fffd}"));
    }

    #[test]
    fn an_output_cut_anywhere_keeps_every_byte_between_its_two_ends() {
        let long_line = "é".repeat(300_000);
        let cases = [
            // One line of 600,000 bytes, of two-byte characters.
            long_line.clone(),
            // Long lines around short ones, and short ones around a long one.
            format!("{}\n{long_line}\n{}", "a\n".repeat(50), "b\n".repeat(50)),
            format!("{long_line}\nshort\n{long_line}"),
            "x\n".repeat(400),
            format!(
                "{}\n",
                "y".repeat(2 * STREAM_END_BYTES + LEFT_OUT_MIN_BYTES + 1)
            ),
            "\n".repeat(1_000),
        ];
        for text in cases {
            let text = text.strip_suffix('\n').unwrap_or(&text);
            let parts = abridge(text).expect("too long to be shown whole");
            assert!(parts.head.len() <= STREAM_END_BYTES && parts.tail.len() <= STREAM_END_BYTES);
            assert!(count_lines(parts.head) <= STREAM_END_LINES as u64);
            assert!(count_lines(parts.tail) <= STREAM_END_LINES as u64);
            // The head, what was left out and the tail are the text, in order.
            let head_end = text[parts.head.len()..]
                .strip_prefix('\n')
                .map_or(parts.head.len(), |_| parts.head.len() + 1);
            let middle = &text[head_end..text.len() - parts.tail.len()];
            assert!(text.starts_with(parts.head) && text.ends_with(parts.tail));
            assert_eq!(parts.left_out_bytes, middle.len() as u64);
            assert_eq!(
                parts.left_out_lines,
                middle.matches('\n').count() as u64,
                "{:?}",
                &text[..40.min(text.len())]
            );
        }
        assert_eq!(abridge(""), None);
        assert_eq!(abridge(&"z".repeat(2 * STREAM_END_BYTES)), None);
        // Just past the limits, what would be left out is shorter than the notice.
        assert_eq!(abridge(&"x\n".repeat(300)), None);
        assert_eq!(abridge(&"z".repeat(2 * STREAM_END_BYTES + 1)), None);
    }

    #[test]
    fn a_long_read_of_a_background_process_is_shown_by_its_two_ends_too() {
        let output = "tick\n".repeat(5_000);
        let shown = render(
            ToolName::ProcessRead,
            json!({"process": "p", "running": true, "stdout": output, "stderr": "",
                   "duration_ms": 5}),
        );
        assert!(shown.contains("--- stdout: 5000 lines, 25000 bytes; its first and last"));
        // Running it again is no way to read what a read took: the advice is for next time.
        assert!(
            shown.contains(
                "[... 4744 lines (23720 bytes) left out of this text; a read takes them, so \
                 they cannot be read again; to keep all of a long-running command's output, \
                 start it with its output sent to a file"
            ),
            "{shown}"
        );
        assert!(shown.len() < 3_000, "{}", shown.len());
    }

    #[test]
    fn a_background_command_gives_its_process_id_and_how_to_read_on() {
        let shown = render(
            ToolName::RunCommand,
            json!({"timed_out": false, "stdout": "starting\n", "stderr": "",
                   "stdout_truncated": false, "stderr_truncated": false, "duration_ms": 2000,
                   "sandbox": "landlock", "process": "proc-7"}),
        );
        assert_eq!(
            shown,
            "Running in the background in workspace laptop as process proc-7 (for 2.0 s): read \
             its output with process_read {\"process\": \"proc-7\"}, stop it with \
             process_kill\n--- stdout\nstarting"
        );
        let read = render(
            ToolName::ProcessRead,
            json!({"process": "proc-7", "running": false, "exit_code": 0, "stdout": "",
                   "stderr": "warn\n", "stderr_dropped": 10, "duration_ms": 61000}),
        );
        assert_eq!(
            read,
            "Process proc-7 in workspace laptop: exit status 0 after 1 min 1 s\n--- stderr (10 \
             older bytes were dropped)\nwarn"
        );
        let again = render(
            ToolName::ProcessRead,
            json!({"process": "proc-7", "running": true, "stdout": "b\nc\n", "stderr": "",
                   "last_lines": 2, "duration_ms": 61000}),
        );
        assert_eq!(
            again,
            "Process proc-7 in workspace laptop: running for 1 min 1 s; each stream's last 2 \
             lines, read before or not (read again for more; `wait_ms` waits for it)\n--- \
             stdout\nb\nc"
        );
        let running = render(
            ToolName::ProcessRead,
            json!({"process": "p", "running": true, "stdout": "", "stderr": "",
                   "duration_ms": 5}),
        );
        assert_eq!(
            running,
            "Process p in workspace laptop: running for 5 ms; no new output (read again for \
             more; `wait_ms` waits for it)"
        );
    }

    #[test]
    fn processes_writes_and_kills_read_as_sentences() {
        let list = render(
            ToolName::ProcessList,
            json!({"processes": [
                {"process": "p1", "argv": ["sh", "-c", "sleep 9; echo 'hi'"], "cwd": ".",
                 "running": true, "duration_ms": 3000, "unread_bytes": 0, "workspace": "laptop"},
                {"process": "p2", "argv": ["make"], "cwd": "src", "running": false,
                 "exit_code": 2, "duration_ms": 10, "unread_bytes": 5, "workspace": "primary"},
            ], "unavailable": [{"workspace": "old", "code": "workspace_disconnected",
                               "message": "offline"}]}),
        );
        // Gathered from the workspaces that have some: each line names its own.
        assert_eq!(
            list,
            "2 background processes:\np1: running for 3.0 s, workspace laptop: sh -c \"sleep 9; \
             echo 'hi'\"\np2: exit status 2, workspace primary, in src, 5 bytes unread: \
             make\nnot listed: workspace old: workspace_disconnected: offline"
        );
        let one = render(
            ToolName::ProcessList,
            json!({"processes": [{"process": "p3", "argv": ["make"], "cwd": ".", "running": true,
                                  "duration_ms": 10, "unread_bytes": 0}],
                   "unavailable": []}),
        );
        assert_eq!(
            one,
            "1 background process in workspace laptop:\np3: running for 10 ms: make"
        );
        assert_eq!(
            render(
                ToolName::ProcessWrite,
                json!({"process": "p1", "bytes_written": 3, "stdin_closed": true})
            ),
            "Wrote 3 bytes to the standard input of process p1 in workspace laptop, and closed it."
        );
        assert_eq!(
            render(
                ToolName::ProcessKill,
                json!({"process": "p1", "signal": "TERM", "delivered": true})
            ),
            "Sent TERM to process p1 in workspace laptop."
        );
    }

    #[test]
    fn writes_and_edits_show_their_diff() {
        let diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(
            render(
                ToolName::EditFile,
                json!({"path": "x", "created": false, "bytes_written": 2, "replacements": 1,
                       "diff": diff, "diff_truncated": false})
            ),
            format!(
                "Edited x in workspace laptop: 1 replacement, 2 bytes now:\n{}",
                diff.trim_end()
            )
        );
        assert_eq!(
            render(
                ToolName::WriteFile,
                json!({"path": "n/y", "created": true, "bytes_written": 1, "diff": "+z\n",
                       "diff_truncated": true})
            ),
            "Created n/y in workspace laptop (1 byte)."
        );
        assert_eq!(
            render(
                ToolName::WriteFile,
                json!({"path": "n/y", "created": false, "bytes_written": 1, "diff": "+z\n",
                       "diff_truncated": true})
            ),
            "Wrote n/y in workspace laptop (1 byte): (the diff is cut at the cap; read_file \
             shows the file as it is now)\n+z"
        );
        assert_eq!(
            render(
                ToolName::WriteFile,
                json!({"path": "y", "created": false, "bytes_written": 1, "diff": "",
                       "diff_truncated": false})
            ),
            "Wrote y in workspace laptop (1 byte): no change."
        );
    }

    #[test]
    fn stat_workspaces_and_memory_are_one_line_each() {
        assert_eq!(
            render(
                ToolName::Stat,
                json!({"path": "l", "kind": "symlink", "size": 3, "mode": "0777",
                       "readonly": false, "modified_unix": 1_764_158_400i64,
                       "link_target": "../x"})
            ),
            "l in workspace laptop: symbolic link to ../x, 3 bytes, mode 0777, modified \
             2025-11-26 12:00:00 UTC"
        );
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
        let ws = render(
            ToolName::Workspaces,
            json!({"session": "default", "workspaces": [
                {"name": "primary", "uri": "server:/sessions/default", "trust": "full",
                 "host": "server", "online": true, "tools": ["read_file"]},
                {"name": "laptop", "uri": "mac:~/p", "trust": "restricted", "host": "client",
                 "online": false, "tools": [], "network": "network to pypi.org only\u{202e}"},
            ]}),
        );
        assert_eq!(
            ws,
            "Session default: 2 workspaces\nprimary (server:/sessions/default): on the server, \
             trusted (runs at once)\nlaptop (mac:~/p): attached from a user's machine, \
             restricted (each action needs its user's approval), commands get network to \
             pypi.org only\\u{202e}, offline"
        );
        let focused = render(
            ToolName::Workspaces,
            json!({"session": "default", "focus": "laptop",
                   "routing": "Calls without `workspace` try laptop (the focus) first.",
                   "workspaces": [
                {"name": "primary", "uri": "server:/sessions/default", "trust": "full",
                 "host": "server", "online": true, "tools": ["read_file"]},
                {"name": "laptop", "uri": "mac:~/p", "trust": "restricted", "host": "client",
                 "online": true, "tools": []},
            ]}),
        );
        assert!(
            focused.ends_with(
                "laptop (mac:~/p): attached from a user's machine, restricted (each action \
                 needs its user's approval), the focus\nCalls without `workspace` try laptop \
                 (the focus) first."
            ),
            "{focused}"
        );
        assert_eq!(
            render(
                ToolName::MemoryStore,
                json!({"key": "plan", "stored": true})
            ),
            "Stored the note `plan`."
        );
        assert_eq!(
            render(
                ToolName::MemoryRecall,
                json!({"notes": [{"key": "plan", "text": "ship it\n"}]})
            ),
            "1 note:\n\n## plan\nship it"
        );
        assert_eq!(
            render(ToolName::MemoryRecall, json!({"notes": []})),
            "No notes."
        );
        // A query that matched nothing does not read as an empty memory.
        assert_eq!(
            render(
                ToolName::MemoryRecall,
                json!({"notes": [], "not_matching": 3})
            ),
            "No note matches the query; the memory holds 3 notes (without `query`, every note)."
        );
        assert_eq!(
            render(
                ToolName::MemoryRecall,
                json!({"notes": [{"key": "plan", "text": "ship it"}], "not_matching": 1})
            ),
            "1 note (1 other note the query did not match; without `query`, every note):\n\n\
             ## plan\nship it"
        );
        // Notes left out for the answer's size are said to be there, and how to get them.
        assert_eq!(
            render(
                ToolName::MemoryRecall,
                json!({"notes": [{"key": "a", "text": "x"}], "not_shown": 2})
            ),
            "1 note; 2 notes not shown: one recall holds at most 256 KiB of notes and reads at \
             most 16 MiB (`read_file` of `memory/KEY.md` in the primary workspace reads any \
             note; `list_dir` of `memory` lists them):\n\n## a\nx"
        );
        assert_eq!(
            render(
                ToolName::MemoryRecall,
                json!({"notes": [], "not_matching": 1, "not_shown": 1})
            ),
            "No note shown: 1 note the query did not match; 1 note not shown: one recall holds \
             at most 256 KiB of notes and reads at most 16 MiB (`read_file` of `memory/KEY.md` in \
             the primary workspace reads any note; `list_dir` of `memory` lists them)."
        );
    }

    #[test]
    fn a_result_of_another_shape_is_shown_as_json_and_no_workspace_is_no_clause() {
        let odd = json!({"unexpected": 1});
        assert_eq!(
            render(ToolName::Glob, odd.clone()),
            serde_json::to_string_pretty(&odd).unwrap()
        );
        assert_eq!(
            text(
                ToolName::Glob,
                None,
                &json!({"paths": ["a"], "truncated": false})
            ),
            "1 path:\na"
        );
    }

    /// The reference MCP filesystem server (`@modelcontextprotocol/server-filesystem`) answers
    /// `list_directory` with one `[FILE] name` or `[DIR] name` line per entry, joined by `\n`,
    /// and `read_text_file` with the file's text as it is. The suite measures the same calls
    /// against the real server (`mcp::text_is_within_a_tenth_of_the_reference_server`); this
    /// pins the budget without it.
    #[test]
    fn text_stays_within_a_tenth_of_the_reference_servers_format() {
        let entries: Vec<Value> = (0..1000)
            .map(|i| json!({"path": format!("many/f{i:04}.txt"), "kind": "file"}))
            .collect();
        let reference: usize = (0..1000)
            .map(|i| format!("[FILE] f{i:04}.txt").len())
            .sum::<usize>()
            + 999;
        let ours = render(
            ToolName::ListDir,
            json!({"path": "many", "entries": entries, "truncated": false}),
        );
        assert!(
            ours.len() * 10 <= reference * 11,
            "{} vs {reference}",
            ours.len()
        );

        let line = "the quick brown fox jumps over the lazy dog, again and again.\n";
        let content: String = line.repeat(4096 / line.len() + 1)[..4096].to_owned();
        let lines = content.split_inclusive('\n').count() as u64;
        let ours = render(
            ToolName::ReadFile,
            json!({"path": "bench.txt", "content": content, "start_line": 1, "lines": lines,
                   "total_lines": lines, "size": 4096, "binary": false, "truncated": false}),
        );
        assert!(ours.len() * 10 <= 4096 * 11, "{} vs 4096", ours.len());
    }

    #[test]
    fn tool_help_lists_every_argument_from_the_schema() {
        let help = tool_help(ToolName::ReadFile);
        assert!(
            help.starts_with("read_file (read tool)\n\nRead a UTF-8"),
            "{help}"
        );
        assert!(help.contains("\n  path: string, required\n"), "{help}");
        assert!(help.contains("\n  offset: integer, optional\n"), "{help}");
        assert!(help.contains("\n  workspace: string, optional\n"), "{help}");
        let run = tool_help(ToolName::RunCommand);
        assert!(
            run.contains("\n  argv: list of string, required\n"),
            "{run}"
        );
        for tool in ToolName::ALL {
            let help = tool_help(tool);
            for name in tool.input_schema()["properties"]
                .as_object()
                .unwrap()
                .keys()
            {
                assert!(help.contains(&format!("\n  {name}: ")), "{tool}: {name}");
            }
            assert!(tool_summary(tool).ends_with('.'), "{tool}");
        }
    }
}
