//! The file tools: `read_file`, `list_dir`, `stat`, `write_file`, `edit_file`.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};
use monad_protocol::text::head;
use monad_protocol::tools::{
    DirEntry, EditFileArgs, EntryKind, ListDirArgs, ListDirResult, ReadFileArgs, ReadFileResult,
    StatArgs, StatResult, Truncation, WriteFileArgs, WriteResult,
};

use crate::error::{EscapeReason, SandboxError};
use crate::jail::{Jail, JailPath, read_capped};
use crate::limits::Limits;
use crate::seen::{Seen, Stamp};

/// How far into a file `read_file` looks for a NUL byte to call it binary.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// `read_file` in one step, for the tests; [`crate::Sandbox`] opens first, to remember what it
/// read ([`crate::seen`]).
#[cfg(test)]
fn read_file(
    jail: &Jail,
    limits: &Limits,
    args: &ReadFileArgs,
) -> Result<ReadFileResult, SandboxError> {
    read_opened(open_for_read(jail, args)?, limits, args)
}

/// A file `read_file` has opened (through the jail) and not read yet.
pub(crate) struct OpenedFile {
    path: JailPath,
    file: cap_std::fs::File,
    size: u64,
    device: u64,
    stamp: Stamp,
}

impl OpenedFile {
    /// The file's size when it was opened.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The device (filesystem) the file is on.
    pub(crate) fn device(&self) -> u64 {
        self.device
    }

    /// Remembers, in `seen`, the file as it was when opened.
    pub(crate) fn note_in(&self, seen: &Seen) {
        seen.note(self.path.rel(), self.stamp);
    }
}

/// The first half of `read_file`: checks the arguments, resolves the path and opens the file.
pub(crate) fn open_for_read(jail: &Jail, args: &ReadFileArgs) -> Result<OpenedFile, SandboxError> {
    if args.offset == Some(0) {
        return Err(SandboxError::InvalidArguments(
            "`offset` counts lines from 1; 0 is not a line".into(),
        ));
    }
    if args.limit == Some(0) {
        return Err(SandboxError::InvalidArguments(
            "`limit` must be at least 1".into(),
        ));
    }
    let path = jail.resolve(&args.path)?;
    let (file, meta) = jail.open_regular(&path)?;
    Ok(OpenedFile {
        path,
        file,
        size: meta.len(),
        device: cap_std::fs::MetadataExt::dev(&meta),
        stamp: Stamp::of(&meta),
    })
}

/// The second half of `read_file`: reads what [`open_for_read`] opened. A file that is not
/// UTF-8 is decoded when it is text in another encoding ([`crate::decode`]); a binary one says
/// why it is not shown.
pub(crate) fn read_opened(
    opened: OpenedFile,
    limits: &Limits,
    args: &ReadFileArgs,
) -> Result<ReadFileResult, SandboxError> {
    let again = opened
        .file
        .try_clone()
        .map_err(|e| SandboxError::from_io("read", opened.path.given(), e))?
        .into_std();
    let mut result = read_utf8(opened, limits, args)?;
    if result.binary {
        decode_other(&mut result, &again, limits, args)
            .map_err(|e| SandboxError::from_io("read", &result.path.clone(), e))?;
    }
    Ok(result)
}

/// The first `max` bytes of `file` (of `size` bytes), read by position: fewer when it is
/// shorter than it was said to be. What `read_file` decodes when a file is not UTF-8, and what
/// `search` tells a file's encoding from.
pub(crate) fn read_start(file: &std::fs::File, size: u64, max: u64) -> std::io::Result<Vec<u8>> {
    read_from(file, 0, size, max)
}

/// At most `max` bytes of `file` (of `size` bytes) from byte `from`, read by position.
fn read_from(file: &std::fs::File, from: u64, size: u64, max: u64) -> std::io::Result<Vec<u8>> {
    let want = usize::try_from(size.saturating_sub(from).min(max)).unwrap_or(usize::MAX);
    let mut raw = vec![0u8; want];
    let got = fill_at(file, &mut raw, from)?;
    raw.truncate(got);
    Ok(raw)
}

/// Fills `buf` from byte `from` of `file`: the bytes read, fewer only at the file's end.
fn fill_at(file: &std::fs::File, buf: &mut [u8], from: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], from + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Where the line after the first `ends` line breaks of `file`, text in `encoding`, starts:
/// `Ok` with its byte offset, or `Err` with how many lines the file has when it has fewer
/// breaks. Read a chunk at a time, nothing kept: in each of these encodings a line break is a
/// byte (`\n`) or a UTF-16 unit of its own, which no other character's bytes contain, so it is
/// found without decoding.
fn line_start(
    file: &std::fs::File,
    encoding: crate::decode::Encoding,
    ends: u64,
) -> std::io::Result<Result<u64, u64>> {
    use crate::decode::Encoding;
    // Even, so that a UTF-16 unit never falls across two chunks.
    const CHUNK: usize = 64 * 1024;
    let mut buf = vec![0u8; CHUNK];
    let (mut at, mut seen, mut after_last) = (0u64, 0u64, 0u64);
    loop {
        let n = fill_at(file, &mut buf, at)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        let breaks: Vec<usize> = match encoding {
            Encoding::Utf16Le | Encoding::Utf16Be => {
                let unit = if encoding == Encoding::Utf16Le {
                    [b'\n', 0]
                } else {
                    [0, b'\n']
                };
                chunk
                    .chunks_exact(2)
                    .enumerate()
                    .filter(|(_, pair)| *pair == unit)
                    .map(|(i, _)| 2 * i + 1)
                    .collect()
            }
            // A chunk without the break looked for is passed over a vector at a time.
            Encoding::Latin1 | Encoding::Utf8 if seen + count_newlines(chunk) < ends => {
                seen += count_newlines(chunk);
                if let Some(last) = chunk.iter().rposition(|&b| b == b'\n') {
                    after_last = at + last as u64 + 1;
                }
                at += n as u64;
                continue;
            }
            Encoding::Latin1 | Encoding::Utf8 => chunk
                .iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'\n')
                .map(|(i, _)| i)
                .collect(),
        };
        for end in breaks {
            seen += 1;
            after_last = at + end as u64 + 1;
            if seen == ends {
                return Ok(Ok(after_last));
            }
        }
        at += n as u64;
    }
    // Text after the last break is one more line.
    Ok(Err(seen + u64::from(at > after_last)))
}

/// Reads a file `read_utf8` found not to be UTF-8 text again: decoded into `result` when it is
/// text in another encoding (told from its first `read_max_bytes`, or, when those are plain
/// ASCII, from the part read), else left binary with the reason. At most `read_max_bytes` of
/// it are decoded, from the line at `offset` (found in the bytes, [`line_start`]), so the
/// whole file can be read on, as UTF-8 text can.
fn decode_other(
    result: &mut ReadFileResult,
    file: &std::fs::File,
    limits: &Limits,
    args: &ReadFileArgs,
) -> std::io::Result<()> {
    let max_bytes = limits.read_max_bytes as usize;
    // As it is now: a file written to since it was opened (a log a command writes) was read
    // by its size then, which, for one empty then, read nothing and called that text.
    if let Ok(now) = file.metadata() {
        result.size = result.size.max(now.len());
    }
    let first = read_start(file, result.size, limits.read_max_bytes)?;
    // Plain ASCII holds no NUL: UTF-16 without a byte-order mark of characters in ASCII's
    // range is all ASCII bytes too, half of them NULs, and its head tells its encoding.
    let first_ascii = first.is_ascii() && !first.contains(&0);
    let encoding = match crate::decode::guess(&first) {
        crate::decode::Guess::Binary(why) => {
            result.binary_reason = Some(why);
            return Ok(());
        }
        crate::decode::Guess::Text(encoding) => encoding,
    };
    let offset = args.offset.unwrap_or(1);
    let max_lines = args.limit.unwrap_or(limits.read_default_lines);
    let (start, mut raw) = if offset == 1 {
        (0, first)
    } else {
        match line_start(file, encoding, offset - 1)? {
            Ok(start) => (
                start,
                read_from(file, start, result.size, limits.read_max_bytes)?,
            ),
            // Past the end: nothing to show, and how many lines there are.
            Err(total) => {
                text_in(result, encoding, offset);
                result.content = String::new();
                result.lines = 0;
                result.total_lines = Some(total);
                result.truncated = false;
                result.truncation = None;
                result.next_offset = None;
                return Ok(());
            }
        }
    };
    // The head tells the file's encoding when it holds anything but plain ASCII; when it does
    // not, a part further in is told by its own bytes (UTF-8 or windows-1252 by what it holds,
    // binary for a NUL), rather than by a guess the head could not make.
    let encoding = if start == 0 || !first_ascii {
        encoding
    } else {
        match crate::decode::guess_part(&raw) {
            crate::decode::Guess::Text(part) => part,
            crate::decode::Guess::Binary(why) => {
                result.binary_reason = Some(format!(
                    "the part from line {offset} (byte {start}) on is not text: {why}"
                ));
                return Ok(());
            }
        }
    };
    text_in(result, encoding, offset);
    let whole = start + raw.len() as u64 >= result.size;
    match encoding {
        // A cut UTF-16 unit is not decoded.
        crate::decode::Encoding::Utf16Le | crate::decode::Encoding::Utf16Be if !whole => {
            raw.truncate(raw.len() & !1);
        }
        // Nor a cut UTF-8 character.
        crate::decode::Encoding::Utf8 if !whole => {
            raw.truncate(crate::decode::complete_utf8_len(&raw));
        }
        _ => {}
    }
    let text = crate::decode::decode_part(&raw, encoding, start == 0);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    // Without the rest of the file, a last line without its end may go on.
    let complete = if whole || text.ends_with('\n') {
        lines.len()
    } else {
        lines.len().saturating_sub(1)
    };
    let mut content = String::new();
    let mut taken: u64 = 0;
    let mut cut = None;
    for line in lines.iter().take(complete) {
        if taken == max_lines {
            cut = Some(Truncation::Lines);
            break;
        }
        if content.len() + line.len() > max_bytes {
            if taken == 0 {
                content.push_str(head(line, max_bytes));
                taken = 1;
            }
            cut = Some(Truncation::Bytes);
            break;
        }
        content.push_str(line);
        taken += 1;
    }
    // The line at `offset` does not end within what was read (longer than the cap): its head.
    if taken == 0 && cut.is_none() && complete == 0 && !lines.is_empty() {
        content.push_str(head(lines[0], max_bytes));
        taken = 1;
        cut = Some(Truncation::Bytes);
    }
    if cut.is_none() && complete < lines.len() || cut.is_none() && !whole {
        cut = Some(Truncation::Bytes);
    }
    result.content = content;
    result.lines = taken;
    result.total_lines = (whole && cut.is_none()).then_some(offset - 1 + lines.len() as u64);
    result.truncated = cut.is_some();
    // Reading on from the next line finds it in the bytes, however far in it is.
    result.next_offset = cut
        .filter(|&cut| taken > 0 || cut == Truncation::Lines)
        .map(|_| offset + taken);
    result.truncation = cut;
    Ok(())
}

/// Marks `result` as text in `encoding`, read from line `offset` (its content still to come).
fn text_in(result: &mut ReadFileResult, encoding: crate::decode::Encoding, offset: u64) {
    result.binary = false;
    result.binary_reason = None;
    result.encoding = Some(encoding.as_str().to_owned());
    result.start_line = offset;
}

/// `read_file` of UTF-8 text; anything else comes back `binary`.
fn read_utf8(
    opened: OpenedFile,
    limits: &Limits,
    args: &ReadFileArgs,
) -> Result<ReadFileResult, SandboxError> {
    let OpenedFile {
        path, file, size, ..
    } = opened;
    let offset = args.offset.unwrap_or(1);
    let max_lines = args.limit.unwrap_or(limits.read_default_lines);
    let max_bytes = limits.read_max_bytes as usize;

    let file = file.into_std();
    let given = path.given().to_owned();
    let io_err = |e| SandboxError::from_io("read", &given, e);

    if offset == 1
        && max_lines > 0
        && size >= PARALLEL_READ_MIN
        && size <= max_bytes as u64
        && lines_likely_fit(&file, size, max_lines).map_err(io_err)?
        && let Some(content) = read_whole_in_halves(&file, size).map_err(io_err)?
    {
        return Ok(whole_file_result(path.display(), size, content, max_lines));
    }
    read_serially(&path, file, size, offset, max_lines, max_bytes)
}

/// `read_file` line by line (a buffer at a time where it can): any offset, both caps.
fn read_serially(
    path: &JailPath,
    file: std::fs::File,
    size: u64,
    offset: u64,
    max_lines: u64,
    max_bytes: usize,
) -> Result<ReadFileResult, SandboxError> {
    let given = path.given().to_owned();
    let io_err = |e| SandboxError::from_io("read", &given, e);
    // By the size at the open, but at least a page: a file empty then and written to since (a
    // log a command writes) was read a byte per system call.
    let capacity = usize::try_from(size)
        .unwrap_or(usize::MAX)
        .clamp(4 * 1024, 64 * 1024);
    let mut reader = BufReader::with_capacity(capacity, file);

    let head = reader.fill_buf().map_err(io_err)?;
    let binary_head = has_nul(&head[..head.len().min(BINARY_SNIFF_BYTES)]);
    let mut result = ReadFileResult {
        path: path.display(),
        content: String::new(),
        start_line: offset,
        lines: 0,
        total_lines: None,
        size,
        binary: binary_head,
        encoding: None,
        binary_reason: None,
        truncated: false,
        truncation: None,
        next_offset: None,
    };
    if binary_head {
        return Ok(result);
    }

    let mut line_no: u64 = 0; // lines consumed so far
    while line_no + 1 < offset {
        // Gigabytes may come before `offset` (a growing log): a cancelled call stops here.
        if crate::cancel::cancelled() {
            return Err(SandboxError::Timeout("the call was cancelled".into()));
        }
        // Passed over without being kept: a long line before `offset` is not held in memory.
        let n = reader.skip_until(b'\n').map_err(io_err)?;
        if n == 0 {
            result.total_lines = Some(line_no);
            return Ok(result);
        }
        line_no += 1;
    }

    let mut content: Vec<u8> = Vec::with_capacity(capacity.min(max_bytes));
    // Whole lines are copied a buffer at a time while they fit under both caps, which gives the
    // same result as the line-by-line loop below at a fraction of its per-line cost; that loop
    // takes over at the line cap and for a line that does not end within the buffer (a long
    // line, a last line without a newline).
    let mut bulk = true;
    loop {
        if result.lines == max_lines {
            if reader.fill_buf().map_err(io_err)?.is_empty() {
                result.total_lines = Some(line_no);
            } else {
                result.truncated = true;
                result.truncation = Some(Truncation::Lines);
                result.next_offset = Some(line_no + 1);
            }
            break;
        }
        if bulk {
            let buf = reader.fill_buf().map_err(io_err)?;
            if buf.is_empty() {
                result.total_lines = Some(line_no);
                break;
            }
            // `content` never exceeds `max_bytes` here: going over it ends the loop.
            let window = &buf[..buf.len().min(max_bytes - content.len())];
            if let Some(last) = window.iter().rposition(|&b| b == b'\n') {
                let whole = &window[..=last];
                let lines = count_newlines(whole);
                if lines <= max_lines - result.lines {
                    let taken = whole.len();
                    content.extend_from_slice(whole);
                    reader.consume(taken);
                    line_no += lines;
                    result.lines += lines;
                    continue;
                }
                // More lines here than the line cap leaves room for: finish line by line.
                bulk = false;
            }
        }
        let before = content.len();
        // At most one byte over the cap is read into memory: a line of gigabytes (a minified
        // file, a log without newlines) is not held whole to keep its head.
        let room = (max_bytes - content.len()) as u64 + 1;
        let n = (&mut reader)
            .take(room)
            .read_until(b'\n', &mut content)
            .map_err(io_err)?;
        if n == 0 {
            result.total_lines = Some(line_no);
            break;
        }
        if content.len() > max_bytes {
            result.truncated = true;
            result.truncation = Some(Truncation::Bytes);
            if result.lines == 0 {
                // A single line longer than the cap: return its head, continue after it (its
                // rest is passed over without being kept, to know whether anything follows).
                let ended = content.last() == Some(&b'\n');
                content.truncate(max_bytes);
                result.lines = 1;
                // Up to a bound: past it, reading on says whether anything follows.
                let scanned = if ended {
                    0
                } else {
                    (&mut reader)
                        .take(LONG_LINE_SCAN)
                        .skip_until(b'\n')
                        .map_err(io_err)?
                };
                if (scanned as u64) < LONG_LINE_SCAN
                    && reader.fill_buf().map_err(io_err)?.is_empty()
                {
                    result.total_lines = Some(line_no + 1);
                } else {
                    result.next_offset = Some(line_no + 2);
                }
            } else {
                content.truncate(before);
                result.next_offset = Some(line_no + 1);
            }
            break;
        }
        line_no += 1;
        result.lines += 1;
    }

    match String::from_utf8(content) {
        Ok(text) => result.content = text,
        Err(err) => {
            // A cut in the middle of a multi-byte character is not binary: drop the partial
            // character. Anything else that is not UTF-8 is.
            let valid = err.utf8_error().valid_up_to();
            let bytes = err.into_bytes();
            let tail_is_partial_char = result.truncation == Some(Truncation::Bytes)
                && bytes.len() - valid < 4
                && std::str::from_utf8(&bytes[valid..]).is_err_and(|e| e.error_len().is_none());
            if tail_is_partial_char {
                result.content = String::from_utf8_lossy(&bytes[..valid]).into_owned();
            } else {
                mark_binary(&mut result);
            }
        }
    }
    Ok(result)
}

/// How far past the byte cap a read looks for the end of a line the cap cut, to say whether
/// anything follows it.
const LONG_LINE_SCAN: u64 = 16 * 1024 * 1024;

/// Files at least this large, read whole, are read by two threads at once (see
/// [`read_whole_in_halves`]).
const PARALLEL_READ_MIN: u64 = 8 * 1024 * 1024;

/// Whether a file of `size` bytes probably has no more than `max_lines` lines, judging by its
/// first 64 KiB (with a factor of 2 to spare). Reading the whole file is only worth it when the
/// line cap will not cut it early: the first 2,000 lines of a 100 MiB log are best read line by
/// line. A wrong guess costs time, never a different result.
fn lines_likely_fit(file: &std::fs::File, size: u64, max_lines: u64) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut sample = vec![0u8; 64 * 1024];
    let n = file.read_at(&mut sample, 0)?;
    if n == 0 {
        return Ok(false);
    }
    let estimate = count_newlines(&sample[..n]).saturating_mul(size) / n as u64;
    Ok(estimate.saturating_mul(2) <= max_lines)
}

/// Runs `work` on a second thread while `here` runs on this one. When the system will not give
/// a thread, `work` runs here afterwards; `None` only if `work` panicked.
fn on_two_threads<A, B: Send>(
    work: impl FnOnce() -> B + Send,
    here: impl FnOnce() -> A,
) -> (A, Option<B>) {
    // Shared so that it can still run here if the thread is refused (spawning consumes it).
    let work = std::sync::Mutex::new(Some(work));
    let take = || work.lock().ok().and_then(|mut w| w.take());
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new().spawn_scoped(scope, || take().map(|w| w()));
        let a = here();
        let b = spawned.ok().and_then(|thread| thread.join().ok().flatten());
        (a, b.or_else(|| take().map(|w| w())))
    })
}

/// Reads a file of `size` bytes whole, its two halves on two threads: most of the time of a
/// large read goes to faulting in the fresh buffer and copying into it, which two cores do in
/// about half the time (a 64 MiB file: 43 ms on one thread, about 20 on two). `None` when the file
/// is not `size` bytes any more (it changed since it was opened): the caller reads it the
/// ordinary way. `pread` leaves the file position alone, so that read starts at the beginning.
fn read_whole_in_halves(file: &std::fs::File, size: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let Ok(len) = usize::try_from(size) else {
        return Ok(None);
    };
    // Zeroed memory from the allocator: a fresh mapping for a buffer this large is zero
    // already, and each of its pages is first touched by the thread that reads into it.
    let mut content = vec![0u8; len];
    let fill = |part: &mut [u8], mut at: u64| -> std::io::Result<bool> {
        let mut done = 0;
        while done < part.len() {
            let chunk = (part.len() - done).min(4 * 1024 * 1024);
            match file.read_at(&mut part[done..done + chunk], at) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    done += n;
                    at += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    };
    let (first, second) = content.split_at_mut(len / 2);
    let split = first.len() as u64;
    let (a, b) = on_two_threads(|| fill(second, split), || fill(first, 0));
    let b = b.unwrap_or_else(|| Err(std::io::Error::other("a reader thread failed")));
    if !(a? && b?) {
        return Ok(None);
    }
    // Nothing more: the file did not grow.
    if file.read_at(&mut [0u8; 1], size)? != 0 {
        return Ok(None);
    }
    Ok(Some(content))
}

/// The result of reading a whole file from line 1 within the byte cap, as the line-by-line
/// reader would give it: the line cap applied, then content that is not UTF-8 text (or a file
/// with a NUL in its first [`BINARY_SNIFF_BYTES`]) reported as binary. UTF-8 is checked and lines are counted on
/// two threads, split at a character boundary.
fn whole_file_result(
    path: String,
    size: u64,
    mut content: Vec<u8>,
    max_lines: u64,
) -> ReadFileResult {
    let mut result = ReadFileResult {
        path,
        content: String::new(),
        start_line: 1,
        lines: 0,
        total_lines: None,
        size,
        binary: false,
        encoding: None,
        binary_reason: None,
        truncated: false,
        truncation: None,
        next_offset: None,
    };
    if has_nul(&content[..content.len().min(BINARY_SNIFF_BYTES)]) {
        result.binary = true;
        return result;
    }
    let newlines = in_halves(&content, |part| (count_newlines(part), true)).0;
    let partial_last = content.last().is_some_and(|&b| b != b'\n');
    let lines = newlines + u64::from(partial_last);
    if lines > max_lines {
        // Cut after line `max_lines`: its newline exists, since there are more lines after it.
        let end = content
            .iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth((max_lines - 1) as usize)
            .map_or(content.len(), |(i, _)| i + 1);
        content.truncate(end);
        content.shrink_to_fit();
        result.lines = max_lines;
        result.truncated = true;
        result.truncation = Some(Truncation::Lines);
        result.next_offset = Some(max_lines + 1);
    } else {
        result.lines = lines;
        result.total_lines = Some(lines);
    }
    if in_halves(&content, |part| (0, std::str::from_utf8(part).is_ok())).1 {
        result.content = String::from_utf8(content).unwrap_or_default();
    } else {
        mark_binary(&mut result);
    }
    result
}

/// Runs `f` on the two halves of `bytes` (split at a UTF-8 character boundary, moving at most 3
/// bytes forward) on two threads; sums the counts and ands the flags.
fn in_halves(bytes: &[u8], f: impl Fn(&[u8]) -> (u64, bool) + Sync) -> (u64, bool) {
    let mut mid = bytes.len() / 2;
    for _ in 0..3 {
        if bytes.get(mid).is_some_and(|&b| b & 0xc0 == 0x80) {
            mid += 1;
        }
    }
    let (first, second) = bytes.split_at(mid.min(bytes.len()));
    let (a, b) = on_two_threads(|| f(second), || f(first));
    match b {
        Some(b) => (a.0 + b.0, a.1 && b.1),
        None => (a.0, false),
    }
}

/// Reports a read's content as not text: no content, no lines, nothing cut. `total_lines`, when
/// the whole file was counted, stays.
fn mark_binary(result: &mut ReadFileResult) {
    result.content = String::new();
    result.binary = true;
    result.lines = 0;
    result.truncated = false;
    result.truncation = None;
    result.next_offset = None;
}

/// Whether `bytes` holds a NUL byte. Unlike `contains`, a branch-free fold the compiler turns
/// into whole-vector compares, for the common case of a text file that has none.
fn has_nul(bytes: &[u8]) -> bool {
    bytes
        .chunks(224)
        .any(|chunk| chunk.iter().fold(0u8, |acc, &b| acc | u8::from(b == 0)) != 0)
}

/// The number of `\n` bytes in `bytes`.
fn count_newlines(bytes: &[u8]) -> u64 {
    // Summed in byte-wide lanes, a chunk at a time (224 bytes: under 256 so a lane cannot
    // overflow, a multiple of the vector width so no scalar tail), so the compiler compares and
    // adds a whole vector register of bytes per step.
    bytes
        .chunks(224)
        .map(|chunk| {
            chunk
                .iter()
                .fold(0u8, |n, &b| n.wrapping_add(u8::from(b == b'\n')))
        })
        .map(u64::from)
        .sum()
}

pub(crate) fn list_dir(
    jail: &Jail,
    limits: &Limits,
    args: &ListDirArgs,
) -> Result<ListDirResult, SandboxError> {
    list_opened(open_for_list(jail, limits, args)?, limits, args)
}

/// A directory `list_dir` has opened (through the jail) and not read yet.
pub(crate) struct OpenedDir {
    path: JailPath,
    dir: Dir,
    depth: u32,
    size: u64,
    device: u64,
}

impl OpenedDir {
    /// The directory's size as its file system reports it. On ext4 (the blocks its entries
    /// took, never shrinking), XFS, f2fs and tmpfs (20 bytes an entry) it grows with its
    /// entries; not on overlayfs, btrfs or ZFS (see `Sandbox::list_dir_async`).
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The device (filesystem) the directory is on.
    pub(crate) fn device(&self) -> u64 {
        self.device
    }
}

/// The first half of `list_dir`: checks the arguments and opens the directory.
pub(crate) fn open_for_list(
    jail: &Jail,
    limits: &Limits,
    args: &ListDirArgs,
) -> Result<OpenedDir, SandboxError> {
    let depth = args.depth.unwrap_or(1);
    if depth == 0 || depth > limits.list_max_depth {
        return Err(SandboxError::InvalidArguments(format!(
            "`depth` must be between 1 and {}",
            limits.list_max_depth
        )));
    }
    let path = jail.resolve(args.path.as_deref().unwrap_or(""))?;
    let dir = jail.open_dir(&path).map_err(|e| match e {
        // The path itself is a file, not one of the directories on its way.
        SandboxError::WrongFileType { .. }
            if jail.dir().metadata(path.rel()).is_ok_and(|m| m.is_file()) =>
        {
            SandboxError::WrongFileType {
                path: path.given().to_owned(),
                what: "is a file, not a directory (read_file reads it)",
            }
        }
        e => e,
    })?;
    let meta = dir
        .dir_metadata()
        .map_err(|e| SandboxError::from_io("open directory", path.given(), e))?;
    Ok(OpenedDir {
        size: meta.len(),
        device: cap_std::fs::MetadataExt::dev(&meta),
        path,
        dir,
        depth,
    })
}

/// The second half of `list_dir`: reads what [`open_for_list`] opened.
pub(crate) fn list_opened(
    opened: OpenedDir,
    limits: &Limits,
    args: &ListDirArgs,
) -> Result<ListDirResult, SandboxError> {
    let listed = list_walk(opened, limits, args, Unknown::Look)?;
    Ok(listed.expect("a listing that looks at unknown kinds never gives up"))
}

/// [`list_opened`] on the calling task: `None`, having looked at nothing, as soon as an entry's
/// kind is not in the directory (`DT_UNKNOWN`), since looking at each such entry may read its
/// inode from the disk. The caller lists on the blocking pool instead.
pub(crate) fn list_inline(
    opened: OpenedDir,
    limits: &Limits,
    args: &ListDirArgs,
) -> Result<Option<ListDirResult>, SandboxError> {
    list_walk(opened, limits, args, Unknown::GiveUp)
}

fn list_walk(
    opened: OpenedDir,
    limits: &Limits,
    args: &ListDirArgs,
    unknown: Unknown,
) -> Result<Option<ListDirResult>, SandboxError> {
    let OpenedDir {
        path, dir, depth, ..
    } = opened;
    let mut out = ListDirResult {
        path: path.display(),
        entries: Vec::new(),
        truncated: false,
        unreadable: Vec::new(),
        hidden: 0,
    };
    let walk = ListWalk {
        include_hidden: args.include_hidden.unwrap_or(false),
        max: limits.list_max_entries,
        given: path.given(),
        unknown,
    };
    let prefix = if path.is_root() {
        String::new()
    } else {
        format!("{}/", path.display())
    };
    let done = walk.list(&dir, &prefix, depth, &mut Vec::new(), &mut out)?;
    Ok(done.then_some(out))
}

/// What a listing does with an entry whose kind the directory does not give (`DT_UNKNOWN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unknown {
    /// Look at the entry (`statat`, not following it).
    Look,
    /// Stop: the listing is not finished.
    GiveUp,
}

struct ListWalk<'a> {
    include_hidden: bool,
    max: usize,
    given: &'a str,
    unknown: Unknown,
}

/// Bytes of directory entries one `getdents64` returns. `cap_std`'s `Dir::entries` starts
/// rustix's buffer at 768 bytes and doubles it, so a directory of 1,000 entries took seven
/// calls, plus two extra opens of `.`. One buffer of this size reads such a directory in two
/// calls (glibc's `readdir` uses 32 KiB too). `docs/benchmarks.md`, the seventh round.
const DIRENT_BUFFER: usize = 32 * 1024;

impl ListWalk<'_> {
    /// Lists `dir` into `out`; false when it gave up on an entry of unknown kind
    /// ([`Unknown::GiveUp`]).
    fn list(
        &self,
        dir: &Dir,
        prefix: &str,
        depth: u32,
        buf: &mut Vec<MaybeUninit<u8>>,
        out: &mut ListDirResult,
    ) -> Result<bool, SandboxError> {
        // Every entry takes one place of what is left under the cap, so only that many of this
        // directory's first names (in sorted order) can be listed.
        let keep = self.max.saturating_sub(out.entries.len());
        let Some(Kept {
            mut entries,
            dropped,
            hidden,
        }) = read_entries(dir, self.include_hidden, self.unknown, keep, buf)
            .map_err(|e| SandboxError::from_io("list", self.given, e))?
        else {
            return Ok(false);
        };
        out.hidden += hidden;
        sort_by_name(&mut entries);
        out.entries.reserve(
            entries
                .len()
                .min(self.max.saturating_sub(out.entries.len())),
        );
        for (name, kind) in entries {
            if out.entries.len() >= self.max {
                out.truncated = true;
                return Ok(true);
            }
            let name_lossy = name.to_string_lossy();
            let mut path = String::with_capacity(prefix.len() + name_lossy.len());
            path.push_str(prefix);
            path.push_str(&name_lossy);
            let sub_prefix = (kind == EntryKind::Dir && depth > 1).then(|| format!("{path}/"));
            out.entries.push(DirEntry { path, kind });
            if let Some(sub_prefix) = sub_prefix {
                // Never follow a link: a directory swapped for one since the listing is skipped.
                let sub = match dir.open_dir_nofollow(&name) {
                    Ok(sub) => sub,
                    Err(e) if is_permission(&e) => {
                        out.unreadable.push(sub_prefix);
                        continue;
                    }
                    Err(_) => continue,
                };
                // A directory below whose entries cannot be read (a build container's, owned
                // by another user) is named, and the rest of the listing goes on.
                match self.list(&sub, &sub_prefix, depth - 1, buf, out) {
                    Ok(true) => {}
                    Ok(false) => return Ok(false),
                    Err(SandboxError::Io { source, .. }) if is_permission(&source) => {
                        out.unreadable.push(sub_prefix);
                    }
                    Err(e) => return Err(e),
                }
                if out.truncated {
                    return Ok(true);
                }
            }
        }
        out.truncated |= dropped;
        Ok(true)
    }
}

/// Sorts entries by their names' bytes, as comparing the names would: by the first eight bytes
/// of each as one number first (names hold no NUL, so one padded with zeros sorts before any
/// longer one it starts), then by the whole name where those are equal. Comparing the names
/// themselves called `memcmp` for each comparison: a tenth of the attached client's time for
/// a listing of 1,000 files (`docs/benchmarks.md`).
fn sort_by_name(entries: &mut Vec<(OsString, EntryKind)>) {
    use std::os::unix::ffi::OsStrExt;
    let head = |name: &OsString| {
        let mut first = [0u8; 8];
        let bytes = name.as_bytes();
        let n = bytes.len().min(8);
        first[..n].copy_from_slice(&bytes[..n]);
        u64::from_be_bytes(first)
    };
    let mut keyed: Vec<(u64, (OsString, EntryKind))> = entries
        .drain(..)
        .map(|entry| (head(&entry.0), entry))
        .collect();
    keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.0.cmp(&b.1.0)));
    entries.extend(keyed.into_iter().map(|(_, entry)| entry));
}

/// Whether `e` says the directory may not be read (its mode, or a security module).
fn is_permission(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
}

/// What [`read_entries`] kept of a directory: at most the `keep` first names, unsorted, and
/// whether it left any out.
struct Kept {
    entries: Vec<(OsString, EntryKind)>,
    dropped: bool,
    /// Entries left out for their names' starting with `.`.
    hidden: u64,
}

/// Keeps the `keep` smallest names of `entries` (in any order); true when it dropped some.
fn keep_first(entries: &mut Vec<(OsString, EntryKind)>, keep: usize) -> bool {
    if entries.len() <= keep {
        return false;
    }
    if keep > 0 {
        entries.select_nth_unstable_by(keep - 1, |a, b| a.0.cmp(&b.0));
    }
    entries.truncate(keep);
    true
}

/// The entries of an open directory (`.` and `..` left out, and hidden ones unless asked
/// for), with their kinds: the `keep` first by name, unsorted. `None` when an entry's kind is
/// unknown and `unknown` says to give up. Memory stays within twice `keep` entries however
/// large the directory: whenever that many are held, the larger half is let go. It reads
/// through one `getdents64` buffer of [`DIRENT_BUFFER`] bytes, `buf`, reused by every directory
/// of a walk. The directory is opened for reading as `.` of `dir`, which never follows
/// anything.
fn read_entries(
    dir: &Dir,
    include_hidden: bool,
    unknown: Unknown,
    keep: usize,
    buf: &mut Vec<MaybeUninit<u8>>,
) -> std::io::Result<Option<Kept>> {
    use rustix::fs::{Mode, OFlags, RawDir};
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    buf.resize(DIRENT_BUFFER, MaybeUninit::uninit());
    let mut raw = RawDir::new(&fd, buf);
    let mut entries = Vec::new();
    let mut dropped = false;
    let mut hidden = 0;
    let hold = keep.saturating_mul(2).max(1);
    while let Some(entry) = raw.next() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        if !include_hidden && name.first() == Some(&b'.') {
            hidden += 1;
            continue;
        }
        let file_type = entry.file_type();
        if file_type == rustix::fs::FileType::Unknown && unknown == Unknown::GiveUp {
            return Ok(None);
        }
        let Some(kind) = kind_of(file_type, &fd, entry.file_name())? else {
            continue; // vanished while listing
        };
        entries.push((OsStr::from_bytes(name).to_owned(), kind));
        if entries.len() >= hold {
            dropped |= keep_first(&mut entries, keep);
        }
    }
    dropped |= keep_first(&mut entries, keep);
    Ok(Some(Kept {
        entries,
        dropped,
        hidden,
    }))
}

/// An entry's kind from its directory record, or, when the record does not say
/// (`DT_UNKNOWN`), from a look at the entry in `dir` that does not follow it. `None` when the
/// entry is gone; one that cannot be looked at for another reason is `Other`.
fn kind_of(
    file_type: rustix::fs::FileType,
    dir: impl std::os::fd::AsFd,
    name: &std::ffi::CStr,
) -> std::io::Result<Option<EntryKind>> {
    use rustix::fs::{AtFlags, FileType};
    let file_type = match file_type {
        FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => FileType::from_raw_mode(stat.st_mode),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(_) => return Ok(Some(EntryKind::Other)),
        },
        known => known,
    };
    Ok(Some(match file_type {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }))
}

pub(crate) fn entry_kind(t: &cap_std::fs::FileType) -> EntryKind {
    if t.is_symlink() {
        EntryKind::Symlink
    } else if t.is_dir() {
        EntryKind::Dir
    } else if t.is_file() {
        EntryKind::File
    } else {
        EntryKind::Other
    }
}

pub(crate) fn stat(jail: &Jail, args: &StatArgs) -> Result<StatResult, SandboxError> {
    let path = jail.resolve(&args.path)?;
    let meta = jail
        .dir()
        .symlink_metadata(path.rel())
        .map_err(|e| SandboxError::from_io("stat", path.given(), e))?;
    let kind = entry_kind(&meta.file_type());
    let link_target = if kind == EntryKind::Symlink {
        // `read_link_contents` returns the stored target without judging it; it is only shown.
        jail.dir()
            .read_link_contents(path.rel())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let mode = cap_std::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let modified_unix = meta.modified().ok().and_then(|t| {
        t.into_std()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs() as i64)
    });
    Ok(StatResult {
        path: path.display(),
        kind,
        size: meta.len(),
        mode: format!("{mode:04o}"),
        readonly: mode & 0o222 == 0,
        modified_unix,
        link_target,
    })
}

/// `write_file`. With `approved` (what an approval prompt showed), a missing directory that is
/// not among those it said the write would create is not made ([`SandboxError::Unapproved`]),
/// and a file that is not the one its diff was made from is not replaced
/// ([`SandboxError::Changed`]): the folder changed while the prompt waited.
pub(crate) fn write_file(
    jail: &Jail,
    limits: &Limits,
    seen: &Seen,
    args: &WriteFileArgs,
    approved: Option<&Preview>,
) -> Result<WriteResult, SandboxError> {
    check_write_size(limits, args)?;
    let path = resolve_file(jail, &args.path)?;
    let parents = match (args.create_parents.unwrap_or(true), approved) {
        (false, _) => Parents::Require,
        (true, None) => Parents::Create,
        (true, Some(approved)) => Parents::Approved(&approved.creates),
    };
    let mut target = Target::locate(jail, &path, parents, limits)?;
    if let Some(approved) = approved {
        target
            .check_approved(jail, &path, approved)
            .inspect_err(|_| {
                std::mem::take(&mut target.new_dirs).undo();
            })?;
    }
    target.check_seen(seen)?;
    let old = target.old_text();
    let (content, kept) = as_the_file_has_it(old.as_deref(), &args.content);
    let (bytes, encoding, reencoded_from) = match target.encoded(&content, limits) {
        Ok(encoded) => encoded,
        Err(e) => {
            std::mem::take(&mut target.new_dirs).undo();
            return Err(e);
        }
    };
    match target.replace(&bytes) {
        Ok(stamp) => target.note_in(seen, stamp),
        Err(e) => {
            std::mem::take(&mut target.new_dirs).undo();
            return Err(e);
        }
    }
    let (diff, diff_truncated) =
        unified_diff(&target.path.display(), old.as_deref(), &content, limits);
    Ok(WriteResult {
        path: target.path.display(),
        created: target.old.is_none(),
        bytes_written: bytes.len() as u64,
        replacements: None,
        diff,
        diff_truncated,
        created_dirs: target.new_dirs.shown(),
        encoding: encoding.map(str::to_owned),
        reencoded_from: reencoded_from.map(str::to_owned),
        crlf_kept: kept.crlf,
        bom_kept: kept.bom,
    })
}

/// `content` as a `write_file` of a file whose text is `old` writes it, and what of the file's
/// ways it kept that the content did not have:
///
/// - In a file whose every line ends with CRLF, content with LF line breaks only (what an agent
///   writes, and what read_file showed it) gets CRLF ones, as `edit_file` writes them, so that
///   a whole-file rewrite does not change every line of a Windows file. Content with a CR of
///   its own is written as given.
/// - A file whose text starts with a byte order mark (a UTF-8 file's U+FEFF: a UTF-16 file's
///   own mark is kept by its encoding, [`crate::decode::encode`]) keeps it before content that
///   has none: read_file does not show it, Windows editors write it and PowerShell 5 needs it
///   to read a script's text as UTF-8. Content that starts with one is written as given.
fn as_the_file_has_it<'a>(
    old: Option<&str>,
    content: &'a str,
) -> (std::borrow::Cow<'a, str>, FileWays) {
    let Some(old) = old else {
        return (content.into(), FileWays::default());
    };
    let crlf = ends_lines_with_crlf(old) && !content.contains('\r') && content.contains('\n');
    let bom = old.starts_with(BOM) && !content.starts_with(BOM);
    let kept = FileWays { crlf, bom };
    let content = if crlf {
        with_crlf(content)
    } else {
        content.into()
    };
    if bom {
        (format!("{BOM}{content}").into(), kept)
    } else {
        (content, kept)
    }
}

/// The byte order mark, as text.
const BOM: char = '\u{feff}';

/// What [`as_the_file_has_it`] kept of the file's ways.
#[derive(Debug, Default, Clone, Copy)]
struct FileWays {
    /// Its CRLF line endings.
    crlf: bool,
    /// Its byte order mark.
    bom: bool,
}

/// The most bytes of UTF-8 one byte of an encoding a write keeps holds: a windows-1252 byte
/// can be a character of three (`€`); UTF-16's two bytes hold at most three.
const UTF8_BYTES_PER_BYTE: u64 = 3;

/// Content no file could hold within the write limit, whatever its encoding, is refused before
/// anything is looked at; the limit itself counts the bytes written, once the file's encoding
/// is known ([`Target::encoded`]): text in UTF-8 over it may fit in windows-1252.
fn check_write_size(limits: &Limits, args: &WriteFileArgs) -> Result<(), SandboxError> {
    let bound = limits.write_max_bytes.saturating_mul(UTF8_BYTES_PER_BYTE);
    if args.content.len() as u64 > bound {
        return Err(SandboxError::LimitExceeded(format!(
            "content is {} bytes, over the {}-byte write limit",
            args.content.len(),
            limits.write_max_bytes
        )));
    }
    Ok(())
}

/// Text of `len` bytes, written as UTF-8 (with a CRLF file's line endings, as written:
/// [`as_the_file_has_it`]), is within the write limit.
fn check_size(limits: &Limits, len: usize) -> Result<(), SandboxError> {
    check_written(limits, len, "content is")
}

/// `len` bytes, which `what` says of (`content is`, `the edited file would be`), are within the
/// write limit.
fn check_written(limits: &Limits, len: usize, what: &str) -> Result<(), SandboxError> {
    if len as u64 > limits.write_max_bytes {
        return Err(SandboxError::LimitExceeded(format!(
            "{what} {len} bytes, over the {}-byte write limit",
            limits.write_max_bytes
        )));
    }
    Ok(())
}

/// `edit_file`; with `approved` (what an approval prompt showed), only of the version of the
/// file its diff was made from ([`SandboxError::Changed`] otherwise).
pub(crate) fn edit_file(
    jail: &Jail,
    limits: &Limits,
    seen: &Seen,
    args: &EditFileArgs,
    approved: Option<&Preview>,
) -> Result<WriteResult, SandboxError> {
    let edit = plan_edit(jail, limits, args)?;
    if let Some(approved) = approved {
        edit.target.check_approved(jail, &edit.given, approved)?;
    }
    let stamp = edit.target.replace(&edit.new_bytes)?;
    edit.target.note_in(seen, stamp);
    let (diff, diff_truncated) = unified_diff(
        &edit.target.path.display(),
        Some(&edit.old_text),
        &edit.new_text,
        limits,
    );
    Ok(WriteResult {
        path: edit.target.path.display(),
        created: false,
        bytes_written: edit.new_bytes.len() as u64,
        replacements: Some(edit.replacements),
        diff,
        diff_truncated,
        created_dirs: Vec::new(),
        encoding: edit.encoding.map(str::to_owned),
        reencoded_from: None,
        crlf_kept: false,
        bom_kept: false,
    })
}

/// An edit worked out and not made yet: where, the old and new text, how many replacements.
struct Edit {
    /// The path as the call gave it, resolved in the jail (links not followed).
    given: JailPath,
    target: Target,
    old_text: String,
    new_text: String,
    /// `new_text` in the file's encoding.
    new_bytes: Vec<u8>,
    /// The file's encoding when it is not UTF-8.
    encoding: Option<&'static str>,
    replacements: u64,
}

/// Checks an `edit_file` call and works out the new content, changing nothing.
fn plan_edit(jail: &Jail, limits: &Limits, args: &EditFileArgs) -> Result<Edit, SandboxError> {
    if args.old_string.is_empty() {
        return Err(SandboxError::InvalidArguments(
            "`old_string` is empty; use write_file to create or replace a whole file".into(),
        ));
    }
    if args.old_string == args.new_string {
        return Err(SandboxError::InvalidArguments(
            "`old_string` and `new_string` are the same; nothing would change".into(),
        ));
    }
    let path = resolve_file(jail, &args.path)?;
    let target = Target::locate(jail, &path, Parents::Require, limits)?;
    let Some(old) = target.old.as_ref() else {
        return Err(SandboxError::NotFound(format!(
            "`{}` does not exist",
            path.shown()
        )));
    };
    // A Latin-1 or UTF-16 file is edited as the text it holds, and written back so; UTF-8
    // with stray bytes is not (they would become U+FFFD for good).
    let held = target.held();
    let decoded;
    let old_text = match (std::str::from_utf8(&old.bytes), held) {
        (_, Some(held)) => {
            decoded = crate::decode::decode(&old.bytes, held.encoding);
            decoded.as_str()
        }
        (Ok(text), None) => text,
        (Err(_), None) => {
            return Err(SandboxError::WrongFileType {
                path: path.given().to_owned(),
                what: "is not text in an encoding edit_file can write back (UTF-8 with bytes \
                       that are not UTF-8, or binary): change it with a program through \
                       run_command (write_file replaces a file with UTF-8 text, which would lose \
                       the bytes that are not)",
            });
        }
    };
    // In a file whose every line ends with CRLF, an agent's LF (what it reads and writes) means
    // the file's line break: matched as CRLF, and written as CRLF so that the file keeps one
    // kind of line ending.
    let crlf = ends_lines_with_crlf(old_text);
    let (old_string, new_string) = if crlf {
        (with_crlf(&args.old_string), with_crlf(&args.new_string))
    } else {
        (
            args.old_string.as_str().into(),
            args.new_string.as_str().into(),
        )
    };
    let replace_all = args.replace_all.unwrap_or(false);
    // `replace_all` replaces what does not overlap, from the start; a single edit must find one
    // place only, and two occurrences that overlap (`}\n}` in `}\n}\n}`) are two places.
    let count = if replace_all {
        old_text.matches(old_string.as_ref()).count()
    } else {
        occurrences(old_text, &old_string)
    };
    match count {
        0 => {
            let endings = if old_text.contains("\r\n") && !crlf {
                " (some of its lines end with CRLF, some with LF)"
            } else {
                ""
            };
            return Err(SandboxError::NoMatch(format!(
                "`old_string` does not occur in `{}`{endings}{}; read the file again and copy \
                 the text exactly, including white space",
                crate::error::shown(&path.display()),
                near_miss(old_text, &args.old_string)
            )));
        }
        n if n > 1 && !replace_all => {
            let n = if n > OCCURRENCES_COUNTED {
                format!("more than {OCCURRENCES_COUNTED}")
            } else {
                n.to_string()
            };
            return Err(SandboxError::NoMatch(format!(
                "`old_string` occurs {n} times in `{}` ({}); add surrounding text to make it \
                 unique, or set `replace_all` to replace every occurrence",
                crate::error::shown(&path.display()),
                occurrence_lines(old_text, &old_string)
            )));
        }
        _ => {}
    }
    // Measured before it is made: 16 MiB of `a` with each `a` replaced by 64 KiB would be a
    // string of 1 TiB.
    let replaced = if replace_all { count as u128 } else { 1 };
    let new_len = old_text.len() as u128 - replaced * old_string.len() as u128
        + replaced * new_string.len() as u128;
    // As text; what it takes in the file's own encoding is counted once it is made, below.
    let bound = match held {
        Some(held) if held.encoding.as_str() != "utf-8" => {
            limits.write_max_bytes.saturating_mul(UTF8_BYTES_PER_BYTE)
        }
        _ => limits.write_max_bytes,
    };
    if new_len > u128::from(bound) {
        return Err(SandboxError::LimitExceeded(format!(
            "the edited file would be {new_len} bytes, over the {}-byte write limit",
            limits.write_max_bytes
        )));
    }
    let new_text = if replace_all {
        old_text.replace(old_string.as_ref(), &new_string)
    } else {
        old_text.replacen(old_string.as_ref(), &new_string, 1)
    };
    let new_bytes = crate::decode::encode(&new_text, held)
        .map_err(|held| {
            SandboxError::InvalidArguments(format!(
                "`{}` is {} text, which cannot hold every character of `new_string`; nothing \
                 was changed (write_file would store the whole file as UTF-8)",
                path.shown(),
                held.encoding.as_str()
            ))
        })?
        .into_owned();
    // The limit counts the bytes written (UTF-16's are about twice the text's).
    let what = match held.map(|h| h.encoding.as_str()) {
        Some(encoding) if encoding != "utf-8" => {
            format!("written as {encoding} (the file's encoding), the edited file would be")
        }
        _ => "the edited file would be".to_owned(),
    };
    check_written(limits, new_bytes.len(), &what)?;
    let old_text = old_text.to_owned();
    Ok(Edit {
        given: path,
        target,
        old_text,
        new_text,
        new_bytes,
        encoding: held.map(|h| h.encoding.as_str()),
        replacements: if replace_all { count as u64 } else { 1 },
    })
}

/// How many times `needle` (not empty) starts in `text`, counting occurrences that overlap.
///
/// Counted up to one past [`OCCURRENCES_COUNTED`]: each occurrence that overlaps the last costs
/// a comparison of the whole needle, so a file of 16 MiB of one repeated character and a needle
/// of 64 KiB of it, every position an occurrence, was 10^12 comparisons (tens of minutes of a
/// core, before the owner was asked, in the check of the call).
fn occurrences(text: &str, needle: &str) -> usize {
    occurrence_starts(text, needle)
        .take(OCCURRENCES_COUNTED + 1)
        .count()
}

/// The most occurrences of one `old_string` counted ([`occurrences`]) or placed on lines
/// ([`occurrence_lines`]).
const OCCURRENCES_COUNTED: usize = 1_000;

/// Where `needle` (not empty) starts in `text`, in order, occurrences that overlap included.
fn occurrence_starts<'a>(text: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + text[from..].find(needle)?;
        // On to the next character after this occurrence's first, so that one overlapping it
        // is found too.
        from = at + text[at..].chars().next().map_or(1, char::len_utf8);
        Some(at)
    })
}

/// Most places an error names for one `old_string`.
const PLACES_NAMED: usize = 10;

/// Where `needle` occurs in `text`, overlapping ones too (as [`occurrences`] counts them), as
/// line numbers for a model to tell them apart: `at lines 3, 17 and 40`.
fn occurrence_lines(text: &str, needle: &str) -> String {
    let mut lines = Vec::new();
    let (mut line, mut counted_to) = (1, 0);
    for at in occurrence_starts(text, needle).take(OCCURRENCES_COUNTED) {
        line += text.as_bytes()[counted_to..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        counted_to = at;
        if lines.last() != Some(&line) {
            lines.push(line);
        }
        if lines.len() > PLACES_NAMED {
            break;
        }
    }
    named_lines(&lines)
}

/// `at line 3`, `at lines 3, 17 and 40`, `at lines 1, 2, ... and more` past [`PLACES_NAMED`].
fn named_lines(lines: &[usize]) -> String {
    let shown: Vec<String> = lines
        .iter()
        .take(PLACES_NAMED)
        .map(ToString::to_string)
        .collect();
    match (shown.as_slice(), lines.len() > PLACES_NAMED) {
        ([], _) => String::new(),
        ([one], false) => format!("at line {one}"),
        (all, true) => format!("at lines {} and more", all.join(", ")),
        ([rest @ .., last], false) => format!("at lines {} and {last}", rest.join(", ")),
    }
}

/// Why an `old_string` that does not occur may have missed, for a model to mend its call
/// rather than read the whole file again: read_file's line numbers copied with the text, or
/// where its first line occurs, or nearly (but for white space or case). Empty when there is
/// nothing to say. One pass over the file's lines, only when the edit failed.
fn near_miss(text: &str, old_string: &str) -> String {
    let numbered = |line: &str| {
        let digits = line.trim_start_matches(' ');
        let rest = digits.trim_start_matches(|c: char| c.is_ascii_digit());
        rest.len() < digits.len() && rest.starts_with('\t')
    };
    let given: Vec<&str> = old_string
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    if !given.is_empty() && given.iter().all(|l| numbered(l)) {
        return " (its lines start with the line numbers read_file shows, a number and a tab: \
                they are not part of the file; leave them out)"
            .to_owned();
    }
    let Some(first) = given.first().map(|l| l.trim_end_matches('\r')) else {
        return String::new();
    };
    let (mut exact, mut spaced, mut cased) = (Vec::new(), Vec::new(), Vec::new());
    let (trimmed, lowered) = (first.trim(), first.trim().to_lowercase());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        // A search is made ready in the needle's length: only where it can fit, so that 8
        // million empty lines and a first line of 64 KiB are not 8 million of them.
        if line.len() >= first.len() && line.contains(first) {
            exact.push(n + 1);
        } else if line.trim() == trimmed {
            spaced.push(n + 1);
        } else if line.trim().to_lowercase() == lowered {
            cased.push(n + 1);
        }
        if exact.len() > PLACES_NAMED {
            break;
        }
    }
    let whole = given.len() == 1;
    match (exact.is_empty(), spaced.is_empty(), cased.is_empty()) {
        (false, _, _) if whole => String::new(),
        (false, _, _) => format!(
            " (its first line occurs {}: what follows it there differs)",
            named_lines(&exact)
        ),
        (true, false, _) => format!(
            " ({} {} but for white space)",
            if whole { "it is" } else { "its first line is" },
            named_lines(&spaced)
        ),
        (true, true, false) => format!(
            " ({} {} but for case)",
            if whole { "it is" } else { "its first line is" },
            named_lines(&cased)
        ),
        (true, true, true) if whole => String::new(),
        (true, true, true) => " (not even its first line occurs)".to_owned(),
    }
}

/// Whether `text` has line breaks and every one of them is CRLF.
fn ends_lines_with_crlf(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut breaks = bytes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .map(|(at, _)| at)
        .peekable();
    breaks.peek().is_some() && breaks.all(|at| at > 0 && bytes[at - 1] == b'\r')
}

/// `text` with each LF that is not already part of a CRLF made CRLF.
fn with_crlf(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\n') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + text.len() / 16);
    let mut last = '\0';
    for c in text.chars() {
        if c == '\n' && last != '\r' {
            out.push('\r');
        }
        out.push(c);
        last = c;
    }
    out.into()
}

/// The existing content of a file about to be replaced.
struct OldFile {
    bytes: Vec<u8>,
    mode: u32,
    /// Its owner (uid, gid), kept when a write replaces it.
    owner: (u32, u32),
    /// What identifies this version of it: checked again just before it is replaced.
    stamp: Stamp,
    /// How it holds its text when in an encoding a write keeps (windows-1252, UTF-16).
    held: Option<crate::decode::Held>,
}

/// When Monad runs as root, what its tools create belongs to whoever owns the place it is
/// created in (the file it replaces, else its directory), so that commands, which never run as
/// root, can still change it; nothing is handed to root itself. Not as root, a file that
/// replaces another keeps that one's group when the user is in it (its owner cannot be given
/// away: it is the user's now), so that the others of the group keep what its mode gives them;
/// a new file is left as the system makes it.
fn give_to(
    file: &impl std::os::fd::AsFd,
    owner: (u32, u32),
    replacing: bool,
) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        if replacing {
            // Refused (EPERM) when the group is not one of the user's: the file then has the
            // user's own, as any program's rewrite of it would.
            let _ = nix::unistd::fchown(file.as_fd(), None, Some(owner.1.into()));
        }
        return Ok(());
    }
    if owner.0 == 0 {
        return Ok(());
    }
    nix::unistd::fchown(file.as_fd(), Some(owner.0.into()), Some(owner.1.into()))
        .map_err(std::io::Error::from)
}

/// [`give_to`] for a directory handle, which may be opened as a path only (`O_PATH`, which
/// `fchown` refuses): changed through the descriptor itself (`AT_EMPTY_PATH`), never by name.
fn give_dir_to(dir: &Dir, owner: (u32, u32)) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() || owner.0 == 0 {
        return Ok(());
    }
    nix::unistd::fchownat(
        dir,
        "",
        Some(owner.0.into()),
        Some(owner.1.into()),
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    )
    .map_err(std::io::Error::from)
}

/// The (uid, gid) of a directory or file.
fn owner_of(meta: &cap_std::fs::Metadata) -> (u32, u32) {
    use cap_std::fs::MetadataExt;
    (meta.uid(), meta.gid())
}

/// Where a write lands: the parent directory handle, the final name, and what is there now.
struct Target {
    parent: Dir,
    name: std::ffi::OsString,
    path: JailPath,
    old: Option<OldFile>,
    /// The directories made for it ([`make_parents`]), taken back if the write fails.
    new_dirs: NewDirs,
}

/// What a write does about missing parent directories.
#[derive(Debug, Clone, Copy)]
enum Parents<'a> {
    /// Refuses the write (`create_parents: false`, and every edit).
    Require,
    /// Makes them.
    Create,
    /// Makes only those an approval prompt showed (relative to the root, as
    /// [`missing_parents`] gives them); refuses the write if another one is missing.
    Approved(&'a [String]),
}

/// The directories a write made, each with a handle on the one it was made in and its path
/// relative to the root, outermost first.
#[derive(Default)]
struct NewDirs(Vec<(Dir, OsString, String)>);

impl NewDirs {
    /// Their paths, relative to the root, outermost first.
    fn shown(&self) -> Vec<String> {
        self.0.iter().map(|(_, _, shown)| shown.clone()).collect()
    }

    /// Syncs the directory each was made in, innermost first, so that the new entries (and
    /// the file written into the innermost) outlast a power cut; a failure is told, not
    /// returned (the write is done).
    fn sync(&self) {
        for (parent, _, shown) in self.0.iter().rev() {
            if let Err(e) = sync_dir(parent) {
                tracing::warn!(
                    "{}/: made, but the directory it is in could not be synced: {e}",
                    crate::error::shown(shown)
                );
            }
        }
    }

    /// Removes them, innermost first, by name in the directory each was made in (`rmdir`
    /// never follows a link and removes only an empty directory: whatever was put in one
    /// meanwhile keeps it, and the ones above it).
    fn undo(self) {
        for (parent, name, _) in self.0.into_iter().rev() {
            if parent.remove_dir(&name).is_err() {
                return;
            }
        }
    }
}

impl Target {
    /// Finds the directory and name a write to `path` replaces. A final symbolic link is
    /// resolved through the jail and the write goes to its target, which must be inside the
    /// root; the link itself is never written through.
    fn locate(
        jail: &Jail,
        path: &JailPath,
        parents: Parents<'_>,
        limits: &Limits,
    ) -> Result<Target, SandboxError> {
        // The file a final link leads to: the canonical path has no links left in it.
        let path = jail.through_final_link(path)?;
        refuse_git_internals(jail, &path)?;
        let Some((parent_path, name)) = path.split() else {
            return Err(SandboxError::WrongFileType {
                path: path.given().to_owned(),
                what: "is a directory, not a file to write",
            });
        };
        let name = name.to_owned();
        let (parent, new_dirs) = match jail.open_dir(&parent_path) {
            Ok(dir) => (dir, NewDirs::default()),
            Err(SandboxError::NotFound(_)) if !matches!(parents, Parents::Require) => {
                make_parents(jail, &parent_path, parents)?
            }
            Err(SandboxError::NotFound(_)) => {
                return Err(SandboxError::NotFound(format!(
                    "the parent directory `{}` of `{}` does not exist (`create_parents: \
                     false` was given; leave it out to create it)",
                    crate::error::shown(&parent_path.display()),
                    path.shown(),
                )));
            }
            Err(e) => return Err(e),
        };
        // Checked by its path above, opened by its path here: a command that swapped a
        // directory on the way for a link meanwhile (to `.git`) is caught on what was opened.
        if let Err(e) = check_opened(jail, &parent, &path.shown()) {
            new_dirs.undo();
            return Err(e);
        }
        match Target::existing(&parent, &name, &path, limits) {
            Ok(old) => Ok(Target {
                parent,
                name,
                path,
                old,
                new_dirs,
            }),
            Err(e) => {
                new_dirs.undo();
                Err(e)
            }
        }
    }

    /// What is at `name` in `parent` now: the file a write replaces (`None` when there is
    /// none), or the error for anything else there.
    fn existing(
        parent: &Dir,
        name: &OsStr,
        path: &JailPath,
        limits: &Limits,
    ) -> Result<Option<OldFile>, SandboxError> {
        let old = match parent.symlink_metadata(name) {
            Ok(meta) if meta.is_file() => {
                // A file its user may not write (read-only, another user's) is not replaced
                // behind that, as a rename over it would: the user's own tools would refuse.
                if let Err(e) = rustix::fs::accessat(
                    parent,
                    Path::new(name),
                    rustix::fs::Access::WRITE_OK,
                    rustix::fs::AtFlags::EACCESS | rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                ) && e == rustix::io::Errno::ACCESS
                {
                    use cap_std::fs::MetadataExt;
                    return Err(SandboxError::Protected(format!(
                        "`{}` is not writable by this workspace's user (mode {:04o}, owned by \
                         uid {}): its owner must make it writable first",
                        path.shown(),
                        meta.mode() & 0o7777,
                        meta.uid()
                    )));
                }
                let (file, meta) =
                    crate::jail::open_regular_nofollow(parent, Path::new(name), path.given())?;
                let bytes = read_capped(file, meta.len(), limits.write_max_bytes, path.given())?;
                Some(OldFile {
                    held: crate::decode::held(&bytes),
                    bytes,
                    // A rewrite by someone else takes away set-user-ID and set-group-ID, as
                    // the kernel does when another user writes to such a file: an agent must
                    // not be able to put its own program behind those bits.
                    mode: PermissionsExt::mode(&meta.permissions()) & 0o1777,
                    owner: owner_of(&meta),
                    stamp: Stamp::of(&meta),
                })
            }
            Ok(meta) if meta.is_dir() => {
                return Err(SandboxError::WrongFileType {
                    path: path.given().to_owned(),
                    what: "is a directory",
                });
            }
            Ok(meta) if meta.file_type().is_symlink() => {
                // Swapped for a link since it was resolved above: refuse rather than chase it.
                return Err(SandboxError::Escape {
                    path: path.given().to_owned(),
                    reason: EscapeReason::LinkOutside,
                });
            }
            Ok(_) => {
                return Err(SandboxError::Escape {
                    path: path.given().to_owned(),
                    reason: EscapeReason::SpecialFile,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(SandboxError::from_io("stat", path.given(), e)),
        };
        Ok(old)
    }

    /// The text of the file it replaces, decoded as `read_file` decodes it.
    fn old_text(&self) -> Option<String> {
        let old = self.old.as_ref()?;
        Some(match old.held {
            Some(held) => crate::decode::decode(&old.bytes, held.encoding),
            None => String::from_utf8_lossy(&old.bytes).into_owned(),
        })
    }

    /// How the file it replaces holds its text, when in an encoding a write keeps.
    fn held(&self) -> Option<crate::decode::Held> {
        self.old.as_ref().and_then(|old| old.held)
    }

    /// `content` as the file will hold it, within the write limit, which counts the bytes
    /// written (in UTF-16 about twice the text's): a file in another encoding than UTF-8 stays
    /// in it when it can hold the new text (its encoding), else it is written anew as UTF-8 (the
    /// encoding it had).
    #[allow(clippy::type_complexity)]
    fn encoded<'a>(
        &self,
        content: &'a str,
        limits: &Limits,
    ) -> Result<
        (
            std::borrow::Cow<'a, [u8]>,
            Option<&'static str>,
            Option<&'static str>,
        ),
        SandboxError,
    > {
        let held = self.held();
        let encoded = match crate::decode::encode(content, held) {
            Ok(bytes) => (bytes, held.map(|h| h.encoding.as_str()), None),
            Err(held) => (
                content.as_bytes().into(),
                None,
                Some(held.encoding.as_str()),
            ),
        };
        match encoded.1 {
            Some(encoding) if encoding != "utf-8" => check_written(
                limits,
                encoded.0.len(),
                &format!("written as {encoding} (the file's encoding), the content is"),
            )?,
            _ => check_size(limits, encoded.0.len())?,
        }
        Ok(encoded)
    }

    /// Writes `content` to a new temporary file beside the target, syncs it, and renames it over
    /// the target. `rename` replaces a directory entry and never follows a link, so whatever was
    /// swapped in at the final name, nothing outside the root is written. Gives the new file's
    /// stamp.
    fn replace(&self, content: &[u8]) -> Result<Stamp, SandboxError> {
        let given = self.path.given();
        // Written without a name where the file system can, and named only once written and
        // synced: a crash mid-write (megabytes take a while) left a partial `.monad-*.tmp` in
        // the folder for good, in a user's project among the files git shows. Where it cannot
        // (no `O_TMPFILE`, or no `/proc` to name it through), under a temporary name from the
        // start.
        let unnamed = if NAMING_FAILS.load(std::sync::atomic::Ordering::Relaxed) {
            None
        } else {
            unnamed_file(&self.parent)
        };
        let (tmp_name, stamp) = match unnamed {
            Some(file) => {
                let stamp = self
                    .fill(&file, content)
                    .map_err(|e| SandboxError::from_io("write", given, e))?;
                match self.name_unnamed(&file) {
                    Ok(name) => (name, stamp),
                    Err(e) => {
                        // Not again in this process: each write would be made twice.
                        if !NAMING_FAILS.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            tracing::warn!(
                                "a written file cannot be named through /proc/self/fd ({e}): \
                                 writes go through named temporary files from now on"
                            );
                        }
                        self.write_named(content)?
                    }
                }
            }
            None => self.write_named(content)?,
        };
        // Another program (an editor, a formatter, the user) may have written the file since
        // this call read it: replacing it then would throw their change away unseen.
        if let Err(changed) = self.unchanged() {
            let _ = self.parent.remove_file(&tmp_name);
            return Err(changed);
        }
        if let Err(e) = self.parent.rename(&tmp_name, &self.parent, &self.name) {
            let _ = self.parent.remove_file(&tmp_name);
            return Err(SandboxError::from_io("write", given, e));
        }
        // The rename is in the directory: synced too, or a write acknowledged to the agent
        // could be undone by a power cut (the file's own sync keeps its content only). The
        // content is in place either way, so a failure here is told, not returned.
        if let Err(e) = sync_dir(&self.parent) {
            tracing::warn!(
                "{}: written, but its directory could not be synced: {e}",
                crate::error::shown(given)
            );
        }
        self.new_dirs.sync();
        Ok(stamp)
    }

    /// Writes `content` into the new `file`, gives it the old file's owner and mode (a new
    /// file's: 0666 less the umask, what its user's own tools would give it) and syncs it; its
    /// stamp.
    fn fill(&self, file: &cap_std::fs::File, content: &[u8]) -> std::io::Result<Stamp> {
        let mode = self.old.as_ref().map_or(0o666 & !umask(), |old| old.mode);
        let owner = match &self.old {
            Some(old) => old.owner,
            None => owner_of(&self.parent.dir_metadata()?),
        };
        give_to(file, owner, self.old.is_some())?;
        let mut writer = file;
        writer.write_all(content)?;
        file.set_permissions(Permissions::from_mode(mode))?;
        file.sync_all()?;
        // The new file's stamp, from its own handle: a rename keeps its inode, size and
        // modification time, and a look by name afterwards could see another program's file.
        Ok(Stamp::of(&file.metadata()?))
    }

    /// `content` in a new file under a temporary name ([`Target::fill`]): the name and stamp;
    /// nothing left behind when it fails.
    fn write_named(&self, content: &[u8]) -> Result<(String, Stamp), SandboxError> {
        let (name, file) = self.named_temp_file()?;
        match self.fill(&file, content) {
            Ok(stamp) => Ok((name, stamp)),
            Err(e) => {
                let _ = self.parent.remove_file(&name);
                Err(SandboxError::from_io("write", self.path.given(), e))
            }
        }
    }

    /// A new file under a temporary name in the file's directory, mode 0600.
    fn named_temp_file(&self) -> Result<(String, cap_std::fs::File), SandboxError> {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o600);
        under_temp_name(|name| self.parent.open_with(name, &options))
            .map_err(|e| SandboxError::from_io("write", self.path.given(), e))
    }

    /// Gives the written [`unnamed_file`] a temporary name in the file's directory, for the
    /// rename: through `/proc/self/fd` (a link by descriptor alone, `AT_EMPTY_PATH`, needs a
    /// capability).
    fn name_unnamed(&self, file: &cap_std::fs::File) -> std::io::Result<String> {
        use std::os::fd::AsRawFd;
        let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
        let (name, ()) = under_temp_name(|name| {
            Ok(nix::unistd::linkat(
                nix::fcntl::AT_FDCWD,
                by_fd.as_str(),
                &self.parent,
                name,
                nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
            )?)
        })?;
        Ok(name)
    }

    /// Refuses to replace a file changed since this workspace's tools last saw it.
    fn check_seen(&self, seen: &Seen) -> Result<(), SandboxError> {
        match &self.old {
            Some(old) => seen.check(&self.path, old.stamp),
            None => Ok(()),
        }
    }

    /// Refuses to write over anything but the version of the file (or its absence) that an
    /// approval prompt's diff was made from: its owner approved that change, not one to what
    /// was put there while the prompt waited.
    fn check_approved(
        &self,
        jail: &Jail,
        given: &JailPath,
        approved: &Preview,
    ) -> Result<(), SandboxError> {
        let now = self.base();
        if now == approved.base {
            // A directory on the way swapped for a link while the prompt waited: the file would
            // be written where its owner was not shown (the file's own stamp cannot tell, for a
            // new one). Where the kernel says where the opened directory is, that is what is
            // compared (a swap back after the open would fool a look by name); else by name.
            let shown = approved
                .through_link
                .as_ref()
                .map_or_else(|| given.rel().to_owned(), std::path::PathBuf::from);
            let moved = match opened_rel(jail, &self.parent) {
                Some(parent) if !shown.to_string_lossy().contains('\u{FFFD}') => {
                    parent.join(&self.name) != shown
                }
                _ => self.through_link(jail, given) != approved.through_link,
            };
            if moved {
                return Err(self.changed(
                    "now leads to another place (a link on its way changed) while its owner was \
                     being asked to approve this change, so it would not be written where they \
                     were shown",
                ));
            }
            return Ok(());
        }
        let what = match (approved.base.stamp, now.stamp) {
            // A link on the way now leads elsewhere: the write would go to another file.
            _ if now.path != approved.base.path => "now leads to another file",
            (None, _) => "was created",
            (Some(_), None) => "was deleted",
            (Some(_), Some(_)) => "was changed",
        };
        Err(self.changed(&format!(
            "{what} while its owner was being asked to approve this change, so the diff they \
             approved is not the change it would make now"
        )))
    }

    /// [`SandboxError::Changed`]: the file `what` (happened), so nothing was written.
    fn changed(&self, what: &str) -> SandboxError {
        SandboxError::Changed(format!(
            "`{}` {what}; nothing was written: read it again and redo the change",
            self.path.shown()
        ))
    }

    /// Remembers what this call wrote as what the tools last saw there.
    fn note_in(&self, seen: &Seen, stamp: Stamp) {
        seen.note(self.path.rel(), stamp);
    }

    /// Whether what is at the name is still what was read there (or still nothing).
    fn unchanged(&self) -> Result<(), SandboxError> {
        let now = match self.parent.symlink_metadata(&self.name) {
            Ok(meta) => Some(Stamp::of(&meta)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(SandboxError::from_io("stat", self.path.given(), e)),
        };
        if now == self.old.as_ref().map(|old| old.stamp) {
            return Ok(());
        }
        Err(self.changed(if self.old.is_none() {
            "was created by another program while it was being written"
        } else {
            "was changed by another program while this call was writing it"
        }))
    }
}

/// Refuses a write or edit of git's own files: anything in a `.git` directory, or a `.git`
/// file (a worktree's pointer to its git directory), at any depth, however the path reaches it
/// (a link on the way counts). git's config names programs it runs (`core.fsmonitor`,
/// `core.pager`, aliases) and its hooks are programs: written by an agent, they would run
/// outside any sandbox the next time the folder's owner runs git, and `git status` and `git
/// diff` would not show the change. Agents use git itself, through `run_command`.
fn refuse_git_internals(jail: &Jail, path: &JailPath) -> Result<(), SandboxError> {
    if in_git(&real_place(jail, path)) {
        return Err(git_refusal(&path.shown()));
    }
    Ok(())
}

/// Whether `path` (relative to the root) is in or of a `.git`, under any name a filesystem a
/// folder may be on takes for it ([`names_git`]).
fn in_git(path: &Path) -> bool {
    path.components().any(|c| names_git(c.as_os_str()))
}

/// Whether some filesystem takes `name` for `.git`, as git's own `verify_path` refuses such
/// names in a checkout: `.git` in any ASCII case (case-insensitive filesystems: macOS's, vfat,
/// NTFS, ext4 with casefold), with characters HFS+ and some casefolding ignore left out (joiners,
/// bidi marks, the byte order mark: every character [`monad_protocol::text::is_hidden`] finds),
/// with trailing dots and spaces (vfat and NTFS drop them), before an NTFS stream's `:`
/// (`.git::$INDEX_ALLOCATION`), or as its 8.3 short name `git~1` (vfat and NTFS look names up
/// by it too). A folder on such a filesystem would otherwise take `write_file .git./config`
/// into its `.git/config`.
fn names_git(name: &std::ffi::OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return name.eq_ignore_ascii_case(".git");
    };
    let stream = name.split(':').next().unwrap_or(name);
    let seen: String = stream
        .chars()
        .filter(|&c| !monad_protocol::text::is_hidden(c))
        .collect();
    let trimmed = seen.trim_end_matches(['.', ' ']);
    trimmed.eq_ignore_ascii_case(".git") || trimmed.eq_ignore_ascii_case("git~1")
}

/// The refusal of a write to git's own files, `shown` as the path is shown.
fn git_refusal(shown: &str) -> SandboxError {
    SandboxError::Protected(format!(
        "`{shown}` is one of git's own files (in or of `.git`): Monad's file tools do not write \
         them, since git runs programs its config and hooks name, outside any sandbox; use git \
         itself through run_command, or ask the folder's owner"
    ))
}

/// Where the open directory `dir` is relative to the root, as the kernel has it; `None` where
/// that cannot be read, or it is not under the root.
fn opened_rel(jail: &Jail, dir: &Dir) -> Option<std::path::PathBuf> {
    let (root, opened) = (opened_path(jail.dir())?, opened_path(dir)?);
    opened.strip_prefix(&root).ok().map(Path::to_path_buf)
}

/// Where the open directory `dir` is, as the kernel has it (`/proc/self/fd`): its absolute
/// path, whatever links led to it. `None` where that cannot be read.
fn opened_path(dir: &Dir) -> Option<std::path::PathBuf> {
    use std::os::fd::{AsFd, AsRawFd};
    std::fs::read_link(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd())).ok()
}

/// Checks the directory a write was opened in as its path was checked: inside the root, and
/// not in or of `.git` (`shown`: the path as the errors show it, as the check by path does). A
/// command can swap a directory on the way for a link between the check of the path and the
/// open (a loop of `rename`s): the write then happens in the directory opened, so that is the
/// one checked. Where the kernel cannot say where it is (no `/proc`), the path's check stands
/// alone.
fn check_opened(jail: &Jail, dir: &Dir, shown: &str) -> Result<(), SandboxError> {
    let (Some(root), Some(opened)) = (opened_path(jail.dir()), opened_path(dir)) else {
        return Ok(());
    };
    let Ok(rel) = opened.strip_prefix(&root) else {
        return Err(SandboxError::Changed(format!(
            "a directory on the way to `{shown}` was changed (a link put in its place) while \
             the write was made; nothing was written"
        )));
    };
    if in_git(rel) {
        return Err(git_refusal(shown));
    }
    Ok(())
}

/// Where `path` really is, relative to the root: the nearest directory above it that exists,
/// with every symbolic link on the way resolved (inside the root), then the rest as given. A
/// write to `docs/hook` where `docs` is a link to `.husky` lands in `.husky/hook`.
fn real_place(jail: &Jail, path: &JailPath) -> std::path::PathBuf {
    let rel = path.rel();
    for above in rel.ancestors().skip(1) {
        if above.as_os_str().is_empty() {
            break;
        }
        if let Ok(canonical) = jail.dir().canonicalize(above) {
            return canonical.join(rel.strip_prefix(above).unwrap_or(rel));
        }
    }
    rel.to_owned()
}

/// Where a write to `path` lands, when a symbolic link on the way (a directory's, or the
/// file's own) makes it another place than the path says: what its owner must be shown.
fn landing_elsewhere(jail: &Jail, path: &JailPath) -> Option<String> {
    let real = real_place(jail, path);
    (real != path.rel()).then(|| real.to_string_lossy().into_owned())
}

/// Why a write refuses a missing directory's place taken by something else.
const NOT_A_NEW_DIRECTORY: &str = "has a component that is a symbolic link or a file where a \
                                   new directory was to be made (refused, not followed)";

/// The directories a write into `parent` would create first: the missing part of it, outermost
/// first, each relative to the root (empty when `parent` exists). The existing part is opened
/// through the jail, as [`make_parents`] opens it, so an error here (a link leading out, a file
/// where a directory must be) is the one the write would fail with.
pub(crate) fn missing_parents(jail: &Jail, parent: &JailPath) -> Result<Vec<String>, SandboxError> {
    let prefixes = parent.prefixes();
    for (i, prefix) in prefixes.iter().enumerate() {
        match jail.open_dir(prefix) {
            Ok(_) => {}
            Err(SandboxError::NotFound(_)) => {
                // Something that cannot be opened as a directory but is there (a dangling
                // link): [`make_parents`] refuses it, so the check does too.
                if jail.dir().symlink_metadata(prefix.rel()).is_ok() {
                    return Err(SandboxError::WrongFileType {
                        path: prefix.given().to_owned(),
                        what: NOT_A_NEW_DIRECTORY,
                    });
                }
                too_many_new_dirs(parent, prefixes.len() - i)?;
                return Ok(prefixes[i..].iter().map(JailPath::display).collect());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Vec::new())
}

/// Opens `parent` (the directory a write lands in), creating what is missing of it (at most
/// [`MAX_NEW_DIRECTORIES`], and with [`Parents::Approved`] only those approved), and returns
/// its handle with what it made. The part that exists is opened through the jail (links
/// followed only while they stay beneath the root). Each missing directory is made by name in
/// the handle of the one above it (`mkdirat`, which never follows a link) and then opened by
/// that name without following links: a link swapped in at any moment, before or after it was
/// made, is refused rather than followed, so nothing outside the root is ever made or opened.
/// No path is looked up again from the root once creating starts. Each directory made belongs
/// to the owner of the one it was made in ([`give_to`]), changed through its own descriptor. On
/// failure, what was made is taken back ([`NewDirs::undo`]).
fn make_parents(
    jail: &Jail,
    parent: &JailPath,
    parents: Parents<'_>,
) -> Result<(Dir, NewDirs), SandboxError> {
    let mut made = NewDirs::default();
    match make_parents_into(jail, parent, parents, &mut made) {
        Ok(dir) => Ok((dir, made)),
        Err(e) => {
            made.undo();
            Err(e)
        }
    }
}

fn make_parents_into(
    jail: &Jail,
    parent: &JailPath,
    parents: Parents<'_>,
    made: &mut NewDirs,
) -> Result<Dir, SandboxError> {
    let mut dir = jail.open_dir(&jail.resolve("")?)?;
    let prefixes = parent.prefixes();
    let mut creating = false;
    for (i, prefix) in prefixes.iter().enumerate() {
        if !creating {
            match jail.open_dir(prefix) {
                Ok(opened) => {
                    dir = opened;
                    continue;
                }
                Err(SandboxError::NotFound(_)) => {
                    too_many_new_dirs(parent, prefixes.len() - i)?;
                    creating = true;
                }
                Err(e) => return Err(e),
            }
        }
        let Some((_, name)) = prefix.split() else {
            continue;
        };
        let shown = prefix.display();
        if let Parents::Approved(approved) = parents
            && !approved.contains(&shown)
        {
            return Err(SandboxError::Unapproved(format!(
                "the folder changed while the write of `{}` waited for approval: it would now \
                 also create the directory `{}/`, which the approval did not cover; \
                 nothing was written (call again to be asked about what it would do now)",
                parent.shown(),
                crate::error::shown(&shown)
            )));
        }
        let fail = |e| SandboxError::from_io("create directory", &shown, e);
        let made_now = match dir.create_dir(name) {
            Ok(()) => true,
            // Made meanwhile by someone else: used if it is a directory, never followed.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(fail(e)),
        };
        let opened = match dir.open_dir_nofollow(name) {
            Ok(opened) => opened,
            Err(e) => {
                if made_now {
                    let _ = dir.remove_dir(name);
                }
                return Err(match e.raw_os_error() {
                    Some(nix::libc::ELOOP | nix::libc::ENOTDIR) => SandboxError::WrongFileType {
                        path: prefix.given().to_owned(),
                        what: NOT_A_NEW_DIRECTORY,
                    },
                    _ => fail(e),
                });
            }
        };
        let above = std::mem::replace(&mut dir, opened);
        if made_now {
            let owner = above.dir_metadata().map(|m| owner_of(&m));
            made.0.push((above, name.to_owned(), shown.clone()));
            give_dir_to(&dir, owner.map_err(fail)?).map_err(fail)?;
        }
    }
    Ok(dir)
}

/// How many directories one write may create: more than any project's layout needs, and a
/// bound on what an approval prompt lists and on what a failed write takes back.
pub const MAX_NEW_DIRECTORIES: usize = 64;

/// Refuses a write into `parent` that would need `missing` new directories, over
/// [`MAX_NEW_DIRECTORIES`].
fn too_many_new_dirs(parent: &JailPath, missing: usize) -> Result<(), SandboxError> {
    if missing > MAX_NEW_DIRECTORIES {
        return Err(SandboxError::LimitExceeded(format!(
            "writing to `{}` would create {missing} new directories, over the \
             {MAX_NEW_DIRECTORIES} one write may create",
            parent.shown()
        )));
    }
    Ok(())
}

/// The longest name a Linux file system takes (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// Resolves the path of the file a write or an edit acts on. The jail resolves a path
/// lexically, so one that ends in `/`, `/.` or `/..` would act on a file of another name
/// (`dir/` is `dir`, `a/b/..` is `a`): it names a directory and is refused. So is a name
/// longer than a file system takes, before any directory is made for it.
fn resolve_file(jail: &Jail, given: &str) -> Result<JailPath, SandboxError> {
    let path = jail.resolve(given)?;
    let last = given.rsplit('/').next().unwrap_or(given);
    if !path.is_root() && matches!(last, "" | "." | "..") {
        return Err(SandboxError::WrongFileType {
            path: given.to_owned(),
            what: "ends in `/`, `.` or `..`: it names a directory, not a file",
        });
    }
    if path
        .rel()
        .components()
        .any(|c| c.as_os_str().len() > NAME_MAX)
    {
        return Err(SandboxError::InvalidPath {
            path: given.to_owned(),
            why: "it has a name longer than 255 bytes, the most a file system takes",
        });
    }
    Ok(path)
}

/// Syncs directory `dir` (a rename in it, say). `dir` is opened `O_PATH`, which `fsync` does
/// not take: opened again, for reading.
fn sync_dir(dir: &Dir) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    let readable = nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    Ok(nix::unistd::fsync(readable)?)
}

/// A written file could not be named through `/proc/self/fd` (no `/proc` mounted, say): writes
/// go through named temporary files from then on.
static NAMING_FAILS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A file without a name in `dir` (`O_TMPFILE`), mode 0600; `None` where the file system (or
/// the kernel) cannot make one.
fn unnamed_file(dir: &Dir) -> Option<cap_std::fs::File> {
    use nix::fcntl::OFlag;
    nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .ok()
    .map(|fd| cap_std::fs::File::from_std(fd.into()))
}

/// Makes something under a new temporary name ([`temp_name`]) with `make`, trying another name
/// while the one tried is taken (at most 16 more); the name and what `make` gave.
fn under_temp_name<T>(
    mut make: impl FnMut(&str) -> std::io::Result<T>,
) -> std::io::Result<(String, T)> {
    let mut attempt = 0u32;
    loop {
        let name = temp_name(attempt);
        match make(&name) {
            Ok(made) => return Ok((name, made)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The name of a write's temporary file, beside its target. Not made from the target's name:
/// a name near the 255-byte limit could not be written otherwise.
fn temp_name(attempt: u32) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(".monad-{}-{nanos:x}-{attempt}.tmp", std::process::id())
}

/// The whole unified diff from `old` (absent for a new file) to `new`.
fn full_diff(path: &str, old: Option<&str>, new: &str) -> String {
    // A name may hold a line break or other control characters: in a header they would start
    // lines of their own that read as the diff's.
    use std::fmt::Write as _;
    let mut shown = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_control() {
            let _ = write!(shown, "\\u{{{:x}}}", u32::from(c));
        } else {
            shown.push(c);
        }
    }
    let path = shown;
    let old_text = old.unwrap_or("");
    let old_header = if old.is_some() {
        format!("a/{path}")
    } else {
        "/dev/null".to_owned()
    };
    // Lines end at a line feed only: a lone carriage return stays inside its line, as `git
    // diff` shows it. `similar`'s own split and its writer end a line at either, so that its
    // diff glues the next line onto one ending in `\r` (` lone\r cr`), and a last line ending
    // in `\r` onto the diff's next; the hunks are written here for that.
    let old_lines: Vec<&str> = old_text.split_inclusive('\n').collect();
    let new_lines: Vec<&str> = new.split_inclusive('\n').collect();
    let mut out = String::new();
    // A line diff's time grows with the product of the lines where they differ, and `similar`
    // recurses as deep as its work: on files of many lines it is shown as what it is in the
    // end, every old line replaced by every new one; under that, it gets a deadline, past
    // which what is left is shown the same way.
    // What the two share at their ends is no part of the work: a one-line edit of a long file
    // is a small diff. Past the bound, the part between is shown replaced, with its context.
    let prefix = old_lines
        .iter()
        .zip(&new_lines)
        .take_while(|(a, b)| a == b)
        .count();
    let suffix = old_lines[prefix..]
        .iter()
        .rev()
        .zip(new_lines[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let (old_end, new_end) = (old_lines.len() - suffix, new_lines.len() - suffix);
    if (old_end - prefix) + (new_end - prefix) > DIFF_LINES_MAX {
        let from = prefix.saturating_sub(3);
        let (old_to, new_to) = (
            (old_end + 3).min(old_lines.len()),
            (new_end + 3).min(new_lines.len()),
        );
        let _ = write!(out, "--- {old_header}\n+++ b/{path}\n");
        let range = |start: usize, n: usize| match n {
            0 => format!("{start},0"),
            n => format!("{},{n}", start + 1),
        };
        let _ = writeln!(
            out,
            "@@ -{} +{} @@",
            range(from, old_to - from),
            range(from, new_to - from)
        );
        let lines = [
            (' ', &old_lines[from..prefix]),
            ('-', &old_lines[prefix..old_end]),
            ('+', &new_lines[prefix..new_end]),
            (' ', &old_lines[old_end..old_to]),
        ];
        for (tag, lines) in lines {
            for line in lines {
                out.push(tag);
                out.push_str(line);
                if !line.ends_with('\n') {
                    out.push_str("\n\\ No newline at end of file\n");
                }
            }
        }
        return out;
    }
    let diff = similar::TextDiff::configure()
        .newline_terminated(true)
        .timeout(DIFF_TIME)
        .diff_slices(&old_lines, &new_lines);
    for (n, hunk) in diff
        .unified_diff()
        .context_radius(3)
        .iter_hunks()
        .enumerate()
    {
        if n == 0 {
            let _ = write!(out, "--- {old_header}\n+++ b/{path}\n");
        }
        let _ = writeln!(out, "{}", hunk.header());
        for change in hunk.iter_changes() {
            let _ = write!(out, "{}{}", change.tag(), change.value());
            if !change.value().ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

/// The process's umask, read once from `/proc/self/status` (the `umask` call both reads and
/// sets it, which threads creating files at that moment would see); 022 where it cannot be read.
fn umask() -> u32 {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UMASK.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Umask:"))
                    .and_then(|m| u32::from_str_radix(m.trim(), 8).ok())
            })
            .unwrap_or(0o022)
    })
}

/// Writes whose differing lines (old and new together, past what their ends share) are more
/// than this are shown as those lines replaced.
const DIFF_LINES_MAX: usize = 200_000;

/// How long a line diff may take; past it, what is left is shown replaced whole.
const DIFF_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// A unified diff from `old` (absent for a new file) to `new`, cut at the diff cap.
fn unified_diff(path: &str, old: Option<&str>, new: &str, limits: &Limits) -> (String, bool) {
    let mut diff = full_diff(path, old, new);
    if diff.len() > limits.diff_max_bytes {
        diff.truncate(head(&diff, limits.diff_max_bytes).len());
        return (diff, true);
    }
    (diff, false)
}

/// Whether a `write_file` or `edit_file` call can be made, without making it and without
/// computing its diff (see [`preview`] for that).
pub(crate) fn check_write(
    jail: &Jail,
    limits: &Limits,
    tool: monad_protocol::ToolName,
    args: &serde_json::Value,
) -> Result<(), SandboxError> {
    use monad_protocol::ToolName;
    match tool {
        ToolName::WriteFile => {
            let args: WriteFileArgs = crate::check::parse(tool, args)?;
            check_write_size(limits, &args)?;
            let path = resolve_file(jail, &args.path)?;
            match Target::locate(jail, &path, Parents::Require, limits) {
                Ok(target) => {
                    let old = target.old_text();
                    let (content, _) = as_the_file_has_it(old.as_deref(), &args.content);
                    target.encoded(&content, limits).map(drop)
                }
                Err(SandboxError::NotFound(_)) if args.create_parents.unwrap_or(true) => {
                    check_size(limits, args.content.len())?;
                    let (parent, _) = path.split().ok_or_else(|| SandboxError::WrongFileType {
                        path: path.given().to_owned(),
                        what: "is a directory, not a file to write",
                    })?;
                    missing_parents(jail, &parent).map(drop)
                }
                Err(e) => Err(e),
            }
        }
        ToolName::EditFile => {
            let args: EditFileArgs = crate::check::parse(tool, args)?;
            plan_edit(jail, limits, &args).map(drop)
        }
        _ => Ok(()),
    }
}

/// What a `write_file` or `edit_file` would do, shown before it is approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The whole unified diff it would make (not cut at the diff cap).
    pub diff: String,
    /// The directories a write would create first, outermost first, relative to the root
    /// (empty when its directory exists, and for an edit).
    pub creates: Vec<String>,
    /// The file it writes, relative to the root, when a symbolic link on the path given (the
    /// file's own, or a directory's on the way) makes it another place; `None` otherwise.
    pub through_link: Option<String>,
    /// What the diff, made of decoded text, cannot show about the bytes written: a file in
    /// another encoding than UTF-8 kept in it or written anew as UTF-8, or bytes that are not
    /// text (shown in the diff as U+FFFD) replaced ([`bytes_note`]).
    pub bytes_note: Option<String>,
    /// The version of the file the diff was made from (none: the file did not exist). The
    /// write or edit made as approved ([`crate::Sandbox::call_approved`]) checks that it is
    /// still there.
    base: DiffBase,
}

/// What a write of `new_text` over `target`'s file does to its bytes that its diff (of decoded
/// text) cannot show: `None` for a UTF-8 file (or a new one). A file in another encoding is kept
/// in it, or, when the new text holds a character it cannot, written anew as UTF-8 (every byte
/// of it changes); a file with bytes that are not UTF-8 has them replaced (the diff shows each
/// as U+FFFD, so an edit elsewhere, or a write of the same text, looks like no change to them).
fn bytes_note(target: &Target, new_text: &str) -> Option<String> {
    let old = target.old.as_ref()?;
    if let Some(held) = old.held {
        let encoding = held.encoding.as_str();
        // What is no UTF-16 in it (an odd last byte, as `echo >> file` leaves; a lone
        // surrogate) reads as U+FFFD, in the old text and the new alike: the diff cannot show
        // that its bytes change.
        let lost = match crate::decode::not_utf16(&old.bytes, held.encoding) {
            0 => String::new(),
            n => format!(
                "; {n} of its bytes are not {encoding} (shown as U+FFFD) and are written as \
                 U+FFFD's bytes"
            ),
        };
        return Some(match crate::decode::encode(new_text, Some(held)) {
            Ok(_) => format!("the file is {encoding} text, and is written as {encoding}{lost}"),
            Err(_) => format!(
                "the file is {encoding} text; the new text has characters {encoding} cannot \
                 hold, so the whole file is written as UTF-8 (every character that is not \
                 ASCII changes its bytes)"
            ),
        });
    }
    let not_text: usize = old
        .bytes
        .utf8_chunks()
        .map(|chunk| chunk.invalid().len())
        .sum();
    (not_text > 0).then(|| {
        format!(
            "the file holds {not_text} bytes that are not UTF-8 text (shown in the diff as \
             U+FFFD): the write replaces them with the new text's UTF-8"
        )
    })
}

/// The file a [`Preview`]'s diff was made from: the path it is at (relative to the root, links
/// resolved: where the write goes) and its [`Stamp`], or `None` when there was no file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DiffBase {
    path: PathBuf,
    stamp: Option<Stamp>,
}

impl Target {
    fn base(&self) -> DiffBase {
        DiffBase {
            path: self.path.rel().to_owned(),
            stamp: self.old.as_ref().map(|old| old.stamp),
        }
    }

    /// The path written, when a link on the given path leads to another place.
    fn through_link(&self, jail: &Jail, given: &JailPath) -> Option<String> {
        landing_elsewhere(jail, &self.path)
            .or_else(|| (self.path.rel() != given.rel()).then(|| self.path.display()))
    }
}

/// What a `write_file` or `edit_file` would do (its whole diff, and the directories it would
/// create), without doing it; the error the call would fail with when it cannot be made; `None`
/// for other tools.
pub(crate) fn preview(
    jail: &Jail,
    limits: &Limits,
    seen: &Seen,
    tool: monad_protocol::ToolName,
    args: &serde_json::Value,
) -> Result<Option<Preview>, SandboxError> {
    use monad_protocol::ToolName;
    match tool {
        ToolName::WriteFile => {
            let args: WriteFileArgs = crate::check::parse(tool, args)?;
            check_write_size(limits, &args)?;
            let path = resolve_file(jail, &args.path)?;
            match Target::locate(jail, &path, Parents::Require, limits) {
                Ok(target) => {
                    // Refused before its owner is asked, as the write itself would be.
                    target.check_seen(seen)?;
                    let old = target.old_text();
                    let (content, _) = as_the_file_has_it(old.as_deref(), &args.content);
                    // Refused before its owner is asked when its bytes pass the limit.
                    target.encoded(&content, limits)?;
                    Ok(Some(Preview {
                        diff: full_diff(&target.path.display(), old.as_deref(), &content),
                        creates: Vec::new(),
                        through_link: target.through_link(jail, &path),
                        bytes_note: bytes_note(&target, &content),
                        base: target.base(),
                    }))
                }
                // A new file in directories the write will create (each checked again as it is
                // made).
                Err(SandboxError::NotFound(_)) if args.create_parents.unwrap_or(true) => {
                    check_size(limits, args.content.len())?;
                    let (parent, _) = path.split().ok_or_else(|| SandboxError::WrongFileType {
                        path: path.given().to_owned(),
                        what: "is a directory, not a file to write",
                    })?;
                    Ok(Some(Preview {
                        diff: full_diff(&path.display(), None, &args.content),
                        creates: missing_parents(jail, &parent)?,
                        through_link: landing_elsewhere(jail, &path),
                        bytes_note: None,
                        base: DiffBase {
                            path: path.rel().to_owned(),
                            stamp: None,
                        },
                    }))
                }
                Err(e) => Err(e),
            }
        }
        ToolName::EditFile => {
            let args: EditFileArgs = crate::check::parse(tool, args)?;
            let edit = plan_edit(jail, limits, &args)?;
            Ok(Some(Preview {
                diff: full_diff(
                    &edit.target.path.display(),
                    Some(&edit.old_text),
                    &edit.new_text,
                ),
                creates: Vec::new(),
                through_link: edit.target.through_link(jail, &edit.given),
                bytes_note: bytes_note(&edit.target, &edit.new_text),
                base: edit.target.base(),
            }))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Names of any bytes but NUL and `/`, of any length around the eight compared as a
        /// number (short ones, one the start of another, equal heads): the order of the
        /// names' bytes.
        #[test]
        fn names_sort_as_their_bytes(
            names in proptest::collection::btree_set(
                proptest::collection::vec(
                    proptest::sample::select(vec![1u8, b'a', b'b', b'.', 0x7f, 0x80, 0xff]),
                    1..12,
                ),
                0..40,
            ),
        ) {
            use std::os::unix::ffi::OsStringExt;
            let mut entries: Vec<(OsString, EntryKind)> = names
                .iter()
                .rev()
                .map(|n| (OsString::from_vec(n.clone()), EntryKind::File))
                .collect();
            sort_by_name(&mut entries);
            let sorted: Vec<Vec<u8>> = entries.into_iter().map(|(n, _)| n.into_vec()).collect();
            let expected: Vec<Vec<u8>> = names.into_iter().collect();
            proptest::prop_assert_eq!(sorted, expected);
        }
    }

    /// The directories the jail opens are `O_PATH` descriptors, which `fsync` refuses (EBADF):
    /// a write's rename was never synced, and every write warned so. It is opened again.
    #[test]
    fn a_jail_directory_can_be_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).unwrap();
        assert_eq!(
            nix::unistd::fsync(&dir),
            Err(nix::errno::Errno::EBADF),
            "opened O_PATH, as the jail opens directories"
        );
        sync_dir(&dir).unwrap();
    }

    /// A new file's mode follows the umask, as its user's own tools' would (it was 0644
    /// whatever the umask: a folder attached under `umask 077` got files others could read).
    /// The umask is read from `/proc`, not set and read back.
    #[test]
    fn the_umask_is_read_as_the_process_has_it() {
        let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        nix::sys::stat::umask(mask);
        assert_eq!(umask(), mask.bits());
        // A new file written is made with it.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sandbox = crate::Sandbox::open(
            dir.path(),
            crate::Limits::default(),
            crate::ExecPolicy::default(),
        )
        .unwrap();
        let args: WriteFileArgs =
            serde_json::from_value(serde_json::json!({"path": "new.txt", "content": "x"})).unwrap();
        sandbox.write_file(&args).unwrap();
        let mode = std::fs::metadata(dir.path().join("new.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o666 & !umask());
    }

    /// Where a directory record gives no kind (`DT_UNKNOWN`: ext4 without `filetype`, XFS with
    /// `ftype=0`), the entry is looked at without following it; a vanished one is left out.
    #[test]
    fn an_entry_of_unknown_kind_is_looked_at_without_following_it() {
        use rustix::fs::FileType;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(root.join("file"), "x").unwrap();
        std::fs::create_dir(root.join("dir")).unwrap();
        std::os::unix::fs::symlink("dir", root.join("link")).unwrap();
        std::os::unix::fs::symlink("/nowhere", root.join("dangling")).unwrap();
        nix::unistd::mkfifo(
            &root.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let dir = std::fs::File::open(root).unwrap();
        let kind = |name: &std::ffi::CStr| kind_of(FileType::Unknown, &dir, name).unwrap();
        assert_eq!(kind(c"file"), Some(EntryKind::File));
        assert_eq!(kind(c"dir"), Some(EntryKind::Dir));
        assert_eq!(kind(c"link"), Some(EntryKind::Symlink));
        assert_eq!(kind(c"dangling"), Some(EntryKind::Symlink));
        assert_eq!(kind(c"fifo"), Some(EntryKind::Other));
        assert_eq!(kind(c"gone"), None);
        // A kind the record gives is taken as it is, without a look.
        assert_eq!(
            kind_of(FileType::Directory, &dir, c"gone").unwrap(),
            Some(EntryKind::Dir)
        );
    }

    /// A lone carriage return is inside its line in a diff, as `git diff` shows it: the line
    /// after it is not glued onto it, and a last line without a line break is marked so.
    #[test]
    fn a_diff_splits_lines_at_line_feeds_only() {
        let old = "a\tb\nmixed crlf\r\nlone\rcr\nend";
        let new = "a b\nmixed crlf\r\nlone\rcr\nend";
        let diff = full_diff("f.txt", Some(old), new);
        assert_eq!(
            diff,
            "--- a/f.txt\n+++ b/f.txt\n@@ -1,4 +1,4 @@\n-a\tb\n+a b\n mixed crlf\r\n \
             lone\rcr\n end\n\\ No newline at end of file\n"
        );
        // A file of lines ending in `\r` alone (the old Mac's) is one line here, marked as
        // ending without a line break; a new file's diff starts from nothing.
        assert_eq!(
            full_diff("m.txt", Some("one\rtwo\r"), "one\rtoo\r"),
            "--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-one\rtwo\r\n\\ No newline at end of \
             file\n+one\rtoo\r\n\\ No newline at end of file\n"
        );
        assert_eq!(
            full_diff("n.txt", None, "x\ny\n"),
            "--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1,2 @@\n+x\n+y\n"
        );
        assert_eq!(full_diff("same.txt", Some("x\n"), "x\n"), "");
    }

    /// Another program that writes the file (or creates it) between a write's read and its
    /// rename keeps its change: the write fails and says so, and leaves no temporary file.
    #[test]
    fn a_write_refuses_to_replace_what_another_program_changed_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(dir.path()).unwrap();
        let limits = Limits::default();
        for existed in [true, false] {
            let name = if existed { "theirs.txt" } else { "new.txt" };
            if existed {
                jail.dir().write(name, "before\n").unwrap();
            }
            let path = jail.resolve(name).unwrap();
            let target = Target::locate(&jail, &path, Parents::Require, &limits).unwrap();
            // Their write: longer, so that the size differs whatever the clock's grain.
            jail.dir().write(name, "their change\n").unwrap();
            let refused = target.replace(b"mine\n").unwrap_err();
            assert!(matches!(refused, SandboxError::Changed(_)), "{refused:?}");
            assert!(
                refused.to_string().contains("nothing was written"),
                "{refused}"
            );
            assert_eq!(jail.dir().read_to_string(name).unwrap(), "their change\n");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        // Unchanged, it is replaced.
        let path = jail.resolve("theirs.txt").unwrap();
        let target = Target::locate(&jail, &path, Parents::Require, &limits).unwrap();
        target.replace(b"mine\n").unwrap();
        assert_eq!(jail.dir().read_to_string("theirs.txt").unwrap(), "mine\n");
    }

    /// Reads `bytes` as a whole file both ways and checks that they agree.
    fn both_ways(jail: &Jail, bytes: &[u8], max_lines: u64) -> ReadFileResult {
        jail.dir().write("f.txt", bytes).unwrap();
        let path = jail.resolve("f.txt").unwrap();
        let size = bytes.len() as u64;
        let (file, _) = jail.open_regular(&path).unwrap();
        let content = read_whole_in_halves(&file.into_std(), size)
            .unwrap()
            .expect("the file is as big as it was");
        let fast = whole_file_result(path.display(), size, content, max_lines);
        let (file, _) = jail.open_regular(&path).unwrap();
        let max_bytes = bytes.len().max(1);
        let serial = read_serially(&path, file.into_std(), size, 1, max_lines, max_bytes).unwrap();
        assert_eq!(fast, serial, "{} bytes, {max_lines} lines", bytes.len());
        fast
    }

    #[test]
    fn reading_in_halves_agrees_with_reading_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(dir.path()).unwrap();
        let text = "abc é ✓ 🦀 line\n".repeat(40);
        let lines = text.lines().count() as u64;
        for max_lines in [1, 2, lines - 1, lines, lines + 1, 1_000_000] {
            let whole = both_ways(&jail, text.as_bytes(), max_lines);
            assert_eq!(whole.truncated, max_lines < lines);
            both_ways(&jail, text.trim_end().as_bytes(), max_lines);
        }
        // A multi-byte character at every position around the middle.
        for pad in 0..8 {
            let bytes = format!("{}🦀é\nend", "a".repeat(100 + pad));
            let result = both_ways(&jail, bytes.as_bytes(), 10);
            assert_eq!(result.content, bytes);
        }
        // Not text: before and after the line cap, a NUL in and after the sniffed head.
        let mut bad = text.clone().into_bytes();
        bad[text.len() / 2] = 0xff;
        assert!(both_ways(&jail, &bad, 1_000_000).binary);
        assert!(!both_ways(&jail, &bad, 2).binary, "cut before the bad byte");
        let mut nul = text.clone().into_bytes();
        nul[3] = 0;
        assert!(both_ways(&jail, &nul, 1_000_000).binary);
        let mut late_nul = "x\n".repeat(BINARY_SNIFF_BYTES).into_bytes();
        late_nul.extend_from_slice(b"\0tail\n");
        assert!(!both_ways(&jail, &late_nul, 100_000).binary);
        for odd in ["\n", "\n\n\n", "no newline", "é", "\r\n\r\n"] {
            both_ways(&jail, odd.as_bytes(), 1_000_000);
            both_ways(&jail, odd.as_bytes(), 1);
        }
    }

    #[test]
    fn only_files_whose_lines_likely_fit_the_cap_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(dir.path()).unwrap();
        let short_lines = "x\n".repeat(64 * 1024);
        jail.dir().write("short.txt", &short_lines).unwrap();
        let long_lines = format!("{}\n", "y".repeat(200_000)).repeat(3);
        jail.dir().write("long.txt", &long_lines).unwrap();
        let file = |name: &str| {
            let path = jail.resolve(name).unwrap();
            jail.open_regular(&path).unwrap().0.into_std()
        };
        let size = short_lines.len() as u64;
        assert!(!lines_likely_fit(&file("short.txt"), size, 2000).unwrap());
        assert!(lines_likely_fit(&file("short.txt"), size, 2 * 65_536).unwrap());
        assert!(lines_likely_fit(&file("long.txt"), long_lines.len() as u64, 2000).unwrap());

        // Through read_file: the first 2,000 lines of a large file, by the line-by-line reader.
        let big = "0123456789\n".repeat(1024 * 1024);
        jail.dir().write("big.txt", &big).unwrap();
        let limits = Limits {
            read_max_bytes: 64 * 1024 * 1024,
            ..Limits::default()
        };
        let args = ReadFileArgs {
            path: "big.txt".into(),
            offset: None,
            limit: None,
            workspace: None,
        };
        let result = read_file(&jail, &limits, &args).unwrap();
        assert_eq!(result.lines, limits.read_default_lines);
        assert_eq!(result.content.len() as u64, 11 * limits.read_default_lines);
        assert!(result.truncated);
        let all = ReadFileArgs {
            limit: Some(2 * 1024 * 1024),
            ..args
        };
        let result = read_file(&jail, &limits, &all).unwrap();
        assert_eq!(result.content, big);
        assert_eq!(result.total_lines, Some(1024 * 1024));
    }

    /// Regression: a file empty when it was opened, written to since with text that is not
    /// UTF-8 (a log a command writes), was decoded by its size at the open: nothing read, and
    /// called empty windows-1252 text. It is read as it is now.
    #[test]
    fn a_file_written_to_since_it_was_opened_is_decoded_as_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(dir.path()).unwrap();
        std::fs::write(dir.path().join("log.txt"), "").unwrap();
        let args = ReadFileArgs {
            path: "log.txt".into(),
            offset: None,
            limit: None,
            workspace: None,
        };
        let opened = open_for_read(&jail, &args).unwrap();
        std::fs::write(dir.path().join("log.txt"), b"caf\xe9\nnext\n").unwrap();
        let read = read_opened(opened, &Limits::default(), &args).unwrap();
        assert_eq!(read.encoding.as_deref(), Some("windows-1252"));
        assert_eq!(read.content, "caf\u{e9}\nnext\n");
        assert_eq!(read.size, 10);
    }

    #[test]
    fn a_file_that_changed_size_is_left_to_the_line_by_line_reader() {
        let dir = tempfile::tempdir().unwrap();
        let jail = Jail::open_ambient(dir.path()).unwrap();
        std::fs::write(dir.path().join("f.txt"), "0123456789\n".repeat(100)).unwrap();
        let path = jail.resolve("f.txt").unwrap();
        let (file, _) = jail.open_regular(&path).unwrap();
        let file = file.into_std();
        assert!(read_whole_in_halves(&file, 1100).unwrap().is_some());
        assert!(
            read_whole_in_halves(&file, 1101).unwrap().is_none(),
            "shrank"
        );
        assert!(read_whole_in_halves(&file, 1090).unwrap().is_none(), "grew");
    }
}
