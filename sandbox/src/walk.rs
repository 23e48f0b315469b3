//! `search` and `glob`: a directory walk through the jail's handles, with ripgrep's matchers.
//!
//! The walk is written here rather than taken from `ignore::WalkBuilder` on purpose: that walker
//! opens directories and files by path with the process's ambient authority, so a directory
//! swapped for a symbolic link mid-walk would lead it outside the root. This walk opens every
//! directory with `O_NOFOLLOW` relative to its already-open parent and every file with
//! `O_NOFOLLOW | O_NONBLOCK`, so it can only ever see what is beneath the root. Matching still
//! uses ripgrep's crates: `ignore`'s gitignore and override matchers, `globset`, `grep-regex` and
//! `grep-searcher`.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::decode::Encoding;
use cap_fs_ext::DirExt;
use cap_std::fs::Dir;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{
    BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use monad_protocol::tools::{
    GlobArgs, GlobResult, MAX_SEARCH_CONTEXT, SearchArgs, SearchMatch, SearchResult,
};

use crate::error::{EscapeReason, SandboxError};
use crate::jail::{Jail, JailPath, open_regular_nofollow};
use crate::limits::Limits;

/// Directories deeper than this below the starting point are not entered.
const MAX_DEPTH: usize = 256;
/// Ignore files larger than this are not read.
const MAX_IGNORE_FILE_BYTES: u64 = 1024 * 1024;

/// What a visitor tells the walk.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// Options of one walk.
struct Walk<'a> {
    include_hidden: bool,
    visit: &'a mut dyn FnMut(&Dir, &OsStr, &str) -> Flow,
}

impl Walk<'_> {
    /// Walks the files under `start` (a directory or a single file) in path order.
    fn run(&mut self, jail: &Jail, start: &JailPath) -> Result<(), SandboxError> {
        let meta = jail
            .dir()
            .metadata(start.rel())
            .map_err(|e| SandboxError::from_io("search", start.given(), e))?;
        if meta.is_file() {
            // A file named explicitly is searched even when an ignore file would skip it; named
            // through a link, the file it leads to inside the root (never followed out of it).
            let start = jail.through_final_link(start)?;
            // The root, when a link put there since the look above leads to it: a directory
            // now, said as the search of a file would say it.
            let (parent, name) = start.split().ok_or_else(|| SandboxError::WrongFileType {
                path: start.given().to_owned(),
                what: "was changed into a directory while the search started; search again",
            })?;
            let dir = jail.open_dir(&parent)?;
            (self.visit)(&dir, name, &start.display());
            return Ok(());
        }
        if !meta.is_dir() {
            return Err(SandboxError::Escape {
                path: start.given().to_owned(),
                reason: EscapeReason::SpecialFile,
            });
        }
        let dir = jail.open_dir(start)?;
        // Ignore files of the directories above the start apply too.
        let mut stack = Vec::new();
        let mut ancestor = JailPath::clone(start);
        let mut ancestors = Vec::new();
        while let Some((parent, _)) = ancestor.split() {
            ancestors.push(parent.clone());
            ancestor = parent;
        }
        for dir_path in ancestors.iter().rev() {
            if let Ok(d) = jail.open_dir(dir_path) {
                stack.extend(load_ignore(&d, dir_path_rel(dir_path)));
            }
        }
        let prefix = if start.is_root() {
            String::new()
        } else {
            format!("{}/", start.display())
        };
        self.dir(&dir, &prefix, &mut stack, 0);
        Ok(())
    }

    /// Walks one directory; returns `Flow::Stop` when the visitor asked to stop.
    fn dir(&mut self, dir: &Dir, prefix: &str, stack: &mut Vec<Gitignore>, depth: usize) -> Flow {
        let pushed = match load_ignore(dir, prefix.trim_end_matches('/')) {
            Some(gi) => {
                stack.push(gi);
                true
            }
            None => false,
        };
        let flow = self.entries(dir, prefix, stack, depth);
        if pushed {
            stack.pop();
        }
        flow
    }

    fn entries(
        &mut self,
        dir: &Dir,
        prefix: &str,
        stack: &mut Vec<Gitignore>,
        depth: usize,
    ) -> Flow {
        let Ok(read) = dir.entries() else {
            return Flow::Continue;
        };
        let mut entries: Vec<(std::ffi::OsString, cap_std::fs::FileType)> = read
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.file_name(), e.file_type().ok()?)))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in entries {
            if crate::cancel::cancelled() {
                return Flow::Stop;
            }
            let bytes = name.as_encoded_bytes();
            if bytes == b".git" || (!self.include_hidden && bytes.first() == Some(&b'.')) {
                continue;
            }
            if kind.is_symlink() {
                continue; // never followed
            }
            let rel = format!("{prefix}{}", name.to_string_lossy());
            let is_dir = kind.is_dir();
            if !(is_dir || kind.is_file()) {
                continue;
            }
            if ignored(stack, &rel, is_dir) {
                continue;
            }
            if is_dir {
                if depth + 1 >= MAX_DEPTH {
                    continue;
                }
                let Ok(sub) = dir.open_dir_nofollow(&name) else {
                    continue;
                };
                if self.dir(&sub, &format!("{rel}/"), stack, depth + 1) == Flow::Stop {
                    return Flow::Stop;
                }
            } else if (self.visit)(dir, &name, &rel) == Flow::Stop {
                return Flow::Stop;
            }
        }
        Flow::Continue
    }
}

fn dir_path_rel(path: &JailPath) -> &str {
    let rel = path.rel().to_str().unwrap_or("");
    if rel == "." { "" } else { rel }
}

/// The matcher for `.gitignore` and `.ignore` in `dir` (whose path relative to the root is
/// `rel`), or `None` when it has neither.
fn load_ignore(dir: &Dir, rel: &str) -> Option<Gitignore> {
    let mut builder: Option<GitignoreBuilder> = None;
    for name in [".gitignore", ".ignore"] {
        // Looked at before it is opened: a FIFO or a device of that name is not opened (its
        // open is its driver's, or wakes a FIFO's writer). Other files come from the listing,
        // whose kinds are known.
        if !dir.symlink_metadata(name).is_ok_and(|meta| meta.is_file()) {
            continue;
        }
        let Ok((mut file, meta)) = open_regular_nofollow(dir, Path::new(name), name) else {
            continue;
        };
        if meta.len() > MAX_IGNORE_FILE_BYTES {
            continue;
        }
        let mut text = String::new();
        if (&mut file)
            .take(MAX_IGNORE_FILE_BYTES)
            .read_to_string(&mut text)
            .is_err()
        {
            continue;
        }
        let builder = builder.get_or_insert_with(|| GitignoreBuilder::new(virtual_path(rel)));
        let from = Some(virtual_path(rel).join(name));
        for line in text.lines() {
            // A malformed line is skipped, as git does.
            let _ = builder.add_line(from.clone(), line);
        }
    }
    builder.and_then(|b| b.build().ok())
}

/// Largest compiled pattern a search takes, in bytes (`grep-regex` allows 100 MiB: a few
/// hundred repeats of a Unicode class, `\w{2000}`, reach it).
const PATTERN_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Largest cache of the lazy DFA one search keeps, in bytes (`grep-regex` allows 1 GiB, a
/// thread): past it the cache starts again, slower, rather than grow. On a shared server every
/// user's searches run on the same machine.
const PATTERN_CACHE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The search's matcher for `args.pattern`, or why the pattern is not one.
pub(crate) fn matcher(args: &SearchArgs) -> Result<grep_regex::RegexMatcher, SandboxError> {
    let case_insensitive = args.case_insensitive.unwrap_or(false);
    RegexMatcherBuilder::new()
        .case_insensitive(case_insensitive)
        .size_limit(PATTERN_MAX_BYTES)
        .dfa_size_limit(PATTERN_CACHE_MAX_BYTES)
        .line_terminator(Some(b'\n'))
        .build(&args.pattern)
        .map_err(|e| {
            // `grep-regex` reports the pattern as it wraps it (`(?:...)`), the caret under its
            // own text; the parser's own error points into the pattern as given.
            let parsed = regex_syntax::ParserBuilder::new()
                .case_insensitive(case_insensitive)
                .build()
                .parse(&args.pattern);
            let said = match parsed {
                Err(own) => own.to_string(),
                Ok(_) => e.to_string(),
            };
            // It repeats the pattern: escaped, its lines kept (the caret has a line of its own).
            let said = monad_protocol::text::printable_lines(&said);
            SandboxError::InvalidArguments(format!("invalid regular expression: {said}"))
        })
}

/// A glob that does not parse, said with the glob's own words for why, escaped (it repeats the
/// glob).
pub(crate) fn invalid_glob(error: impl std::fmt::Display) -> SandboxError {
    SandboxError::InvalidArguments(format!(
        "invalid glob: {}",
        crate::error::shown(&error.to_string())
    ))
}

/// Paths are matched as if the root were `/`, so each matcher strips its own directory.
fn virtual_path(rel: &str) -> PathBuf {
    Path::new("/").join(rel)
}

fn ignored(stack: &[Gitignore], rel: &str, is_dir: bool) -> bool {
    if stack.is_empty() {
        return false;
    }
    let path = virtual_path(rel);
    for gi in stack.iter().rev() {
        match gi.matched(&path, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
    }
    false
}

/// The most a search holds of a line (grep-searcher's buffer, which must hold a line whole):
/// a longer line stops its file's search, said in the result.
pub const SEARCH_LINE_MAX: usize = 16 * 1024 * 1024;

pub(crate) fn search(
    jail: &Jail,
    limits: &Limits,
    args: &SearchArgs,
) -> Result<SearchResult, SandboxError> {
    let max = match args.max_results {
        Some(0) => {
            return Err(SandboxError::InvalidArguments(
                "`max_results` must be at least 1".into(),
            ));
        }
        Some(n) => (n as usize).min(limits.search_max_results),
        None => limits.search_max_results,
    };
    let files_only = args.files_only.unwrap_or(false);
    let context = match args.context.unwrap_or(0) {
        _ if files_only => 0,
        n if n > MAX_SEARCH_CONTEXT => {
            return Err(SandboxError::InvalidArguments(format!(
                "`context` is at most {MAX_SEARCH_CONTEXT} lines; read_file shows more of a file"
            )));
        }
        n => n as usize,
    };
    let matcher = matcher(args)?;
    let start = jail.resolve(args.path.as_deref().unwrap_or(""))?;
    let filter = match &args.glob {
        Some(glob) => {
            let mut builder =
                ignore::overrides::OverrideBuilder::new(virtual_path(dir_path_rel(&start)));
            builder.add(glob).map_err(invalid_glob)?;
            Some(builder.build().map_err(invalid_glob)?)
        }
        None => None,
    };
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(0))
        // A line is held whole to be searched: one of gigabytes (a file of one line) would
        // be held whole, three times over, in the server's or the laptop's memory.
        .heap_limit(Some(SEARCH_LINE_MAX))
        .before_context(context)
        .after_context(context)
        .build();
    let mut sink = Collect {
        matcher: &matcher,
        files_only,
        found: 0,
        binary: 0,
        late_nul: None,
        stopped_at_binary: Vec::new(),
        stopped_at_long_line: Vec::new(),
        path: String::new(),
        matches: Vec::new(),
        max,
        max_line_chars: limits.search_max_line_chars,
        truncated: false,
        sniff_bytes: limits.read_max_bytes,
    };
    let mut before_nul = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::none())
        .heap_limit(Some(SEARCH_LINE_MAX))
        .before_context(context)
        .after_context(context)
        .build();
    let mut files_searched = 0u64;
    let mut visit = |dir: &Dir, name: &OsStr, rel: &str| {
        if let Some(filter) = &filter
            && filter.matched(virtual_path(rel), false).is_ignore()
        {
            return Flow::Continue;
        }
        let Ok((file, meta)) = open_regular_nofollow(dir, Path::new(name), rel) else {
            return Flow::Continue;
        };
        files_searched += 1;
        sink.path.clear();
        sink.path.push_str(rel);
        // An unreadable file is skipped like ripgrep does; its matches so far are kept.
        let file = file.into_std();
        let mut in_file = InFile {
            collect: &mut sink,
            file: &file,
            len: meta.len(),
            encoding: None,
        };
        if let Err(e) = searcher.search_file(&matcher, &file, &mut in_file)
            && e.to_string().contains("allocation limit")
        {
            sink.stopped_at_long_line.push(rel.to_owned());
        }
        // Stopped at a NUL past the start: the searcher leaves unsearched what it had read
        // with the NUL (up to its buffer, 64 KiB, before it), so the part before the NUL is
        // searched again, whole, in place of what the first pass found of it.
        if let Some(at) = sink.late_nul.take() {
            let kept = sink
                .matches
                .iter()
                .rposition(|m| m.path != rel)
                .map_or(0, |i| i + 1);
            if kept < sink.matches.len() {
                sink.matches.truncate(kept);
                sink.found = sink.matches.iter().filter(|m| !m.context).count();
                sink.truncated = false;
            }
            let mut in_file = InFile {
                collect: &mut sink,
                file: &file,
                len: meta.len(),
                encoding: None,
            };
            let mut head = &file;
            if std::io::Seek::seek(&mut head, std::io::SeekFrom::Start(0)).is_ok() {
                let _ =
                    before_nul.search_reader(&matcher, std::io::Read::take(head, at), &mut in_file);
            }
        }
        if sink.truncated {
            Flow::Stop
        } else {
            Flow::Continue
        }
    };
    Walk {
        include_hidden: args.include_hidden.unwrap_or(false),
        visit: &mut visit,
    }
    .run(jail, &start)?;
    Ok(SearchResult {
        at_cap: sink.truncated && max == limits.search_max_results,
        matches: sink.matches,
        files_only,
        files_searched,
        truncated: sink.truncated,
        binary_skipped: sink.binary,
        stopped_at_binary: sink.stopped_at_binary,
        stopped_at_long_line: sink.stopped_at_long_line,
    })
}

/// A matched line as `search` shows it: without its line ending, decoded as `encoding`, and a
/// very long one cut to `max_chars` characters around the match's first byte in `bytes` (`at`,
/// asked only then: it runs the matcher again).
fn shown_line(
    bytes: &[u8],
    at: impl FnOnce() -> Option<usize>,
    encoding: Encoding,
    max_chars: usize,
) -> String {
    let mut line = crate::decode::decode(bytes, encoding);
    let trimmed = line.trim_end_matches(['\n', '\r']).len();
    line.truncate(trimmed);
    if line.chars().nth(max_chars).is_some() {
        // Where the match starts, in the line as text: a byte that is not UTF-8 became two or
        // three there.
        let at = at().map_or(0, |at| crate::decode::decode(&bytes[..at], encoding).len());
        line = window(&line, at, max_chars);
    }
    line
}

/// Collects matching lines, and the lines around them (`context`), up to a cap of matches.
struct Collect<'m> {
    /// The search's matcher, to find where in a long line the match is.
    matcher: &'m grep_regex::RegexMatcher,
    /// Each file's first match only (`files_only`): the cap counts files.
    files_only: bool,
    /// Matches in `matches` (the rest are lines around them).
    found: usize,
    /// Files skipped as binary: a NUL byte at their start.
    binary: u64,
    /// Where the current file's search stopped at a NUL past its start.
    late_nul: Option<u64>,
    /// Files whose search stopped at a NUL byte past their start.
    stopped_at_binary: Vec<String>,
    /// Files whose search stopped at a line over [`SEARCH_LINE_MAX`].
    stopped_at_long_line: Vec<String>,
    path: String,
    matches: Vec<SearchMatch>,
    max: usize,
    max_line_chars: usize,
    truncated: bool,
    /// How much of a file is looked at to tell its encoding: what a `read_file` reads.
    sniff_bytes: u64,
}

/// [`Collect`] for one file: what a search of it gives is collected, its lines shown as
/// `read_file` shows the file.
struct InFile<'a, 'm> {
    collect: &'a mut Collect<'m>,
    file: &'a std::fs::File,
    /// The file's size, to read its start.
    len: u64,
    /// How its lines that are not UTF-8 are decoded, once one was met.
    encoding: Option<Encoding>,
}

impl InFile<'_, '_> {
    /// How the file's lines that are not UTF-8 are shown: as `read_file` shows the file, its
    /// encoding told from what a read of it holds (Windows-1252, or UTF-8 with stray bytes), the
    /// same for every line. Line by line, one Latin-1 line of a UTF-8 file read `café` where
    /// `read_file` (and so `edit_file`) has `caf\u{FFFD}`. Looked at once per file, at its first
    /// such line (`read_start` reads at an offset: the search's own reading is not moved).
    fn encoding(&mut self) -> Encoding {
        let (file, len, sniff) = (self.file, self.len, self.collect.sniff_bytes);
        *self.encoding.get_or_insert_with(|| {
            // What a read of the file holds (nothing, when it cannot be read: then as UTF-8).
            let head = crate::fs::read_start(file, len, sniff).unwrap_or_default();
            match crate::decode::guess(&head) {
                crate::decode::Guess::Text(Encoding::Latin1) => Encoding::Latin1,
                // UTF-8 with stray bytes, or what a read would not show as these lines (UTF-16,
                // binary): the bytes that are not UTF-8 as U+FFFD.
                _ => Encoding::Utf8,
            }
        })
    }
}

impl Sink for &mut InFile<'_, '_> {
    type Error = std::io::Error;

    /// A NUL byte stops the file's search (ripgrep's binary detection). One past the part
    /// `read_file` looks at to tell text from binary is in a file shown as text: said, so that
    /// "no matches" is not taken for the whole file's answer.
    fn binary_data(&mut self, _: &Searcher, offset: u64) -> Result<bool, std::io::Error> {
        let collect = &mut *self.collect;
        if offset >= crate::decode::SNIFF as u64 {
            collect.stopped_at_binary.push(collect.path.clone());
            collect.late_nul = Some(offset);
        } else {
            collect.binary += 1;
        }
        Ok(false)
    }

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, std::io::Error> {
        if self.collect.found >= self.collect.max {
            self.collect.truncated = true;
            return Ok(false);
        }
        self.collect.found += 1;
        self.push(mat.bytes(), mat.line_number(), false);
        // One line names the file: the rest of it is not searched.
        Ok(!self.collect.files_only)
    }

    /// A line around a match. One before a match past the cap is left out with that match
    /// (the searcher gives it before it knows the match is refused).
    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, std::io::Error> {
        let before = matches!(ctx.kind(), SinkContextKind::Before);
        if !(before && self.collect.found >= self.collect.max) {
            self.push(ctx.bytes(), ctx.line_number(), true);
        }
        Ok(true)
    }
}

impl InFile<'_, '_> {
    /// Adds the line `bytes` (number `line_number`), a match or a line around one (`context`),
    /// shown as `read_file` shows its file.
    fn push(&mut self, bytes: &[u8], line_number: Option<u64>, context: bool) {
        let encoding = if std::str::from_utf8(bytes).is_ok() {
            Encoding::Utf8
        } else {
            self.encoding()
        };
        let matcher = self.collect.matcher;
        let at = || {
            grep_matcher::Matcher::find(matcher, bytes)
                .ok()
                .flatten()
                .map(|m| m.start())
        };
        let line = shown_line(bytes, at, encoding, self.collect.max_line_chars);
        self.collect.matches.push(SearchMatch {
            path: self.collect.path.clone(),
            line_number: line_number.unwrap_or(0),
            line,
            context,
        });
    }
}

/// `max_chars` characters of a long `line` around byte `at` (where the match starts), with `…`
/// where it was cut: from the line's start when the match is within its first half, else from
/// a little before the match. A minified file's match ten thousand characters in was shown as
/// the line's start, without it.
fn window(line: &str, at: usize, max_chars: usize) -> String {
    let before = monad_protocol::text::head(line, at).chars().count();
    let lead = max_chars / 4;
    let start_char = if before <= max_chars / 2 {
        0
    } else {
        before - lead
    };
    let start = line
        .char_indices()
        .nth(start_char)
        .map_or(line.len(), |(i, _)| i);
    let shown: String = line[start..].chars().take(max_chars).collect();
    let cut_end = start + shown.len() < line.len();
    let mut out = String::with_capacity(shown.len() + 8);
    if start > 0 {
        out.push('…');
    }
    out.push_str(&shown);
    if cut_end {
        out.push('…');
    }
    out
}

/// An absolute pattern as one relative to the root (agents give absolute paths: the part
/// before the first wildcard is taken as a path, as every tool takes one), or `None` for a
/// relative one. One that starts outside the root is refused, saying how to write it.
fn rooted_pattern(jail: &Jail, pattern: &str) -> Result<Option<String>, SandboxError> {
    if !pattern.starts_with('/') {
        return Ok(None);
    }
    let outside = || {
        SandboxError::InvalidArguments(format!(
            "`pattern` {} starts outside the workspace root; patterns are matched \
             against paths relative to the root (or to `path`), such as `**/*.rs`",
            crate::error::shown(pattern)
        ))
    };
    // The root (its name may hold `[` or `{`) is taken off first, then what comes before the
    // first wildcard is folded as a path relative to it.
    let relative = jail.strip_root(pattern).ok_or_else(outside)?;
    let wild = |part: &str| part.contains(['*', '?', '[', '{', '\\']);
    let literal = relative
        .split('/')
        .take_while(|part| !wild(part))
        .collect::<Vec<_>>()
        .join("/");
    // A name spelled with U+FFFD that cannot be told apart says so; anything else refused here
    // starts outside.
    let prefix = jail.resolve(&literal).map_err(|e| match e {
        SandboxError::Unspellable(_) => e,
        _ => outside(),
    })?;
    let rest = relative[literal.len()..].trim_start_matches('/');
    Ok(Some(match (prefix.is_root(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (false, true) => prefix.display(),
        (false, false) => format!("{}/{rest}", prefix.display()),
    }))
}

/// `rel` (a path the walk reports) as a glob pattern sees it: relative to `under` (the start
/// with a `/`, when the pattern is not taken from the root), or, outside it (a file as the
/// start, or the file a link there leads to), its name.
fn relative_to<'a>(under: Option<&str>, rel: &'a str) -> &'a str {
    match under {
        None => rel,
        Some(under) => rel
            .strip_prefix(under)
            .unwrap_or_else(|| rel.rsplit('/').next().unwrap_or(rel)),
    }
}

pub(crate) fn glob(
    jail: &Jail,
    limits: &Limits,
    args: &GlobArgs,
) -> Result<GlobResult, SandboxError> {
    let rooted = rooted_pattern(jail, &args.pattern)?;
    let pattern = rooted.as_deref().unwrap_or(&args.pattern);
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(invalid_glob)?
        .compile_matcher();
    let start = jail.resolve(args.path.as_deref().unwrap_or(""))?;
    // A pattern is matched against paths relative to `path`, an absolute one (made relative to
    // the root) against paths relative to the root. A file as `path` is matched by its name (the
    // name of the file a link leads to, whose path the walk reports), as `find FILE -name` does.
    let under = (!start.is_root() && rooted.is_none()).then(|| format!("{}/", start.display()));
    // Hidden files are found only by a pattern that names them (`.github/**`, `**/.env`).
    let include_hidden = pattern.starts_with('.') || pattern.contains("/.");
    let mut paths = Vec::new();
    let mut truncated = false;
    let max = limits.glob_max_results;
    let mut visit = |_: &Dir, _: &OsStr, rel: &str| {
        if matcher.is_match(relative_to(under.as_deref(), rel)) {
            if paths.len() >= max {
                truncated = true;
                return Flow::Stop;
            }
            paths.push(rel.to_owned());
        }
        Flow::Continue
    };
    Walk {
        include_hidden,
        visit: &mut visit,
    }
    .run(jail, &start)?;
    Ok(GlobResult { paths, truncated })
}
