//! Approvals: what the client's user allows agents to do in an attached folder.
//!
//! Enforced here, in the client, so a server cannot make the client run what its user did not
//! allow. [`Policy`] is the pure part (trust, pre-approved classes, remembered decisions);
//! an [`Approver`] asks a person (or a script) when the policy has no answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use monad_protocol::text::printable;
use monad_protocol::wire::{Decider, Trust};
use monad_protocol::{ToolClass, ToolName};
use serde_json::Value;

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
    /// The attached folder's short name.
    pub workspace: String,
    /// The tool.
    pub tool: ToolName,
    /// The call's arguments, as the agent sent them (already checked by
    /// [`monad_sandbox::Sandbox::check`]).
    pub args: Value,
    /// The path, or the command line, in one line, escaped (see [`describe`]).
    pub target: String,
    /// For writes and edits: the whole diff the call would make.
    pub diff: Option<String>,
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

/// Programs that run whatever code or command they are given (in argv, on standard input, or
/// through a file they are pointed at): shells, interpreters and wrappers. "Allow always" for
/// one of these would allow anything, so it remembers only the exact command. Matched on the
/// base name of `argv[0]` with a version suffix removed (`python3.12`, `perl5.36`, `bash5`);
/// see [`RUNS_ANYTHING_FAMILIES`] for names matched by prefix.
pub const RUNS_ANYTHING: &[&str] = &[
    // shells
    "sh",
    "bash",
    "dash",
    "zsh",
    "fish",
    "ksh",
    "mksh",
    "pdksh",
    "yash",
    "csh",
    "tcsh",
    "ash",
    "busybox",
    "toybox",
    "rbash",
    "elvish",
    "nu",
    "xonsh",
    "pwsh",
    // interpreters
    "node",
    "nodejs",
    "deno",
    "bun",
    "tclsh",
    "wish",
    "expect",
    "rscript",
    "r",
    "julia",
    "osh",
    "guile",
    "racket",
    "sbcl",
    "clisp",
    "scheme",
    "ocaml",
    "ghci",
    "runghc",
    "irb",
    "jshell",
    "groovy",
    "kotlin",
    "scala",
    "swift",
    "erl",
    "escript",
    "elixir",
    "iex",
    "qjs",
    "jq",
    // the awk family and other languages in a tool
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "busybox-awk",
    "sed",
    "gsed",
    "find",
    "vim",
    "vi",
    "nvim",
    "emacs",
    "ed",
    "ex",
    // wrappers that run another command
    "env",
    "xargs",
    "nice",
    "nohup",
    "timeout",
    "setsid",
    "stdbuf",
    "sudo",
    "doas",
    "su",
    "time",
    "strace",
    "ltrace",
    "gdb",
    "lldb",
    "valgrind",
    "make",
    "gmake",
    "npx",
    "pnpx",
    "bunx",
    "uv",
    "uvx",
    "pipx",
    "poetry",
    "pdm",
    "hatch",
    "conda",
    "mamba",
    "micromamba",
    "npm",
    "pnpm",
    "yarn",
    "cargo",
    "go",
    "exec",
    "command",
    "builtin",
    "eval",
    "chroot",
    "unshare",
    "nsenter",
    "ionice",
    "taskset",
    "chrt",
    "flock",
    "watch",
    "script",
    "ssh",
    "parallel",
    "entr",
    "systemd-run",
    "runuser",
    "setpriv",
    "capsh",
    "firejail",
    "bwrap",
    "docker",
    "podman",
    "kubectl",
    "git",
];

/// Families of [`RUNS_ANYTHING`] matched by prefix, whatever follows (`python3-dbg`,
/// `pypy3.10`, `perl5.36.0`, `luajit`, `php-cgi`, `ruby3.2`).
pub const RUNS_ANYTHING_FAMILIES: &[&str] = &["python", "pypy", "perl", "ruby", "php", "lua"];

/// Whether `program` (`argv[0]`, a name or a path) runs whatever it is given: see
/// [`RUNS_ANYTHING`].
pub fn runs_anything(program: &str) -> bool {
    let base = program
        .rsplit('/')
        .next()
        .unwrap_or(program)
        .to_ascii_lowercase();
    let name = base.trim_end_matches(|c: char| c.is_ascii_digit() || matches!(c, '.' | '-' | '_'));
    RUNS_ANYTHING.contains(&name)
        || RUNS_ANYTHING.contains(&base.as_str())
        || RUNS_ANYTHING_FAMILIES.iter().any(|f| base.starts_with(f))
}

/// What "always" remembers: a whole class for reads and writes, one program for ordinary
/// commands, the exact command for shells, interpreters and wrappers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every tool of a class.
    Class(ToolClass),
    /// `run_command` of one program (`argv[0]`), with any arguments.
    Program(String),
    /// Exactly one command: a program that runs anything it is given ([`runs_anything`]), so
    /// only the same argv, in the same directory, with the same standard input, is remembered.
    Command {
        /// The whole argv.
        argv: Vec<String>,
        /// The working directory as given (`.` when none).
        cwd: String,
        /// The standard input, when there is one.
        stdin: Option<String>,
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
    /// The rule a call falls under.
    pub fn of(tool: ToolName, args: &Value) -> Rule {
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
                let program = argv.first().cloned().unwrap_or_default();
                if runs_anything(&program) {
                    Rule::Command {
                        argv,
                        cwd: args
                            .get("cwd")
                            .and_then(Value::as_str)
                            .unwrap_or(".")
                            .to_owned(),
                        stdin: args.get("stdin").and_then(Value::as_str).map(str::to_owned),
                    }
                } else {
                    Rule::Program(program)
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
            Rule::Program(p) => format!(
                "every run of `{}` in this workspace, with any arguments",
                printable(p)
            ),
            Rule::Command { argv, .. } => format!(
                "exactly this command (same arguments, directory and standard input): `{}` runs \
                 whatever it is given, so nothing wider is remembered for it",
                printable(argv.first().map_or("", String::as_str))
            ),
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
            printable(session)
        )
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
    /// There is no terminal to ask on (`--non-interactive`, or none).
    NoTerminal,
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
            Basis::NoTerminal => Decider::NoTerminal,
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

    /// The verdict without asking, if there is one, and why.
    pub fn check(&self, session: &str, tool: ToolName, args: &Value) -> Option<(Verdict, Basis)> {
        if self.trust == Trust::Full {
            return Some((Verdict::Allow, Basis::FullTrust));
        }
        if self.allowed.contains(&tool.class()) {
            return Some((Verdict::Allow, Basis::PreApproved(tool.class())));
        }
        let rule = Rule::of(tool, args);
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

    /// Records the user's decision and turns it into a verdict.
    pub fn record(
        &self,
        session: &str,
        tool: ToolName,
        args: &Value,
        decision: Decision,
    ) -> Verdict {
        let rule = Rule::of(tool, args);
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

/// The reason given when nobody can be asked.
pub fn nobody_to_ask(tool: ToolName, dir: &str) -> String {
    format!(
        "`{tool}` in this restricted workspace needs its user's approval, and the client runs \
         without a terminal to ask; the user can pre-approve it by attaching with \
         `monad-client attach {dir} --allow {}`",
        tool.class().as_str()
    )
}

/// The call in one line, escaped: its command line (argv quoted as a POSIX shell would need it,
/// see [`crate::prompt::shell_words`]), or its path or pattern.
pub fn describe(tool: ToolName, args: &Value) -> String {
    let text = |key: &str| args.get(key).and_then(Value::as_str);
    match tool {
        ToolName::RunCommand => {
            let argv: Vec<&str> = args
                .get("argv")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            format!("$ {}", crate::prompt::shell_words(&argv))
        }
        ToolName::Search | ToolName::Glob => match text("path") {
            Some(path) => format!(
                "pattern `{}` under `{}`",
                printable(text("pattern").unwrap_or("")),
                printable(path)
            ),
            None => format!("pattern `{}`", printable(text("pattern").unwrap_or(""))),
        },
        ToolName::ProcessRead | ToolName::ProcessWrite | ToolName::ProcessKill => {
            format!("process `{}`", printable(text("process").unwrap_or("")))
        }
        ToolName::ProcessList => "the background processes".into(),
        _ => printable(text("path").unwrap_or(".")).into_owned(),
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

    #[test]
    fn full_trust_and_pre_approved_classes_need_no_question() {
        let full = Policy::new(Trust::Full, vec![]);
        assert_eq!(
            full.check("s", ToolName::RunCommand, &json!({})),
            Some((Verdict::Allow, Basis::FullTrust))
        );
        let reads = Policy::new(Trust::Restricted, vec![ToolClass::Read]);
        assert_eq!(
            reads.check("s", ToolName::Search, &json!({})),
            Some((Verdict::Allow, Basis::PreApproved(ToolClass::Read)))
        );
        assert_eq!(reads.check("s", ToolName::WriteFile, &json!({})), None);
    }

    #[test]
    fn always_is_remembered_per_session_and_rule() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let cargo = json!({"argv": ["ls", "src"]});
        let rm = json!({"argv": ["rm", "-rf", "x"]});
        assert_eq!(
            p.record("s", ToolName::RunCommand, &cargo, Decision::AllowAlways),
            Verdict::Allow
        );
        assert_eq!(
            p.check(
                "s",
                ToolName::RunCommand,
                &json!({"argv": ["rustc", "--version"]})
            ),
            None,
            "another program"
        );
        assert_eq!(
            p.check("s", ToolName::RunCommand, &json!({"argv": ["ls", "-la"]})),
            Some((Verdict::Allow, Basis::Remembered))
        );
        assert_eq!(
            p.check("s", ToolName::RunCommand, &rm),
            None,
            "another program asks again"
        );
        assert_eq!(
            p.check("other", ToolName::RunCommand, &cargo),
            None,
            "another session asks again"
        );
        assert!(matches!(
            p.record("s", ToolName::EditFile, &json!({}), Decision::DenyAlways),
            Verdict::Deny(_)
        ));
        assert!(matches!(
            p.check("s", ToolName::WriteFile, &json!({})),
            Some((Verdict::Deny(_), Basis::Remembered))
        ));
        assert_eq!(
            p.record("s", ToolName::ReadFile, &json!({}), Decision::AllowOnce),
            Verdict::Allow
        );
        assert_eq!(
            p.check("s", ToolName::ReadFile, &json!({})),
            None,
            "once is not remembered"
        );
    }

    #[test]
    fn shells_interpreters_and_wrappers_are_recognised_with_version_suffixes() {
        for program in [
            "sh",
            "/bin/bash",
            "dash",
            "zsh",
            "fish",
            "ksh",
            "busybox",
            "python",
            "python3",
            "python3.12",
            "/usr/bin/python3.11",
            "pypy3",
            "node",
            "deno",
            "bun",
            "perl",
            "perl5.36",
            "ruby3.2",
            "php8.2",
            "lua5.4",
            "luajit",
            "awk",
            "gawk",
            "mawk",
            "env",
            "xargs",
            "nice",
            "nohup",
            "timeout",
            "setsid",
            "stdbuf",
            "sudo",
            "doas",
            "su",
            "time",
            "strace",
            "gdb",
            "make",
            "npx",
            "uv",
            "uvx",
            "bash5",
            "SH",
        ] {
            assert!(runs_anything(program), "{program}");
        }
        for program in [
            "ls",
            "cat",
            "rg",
            "rustc",
            "/usr/bin/grep",
            "shellcheck",
            "true",
            "",
        ] {
            assert!(!runs_anything(program), "{program}");
        }
    }

    #[test]
    fn always_on_a_shell_remembers_only_the_exact_command() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let a = json!({"argv": ["sh", "-c", "echo A"]});
        assert_eq!(
            Rule::of(ToolName::RunCommand, &a),
            Rule::Command {
                argv: vec!["sh".into(), "-c".into(), "echo A".into()],
                cwd: ".".into(),
                stdin: None
            }
        );
        p.record("s", ToolName::RunCommand, &a, Decision::AllowAlways);
        assert_eq!(
            p.check("s", ToolName::RunCommand, &a),
            Some((Verdict::Allow, Basis::Remembered))
        );
        for other in [
            json!({"argv": ["sh", "-c", "echo B"]}),
            json!({"argv": ["sh", "-c", "echo A"], "cwd": "sub"}),
            json!({"argv": ["sh", "-c", "echo A"], "stdin": "rm -rf ~"}),
            json!({"argv": ["sh"], "stdin": "echo A"}),
            json!({"argv": ["/bin/sh", "-c", "echo A"]}),
        ] {
            assert_eq!(p.check("s", ToolName::RunCommand, &other), None, "{other}");
        }
        let python = json!({"argv": ["python3.12", "x.py"]});
        p.record("s", ToolName::RunCommand, &python, Decision::AllowAlways);
        assert_eq!(
            p.check(
                "s",
                ToolName::RunCommand,
                &json!({"argv": ["python3.12", "y.py"]})
            ),
            None
        );
        let write = json!({"process": "p1", "text": "ls\n"});
        p.record("s", ToolName::ProcessWrite, &write, Decision::AllowAlways);
        assert_eq!(
            p.check(
                "s",
                ToolName::ProcessWrite,
                &json!({"process": "p1", "text": "rm x\n"})
            ),
            None
        );
        let scope = Rule::of(ToolName::RunCommand, &a).scope("s1");
        assert!(scope.contains("exactly this command"), "{scope}");
        assert!(
            scope.contains("until this attach ends, in session s1 only"),
            "{scope}"
        );
        let scope = Rule::of(ToolName::RunCommand, &json!({"argv": ["ls"]})).scope("s1");
        assert!(scope.contains("every run of `ls`"), "{scope}");
    }
}
