//! Approvals: what the client's user allows agents to do in an attached folder.
//!
//! Enforced here, in the client, so a server cannot make the client run what its user did not
//! allow. [`Policy`] is the pure part (trust, pre-approved classes, remembered decisions);
//! an [`Approver`] asks a person (or a script) when the policy has no answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use monad_protocol::wire::Trust;
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

/// What the user is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRequest {
    /// The session the call comes from.
    pub session: String,
    /// The attached folder's short name.
    pub workspace: String,
    /// The tool.
    pub tool: ToolName,
    /// The path, or the command line, in one line.
    pub target: String,
    /// For writes and edits: the diff the call would make.
    pub diff: Option<String>,
    /// What "always" would cover, in words (`every read`, `every run of cargo`).
    pub scope: String,
    /// When the question stops waiting and the call is denied (a request that waited in the
    /// queue behind others has less time left than the full time-out).
    pub deadline: std::time::Instant,
}

/// Something that asks the user. Concurrent requests may arrive; implementations queue them.
pub trait Approver: Send + Sync {
    /// Asks about `request`. Dropping the future withdraws the question (the call was cancelled
    /// or timed out).
    fn decide(&self, request: ApprovalRequest) -> Pin<Box<dyn Future<Output = Decision> + Send>>;
}

/// What "always" remembers: a whole class for reads and writes, one program for commands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every tool of a class.
    Class(ToolClass),
    /// `run_command` of one program (`argv[0]`).
    Program(String),
}

impl Rule {
    /// The rule a call falls under.
    pub fn of(tool: ToolName, args: &Value) -> Rule {
        match tool.class() {
            ToolClass::Exec => Rule::Program(program(args).unwrap_or_default()),
            class => Rule::Class(class),
        }
    }

    /// In words, for the prompt.
    pub fn describe(&self) -> String {
        match self {
            Rule::Class(ToolClass::Read) => "every read in this workspace".into(),
            Rule::Class(ToolClass::Write) => "every write and edit in this workspace".into(),
            Rule::Class(class) => format!("every {} call in this workspace", class.as_str()),
            Rule::Program(p) => format!("every run of `{p}` in this workspace"),
        }
    }
}

fn program(args: &Value) -> Option<String> {
    args.get("argv")?.get(0)?.as_str().map(str::to_owned)
}

/// The answer the policy gives without asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Refuse it, with the reason the agent is told.
    Deny(String),
}

/// Trust, pre-approved classes and remembered decisions of one attached folder. Decisions are
/// remembered for the session and workspace: a new session starts from the flags again.
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

    /// The verdict without asking, if there is one.
    pub fn check(&self, session: &str, tool: ToolName, args: &Value) -> Option<Verdict> {
        if self.trust == Trust::Full || self.allowed.contains(&tool.class()) {
            return Some(Verdict::Allow);
        }
        let rule = Rule::of(tool, args);
        let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        match remembered.get(&(session.to_owned(), rule.clone())) {
            Some(true) => Some(Verdict::Allow),
            Some(false) => Some(Verdict::Deny(format!(
                "the user chose to deny {} for this session",
                rule.describe()
            ))),
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
            Some(Verdict::Allow)
        );
        let reads = Policy::new(Trust::Restricted, vec![ToolClass::Read]);
        assert_eq!(
            reads.check("s", ToolName::Search, &json!({})),
            Some(Verdict::Allow)
        );
        assert_eq!(reads.check("s", ToolName::WriteFile, &json!({})), None);
    }

    #[test]
    fn always_is_remembered_per_session_and_rule() {
        let p = Policy::new(Trust::Restricted, vec![]);
        let cargo = json!({"argv": ["cargo", "test"]});
        let rm = json!({"argv": ["rm", "-rf", "x"]});
        assert_eq!(
            p.record("s", ToolName::RunCommand, &cargo, Decision::AllowAlways),
            Verdict::Allow
        );
        assert_eq!(
            p.check(
                "s",
                ToolName::RunCommand,
                &json!({"argv": ["cargo", "build"]})
            ),
            Some(Verdict::Allow)
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
            Some(Verdict::Deny(_))
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
}
