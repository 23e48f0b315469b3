//! The tool contract: names, approval classes, typed arguments and results, and JSON Schemas.
//!
//! Argument types refuse unknown fields, so a misspelt argument is an `invalid_arguments` error
//! instead of being silently ignored. Every argument type carries the optional `workspace` that
//! routing reads; the tool implementations ignore it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What approving a tool call lets it do. Restricted workspaces ask their user per class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Looks at files; changes nothing.
    Read,
    /// Creates or changes files.
    Write,
    /// Runs a program.
    Exec,
    /// Session-level bookkeeping on the server (workspaces, memory).
    System,
}

impl ToolClass {
    /// The class as written in flags and config (`read`, `write`, `exec`, `system`).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolClass::Read => "read",
            ToolClass::Write => "write",
            ToolClass::Exec => "exec",
            ToolClass::System => "system",
        }
    }
}

/// Every tool Monad offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolName {
    /// Read a text file, whole or by lines.
    ReadFile,
    /// List a directory.
    ListDir,
    /// Describe one path.
    Stat,
    /// Search file contents with a regular expression.
    Search,
    /// Find paths matching a glob.
    Glob,
    /// Create or replace a file.
    WriteFile,
    /// Replace text in a file.
    EditFile,
    /// Run a program.
    RunCommand,
    /// List the session's workspaces.
    Workspaces,
    /// Keep a note in the session's memory.
    MemoryStore,
    /// Read notes back from the session's memory.
    MemoryRecall,
    /// Read the new output of a background process, and whether it exited.
    ProcessRead,
    /// Write to a background process's standard input.
    ProcessWrite,
    /// Send a signal to a background process.
    ProcessKill,
    /// List the session's background processes in a workspace.
    ProcessList,
}

impl ToolName {
    /// All tools, in the order they are listed to agents.
    pub const ALL: [ToolName; 15] = [
        ToolName::ReadFile,
        ToolName::ListDir,
        ToolName::Stat,
        ToolName::Search,
        ToolName::Glob,
        ToolName::WriteFile,
        ToolName::EditFile,
        ToolName::RunCommand,
        ToolName::ProcessRead,
        ToolName::ProcessWrite,
        ToolName::ProcessKill,
        ToolName::ProcessList,
        ToolName::Workspaces,
        ToolName::MemoryStore,
        ToolName::MemoryRecall,
    ];

    /// The tools a workspace runs (everything but the session-level ones).
    pub const WORKSPACE_TOOLS: [ToolName; 12] = [
        ToolName::ReadFile,
        ToolName::ListDir,
        ToolName::Stat,
        ToolName::Search,
        ToolName::Glob,
        ToolName::WriteFile,
        ToolName::EditFile,
        ToolName::RunCommand,
        ToolName::ProcessRead,
        ToolName::ProcessWrite,
        ToolName::ProcessKill,
        ToolName::ProcessList,
    ];

    /// The tools that act on a background process named by its `process` argument.
    pub const PROCESS_TOOLS: [ToolName; 3] = [
        ToolName::ProcessRead,
        ToolName::ProcessWrite,
        ToolName::ProcessKill,
    ];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolName::ReadFile => "read_file",
            ToolName::ListDir => "list_dir",
            ToolName::Stat => "stat",
            ToolName::Search => "search",
            ToolName::Glob => "glob",
            ToolName::WriteFile => "write_file",
            ToolName::EditFile => "edit_file",
            ToolName::RunCommand => "run_command",
            ToolName::Workspaces => "workspaces",
            ToolName::MemoryStore => "memory_store",
            ToolName::MemoryRecall => "memory_recall",
            ToolName::ProcessRead => "process_read",
            ToolName::ProcessWrite => "process_write",
            ToolName::ProcessKill => "process_kill",
            ToolName::ProcessList => "process_list",
        }
    }

    /// Looks a tool up by its wire name.
    pub fn parse(name: &str) -> Option<ToolName> {
        ToolName::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The approval class of the tool.
    pub fn class(self) -> ToolClass {
        match self {
            ToolName::ReadFile
            | ToolName::ListDir
            | ToolName::Stat
            | ToolName::Search
            | ToolName::Glob
            | ToolName::ProcessRead
            | ToolName::ProcessList => ToolClass::Read,
            ToolName::WriteFile | ToolName::EditFile => ToolClass::Write,
            ToolName::RunCommand | ToolName::ProcessWrite | ToolName::ProcessKill => {
                ToolClass::Exec
            }
            ToolName::Workspaces | ToolName::MemoryStore | ToolName::MemoryRecall => {
                ToolClass::System
            }
        }
    }

    /// Whether the tool's main argument names an existing path, which routing uses to pick the
    /// workspace that contains it.
    pub fn reads_existing_path(self) -> bool {
        matches!(
            self,
            ToolName::ReadFile | ToolName::Stat | ToolName::EditFile
        )
    }

    /// `args` as this tool's arguments, or why not, written for a model: the argument at fault
    /// named, and the Rust type names the decoder speaks of (`expected u64`, `floating point`)
    /// in the words of the tool's schema, its lowest value included (`limit` is a whole number
    /// from 1, not from 0 as its type would say). A whole number written with a zero fraction
    /// (`100.0`), which JSON Schema counts an integer, is taken as one.
    pub fn decode_args<A: serde::de::DeserializeOwned>(
        self,
        args: serde_json::Value,
    ) -> Result<A, String> {
        self.decoded(with_whole_numbers(args))
    }

    /// [`ToolName::decode_args`] of arguments borrowed (copied only when a number must be
    /// rewritten).
    pub fn decode_args_ref<A: serde::de::DeserializeOwned>(
        self,
        args: &serde_json::Value,
    ) -> Result<A, String> {
        let rewrite = args
            .as_object()
            .is_some_and(|fields| fields.values().any(|v| whole_number(v).is_some()));
        if rewrite {
            self.decode_args(args.clone())
        } else {
            self.decoded(args)
        }
    }

    fn decoded<'de, A, D>(self, args: D) -> Result<A, String>
    where
        A: serde::Deserialize<'de>,
        D: serde::Deserializer<'de, Error = serde_json::Error>,
    {
        serde_path_to_error::deserialize(args)
            .map_err(|e| self.argument_error(&e.path().to_string(), e.inner()))
    }

    /// Why a value is not this tool's arguments: `error`, about the argument `at` (`.` for the
    /// arguments as a whole).
    fn argument_error(self, at: &str, error: &serde_json::Error) -> String {
        let mut said = error.to_string();
        // In words: the lowest value the schema allows (not the type's own 0 where it says
        // more), and no largest: the type's is no bound a workspace takes (`depth` stops at
        // `limits.list_max_depth`, which the workspace's own check says), so a whole number too
        // large for the type is only said to be too large.
        let beyond = beyond_every_integer(&said);
        let too_large = (said.starts_with("invalid value: integer `")
            && !said.starts_with("invalid value: integer `-"))
            || beyond == Some(std::cmp::Ordering::Greater);
        let words = |unsigned: bool| {
            if !unsigned {
                return "expected a whole number".to_owned();
            }
            if too_large {
                return "expected a smaller whole number".to_owned();
            }
            let lowest = (at != ".")
                .then(|| self.input_schema()["properties"][at]["minimum"].as_u64())
                .flatten()
                .unwrap_or(0);
            format!("expected a whole number of at least {lowest}")
        };
        // What was expected ends serde's message, after the value given (which may read like
        // it): only there is it rewritten.
        if let Some((rust, unsigned)) = expected_integer(&said) {
            said.truncate(said.len() - rust.len());
            said.push_str(&words(unsigned));
        }
        // Rust's name for a JSON number with a fraction or an exponent, where it opens the
        // message (not in a string value that reads so).
        for kind in ["invalid type: ", "invalid value: "] {
            if let Some(rest) = said.strip_prefix(&format!("{kind}floating point `")) {
                said = format!("{kind}number `{rest}");
                break;
            }
        }
        // A whole number past every integer type is of the right kind, only out of range.
        if beyond.is_some() {
            said = said.replacen("invalid type: number `", "invalid value: number `", 1);
        }
        // An unknown argument's own error names it already.
        if at == "." || said.starts_with("unknown field") {
            format!("{self}: {said}")
        } else {
            format!("{self}: `{at}`: {said}")
        }
    }

    /// Why `args` are not this tool's arguments (an unknown or misspelled field, a value of the
    /// wrong type, a missing one), in the words a workspace refuses them with; `None` when they
    /// are. For a caller that answers before any workspace has looked at them.
    pub fn args_error(self, args: &serde_json::Value) -> Option<String> {
        fn error<T: serde::de::DeserializeOwned>(
            tool: ToolName,
            args: &serde_json::Value,
        ) -> Option<String> {
            tool.decode_args_ref::<T>(args).err()
        }
        match self {
            ToolName::ReadFile => error::<ReadFileArgs>(self, args),
            ToolName::ListDir => error::<ListDirArgs>(self, args),
            ToolName::Stat => error::<StatArgs>(self, args),
            ToolName::Search => error::<SearchArgs>(self, args),
            ToolName::Glob => error::<GlobArgs>(self, args),
            ToolName::WriteFile => error::<WriteFileArgs>(self, args),
            ToolName::EditFile => error::<EditFileArgs>(self, args),
            ToolName::RunCommand => error::<RunCommandArgs>(self, args),
            ToolName::Workspaces => error::<WorkspacesArgs>(self, args),
            ToolName::MemoryStore => error::<MemoryStoreArgs>(self, args),
            ToolName::MemoryRecall => error::<MemoryRecallArgs>(self, args),
            ToolName::ProcessRead => error::<ProcessReadArgs>(self, args),
            ToolName::ProcessWrite => error::<ProcessWriteArgs>(self, args),
            ToolName::ProcessKill => error::<ProcessKillArgs>(self, args),
            ToolName::ProcessList => error::<ProcessListArgs>(self, args),
        }
    }

    /// The JSON Schema of the tool's arguments, generated from the Rust type.
    pub fn input_schema(self) -> serde_json::Value {
        match self {
            ToolName::ReadFile => input_schema_of::<ReadFileArgs>(),
            ToolName::ListDir => input_schema_of::<ListDirArgs>(),
            ToolName::Stat => input_schema_of::<StatArgs>(),
            ToolName::Search => input_schema_of::<SearchArgs>(),
            ToolName::Glob => input_schema_of::<GlobArgs>(),
            ToolName::WriteFile => input_schema_of::<WriteFileArgs>(),
            ToolName::EditFile => input_schema_of::<EditFileArgs>(),
            ToolName::RunCommand => input_schema_of::<RunCommandArgs>(),
            ToolName::Workspaces => input_schema_of::<WorkspacesArgs>(),
            ToolName::MemoryStore => input_schema_of::<MemoryStoreArgs>(),
            ToolName::MemoryRecall => input_schema_of::<MemoryRecallArgs>(),
            ToolName::ProcessRead => input_schema_of::<ProcessReadArgs>(),
            ToolName::ProcessWrite => input_schema_of::<ProcessWriteArgs>(),
            ToolName::ProcessKill => input_schema_of::<ProcessKillArgs>(),
            ToolName::ProcessList => input_schema_of::<ProcessListArgs>(),
        }
    }

    /// The JSON Schema of what a call returns to programs ([`Structured`] of the tool's result
    /// type), generated from the Rust types: the MCP `outputSchema`.
    pub fn output_schema(self) -> serde_json::Value {
        match self {
            ToolName::ReadFile => output_schema_of::<Structured<ReadFileResult>>(),
            ToolName::ListDir => output_schema_of::<Structured<ListDirStructured>>(),
            ToolName::Stat => output_schema_of::<Structured<StatResult>>(),
            ToolName::Search => output_schema_of::<Structured<SearchResult>>(),
            ToolName::Glob => output_schema_of::<Structured<GlobStructured>>(),
            ToolName::WriteFile | ToolName::EditFile => {
                output_schema_of::<Structured<WriteResult>>()
            }
            ToolName::RunCommand => output_schema_of::<Structured<RunCommandResult>>(),
            ToolName::Workspaces => output_schema_of::<Structured<WorkspacesResult>>(),
            ToolName::MemoryStore => output_schema_of::<Structured<MemoryStoreResult>>(),
            ToolName::MemoryRecall => output_schema_of::<Structured<MemoryRecallResult>>(),
            ToolName::ProcessRead => output_schema_of::<Structured<ProcessReadResult>>(),
            ToolName::ProcessWrite => output_schema_of::<Structured<ProcessWriteResult>>(),
            ToolName::ProcessKill => output_schema_of::<Structured<ProcessKillResult>>(),
            ToolName::ProcessList => output_schema_of::<Structured<ProcessListResult>>(),
        }
    }

    /// A description written for a model: what the tool does, where, and its limits.
    pub fn description(self) -> &'static str {
        match self {
            ToolName::ReadFile => {
                "Read a UTF-8 text file in a workspace. Returns its lines, numbered from 1 like \
                 `cat -n` (the number and a tab before each line: not part of the file); use \
                 `offset` (first line, 1-based) and `limit` (number of lines) to page through \
                 large files. Output is capped in bytes and lines: the first line of the result \
                 says which lines it shows and, when the file goes on, the `offset` to read on \
                 with. A line over 2,000 bytes is shown cut; `search` finds text in it. Binary \
                 files are reported, not dumped."
            }
            ToolName::ListDir => {
                "List a directory in a workspace (default: its root), `depth` levels deep \
                 (default 1). Hidden entries are left out unless `include_hidden` is true. One \
                 entry a line, relative to the directory listed, with `/` after directories. \
                 Entries are capped; the result says when some were left out."
            }
            ToolName::Stat => {
                "Describe one path in a workspace: its kind, size, permissions and modification \
                 time, and the target of a symbolic link."
            }
            ToolName::Search => {
                "Search file contents in a workspace with a regular expression (Rust regex \
                 syntax), honouring .gitignore and skipping hidden and binary files. Restrict \
                 with `path` (a directory or file) and `glob` (e.g. `*.rs`). Returns matching \
                 lines with their paths and line numbers, capped at `max_results`; `context` \
                 shows lines around each (like `grep -C`), and `files_only` lists only the \
                 files that match (like `grep -l`)."
            }
            ToolName::Glob => {
                "Find files in a workspace whose paths match a glob pattern such as `**/*.rs` \
                 or `src/*.toml`, honouring .gitignore. The pattern is matched against paths \
                 relative to `path` (default: the root); an absolute one, against the root. \
                 Returns the paths of regular files (not directories or symbolic links: \
                 list_dir shows those) relative to the workspace root, capped."
            }
            ToolName::WriteFile => {
                "Create or replace a file in a workspace with the given UTF-8 content, \
                 atomically, creating missing parent directories (never git's own files in \
                 `.git`: use git). Refused when the file changed since this workspace's \
                 tools last read or wrote it: read it again first. Returns a unified diff of the change to a file that existed."
            }
            ToolName::EditFile => {
                "Replace `old_string` with `new_string` in a text file in a workspace. Fails, \
                 changing nothing, when `old_string` does not occur or occurs more than once \
                 (unless `replace_all` is true); include enough surrounding text to make it \
                 unique. `old_string` is the file's own text, exactly: never the line numbers \
                 read_file puts before each line. Returns a unified diff of the change."
            }
            ToolName::RunCommand => {
                "Run a program in a workspace: `argv` is the program and its arguments (no \
                 shell; pass [\"sh\", \"-c\", \"...\"] for one). It runs sandboxed: it can \
                 read and write only the workspace and read the system's runtime directories, \
                 without privileges, with no network unless the workspace's policy allows some \
                 (`workspaces` says what), \
                 with a time limit (`timeout_ms`; 2 minutes unless the operator set another) \
                 and capped output; everything it starts ends with it. Temporary files go in \
                 `$TMPDIR` (`/tmp` is not writable). Returns the exit code, stdout and stderr; of a long output, its \
                 first and last lines (send it to a file to read it all). For builds, test suites and \
                 servers that run long, set `background: true` to get a process id at once, or \
                 `background_after_ms` to wait that long and then leave it running; then use \
                 `process_read`, `process_write` and `process_kill`."
            }
            ToolName::ProcessRead => {
                "Read what a background process (from `run_command` with `background`) wrote \
                 since the last read, waiting up to `wait_ms` for more when there is none yet; \
                 `last_lines` shows each stream's last lines again, read before or not, even \
                 after a read told its end. Says whether it is still running, and how it ended \
                 when it has. Output stays readable after the process exits, until it has been \
                 read."
            }
            ToolName::ProcessWrite => {
                "Write `text` to a background process's standard input; `close_stdin` closes it \
                 afterwards (end of input)."
            }
            ToolName::ProcessKill => {
                "Send a signal to a background process and everything it started: `TERM` \
                 (default), `INT`, `HUP`, `QUIT`, `USR1`, `USR2` or `KILL`."
            }
            ToolName::ProcessList => {
                "List the session's background processes (in one workspace when `workspace` \
                 is given, else in every one): their ids, command lines, and whether they are \
                 still running."
            }
            ToolName::Workspaces => {
                "List the session's workspaces: their short names, URIs, trust levels, hosts, \
                 whether they are online and what network their commands get; which one is the focus (tried first by calls \
                 that name no workspace); and, in `routing`, where such calls go."
            }
            ToolName::MemoryStore => {
                "Keep a note under `key` in the session's memory, replacing any note with the \
                 same key."
            }
            ToolName::MemoryRecall => {
                "Read notes back from the session's memory: those whose key or text contains \
                 `query`, or all of them without one. One recall holds at most 256 KiB of notes \
                 (`not_shown` counts the others)."
            }
        }
    }
}

impl std::fmt::Display for ToolName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The integer types tool arguments decode to, as serde_json names them at the end of a message
/// (`expected u64`), and whether each is unsigned.
const INTEGER_TYPES: [(&str, bool); 6] = [
    ("expected u64", true),
    ("expected usize", true),
    ("expected u32", true),
    ("expected u16", true),
    ("expected u8", true),
    ("expected i64", false),
];

/// 2^64, the first whole number past `u64`: with [`I64_MIN`], the bounds of the two integer
/// kinds a JSON number decodes to.
const PAST_U64: f64 = 18_446_744_073_709_551_616.0;
/// -2^63, the least `i64`.
const I64_MIN: f64 = -9_223_372_036_854_775_808.0;

/// The integer type serde_json's `said` ends expecting (its words, and whether it is unsigned),
/// if it does.
fn expected_integer(said: &str) -> Option<(&'static str, bool)> {
    INTEGER_TYPES
        .into_iter()
        .find(|(rust, _)| said.ends_with(rust))
}

/// Whether serde_json's `said` is about a number written as a float past every integer type
/// here (`1e20`, `-1e20`): a whole number (every float that large is one) above 2^64 - 1
/// (`Greater`) or below -2^63 (`Less`).
fn beyond_every_integer(said: &str) -> Option<std::cmp::Ordering> {
    // serde_json's words for a float given where an integer type was expected, and nothing
    // else: `invalid type: floating point `1e20`, expected u64` (not a string argument's
    // value that reads so, nor a float where a string was expected).
    expected_integer(said)?;
    let (number, _) = said
        .strip_prefix("invalid type: floating point `")?
        .split_once('`')?;
    let number = number.parse::<f64>().ok()?;
    if number >= PAST_U64 {
        Some(std::cmp::Ordering::Greater)
    } else if number < I64_MIN {
        Some(std::cmp::Ordering::Less)
    } else {
        None
    }
}

/// Whether a call of `tool` with `args` may leave a process running after it: a `run_command`
/// started in the background, or told to go there after a while (`background_after_ms`). Only
/// such a call's result is looked into for its process (a command's output may be megabytes).
pub fn may_outlive_its_call(tool: &str, args: &serde_json::Value) -> bool {
    tool == crate::ToolName::RunCommand.as_str()
        && (args.get("background") == Some(&serde_json::Value::Bool(true))
            || args
                .get("background_after_ms")
                .is_some_and(|v| !v.is_null()))
}

/// `args` with each argument that is a whole number written as a float (`1000.0`) as the
/// integer it is, as every tool reads it ([`ToolName::decode_args`]). What shows a call before
/// it runs (an approval prompt, an "always" rule) reads the arguments so rewritten, so that it
/// says what will run: `"timeout_ms": 600000.0` is a time-out of 600 s there too.
pub fn with_whole_numbers(mut args: serde_json::Value) -> serde_json::Value {
    if let Some(fields) = args.as_object_mut() {
        for value in fields.values_mut() {
            if let Some(whole) = whole_number(value) {
                *value = whole;
            }
        }
    }
    args
}

/// `value` as an integer when it is a whole number written as a float (`100.0`, `-1.0`) that
/// fits one; `None` otherwise (an integer already, a fraction, anything else).
fn whole_number(value: &serde_json::Value) -> Option<serde_json::Value> {
    let float = value.as_f64().filter(|_| value.is_f64())?;
    if float.fract() != 0.0 {
        return None;
    }
    if (0.0..PAST_U64).contains(&float) {
        Some((float as u64).into())
    } else if (I64_MIN..0.0).contains(&float) {
        Some((float as i64).into())
    } else {
        None
    }
}

/// Arguments of `read_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Path of the file, relative to the workspace root (an absolute path inside the root is
    /// accepted too).
    pub path: String,
    /// First line to return, counting from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub offset: Option<u64>,
    /// How many lines to return at most (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
    /// Workspace to run in: a short name or URI. Default: the session's focus workspace when it
    /// has the path, else the first in priority order that has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Why a result is shorter than what was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Truncation {
    /// The byte cap was reached.
    Bytes,
    /// The line cap (or the caller's `limit`) was reached.
    Lines,
    /// The entry cap of a listing was reached.
    Entries,
    /// The result cap of a search or glob was reached.
    Results,
}

/// Result of `read_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReadFileResult {
    /// The path as resolved inside the workspace, relative to its root.
    pub path: String,
    /// The returned lines, joined, each with its line ending as in the file. Empty for a binary
    /// file.
    pub content: String,
    /// The number of the first returned line (1-based).
    pub start_line: u64,
    /// How many lines `content` holds.
    pub lines: u64,
    /// Total lines in the file, when the whole file was scanned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_lines: Option<u64>,
    /// Size of the file in bytes.
    pub size: u64,
    /// True when the file is not text (in UTF-8, nor in an encoding `encoding` names);
    /// `content` is then empty, and `binary_reason` says why.
    pub binary: bool,
    /// The encoding the file's text was decoded from when it is not UTF-8 (`utf-16le`,
    /// `utf-16be`, `windows-1252`, which covers Latin-1, or `utf-8` for UTF-8 text with a few
    /// bytes that are not); absent for UTF-8. Decoding is lossy: what does not decode becomes
    /// U+FFFD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Why a binary file's content is not shown (a NUL byte, control characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_reason: Option<String>,
    /// True when the content stops before the end of the file.
    pub truncated: bool,
    /// What cut the content short, when `truncated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    /// The `offset` to pass to read on, when `truncated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
}

/// Arguments of `list_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Directory to list, relative to the workspace root. Default: the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// How many levels to descend; 1 lists only the directory itself. Default 1; at most the
    /// workspace's `list_max_depth` (32 unless its operator set another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub depth: Option<u32>,
    /// Include entries whose name starts with a dot. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_hidden: Option<bool>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// The kind of a directory entry. Symbolic links are reported as links, never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// One entry of a listing.
///
/// In JSON an entry is compact, because a listing is the largest structured result most agents
/// get and every hop (the attached client, the server, the front, the AI host) parses it: a
/// regular file is its path as a string (`"src/main.rs"`), a directory its path followed by `/`
/// (`"src/"`; a name cannot contain `/`, so this is unambiguous), and only a symbolic link or a
/// device, FIFO or socket is an object `{"path": ..., "kind": "symlink" | "other"}`. The object
/// form is read for every kind too (what earlier versions sent). A listing of 1,000 files is 15 KB
/// of strings instead of 40 KB of objects (`docs/benchmarks.md`, the Python SDK cases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Path relative to the workspace root.
    pub path: String,
    /// What the entry is.
    pub kind: EntryKind,
}

/// The object form of a [`DirEntry`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DirEntryObject<'a> {
    /// Path relative to the workspace root.
    #[serde(borrow)]
    path: std::borrow::Cow<'a, str>,
    /// What the entry is.
    kind: EntryKind,
}

impl Serialize for DirEntry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.kind {
            EntryKind::File => serializer.serialize_str(&self.path),
            EntryKind::Dir => serializer.collect_str(&format_args!("{}/", self.path)),
            EntryKind::Symlink | EntryKind::Other => DirEntryObject {
                path: std::borrow::Cow::Borrowed(&self.path),
                kind: self.kind,
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for DirEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<DirEntry, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = DirEntry;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a path (a directory's ending in `/`) or an object {path, kind}")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DirEntry, E> {
                let (path, kind) = match v.strip_suffix('/') {
                    Some(dir) => (dir, EntryKind::Dir),
                    None => (v, EntryKind::File),
                };
                if path.is_empty() {
                    return Err(E::invalid_value(serde::de::Unexpected::Str(v), &self));
                }
                Ok(DirEntry {
                    path: path.to_owned(),
                    kind,
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<DirEntry, A::Error> {
                let object =
                    DirEntryObject::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(DirEntry {
                    path: object.path.into_owned(),
                    kind: object.kind,
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The schema of `search`'s `matches`: an array, its items described in words (the field's
/// description) rather than by a per-item schema. An MCP client validates every
/// `structuredContent` against the tool's `outputSchema`, and the official Python SDK does it in
/// pure Python, item by item whenever the schema has `items`, even `"items": true`: 20 ms for
/// 1,000 search matches (three fields each), more than the search itself (`docs/benchmarks.md`).
/// Without `items` it checks the array once. The result's other fields keep their full schema.
/// (A listing's entries and a glob's paths go further: one string each, [`ListDirStructured`].)
fn array_described_in_words(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
    })
}

/// Result of `list_dir` on the wire between Monad's processes; MCP answers carry it as
/// [`ListDirStructured`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDirResult {
    /// The listed directory, relative to the workspace root (`.` for the root).
    pub path: String,
    /// Entries sorted by path, directories listed before their contents. Each is a string for a
    /// regular file (its path relative to the workspace root) or a directory (its path followed
    /// by `/`), or an object `{"path": ..., "kind": "symlink" | "other"}` for a symbolic link or
    /// a device, FIFO or socket.
    pub entries: Vec<DirEntry>,
    /// True when the entry cap left some out.
    pub truncated: bool,
    /// Directories below the listed one whose entries could not be read (no permission),
    /// each as in `entries` (its path followed by `/`); absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// How many entries of the listed directories were left out for their names' starting
    /// with `.` (`include_hidden` lists them); absent when none were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hidden: u64,
}

/// `list_dir`'s result as programs get it over MCP (`structuredContent`): the entries in one
/// string rather than an array.
///
/// An MCP client parses every answer into its language's values, and the official Python SDK
/// pays for each item of an array: a 1,000-entry listing as an array of strings cost it about
/// 400 µs more per call than the same entries as one string, more than all of Monad's own
/// processes spend on the call (`docs/benchmarks.md`, the Python SDK cases' twelfth round). The
/// separator is NUL, which no path can hold, so a program splits the string unambiguously,
/// whatever the names hold (a newline, say). The wire between Monad's processes keeps
/// [`ListDirResult`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListDirStructured {
    /// The listed directory, relative to the workspace root (`.` for the root).
    pub path: String,
    /// Every entry's path relative to the workspace root, sorted, directories before their
    /// contents, each directory's path followed by `/`; separated by NUL characters (`\u0000`,
    /// which no path can hold: split on it), and empty when there are none.
    pub entries: String,
    /// The kind of each entry that is neither a regular file nor a directory, by its path as in
    /// `entries`: `symlink` (a symbolic link, never followed) or `other` (a device, FIFO or
    /// socket). Absent when there are none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(schema_with = "object_described_in_words")]
    pub kinds: std::collections::BTreeMap<String, EntryKind>,
    /// True when the entry cap left some out.
    pub truncated: bool,
    /// Directories below the listed one whose entries could not be read (no permission),
    /// each as in `entries`; absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<String>,
    /// How many entries of the listed directories were left out for their names' starting
    /// with `.` (`include_hidden` lists them); absent when none were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hidden: u64,
}

/// The separator of [`ListDirStructured::entries`] and [`GlobStructured::paths`].
pub const ENTRY_SEPARATOR: &str = "\0";

impl From<ListDirResult> for ListDirStructured {
    fn from(listing: ListDirResult) -> ListDirStructured {
        let mut entries =
            String::with_capacity(listing.entries.iter().map(|e| e.path.len() + 2).sum());
        let mut kinds = std::collections::BTreeMap::new();
        for (i, entry) in listing.entries.into_iter().enumerate() {
            if i > 0 {
                entries.push_str(ENTRY_SEPARATOR);
            }
            entries.push_str(&entry.path);
            match entry.kind {
                EntryKind::File => {}
                EntryKind::Dir => entries.push('/'),
                EntryKind::Symlink | EntryKind::Other => {
                    kinds.insert(entry.path, entry.kind);
                }
            }
        }
        ListDirStructured {
            path: listing.path,
            entries,
            kinds,
            truncated: listing.truncated,
            unreadable: listing.unreadable,
            hidden: listing.hidden,
        }
    }
}

/// The schema of a map whose values are described in words (`ListDirStructured`'s `kinds`):
/// only `"type": "object"`, so that a client checks it once rather than once per entry (a
/// directory of symbolic links, such as `node_modules/.bin`, has hundreds).
fn object_described_in_words(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
    })
}

/// Arguments of `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatArgs {
    /// Path to describe, relative to the workspace root.
    pub path: String,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StatResult {
    /// The path, relative to the workspace root.
    pub path: String,
    /// What the path is (a symbolic link is described, not followed).
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, as an octal string such as `0644`.
    pub mode: String,
    /// True when no write permission bit is set.
    pub readonly: bool,
    /// Last modification, in seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_unix: Option<i64>,
    /// For a symbolic link, the path it points to, as stored in the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
}

/// Arguments of `search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Regular expression to look for (Rust regex syntax), matched line by line.
    pub pattern: String,
    /// Directory or file to search, relative to the workspace root. Default: the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only search files whose path matches this glob, e.g. `*.rs` or `src/**/*.ts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
    /// Match without regard to case. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case_insensitive: Option<bool>,
    /// Stop after this many matching lines (at least 1). A workspace returns at most its own
    /// cap (1,000 unless its operator set another); a larger value is taken as that cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_results: Option<u32>,
    /// Also search hidden files and directories (never git's own `.git`). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_hidden: Option<bool>,
    /// Lines to show before and after each matching line, like `grep -C` (at most
    /// [`MAX_SEARCH_CONTEXT`], 10). Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10))]
    pub context: Option<u32>,
    /// List each file that has a match once, without its lines, like `grep -l`;
    /// `max_results` then counts files. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_only: Option<bool>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Most lines of [`SearchArgs::context`] before and after a match.
pub const MAX_SEARCH_CONTEXT: u32 = 10;

impl SearchArgs {
    /// `args` of a `search` for a workspace whose client is older than protocol minor
    /// [`crate::wire::SEARCH_CONTEXT_MINOR`], which refuses `context` and `files_only` as
    /// unknown fields: taken out where they ask for nothing (0, false, null); else the name of
    /// the one that asks for what that client cannot do.
    pub fn for_older_client(args: &mut serde_json::Value) -> Result<(), &'static str> {
        let Some(object) = args.as_object_mut() else {
            return Ok(());
        };
        for (key, nothing) in [
            ("context", serde_json::json!(0)),
            ("files_only", false.into()),
        ] {
            match object.get(key) {
                Some(v) if !v.is_null() && *v != nothing => return Err(key),
                Some(_) => {
                    object.remove(key);
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// One matching line, or a line shown around one (`context`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SearchMatch {
    /// File path relative to the workspace root.
    pub path: String,
    /// Line number, from 1.
    pub line_number: u64,
    /// The line, without its line ending; a very long one cut to a fixed length around its
    /// first match, with `…` where it was cut. A line that is not UTF-8 is decoded as
    /// `read_file` decodes its file (Windows-1252, or UTF-8 with stray bytes as U+FFFD); a
    /// line that is UTF-8 is shown as such.
    pub line: String,
    /// True for a line shown around a match (`context`), not a match itself. Absent when
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub context: bool,
}

/// Result of `search`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SearchResult {
    /// Matching lines, grouped by file in path order. Each is an object `{"path", "line_number",
    /// "line"}`: the file's path relative to the workspace root, the line's number (from 1), and
    /// the line without its line ending (cut at a fixed length for very long lines); a line
    /// shown around a match (`context`) also has `"context": true`. With `files_only`, the
    /// first matching line of each file.
    #[schemars(schema_with = "array_described_in_words")]
    pub matches: Vec<SearchMatch>,
    /// True when the search listed files only (`files_only`). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub files_only: bool,
    /// How many files were searched.
    pub files_searched: u64,
    /// True when `max_results` (or the workspace's cap) stopped the search early.
    pub truncated: bool,
    /// True when it was the workspace's own cap (its operator's `search_max_results`), not a
    /// lower `max_results`, that stopped it: asking for more gives no more. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_cap: bool,
    /// Files skipped as binary (a NUL byte at their start), counted in `files_searched`.
    /// Absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub binary_skipped: u64,
    /// Files whose search stopped at a NUL byte past their start (text that holds binary data
    /// further on, which `read_file` still shows as text): their lines after it were not
    /// searched. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped_at_binary: Vec<String>,
    /// Files whose search stopped at a line longer than a search holds in memory (16 MiB):
    /// their lines from it on were not searched. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped_at_long_line: Vec<String>,
}

/// Arguments of `glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// Glob pattern matched against paths relative to `path`, e.g. `**/*.rs`.
    pub pattern: String,
    /// Directory to search under, relative to the workspace root. Default: the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `glob` on the wire between Monad's processes; MCP answers carry it as
/// [`GlobStructured`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobResult {
    /// Matching paths relative to the workspace root, sorted.
    pub paths: Vec<String>,
    /// True when the result cap left some out.
    pub truncated: bool,
}

/// `glob`'s result as programs get it over MCP (`structuredContent`): the paths in one string,
/// for the reason [`ListDirStructured`] gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GlobStructured {
    /// The matching paths relative to the workspace root, sorted; separated by NUL characters
    /// (`\u0000`, which no path can hold: split on it), and empty when none match.
    pub paths: String,
    /// True when the result cap left some out.
    pub truncated: bool,
}

impl From<GlobResult> for GlobStructured {
    fn from(found: GlobResult) -> GlobStructured {
        GlobStructured {
            paths: found.paths.join(ENTRY_SEPARATOR),
            truncated: found.truncated,
        }
    }
}

/// Arguments of `write_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Path of the file to create or replace, relative to the workspace root.
    pub path: String,
    /// The complete new content.
    pub content: String,
    /// Create missing parent directories inside the workspace (at most 64). Default true;
    /// `false` fails instead when the file's directory does not exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_parents: Option<bool>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `write_file` and `edit_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WriteResult {
    /// The path written, relative to the workspace root.
    pub path: String,
    /// True when the file did not exist before.
    pub created: bool,
    /// Size of the new content in bytes.
    pub bytes_written: u64,
    /// How many replacements `edit_file` made (absent for `write_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacements: Option<u64>,
    /// Unified diff from the old content to the new.
    pub diff: String,
    /// True when the diff was cut at the workspace's cap.
    pub diff_truncated: bool,
    /// The directories `write_file` made for the file first, outermost first, relative to the
    /// workspace root (absent when it made none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_dirs: Vec<String>,
    /// The encoding the file was written in when it is not UTF-8: that of the file it replaced
    /// (`utf-16le`, `utf-16be` with its byte order mark, `windows-1252`). Absent for UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// The encoding of the file it replaced, when that could not hold the new content: the
    /// file is UTF-8 now. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencoded_from: Option<String>,
    /// True when `write_file` kept the CRLF line endings of the file it replaced: every line
    /// of that file ended with CRLF and the content had LF line breaks only, written as CRLF.
    /// Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub crlf_kept: bool,
    /// True when `write_file` kept the byte order mark the file it replaced started with (a
    /// UTF-8 file's U+FEFF, which `read_file` does not show) before content that had none.
    /// Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bom_kept: bool,
}

/// Arguments of `edit_file`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// Path of the file to edit, relative to the workspace root.
    pub path: String,
    /// The exact text to replace; must occur exactly once unless `replace_all` is true.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_all: Option<bool>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Arguments of `run_command`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// The program and its arguments. The program is looked up in the sandbox's PATH when it has
    /// no slash.
    pub argv: Vec<String>,
    /// Working directory, relative to the workspace root. Default: the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Time limit in milliseconds; the whole process group is killed when it runs out. At least
    /// 1, and at most the workspace's longest (600,000, ten minutes, unless its operator set
    /// another).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// Text to pass on standard input. Default: none (standard input is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Start it in the background and answer at once with its process id (read its output
    /// with `process_read`). Default false. A background command has no time limit unless
    /// `timeout_ms` gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<bool>,
    /// When it still runs after this many milliseconds, answer with what it printed so far and
    /// its process id, and leave it running in the background instead of waiting (or killing it
    /// at the default time limit, which no longer applies; a `timeout_ms` given still does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub background_after_ms: Option<u64>,
    /// Workspace to run in: a short name or URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `run_command`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RunCommandResult {
    /// Exit code, when the program exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the program, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// True when the time limit ran out and the process group was killed.
    pub timed_out: bool,
    /// True when, while it ran, the kernel killed a process of its user's commands at their
    /// memory bound on the server (`server.max_memory_per_user`, over all the user's sessions).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_bound: bool,
    /// Standard output (lossy UTF-8), capped: past the cap, its first and last bytes (see
    /// `stdout_gap`).
    pub stdout: String,
    /// Standard error (lossy UTF-8), capped like `stdout`.
    pub stderr: String,
    /// True when standard output went over the cap: bytes in its middle were read and dropped.
    pub stdout_truncated: bool,
    /// True when standard error went over the cap.
    pub stderr_truncated: bool,
    /// Where in `stdout` the bytes dropped at the cap were, and how many: the output's end,
    /// where builds and tests say what failed, is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_gap: Option<OutputGap>,
    /// The same for `stderr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_gap: Option<OutputGap>,
    /// Wall-clock time from start to exit, in milliseconds.
    pub duration_ms: u64,
    /// How the command was confined: `landlock` or `none` (only when the operator allowed
    /// unsandboxed execution on a kernel without landlock).
    pub sandbox: String,
    /// When it runs on in the background (started with `background`, or still running after
    /// `background_after_ms`): its process id, for `process_read`, `process_write` and
    /// `process_kill`. `exit_code` and `signal` are then absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// Network connections it asked the workspace's proxy for (with `network = "allowlist"`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<NetworkEvent>,
    /// Connections past the most an answer carries: only counted here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub network_not_shown: u64,
    /// True when the workspace's commands have no network (`network = "off"`). Absent when
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network_off: bool,
}

/// The bytes dropped from the middle of a command's output that went over the output cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputGap {
    /// Where they were: a byte offset in the output as returned (the first kept bytes before
    /// it, the last ones from it on).
    pub at: u64,
    /// How many bytes were dropped there.
    pub dropped: u64,
}

/// Arguments of `process_read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessReadArgs {
    /// The process id `run_command` returned.
    pub process: String,
    /// When there is no new output yet, wait up to this many milliseconds for some (or for the
    /// process to exit). Default 0: answer at once; at most 300000 (5 minutes): a longer wait
    /// is cut to that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Instead of only what is new, each stream's last this many lines, read before or not, as
    /// far back as the output cap keeps them (1 MiB per stream by default); what is new is then
    /// read too. For output an earlier read returned (the start of an error scrolled past),
    /// while the process runs and after: once a read has told its end, a workspace keeps the
    /// last 64 KiB of each stream of its last 8 processes so read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub last_lines: Option<u64>,
    /// Workspace to run in: a short name or URI. Default: the workspace that started the
    /// process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `process_read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessReadResult {
    /// The process id.
    pub process: String,
    /// True while the process (or anything it started) still runs.
    pub running: bool,
    /// Exit code, once it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// True when its time limit ran out and it was killed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// True when, while it ran, the kernel killed a process of its user's commands at their
    /// memory bound on the server (`server.max_memory_per_user`, over all the user's sessions).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_bound: bool,
    /// Standard output written since the last read (lossy UTF-8); with `last_lines`, its last
    /// lines.
    pub stdout: String,
    /// Standard error written since the last read (lossy UTF-8); with `last_lines`, its last
    /// lines.
    pub stderr: String,
    /// The `last_lines` asked for, when it was: `stdout` and `stderr` then hold up to that many
    /// of their last lines, output earlier reads returned included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_lines: Option<u64>,
    /// Bytes of standard output dropped, oldest first, because more than the cap piled up
    /// between two reads.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stdout_dropped: u64,
    /// Bytes of standard error dropped likewise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stderr_dropped: u64,
    /// Milliseconds since it started (until it exited, once it has).
    pub duration_ms: u64,
    /// Network connections it asked the workspace's proxy for since the last read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<NetworkEvent>,
    /// Connections past the most an answer carries: only counted here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub network_not_shown: u64,
    /// True when the workspace's commands have no network (`network = "off"`). Absent when
    /// false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network_off: bool,
}

/// Arguments of `process_write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessWriteArgs {
    /// The process id `run_command` returned.
    pub process: String,
    /// Text to write to its standard input (may be empty, e.g. to only close it).
    pub text: String,
    /// Close its standard input after writing (end of input). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_stdin: Option<bool>,
    /// Workspace to run in: a short name or URI. Default: the workspace that started the
    /// process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `process_write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessWriteResult {
    /// The process id.
    pub process: String,
    /// Bytes written.
    pub bytes_written: u64,
    /// True when its standard input is closed now.
    pub stdin_closed: bool,
}

/// Arguments of `process_kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessKillArgs {
    /// The process id `run_command` returned.
    pub process: String,
    /// `TERM` (default), `INT`, `HUP`, `QUIT`, `USR1`, `USR2` or `KILL` (with or without a
    /// `SIG` prefix). `KILL` ends it and everything it started at once; the others are
    /// delivered to the process, which may handle them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Workspace to run in: a short name or URI. Default: the workspace that started the
    /// process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `process_kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessKillResult {
    /// The process id.
    pub process: String,
    /// The signal sent, e.g. `TERM`.
    pub signal: String,
    /// False when it exited meanwhile (nothing was sent); one that had already exited is
    /// refused (`invalid_arguments`).
    pub delivered: bool,
}

/// Arguments of `process_list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessListArgs {
    /// Workspace to list: a short name or URI. Default: every workspace of the session that
    /// runs (or ran) its background processes, merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// One background process, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessInfo {
    /// Its id.
    pub process: String,
    /// The command line it was started with.
    pub argv: Vec<String>,
    /// Its working directory, relative to the workspace root.
    pub cwd: String,
    /// True while it runs.
    pub running: bool,
    /// Exit code, once it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Milliseconds since it started (until it exited, once it has).
    pub duration_ms: u64,
    /// Bytes of output waiting to be read.
    pub unread_bytes: u64,
    /// The workspace that runs it, when the list covers several (`process_list` without
    /// `workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `process_list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessListResult {
    /// The processes, oldest first (workspace by workspace): those running, and those that
    /// exited with output not read yet.
    pub processes: Vec<ProcessInfo>,
    /// Workspaces with processes of this session that could not be listed (offline, refused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<UnavailableWorkspace>,
}

/// A workspace `process_list` could not list, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UnavailableWorkspace {
    /// Its short name.
    pub workspace: String,
    /// The error code, e.g. `workspace_disconnected`.
    pub code: String,
    /// Why it could not be listed.
    pub message: String,
}

/// A connection a command asked the workspace's network proxy for, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkEvent {
    /// The host name (or address) the command asked for.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Whether the connection was let through.
    pub allowed: bool,
    /// The address it was made to, when allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Why it was refused, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Arguments of `workspaces` (none besides the usual optional `workspace`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesArgs {
    /// Ignored: `workspaces` always describes the whole session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Arguments of `memory_store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryStoreArgs {
    /// Name of the note.
    pub key: String,
    /// The note.
    pub text: String,
    /// Ignored: memory lives in the primary workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Arguments of `memory_recall`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryRecallArgs {
    /// Text to look for in keys and notes. Default: return every note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Ignored: memory lives in the primary workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Result of `workspaces`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkspacesResult {
    /// The session's id.
    pub session: String,
    /// The focus workspace (tried first by calls that name no workspace), if the session has
    /// one.
    #[serde(default)]
    pub focus: Option<String>,
    /// Where calls that name no workspace go now, in one sentence.
    #[serde(default)]
    pub routing: String,
    /// Its workspaces: the primary first, then the attached ones in attach order.
    pub workspaces: Vec<crate::wire::WorkspaceInfo>,
}

/// Result of `memory_store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryStoreResult {
    /// The note's key.
    pub key: String,
    /// True once the note is stored.
    pub stored: bool,
}

/// One note of the session's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Note {
    /// Its key.
    pub key: String,
    /// Its text.
    pub text: String,
}

/// Result of `memory_recall`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryRecallResult {
    /// The notes found, by key.
    pub notes: Vec<Note>,
    /// How many other notes the memory holds, which `query` did not match.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_matching: u64,
    /// How many notes were left out for the answer's size: ones that match but did not fit in
    /// the [`MEMORY_RECALL_MAX_BYTES`] one recall holds, and ones past the
    /// [`MEMORY_RECALL_SCAN_MAX_BYTES`] one recall reads, in key order (whether those match is
    /// not known, and no query reaches them). `read_file` of `memory/KEY.md` in the primary
    /// workspace reads any note; `list_dir` of `memory` lists them. Absent when none were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_shown: u64,
}

/// Most bytes of notes (their keys and text) one `memory_recall` answers with: the notes in key
/// order, each that fits (the server holds the whole answer in memory: a memory of 5,000 notes
/// of 256 KiB, or as many links to one, was a 1.25 GiB answer).
pub const MEMORY_RECALL_MAX_BYTES: usize = 256 * 1024;

/// Most bytes of notes one `memory_recall` reads to look for its `query` (each note is read
/// whole, up to the primary workspace's read cap).
pub const MEMORY_RECALL_SCAN_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// What a program gets for a call (MCP `structuredContent`): the workspace that ran it and either
/// the tool's result or its error. [`ToolName::output_schema`] is this type's schema for each
/// tool's result type `T`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Structured<T> {
    /// The workspace that ran the call, `{"name": ..., "uri": ...}` (its short name and its
    /// URI, two strings); null when none was reached.
    #[schemars(schema_with = "workspace_described_in_words")]
    pub workspace: Option<crate::wire::WorkspaceRef>,
    /// The tool's result, when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    /// Why it failed, when it did (the result is then marked `isError`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::error::ToolError>,
}

/// The schema of [`Structured`]'s `workspace`: an object or null, its two fields described in
/// words. Every answer carries it, and the official Python SDK's check of it (three descents
/// into subschemas, with `required` and `additionalProperties`) took 26 of the 57 µs it spent on
/// a whole 1,000-entry listing (`docs/benchmarks.md`, the Python SDK cases' twelfth round).
fn workspace_described_in_words(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["object", "null"],
    })
}

/// The JSON Schema of what `T` serializes to (the serialize contract: a field skipped when empty
/// is optional), draft 2020-12 as MCP wants, without the Rust type's title.
///
/// Clients validate every result against it (the Python SDK does, with `jsonschema`), once per
/// entry of a listing, so it is written to be cheap to check: subschemas inline rather than
/// behind `$ref`s (each a lookup), and a choice of constants as one `enum` rather than a `oneOf`
/// (which tries every alternative). It accepts exactly what the generated schema accepts; a
/// 1,000-entry `list_dir` result validates about four times faster.
fn output_schema_of<T: JsonSchema>() -> serde_json::Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .with_transform(schemars::transform::RecursiveTransform(
            no_rust_number_format,
        ))
        .with_transform(schemars::transform::RecursiveTransform(prose_description));
    settings.inline_subschemas = true;
    let mut schema = settings
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value();
    if let Some(map) = schema.as_object_mut() {
        // The wrapper's own doc comment speaks of Rust, not of the tool.
        map.remove("title");
        map.remove("description");
    }
    constants_as_enums(&mut schema);
    schema
}

/// The JSON Schema of `T` as arguments (what `schemars::schema_for!` makes, draft 2020-12),
/// without schemars' number formats ([`no_rust_number_format`]).
fn input_schema_of<T: JsonSchema>() -> serde_json::Value {
    schemars::generate::SchemaSettings::default()
        .with_transform(schemars::transform::RecursiveTransform(
            no_rust_number_format,
        ))
        .with_transform(schemars::transform::RecursiveTransform(prose_description))
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

/// Makes a subschema's `description`, a Rust doc comment, read as prose for a model and a
/// person: the lines wrapped in the source are joined (a blank line still ends a paragraph, and
/// a line starting with `- ` an item), and rustdoc's links keep only their text (`` [`Type`] ``
/// and `` [`Type`](path) `` become `` `Type` ``). A generator's transform, as
/// [`no_rust_number_format`].
fn prose_description(schema: &mut schemars::Schema) {
    if let Some(serde_json::Value::String(text)) = schema.get_mut("description") {
        *text = unlinked(&unwrapped(text));
    }
}

/// `doc` with its wrapped lines joined ([`prose_description`]).
fn unwrapped(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut previous: Option<&str> = None;
    for line in doc.lines() {
        let line = line.trim_end();
        if let Some(previous) = previous {
            let apart = line.is_empty() || previous.is_empty() || line.starts_with("- ");
            out.push(if apart { '\n' } else { ' ' });
        }
        out.push_str(line);
        previous = Some(line);
    }
    out
}

/// `text` with rustdoc's links as their code text ([`prose_description`]).
fn unlinked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        // The code is from the backtick after `[` to the one before `]`.
        let Some(len) = rest[start + 1..].find("`]") else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&rest[start + 1..start + len + 2]);
        rest = &rest[start + len + 3..];
        if rest.starts_with('(')
            && let Some(end) = rest.find(')')
        {
            rest = &rest[end + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// Takes out of a schema the `format` schemars gives Rust's number types (`uint64`, `int32`,
/// `double`, ...); a generator's transform, applied by `RecursiveTransform` to every subschema
/// (and to nothing else: not to a value inside a `const`, an `enum` or `examples`). JSON Schema
/// defines no such formats: validators ignore them, and the TypeScript SDK's (Ajv) writes a
/// warning for each to the host's console (40 per connection, `suite::mcp::typescript`). An
/// unsigned integer keeps its `"minimum": 0`; the widths were never checked by any validator.
fn no_rust_number_format(schema: &mut schemars::Schema) {
    const RUST_NUMBERS: [&str; 14] = [
        "uint", "uint8", "uint16", "uint32", "uint64", "uint128", "int", "int8", "int16", "int32",
        "int64", "int128", "float", "double",
    ];
    let invented = schema
        .get("format")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|f| RUST_NUMBERS.contains(&f));
    if invented {
        schema.remove("format");
    }
}

/// Rewrites, throughout `schema`, each `oneOf` whose alternatives are all string constants (a
/// unit-variant enum with documented variants) as a string `enum` of the same values; the
/// variants' descriptions move into the schema's own description.
fn constants_as_enums(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(map) => {
            let constants: Option<Vec<(Value, Option<String>)>> =
                map.get("oneOf").and_then(Value::as_array).and_then(|alts| {
                    alts.iter()
                        .map(|alt| {
                            let alt = alt.as_object()?;
                            let value = alt.get("const").filter(|v| v.is_string())?;
                            let only_known = alt
                                .keys()
                                .all(|k| matches!(k.as_str(), "const" | "description" | "type"));
                            let typed = alt.get("type").is_none_or(|t| t == "string");
                            (only_known && typed).then(|| {
                                let said = alt.get("description").and_then(Value::as_str);
                                (value.clone(), said.map(str::to_owned))
                            })
                        })
                        .collect()
                });
            if let Some(constants) = constants.filter(|c| !c.is_empty()) {
                map.remove("oneOf");
                let said: Vec<String> = constants
                    .iter()
                    .filter_map(|(value, said)| {
                        Some(format!("`{}`: {}", value.as_str()?, said.as_ref()?))
                    })
                    .collect();
                if !said.is_empty() {
                    let head = map.get("description").and_then(Value::as_str).unwrap_or("");
                    let joined = said.join(" ");
                    let description = if head.is_empty() {
                        joined
                    } else {
                        format!("{head} {joined}")
                    };
                    map.insert("description".into(), Value::String(description));
                }
                map.insert("type".into(), Value::String("string".into()));
                map.insert(
                    "enum".into(),
                    Value::Array(constants.into_iter().map(|(v, _)| v).collect()),
                );
            }
            map.values_mut().for_each(constants_as_enums);
        }
        Value::Array(items) => items.iter_mut().for_each(constants_as_enums),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_tool_names_an_argument_it_does_not_take() {
        for tool in ToolName::ALL {
            let why = tool
                .args_error(&json!({"bogus": 1}))
                .unwrap_or_else(|| panic!("{tool} took `bogus`"));
            assert!(why.starts_with(&format!("{tool}: ")), "{why}");
            assert!(why.contains("`bogus`"), "{why}");
        }
        assert_eq!(ToolName::ReadFile.args_error(&json!({"path": "a"})), None);
        let wrong = ToolName::ReadFile.args_error(&json!({"path": 3})).unwrap();
        assert!(wrong.contains("invalid type"), "{wrong}");
    }

    /// A number of the wrong kind is refused in the words of the schema, not Rust's: the
    /// argument named, and its lowest value the schema's (a `last_lines` of -1 was told "from
    /// 0", and then 0 "at least 1").
    #[test]
    fn a_number_out_of_range_is_refused_without_rust_type_names() {
        for (tool, args, said) in [
            (
                ToolName::ReadFile,
                json!({"path": "a", "offset": -1}),
                "read_file: `offset`: invalid value: integer `-1`, expected a whole number of \
                 at least 1",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "limit": 1.8446744073709552e19}),
                "read_file: `limit`: invalid value: number `1.8446744073709552e+19`, expected a \
                 smaller whole number",
            ),
            (
                ToolName::ListDir,
                json!({"depth": 1e300}),
                "list_dir: `depth`: invalid value: number `1e+300`, expected a smaller whole number",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "offset": -1e20}),
                "read_file: `offset`: invalid value: number `-1e+20`, expected a whole number of \
                 at least 1",
            ),
            (
                ToolName::ListDir,
                json!({"depth": 5_000_000_000u64}),
                "list_dir: `depth`: invalid value: integer `5000000000`, expected a smaller whole \
                 number",
            ),
            (
                ToolName::ProcessRead,
                json!({"process": "p1", "wait_ms": -5}),
                "process_read: `wait_ms`: invalid value: integer `-5`, expected a whole number \
                 of at least 0",
            ),
            (
                ToolName::ProcessRead,
                json!({"process": "p1", "last_lines": -1}),
                "process_read: `last_lines`: invalid value: integer `-1`, expected a whole \
                 number of at least 1",
            ),
            (
                ToolName::Search,
                json!({"pattern": "x", "max_results": "ten"}),
                "search: `max_results`: invalid type: string \"ten\", expected a whole number \
                 of at least 1",
            ),
            (
                ToolName::RunCommand,
                json!({"argv": ["true"], "background_after_ms": -1}),
                "run_command: `background_after_ms`: invalid value: integer `-1`, expected a \
                 whole number of at least 1",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "limit": 2.5}),
                "read_file: `limit`: invalid type: number `2.5`, expected a whole number of at \
                 least 1",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "offset": -1.0}),
                "read_file: `offset`: invalid value: integer `-1`, expected a whole number of \
                 at least 1",
            ),
            (
                ToolName::RunCommand,
                json!({"argv": ["true", 1]}),
                "run_command: `argv[1]`: invalid type: integer `1`, expected a string",
            ),
            // A large float where no number goes is of the wrong kind, not out of range; nor
            // is a string that reads like the decoder's words.
            (
                ToolName::ReadFile,
                json!({"path": 1e20}),
                "read_file: `path`: invalid type: number `1e+20`, expected a string",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "limit": "integer `7`, expected u64"}),
                "read_file: `limit`: invalid type: string \"integer `7`, expected u64\", expected \
                 a whole number of at least 1",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "limit": "expected u32"}),
                "read_file: `limit`: invalid type: string \"expected u32\", expected a whole \
                 number of at least 1",
            ),
            (
                ToolName::ReadFile,
                json!({"path": "a", "limit": "floating point `1e99`"}),
                "read_file: `limit`: invalid type: string \"floating point `1e99`\", expected a \
                 whole number of at least 1",
            ),
        ] {
            assert_eq!(tool.args_error(&args).as_deref(), Some(said));
        }
        // A whole number with a zero fraction is one, as JSON Schema's `integer` counts it.
        let read: ReadFileArgs = ToolName::ReadFile
            .decode_args(json!({"path": "a", "offset": 3.0, "limit": 1e3}))
            .unwrap();
        assert_eq!((read.offset, read.limit), (Some(3), Some(1000)));
        assert_eq!(
            ToolName::ReadFile.args_error(&json!({"path": "a", "limit": 100.0})),
            None
        );
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn names_round_trip_and_classes_match_the_design() {
        for tool in ToolName::ALL {
            assert_eq!(ToolName::parse(tool.as_str()), Some(tool));
            let json = serde_json::to_value(tool).unwrap();
            assert_eq!(json, json!(tool.as_str()));
        }
        assert_eq!(ToolName::parse("rm_rf"), None);
        assert_eq!(ToolName::ReadFile.class(), ToolClass::Read);
        assert_eq!(ToolName::Glob.class(), ToolClass::Read);
        assert_eq!(ToolName::EditFile.class(), ToolClass::Write);
        assert_eq!(ToolName::RunCommand.class(), ToolClass::Exec);
        assert_eq!(ToolName::MemoryStore.class(), ToolClass::System);
    }

    /// A description is a doc comment made prose: no line break where the source wrapped a
    /// line, no rustdoc link; paragraphs and items stay.
    #[test]
    fn schema_descriptions_read_as_prose_without_the_source_s_wrapping_or_rustdoc_links() {
        assert_eq!(
            unwrapped("one line\nwrapped here.\n\nA paragraph:\n- an item\n- another"),
            "one line wrapped here.\n\nA paragraph:\n- an item\n- another"
        );
        assert_eq!(
            unlinked("see [`Foo::bar`] and [`Baz`](crate::Baz), `[` alone, [`open"),
            "see `Foo::bar` and `Baz`, `[` alone, [`open"
        );
        fn walk(value: &serde_json::Value, tool: ToolName, found: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    for (key, value) in map {
                        match (key.as_str(), value) {
                            ("description", serde_json::Value::String(text)) => {
                                let wrapped =
                                    text.split("\n")
                                        .zip(text.split("\n").skip(1))
                                        .any(|(a, b)| {
                                            !a.is_empty() && !b.is_empty() && !b.starts_with("- ")
                                        });
                                if wrapped || text.contains("[`") {
                                    found.push(format!("{}: {text}", tool.as_str()));
                                }
                            }
                            _ => walk(value, tool, found),
                        }
                    }
                }
                serde_json::Value::Array(items) => {
                    items.iter().for_each(|v| walk(v, tool, found));
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        for tool in ToolName::ALL {
            walk(&tool.input_schema(), tool, &mut found);
            walk(&tool.output_schema(), tool, &mut found);
        }
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn output_schemas_have_no_references_and_choices_of_constants_are_enums() {
        fn walk(node: &serde_json::Value, tool: ToolName) {
            match node {
                serde_json::Value::Object(map) => {
                    assert!(!map.contains_key("$ref"), "{tool:?}: {node}");
                    if let Some(alts) = map.get("oneOf").and_then(|a| a.as_array()) {
                        assert!(!alts.iter().all(|a| a.get("const").is_some()), "{tool:?}");
                    }
                    map.values().for_each(|v| walk(v, tool));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, tool)),
                _ => {}
            }
        }
        for tool in ToolName::ALL {
            walk(&tool.output_schema(), tool);
        }
        let stat = ToolName::Stat.output_schema();
        let kind = &stat["properties"]["result"]["properties"]["kind"];
        assert_eq!(kind["type"], "string", "{kind}");
        assert_eq!(kind["enum"], json!(["file", "dir", "symlink", "other"]));
        let described = kind["description"].as_str().unwrap();
        assert!(described.contains("`dir`: A directory."), "{described}");
    }

    #[test]
    fn every_schema_is_an_object_with_the_required_arguments_and_workspace() {
        let required: &[(ToolName, &[&str])] = &[
            (ToolName::ReadFile, &["path"]),
            (ToolName::ListDir, &[]),
            (ToolName::Stat, &["path"]),
            (ToolName::Search, &["pattern"]),
            (ToolName::Glob, &["pattern"]),
            (ToolName::WriteFile, &["content", "path"]),
            (ToolName::EditFile, &["new_string", "old_string", "path"]),
            (ToolName::RunCommand, &["argv"]),
            (ToolName::Workspaces, &[]),
            (ToolName::MemoryStore, &["key", "text"]),
            (ToolName::MemoryRecall, &[]),
            (ToolName::ProcessRead, &["process"]),
            (ToolName::ProcessWrite, &["process", "text"]),
            (ToolName::ProcessKill, &["process"]),
            (ToolName::ProcessList, &[]),
        ];
        for (tool, want) in required {
            let schema = tool.input_schema();
            assert_eq!(schema["type"], "object", "{tool}");
            assert_eq!(schema["additionalProperties"], false, "{tool}");
            assert!(schema["properties"]["workspace"].is_object(), "{tool}");
            let mut got: Vec<String> = schema
                .get("required")
                .and_then(|r| r.as_array())
                .map(|r| r.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            got.sort();
            assert_eq!(got, *want, "{tool}");
            assert!(!tool.description().is_empty());
        }
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let bad = json!({"path": "a", "pth": "b"});
        assert!(serde_json::from_value::<ReadFileArgs>(bad).is_err());
        let ok = json!({"path": "a", "offset": 3});
        let args: ReadFileArgs = serde_json::from_value(ok).unwrap();
        assert_eq!(args.offset, Some(3));
    }

    #[test]
    fn args_round_trip() {
        let run = RunCommandArgs {
            argv: vec!["ls".into(), "-l".into()],
            cwd: Some("src".into()),
            timeout_ms: Some(1000),
            stdin: None,
            background: Some(true),
            background_after_ms: None,
            workspace: Some("primary".into()),
        };
        let back: RunCommandArgs =
            serde_json::from_value(serde_json::to_value(&run).unwrap()).unwrap();
        assert_eq!(back, run);
        let edit = EditFileArgs {
            path: "a".into(),
            old_string: "x".into(),
            new_string: "y".into(),
            replace_all: Some(true),
            workspace: None,
        };
        let back: EditFileArgs =
            serde_json::from_value(serde_json::to_value(&edit).unwrap()).unwrap();
        assert_eq!(back, edit);
    }

    fn entry(path: &str, kind: EntryKind) -> DirEntry {
        DirEntry {
            path: path.into(),
            kind,
        }
    }

    #[test]
    fn a_listing_is_compact_in_json_and_reads_back_every_kind() {
        let listing = ListDirResult {
            path: ".".into(),
            entries: vec![
                entry("src", EntryKind::Dir),
                entry("src/main.rs", EntryKind::File),
                entry("link", EntryKind::Symlink),
                entry("fifo", EntryKind::Other),
                entry("odd name@", EntryKind::File),
            ],
            truncated: false,
            unreadable: Vec::new(),
            hidden: 0,
        };
        let value = serde_json::to_value(&listing).unwrap();
        assert_eq!(
            value["entries"],
            json!([
                "src/",
                "src/main.rs",
                {"path": "link", "kind": "symlink"},
                {"path": "fifo", "kind": "other"},
                "odd name@",
            ])
        );
        let back: ListDirResult = serde_json::from_value(value).unwrap();
        assert_eq!(back, listing);
    }

    #[test]
    fn a_listing_in_the_object_form_of_earlier_versions_still_reads() {
        let old = json!({"path": ".", "truncated": false, "entries": [
            {"path": "a", "kind": "dir"},
            {"path": "a/b.txt", "kind": "file"},
        ]});
        let listing: ListDirResult = serde_json::from_value(old).unwrap();
        assert_eq!(listing.entries[0].kind, EntryKind::Dir);
        assert_eq!(listing.entries[0].path, "a");
        assert_eq!(listing.entries[1].kind, EntryKind::File);
    }

    #[test]
    fn a_malformed_entry_is_an_error_that_says_what_an_entry_is() {
        for bad in [
            json!(""),
            json!("/"),
            json!(7),
            json!({"path": "a", "kind": "door"}),
            json!({"path": "a", "kind": "file", "extra": 1}),
            json!({"kind": "file"}),
        ] {
            let err = serde_json::from_value::<DirEntry>(bad.clone()).unwrap_err();
            assert!(!err.to_string().is_empty(), "{bad}");
        }
        let err = serde_json::from_value::<DirEntry>(json!(7)).unwrap_err();
        assert!(err.to_string().contains("a path"), "{err}");
    }

    #[test]
    fn schemas_use_only_formats_json_schema_defines_and_unsigned_integers_stay_unsigned() {
        fn formats(schema: &serde_json::Value, found: &mut Vec<String>) {
            match schema {
                serde_json::Value::Object(map) => {
                    if let Some(f) = map.get("format").and_then(|f| f.as_str()) {
                        found.push(f.to_owned());
                    }
                    map.values().for_each(|v| formats(v, found));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| formats(v, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for tool in ToolName::ALL {
            formats(&tool.input_schema(), &mut found);
            formats(&tool.output_schema(), &mut found);
        }
        // JSON Schema 2020-12's own formats.
        let defined = [
            "date-time",
            "date",
            "time",
            "duration",
            "email",
            "idn-email",
            "hostname",
            "idn-hostname",
            "ipv4",
            "ipv6",
            "uri",
            "uri-reference",
            "iri",
            "iri-reference",
            "uuid",
            "uri-template",
            "json-pointer",
            "relative-json-pointer",
            "regex",
        ];
        found.retain(|f| !defined.contains(&f.as_str()));
        assert!(
            found.is_empty(),
            "formats JSON Schema does not define: {found:?}"
        );
        // An unsigned integer still says so, in standard words.
        let read = ToolName::ReadFile.output_schema();
        let start = &read["properties"]["result"]["properties"]["start_line"];
        assert_eq!(start["type"], "integer");
        assert_eq!(start["minimum"], 0);
        let limit = &ToolName::ReadFile.input_schema()["properties"]["limit"];
        assert_eq!(limit["minimum"], 1, "{limit}");
        // A property that happens to be called `format` is a schema, not a keyword: kept; and a
        // value that merely looks like a schema (a `const`) is left as it is.
        use schemars::transform::{RecursiveTransform, Transform};
        let mut named = schemars::json_schema!({
            "properties": {"format": {"type": "string", "format": "uint8"}},
            "const": {"format": "uint8"},
        });
        RecursiveTransform(no_rust_number_format).transform(&mut named);
        assert_eq!(
            named.to_value(),
            json!({"properties": {"format": {"type": "string"}}, "const": {"format": "uint8"}})
        );
    }

    #[test]
    fn long_results_are_declared_so_that_a_client_checks_them_once() {
        // Search's matches: an array without a per-item schema.
        let schema = ToolName::Search.output_schema();
        let array = &schema["properties"]["result"]["properties"]["matches"];
        assert_eq!(array["type"], "array");
        assert!(array.get("items").is_none(), "{array}");
        let described = array["description"].as_str().unwrap();
        assert!(described.contains("line_number"), "{described}");
        // A listing's entries and a glob's paths: one string each, split on NUL.
        for (tool, field, said) in [
            (ToolName::ListDir, "entries", "followed by `/`"),
            (ToolName::Glob, "paths", "relative to the workspace root"),
        ] {
            let schema = tool.output_schema();
            let result = &schema["properties"]["result"];
            assert_eq!(result["properties"][field]["type"], "string", "{tool}");
            let described = result["properties"][field]["description"].as_str().unwrap();
            assert!(
                described.contains(said) && described.contains("NUL"),
                "{tool}: {described}"
            );
            assert!(
                result["required"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("truncated"))
            );
        }
        let schema = ToolName::ListDir.output_schema();
        let kinds = &schema["properties"]["result"]["properties"]["kinds"];
        assert_eq!(kinds["type"], "object");
        assert!(kinds.get("additionalProperties").is_none(), "{kinds}");
        // Every answer's workspace: an object or null, its fields in words.
        for tool in ToolName::ALL {
            let workspace = &tool.output_schema()["properties"]["workspace"];
            assert_eq!(workspace["type"], json!(["object", "null"]), "{tool}");
            assert!(workspace.get("properties").is_none(), "{tool}: {workspace}");
            let said = workspace["description"].as_str().unwrap();
            assert!(
                said.contains("\"name\"") && said.contains("\"uri\""),
                "{said}"
            );
        }
    }

    #[test]
    fn a_listing_for_programs_keeps_every_entry_and_says_which_are_neither_files_nor_directories() {
        let listing = ListDirResult {
            path: ".".into(),
            entries: vec![
                entry("a b.txt", EntryKind::File),
                entry("dir", EntryKind::Dir),
                entry("dir/line\nbreak", EntryKind::File),
                entry("dir/link", EntryKind::Symlink),
                entry("dir/sock", EntryKind::Other),
            ],
            truncated: true,
            unreadable: Vec::new(),
            hidden: 2,
        };
        let structured = ListDirStructured::from(listing);
        assert_eq!(structured.hidden, 2);
        assert_eq!(
            structured
                .entries
                .split(ENTRY_SEPARATOR)
                .collect::<Vec<_>>(),
            ["a b.txt", "dir/", "dir/line\nbreak", "dir/link", "dir/sock"]
        );
        assert_eq!(
            structured.kinds.into_iter().collect::<Vec<_>>(),
            [
                ("dir/link".to_owned(), EntryKind::Symlink),
                ("dir/sock".to_owned(), EntryKind::Other)
            ]
        );
        assert!(structured.truncated);
        let empty = ListDirStructured::from(ListDirResult {
            path: "d".into(),
            entries: vec![],
            truncated: false,
            unreadable: Vec::new(),
            hidden: 0,
        });
        assert_eq!(
            serde_json::to_value(&empty).unwrap(),
            json!({"path": "d", "entries": "", "truncated": false})
        );
        let found = GlobStructured::from(GlobResult {
            paths: vec!["a.rs".into(), "b/c.rs".into()],
            truncated: false,
        });
        assert_eq!(found.paths, "a.rs\0b/c.rs");
    }
}
