//! The messages exchanged over QUIC, as internally tagged serde enums.
//!
//! A connection speaks ALPN [`ALPN`] (the major version is in the ALPN, so a peer of another major
//! version fails the TLS handshake with a clear ALPN error). Its first bidirectional stream, opened
//! by the connecting side, carries [`Message::Hello`], answered by [`Message::Welcome`] or
//! [`Message::Refused`]. After that every request has its own bidirectional stream: agents open
//! streams toward the server for calls; the server opens streams toward an attached client to run
//! tools in its folders. Each message is JSON in frames ([`crate::frame`]). Cancelling a request
//! is resetting its stream.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;
use crate::tools::{NetworkEvent, ToolName};

/// The ALPN protocol id; its suffix is the protocol's major version.
pub const ALPN: &[u8] = b"monad/1";
/// Major version, also in [`ALPN`]: peers with another major version cannot talk.
pub const PROTOCOL_MAJOR: u32 = 1;
/// Minor version: additions that older peers can ignore. The lower of the two is used.
pub const PROTOCOL_MINOR: u32 = 15;
/// The first minor version with result bodies ([`Body`]): a peer never sends one on a connection
/// whose negotiated minor version is lower, and sends the field inline instead.
pub const BODY_MINOR: u32 = 1;
/// The first minor version where a client reports its folders' network connections on the
/// attach stream as they happen ([`Message::Network`]); with a lower one the server audits
/// those a result carries.
pub const NETWORK_MINOR: u32 = 2;
/// The first minor version where [`Message::Attach`] may ask to make the folder the session's
/// focus (`focus: true`); a client never sends the field to a server of a lower one.
pub const FOCUS_MINOR: u32 = 3;
/// The first minor version with MCP roots: [`Message::Land`], and the folder's absolute path on
/// its device in [`Message::Attach`] and [`Message::OpenSession`] (`folder`). A peer never sends
/// them to one of a lower version.
pub const ROOTS_MINOR: u32 = 4;
/// Most roots one [`Message::Land`] carries (a bridge sends its host's first ones).
pub const MAX_ROOTS: usize = 64;
/// Longest root URI a [`Message::Land`] carries, in bytes.
pub const MAX_ROOT_LEN: usize = 4096;
/// The first minor version with the built-in agent ([`Message::Prompt`], answered by
/// [`Message::AgentEvent`]s and [`Message::TurnDone`]); a client never sends a prompt to a server
/// of a lower one.
pub const AGENT_MINOR: u32 = 5;
// --- Minor 6, the front's permission (the ACP front). Kept in its own constant so that other
// additions under minor 6 merge beside it.
/// The first minor version where a prompt's front may approve or reject a restricted call before
/// the folder's owner is asked: [`Message::Prompt`] with `ask: true`, answered by
/// [`crate::agent::AgentEvent::Permission`] and [`Message::PermissionAnswer`] on the prompt's
/// stream. A client never sends `ask` to a server of a lower one.
pub const PERMISSION_MINOR: u32 = 6;
/// Longest call id a [`Message::PermissionAnswer`] carries, in bytes.
pub const MAX_CALL_ID_LEN: usize = 1024;
// --- Minor 6, the chat front's additions.
/// The first minor version with the chat front's additions: per-prompt `model` and `base_url`
/// in [`Message::Prompt`], and [`Message::ChatInfo`] (answered by [`Message::ChatInfoIs`]). A
/// client never sends them to a server of a lower one.
pub const CHAT_MINOR: u32 = 6;
// --- Minor 7, the command line's additions.
/// The first minor version with the command line's additions: [`Message::Detach`] (detach or
/// forget a folder by name), [`Message::Detached`] (the server tells an `attach` that its folder
/// was taken over or detached, so that it stops), `exact_name` in [`Message::Attach`], a
/// session's human `name` in [`Message::OpenSession`] and [`SessionInfo`]. A peer never sends
/// them to one of a lower version (see [`Message::for_minor`]).
pub const CLI_MINOR: u32 = 7;
/// Longest human name of a session, in bytes.
pub const MAX_SESSION_NAME: usize = 200;
// --- Minor 8.
/// The first minor version where a [`Message::Run`] may carry `if_present`: routing's probe and
/// the run in one round trip. A server never sends it to a client of a lower one (it probes
/// first, then runs).
pub const IF_PRESENT_MINOR: u32 = 8;
// --- Minor 9.
/// The first minor version where the server tells an attached folder's client when the
/// session's focus moves to or from the folder ([`Message::Focused`], on the attach stream). A
/// server never sends it to a client of a lower one.
pub const FOCUSED_MINOR: u32 = 9;
// --- Minor 10.
/// The first minor version where the server also tells an attached folder's client of the
/// focus in the other sessions the folder serves (an MCP host landing in it in a session of its
/// own, `sessions --new` in it), naming that session ([`Message::Focused`]'s `session`). A
/// server tells a client of a lower one of the session it attached to only.
pub const SHARED_FOCUS_MINOR: u32 = 10;
/// The first minor version where [`Message::Landed`] says when the session's focus is a
/// folder that is offline (`focus_offline`); left out for an older peer, which would refuse it.
pub const OFFLINE_FOCUS_MINOR: u32 = 10;
// --- Minor 11.
/// The first minor version where [`Message::Landed`] says whether the folder a root matched
/// became the session's focus (`folder_focus`); left out for an older peer, which would refuse
/// it.
pub const FOLDER_FOCUS_MINOR: u32 = 11;
// --- Minor 12.
/// The first minor version where a folder attaching to a session that another host of the
/// deployment serves, and keeps, is told that host's address ([`Message::Elsewhere`]) rather
/// than refused: its client attaches there. A client of a lower one is refused
/// (`workspace_disconnected`), as before.
pub const ELSEWHERE_MINOR: u32 = 12;
// --- Minor 13.
/// The first minor version whose `search` takes `context` and `files_only`
/// ([`crate::tools::SearchArgs`]). A server never sends them to an attached folder's client of
/// a lower one: the call is refused, saying so.
pub const SEARCH_CONTEXT_MINOR: u32 = 13;
// --- Minor 14.
/// The first minor version where a client says what network its folder's commands get
/// ([`Message::Attach`]'s `network`) and a workspace's listing says it
/// ([`WorkspaceInfo::network`]). A peer of a lower one is never sent it.
pub const NETWORK_POLICY_MINOR: u32 = 14;
/// Longest [`WorkspaceInfo::network`] a server keeps, in bytes (a longer one is cut, marked
/// with `…`).
pub const MAX_NETWORK_SUMMARY: usize = 1024;
// --- Minor 15.
/// The first minor version whose `memory_recall` result may say how many notes it left out
/// ([`crate::tools::MemoryRecallResult::not_shown`]); left out of the result for an older agent.
pub const RECALL_BOUND_MINOR: u32 = 15;

/// `summary` as a [`WorkspaceInfo::network`] holds it: cut to at most [`MAX_NETWORK_SUMMARY`]
/// bytes on a character boundary, marked `…` where cut.
pub fn bounded_network(summary: &str) -> String {
    if summary.len() <= MAX_NETWORK_SUMMARY {
        return summary.to_owned();
    }
    crate::text::shortened(summary, MAX_NETWORK_SUMMARY - '…'.len_utf8()).into_owned()
}
/// Most connections one [`Message::Network`] carries (a client sends more in several).
pub const MAX_NETWORK_EVENTS: usize = 64;
/// Longest [`Message::Progress`] line a server passes on, in bytes: a longer one is cut to it
/// at a character boundary. A client's own lines are a sentence ("waiting for … to approve",
/// "`cargo` running for 12 s: last line"); the cap keeps a client from making the server hold
/// and relay megabytes per line.
pub const MAX_PROGRESS: usize = 4096;

/// Progress lines a call keeps for its caller (an agent, an MCP host) that has not taken them
/// yet; more are dropped (`try_send`), so a caller that reads slowly never makes a call hold
/// lines without bound.
pub const PROGRESS_QUEUE: usize = 16;

/// A progress line as a server passes it on: at most [`MAX_PROGRESS`] bytes.
pub fn progress_line(message: &str) -> &str {
    crate::text::head(message, MAX_PROGRESS)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Whether `id` is a device id as a hello must give it: a UUID in its canonical form, 36
/// characters, lowercase hex digits and hyphens at 8, 13, 18 and 23. The server refuses any
/// other (it keys the device's bindings), and the client's config says so where it is read.
pub fn is_device_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => matches!(b, b'0'..=b'9' | b'a'..=b'f'),
        })
}

/// Checks a client name, as the server does a hello's and the client its config's: it goes into workspace URIs (`<client-name>:<path>`) and
/// onto terminals, so 1 to 64 characters, none of them `:`, `/`, or a character
/// [`crate::text::is_hidden`] finds (controls, bidi and other format characters,
/// line and paragraph separators, default-ignorable code points such as zero-width characters,
/// variation selectors and tags).
pub fn check_client_name(name: &str) -> Result<(), String> {
    let count = name.chars().count();
    let bad = name
        .chars()
        .find(|&c| crate::text::is_hidden(c) || matches!(c, ':' | '/'));
    match (count, bad) {
        (1..=64, None) => Ok(()),
        (1..=64, Some(c)) => Err(format!(
            "the client name {name:?} contains {c:?}; a client name has no control, format or \
             invisible characters, `:` or `/`"
        )),
        _ => Err(format!(
            "the client name {name:?} must be 1 to 64 characters ({count} given)"
        )),
    }
}

/// The minor version both sides speak: the lower of the two.
pub fn negotiate_minor(peer: u32) -> u32 {
    peer.min(PROTOCOL_MINOR)
}

/// What the connecting side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A laptop attaching folders (`monad-client attach`).
    Client,
    /// Something that calls tools (`monad-client call`, `mcp`, an agent host).
    Agent,
}

/// How much a workspace is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Tools run at once.
    Full,
    /// Each action waits for the client user's decision.
    Restricted,
}

impl Trust {
    /// `full` or `restricted`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Full => "full",
            Trust::Restricted => "restricted",
        }
    }
}

/// Who decided whether a call ran: in the `decided` message and in the audit log. Serialized as
/// the words below; a word this version does not know (from a newer or an older peer) reads as
/// [`Decider::Client`], never as an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// A workspace of full trust: the primary, or a folder attached with `--trust full`.
    Trust,
    /// The client's policy without asking: a class pre-approved with `--allow`, or an "always"
    /// the user chose earlier.
    Policy,
    /// The client's user, at a prompt.
    User,
    /// Nobody answered the prompt in time.
    Timeout,
    /// The client has no terminal to ask on, and nothing pre-approved the call.
    NoTerminal,
    /// The server, before any workspace was reached (routing failed, bad arguments, the call's
    /// time limit).
    Server,
    /// A session tool (`workspaces`, `memory_*`), run by the server for the session.
    Session,
    /// The client, without saying more (its checks refused the call, or it is a peer that does
    /// not say who decided).
    Client,
    /// A workspace's network policy, for a connection a command asked its proxy for (audit
    /// log only).
    NetworkPolicy,
    /// The front the built-in agent's user works in (an ACP editor) rejected the call, so the
    /// folder's owner was never asked (audit log only; minor [`PERMISSION_MINOR`]).
    Front,
}

impl Decider {
    /// Every decider, in the order above.
    pub const ALL: [Decider; 10] = [
        Decider::Trust,
        Decider::Policy,
        Decider::User,
        Decider::Timeout,
        Decider::NoTerminal,
        Decider::Server,
        Decider::Session,
        Decider::Client,
        Decider::NetworkPolicy,
        Decider::Front,
    ];

    /// Who decided, as a client says it of a folder it attached (with full trust or not):
    /// only what a client decides; any other word (the server, a session tool, the network
    /// policy, the editor, or trust for a restricted folder) is [`Decider::Client`], so that a
    /// client cannot make the audit log say that someone else decided.
    pub fn said_by_client(self, full_trust: bool) -> Decider {
        match self {
            Decider::Trust if full_trust => Decider::Trust,
            Decider::Policy | Decider::User | Decider::Timeout | Decider::NoTerminal => self,
            _ => Decider::Client,
        }
    }

    /// The word on the wire and in the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            Decider::Trust => "trust",
            Decider::Policy => "policy",
            Decider::User => "user",
            Decider::Timeout => "timeout",
            Decider::NoTerminal => "no_terminal",
            Decider::Server => "server",
            Decider::Session => "session",
            Decider::Client => "client",
            Decider::NetworkPolicy => "network_policy",
            Decider::Front => "front",
        }
    }

    /// The decider a word names; [`Decider::Client`] for a word this version does not know.
    pub fn from_word(word: &str) -> Decider {
        Decider::ALL
            .into_iter()
            .find(|d| d.as_str() == word)
            .unwrap_or(Decider::Client)
    }
}

impl std::fmt::Display for Decider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Decider {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Decider, D::Error> {
        let word = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Decider::from_word(&word))
    }
}

/// Where a workspace lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Host {
    /// On the server (the primary workspace).
    Server,
    /// On an attached client machine.
    Client,
}

/// A workspace as agents and users see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceInfo {
    /// Short name, unique in the session (`primary`, or the attached folder's name).
    pub name: String,
    /// URI: `server:/sessions/<id>` or `<client-name>:<path as the user gave it>`.
    pub uri: String,
    /// Trust level.
    pub trust: Trust,
    /// Where it lives.
    pub host: Host,
    /// False while an attached workspace's client is disconnected.
    pub online: bool,
    /// The tools it offers.
    pub tools: Vec<ToolName>,
    /// What network its commands get, in a few words (`no network`, `network to pypi.org
    /// only`, `full network (the host's)`); absent when not known (a folder last attached by a
    /// client older than minor [`NETWORK_POLICY_MINOR`], the primary of a session listed but not
    /// loaded). At most [`MAX_NETWORK_SUMMARY`] bytes ([`bounded_network`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// A session as listed to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionInfo {
    /// `default` or a UUID.
    pub id: String,
    /// The owning user.
    pub owner: String,
    /// Creation time, RFC 3339.
    pub created_at: String,
    /// Last activity, RFC 3339.
    #[serde(default)]
    pub last_active: String,
    /// Its human name, when it was given one (`sessions --new --name`; minor [`CLI_MINOR`] or
    /// later, never sent when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its workspaces, primary first, then attached in attach order.
    pub workspaces: Vec<WorkspaceInfo>,
}

/// A session's agent as the chat front shows it ([`Message::ChatInfoIs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatInfo {
    /// The session's id (`default` or a UUID).
    pub session: String,
    /// The session's effective `llm.provider` (`openai`, `anthropic`).
    pub provider: String,
    /// The session's effective `llm.model` (empty when none is set).
    pub model: String,
    /// Messages in `session.md` (user, assistant and system).
    pub messages: u64,
    /// Of the user and assistant messages, how many the next turn would send to the model
    /// (the loop's own context-budget trimming, the next message not counted).
    pub context_messages: u64,
    /// The user and assistant messages of `session.md`.
    pub conversation_messages: u64,
    /// Its workspaces, primary first.
    pub workspaces: Vec<WorkspaceInfo>,
}

/// Who said a message of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryRole {
    /// The person.
    User,
    /// The model.
    Assistant,
    /// A system prompt.
    System,
}

impl HistoryRole {
    /// The header word of `session.md`: `User`, `Assistant`, `System`.
    pub fn header(self) -> &'static str {
        match self {
            HistoryRole::User => "User",
            HistoryRole::Assistant => "Assistant",
            HistoryRole::System => "System",
        }
    }

    /// Parses `user`, `assistant` or `system` (any case).
    pub fn parse(s: &str) -> Option<HistoryRole> {
        match s.to_ascii_lowercase().as_str() {
            "user" => Some(HistoryRole::User),
            "assistant" => Some(HistoryRole::Assistant),
            "system" => Some(HistoryRole::System),
            _ => None,
        }
    }
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryMessage {
    /// Who said it.
    pub role: HistoryRole,
    /// What was said (markdown).
    pub text: String,
}

/// A session's conversation: what `session.md` holds. Tool calls are never part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// The model provider, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The model, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// When the session was created, RFC 3339.
    pub created_at: String,
    /// The messages, oldest first.
    pub messages: Vec<HistoryMessage>,
}

/// A workspace record: an attached folder, resolved by (user, device, path) and reused by every
/// session it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRecord {
    /// A UUID.
    pub id: String,
    /// The owner.
    pub user: String,
    /// The device that attached it.
    pub device_id: String,
    /// The folder as the user gave it.
    pub path: String,
    /// Its URI at the last attach.
    pub uri: String,
    /// First attach, RFC 3339.
    pub created_at: String,
    /// Last activity in any session, RFC 3339.
    pub last_active: String,
}

/// A session as seen from a workspace record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSession {
    /// The session id.
    pub session: String,
    /// When the folder was first used in it, RFC 3339.
    pub first_at: String,
    /// The folder's last activity in it, RFC 3339.
    pub last_active: String,
    /// How many calls ran in the folder for this session.
    pub calls: u64,
}

/// Which workspace ran a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRef {
    /// Short name.
    pub name: String,
    /// URI.
    pub uri: String,
}

/// A tool's JSON result: a tree, or the JSON text it was read as.
///
/// A server relays a result from an attached client to the agent, and records it, without
/// looking inside it: [`Message::from_json_relayed`] keeps the result as the text it came in, and
/// writing it out copies that text. Decoding a 1,000-entry listing into a tree and encoding it
/// twice (for the agent and for the call's artifact) took the server about 180 µs per call
/// (`docs/benchmarks.md`, the Python SDK cases' eleventh round). Whoever needs the tree gets
/// it with [`ToolResult::value`], parsed then. Every other decoding makes a tree at once.
#[derive(Clone)]
pub struct ToolResult(Repr);

#[derive(Clone)]
enum Repr {
    Tree(Value),
    Text(Box<serde_json::value::RawValue>),
}

impl ToolResult {
    /// The result as a tree: the one it is, or one parsed from its text.
    pub fn value(&self) -> std::borrow::Cow<'_, Value> {
        match &self.0 {
            Repr::Tree(value) => std::borrow::Cow::Borrowed(value),
            Repr::Text(text) => std::borrow::Cow::Owned(parse_checked(text)),
        }
    }

    /// The result as a tree, taken.
    pub fn into_value(self) -> Value {
        match self.0 {
            Repr::Tree(value) => value,
            Repr::Text(text) => parse_checked(&text),
        }
    }

    /// The tree, to change it: a result kept as text is parsed into one first.
    pub fn tree_mut(&mut self) -> &mut Value {
        if let Repr::Text(text) = &self.0 {
            self.0 = Repr::Tree(parse_checked(text));
        }
        match &mut self.0 {
            Repr::Tree(value) => value,
            Repr::Text(_) => unreachable!("made a tree just above"),
        }
    }

    /// The result decoded as a `T`, from its tree or straight from its text.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        match &self.0 {
            Repr::Tree(value) => T::deserialize(value),
            Repr::Text(text) => serde_json::from_str(text.get()),
        }
    }

    /// The length of the text the result was read as, when it is kept so.
    pub fn text_len(&self) -> Option<usize> {
        match &self.0 {
            Repr::Tree(_) => None,
            Repr::Text(text) => Some(text.get().len()),
        }
    }

    /// The text the result was read as, when it is kept so.
    pub fn text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Tree(_) => None,
            Repr::Text(text) => Some(text.get()),
        }
    }

    /// True when the result is kept as the text it was read as.
    pub fn is_text(&self) -> bool {
        matches!(self.0, Repr::Text(_))
    }
}

/// How deep serde_json lets arrays and objects nest in what it decodes.
const MAX_NESTING: usize = 127;

/// Longest run of digits passed on as text: serde_json refuses a number out of a double's range
/// (over about 1.8e308, so 309 digits and more) when it makes a tree, not when it keeps text.
const MAX_DIGITS: usize = 300;

/// The largest relayed result read as a tree when it cannot be passed on as text
/// ([`Message::from_json_relayed`]).
pub const MAX_TREE_RESULT: usize = 1024 * 1024;

/// True when JSON text can be passed on as it is, because every reader decodes it as a tree:
/// its arrays and objects nest at most `max` deep, it escapes no UTF-16 surrogate (`\ud800` to
/// `\udfff`), and its numbers have no exponent and at most [`MAX_DIGITS`] digits in a row.
/// serde_json checks each of these when it makes a tree (too deep, half a surrogate pair, out of
/// range: refused) but not when it keeps text. Text that is not plain in this way (which Monad's
/// peers do not write: they send UTF-8, and integers) is made a tree of, so that what decodes is
/// decoded and the rest refused, as anywhere else.
///
/// Both the server and `monad-client mcp` look at every result so: a string's content is
/// passed over with `memchr` to its next quote or backslash rather than a byte at a time (the
/// byte loop was 2% of all three processes' time on a 1,000-entry listing, `docs/benchmarks.md`).
fn passes_as_text(text: &[u8], max: usize) -> bool {
    let (mut depth, mut digits, mut i) = (0usize, 0usize, 0usize);
    while let Some(&byte) = text.get(i) {
        match byte {
            b'0'..=b'9' => {
                digits += 1;
                if digits > MAX_DIGITS {
                    return false;
                }
                i += 1;
                continue;
            }
            // An exponent: `e` right after a number's digit or point (in `true` and `false` it
            // follows a letter).
            b'e' | b'E' if digits > 0 || i > 0 && text[i - 1] == b'.' => return false,
            b'"' => {
                // To the string's closing quote, looking only at its escapes. Text that ends
                // inside a string has nothing more to refuse.
                i += 1;
                loop {
                    let Some(at) = text
                        .get(i..)
                        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                    else {
                        return true;
                    };
                    i += at;
                    if text[i] == b'"' {
                        break;
                    }
                    if let [
                        b'u',
                        b'd' | b'D',
                        b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F',
                        ..,
                    ] = &text[i + 1..]
                    {
                        return false;
                    }
                    // The backslash and the character it escapes.
                    i += 2;
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        digits = 0;
        i += 1;
    }
    true
}

/// Parses text that [`Message::from_json_relayed`] kept as a result because it decodes as a tree
/// ([`passes_as_text`]): it does not fail, and were it to, the result would be `null`.
fn parse_checked(text: &serde_json::value::RawValue) -> Value {
    serde_json::from_str(text.get()).unwrap_or(Value::Null)
}

impl From<Value> for ToolResult {
    fn from(value: Value) -> ToolResult {
        ToolResult(Repr::Tree(value))
    }
}

impl PartialEq for ToolResult {
    fn eq(&self, other: &ToolResult) -> bool {
        self.value() == other.value()
    }
}

/// The result as JSON text.
impl std::fmt::Display for ToolResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Repr::Tree(value) => value.fmt(f),
            Repr::Text(text) => f.write_str(text.get()),
        }
    }
}

/// As the tree's, whichever the result holds.
impl std::fmt::Debug for ToolResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.value().as_ref(), f)
    }
}

impl Serialize for ToolResult {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Repr::Tree(value) => value.serialize(serializer),
            Repr::Text(text) => text.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ToolResult {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ToolResult, D::Error> {
        Value::deserialize(deserializer).map(ToolResult::from)
    }
}

/// How a tool call ended. Decoded by hand (see the `Deserialize` impl below), written by serde
/// as `{"status": "ok", "result": ...}` or `{"status": "error", "error": ...}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The tool's JSON result.
    Ok {
        /// The result, as the tool's result type serializes.
        result: ToolResult,
    },
    /// The tool failed; `error.code` says how.
    Error {
        /// What went wrong.
        error: ToolError,
    },
}

impl Outcome {
    /// The outcome of a call of `tool` as an agent speaking minor `minor` can read it: what a
    /// `workspaces` or `memory_recall` result holds that is newer than that is left out (the
    /// agent's own copy of the tool's output schema, which an MCP host checks results against,
    /// refuses fields it does not know).
    pub fn for_minor(&mut self, tool: &str, minor: u32) {
        let Outcome::Ok { result } = self else {
            return;
        };
        if minor < NETWORK_POLICY_MINOR
            && tool == ToolName::Workspaces.as_str()
            && let Some(list) = result
                .tree_mut()
                .get_mut("workspaces")
                .and_then(Value::as_array_mut)
        {
            for workspace in list.iter_mut().filter_map(Value::as_object_mut) {
                workspace.remove("network");
            }
        }
        if minor < RECALL_BOUND_MINOR
            && tool == ToolName::MemoryRecall.as_str()
            && let Some(recalled) = result.tree_mut().as_object_mut()
        {
            recalled.remove("not_shown");
        }
    }
}

/// Reads an [`Outcome`] field by field. serde's derive for an internally tagged enum first
/// buffers the whole object (the tool's result included, however large) into a private tree and
/// decodes that again; this visitor decodes each field once, straight into its type, in any
/// order. Unknown fields, a missing or unknown `status`, and a field of the other status are
/// errors, as with the derive.
impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Outcome, D::Error> {
        deserialize_outcome::<D, Value>(deserializer)
    }
}

/// An [`Outcome`] whose result is kept as the JSON text it is read as (see [`ToolResult`]).
struct RelayedOutcome(Outcome);

impl<'de> Deserialize<'de> for RelayedOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<RelayedOutcome, D::Error> {
        deserialize_outcome::<D, Box<serde_json::value::RawValue>>(deserializer).map(RelayedOutcome)
    }
}

impl From<Box<serde_json::value::RawValue>> for ToolResult {
    fn from(text: Box<serde_json::value::RawValue>) -> ToolResult {
        ToolResult(Repr::Text(text))
    }
}

impl From<RelayedOutcome> for Outcome {
    fn from(relayed: RelayedOutcome) -> Outcome {
        relayed.0
    }
}

/// Reads an [`Outcome`] whose result is first read as an `R`.
fn deserialize_outcome<'de, D, R>(deserializer: D) -> Result<Outcome, D::Error>
where
    D: serde::Deserializer<'de>,
    R: Deserialize<'de> + Into<ToolResult>,
{
    struct Visitor<R>(std::marker::PhantomData<R>);
    impl<'de, R: Deserialize<'de> + Into<ToolResult>> serde::de::Visitor<'de> for Visitor<R> {
        type Value = Outcome;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an outcome {status: ok, result} or {status: error, error}")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Outcome, A::Error> {
            use serde::de::Error;
            #[derive(Deserialize)]
            #[serde(rename_all = "snake_case")]
            enum Status {
                Ok,
                Error,
            }
            #[derive(Deserialize)]
            #[serde(field_identifier, rename_all = "snake_case")]
            enum Field {
                Status,
                Result,
                Error,
            }
            let (mut status, mut result, mut error) = (None, None, None);
            while let Some(field) = map.next_key::<Field>()? {
                match field {
                    Field::Status if status.is_none() => status = Some(map.next_value()?),
                    Field::Result if result.is_none() => {
                        result = Some(map.next_value::<R>()?.into());
                    }
                    Field::Error if error.is_none() => error = Some(map.next_value()?),
                    Field::Status => return Err(A::Error::duplicate_field("status")),
                    Field::Result => return Err(A::Error::duplicate_field("result")),
                    Field::Error => return Err(A::Error::duplicate_field("error")),
                }
            }
            match (status, result, error) {
                (None, _, _) => Err(A::Error::missing_field("status")),
                (Some(Status::Ok), Some(result), None) => Ok(Outcome::Ok { result }),
                (Some(Status::Ok), None, _) => Err(A::Error::missing_field("result")),
                (Some(Status::Ok), Some(_), Some(_)) => {
                    Err(A::Error::unknown_field("error", &["status", "result"]))
                }
                (Some(Status::Error), None, Some(error)) => Ok(Outcome::Error { error }),
                (Some(Status::Error), _, None) => Err(A::Error::missing_field("error")),
                (Some(Status::Error), Some(_), Some(_)) => {
                    Err(A::Error::unknown_field("result", &["status", "error"]))
                }
            }
        }
    }
    deserializer.deserialize_map(Visitor::<R>(std::marker::PhantomData))
}

/// A field of a result that travels after its [`Message::Result`] as raw bytes instead of inside
/// the JSON: the `content` of a large `read_file`. The bytes come right after the message's last
/// frame, exactly `len` of them, unframed (the length is already known), and are the field's
/// UTF-8 text. Nothing follows them on the stream.
///
/// Raw bytes cost no escaping on the way out and no parsing on the way in, and a server relays
/// them chunk by chunk as they arrive instead of holding the whole result. Only on connections
/// of minor version [`BODY_MINOR`] or later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Body {
    /// The top-level string field of the result the bytes are the value of.
    pub field: String,
    /// How many bytes follow.
    pub len: u64,
}

/// Stream reset codes: the QUIC application error code a side resets a stream (or stops reading
/// it) with. A reset is how a request is cancelled, and how a [`Body`] that cannot be finished
/// ends: its result message has already gone out, so no error message can follow it.
pub mod reset {
    /// The request is cancelled, or the stream is no longer wanted.
    pub const CANCELLED: u32 = 0;
    /// The workspace sending a body went away (or gave up) mid-body: the call failed with
    /// `workspace_disconnected`.
    pub const WORKSPACE_DISCONNECTED: u32 = 1;
    /// The body did not arrive within the call's time limit: the call failed with `timeout`.
    pub const TIMEOUT: u32 = 2;
    /// The request was malformed or too large, and the receiver stopped reading it; or, on a
    /// relayed [`Body`](super::Body), the body is not what its result announced: it ended short,
    /// ran long, or is not UTF-8 text. The call failed with `malformed`.
    pub const MALFORMED: u32 = 3;
}

/// Results whose `content` is at least this long send it as a [`Body`].
pub const BODY_THRESHOLD: usize = 64 * 1024;

/// Why a [`Body`] cannot be put back into its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// The outcome is an error, or its result is not a JSON object.
    NotAnObject,
    /// The result already has the field the body claims.
    FieldPresent(String),
    /// The bytes are not UTF-8 text.
    NotText(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::NotAnObject => write!(f, "a body follows a result that is not an object"),
            BodyError::FieldPresent(field) => {
                write!(
                    f,
                    "a body for `{field}` follows a result that has `{field}`"
                )
            }
            BodyError::NotText(field) => write!(f, "the body for `{field}` is not UTF-8 text"),
        }
    }
}

impl std::error::Error for BodyError {}

impl Outcome {
    /// Takes a large `content` string out of a successful result, to be sent as a [`Body`]:
    /// `None` (and the outcome untouched) when there is none of at least [`BODY_THRESHOLD`]
    /// bytes. The string's buffer is moved, not copied.
    pub fn split_body(&mut self) -> Option<(Body, Vec<u8>)> {
        let Outcome::Ok { result } = self else {
            return None;
        };
        // A result kept as text is relayed as it came: its client sent a large `content` as a
        // body already (or is too old to read one, and so is what it answers to).
        if result.is_text() {
            return None;
        }
        let Value::Object(map) = result.tree_mut() else {
            return None;
        };
        match map.get("content") {
            Some(Value::String(s)) if s.len() >= BODY_THRESHOLD => {}
            _ => return None,
        }
        let Some(Value::String(content)) = map.remove("content") else {
            unreachable!("checked just above")
        };
        let body = Body {
            field: "content".into(),
            len: content.len() as u64,
        };
        Some((body, content.into_bytes()))
    }

    /// Puts a received [`Body`] back into its result, the inverse of [`Outcome::split_body`].
    /// Changes nothing on error.
    pub fn join_body(&mut self, body: &Body, bytes: Vec<u8>) -> Result<(), BodyError> {
        let Outcome::Ok { result } = self else {
            return Err(BodyError::NotAnObject);
        };
        let Value::Object(map) = result.tree_mut() else {
            return Err(BodyError::NotAnObject);
        };
        if map.contains_key(&body.field) {
            return Err(BodyError::FieldPresent(body.field.clone()));
        }
        let text = String::from_utf8(bytes).map_err(|_| BodyError::NotText(body.field.clone()))?;
        map.insert(body.field.clone(), Value::String(text));
        Ok(())
    }
}

/// Checks that bytes arriving in pieces are UTF-8 text, without holding them: a character cut
/// between two pieces is carried over (at most 3 bytes).
#[derive(Debug, Default)]
pub struct Utf8Stream {
    carry: Vec<u8>,
}

impl Utf8Stream {
    /// Checks the next piece; `false` once the bytes so far cannot be UTF-8 text.
    pub fn feed(&mut self, mut bytes: &[u8]) -> bool {
        // First finish the character the last piece cut, a byte at a time (at most 3).
        while !self.carry.is_empty() {
            let Some((&first, rest)) = bytes.split_first() else {
                return true;
            };
            self.carry.push(first);
            bytes = rest;
            match std::str::from_utf8(&self.carry) {
                Ok(_) => self.carry.clear(),
                Err(e) if e.error_len().is_some() => return false,
                Err(_) => {}
            }
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => true,
            Err(e) if e.error_len().is_none() => {
                self.carry.extend_from_slice(&bytes[e.valid_up_to()..]);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the bytes fed, all of them, are UTF-8 text (no character left unfinished).
    pub fn finish(&self) -> bool {
        self.carry.is_empty()
    }
}

/// Every message of the protocol. The `type` field names the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// First message of a connection, from the connecting side.
    Hello {
        /// The sender's major version (must equal [`PROTOCOL_MAJOR`]).
        protocol: u32,
        /// The sender's minor version.
        minor: u32,
        /// What the sender is.
        role: Role,
        /// The bearer token (`monad-server token create`).
        token: String,
        /// The sender's stable device id.
        device_id: String,
        /// The sender's machine name, used in workspace URIs.
        client_name: String,
        /// Optional features the sender understands.
        #[serde(default)]
        capabilities: Vec<String>,
        /// Host to host: another server of the same store forwards calls of this user (whose
        /// token it checked) to the session's owner; `token` is then the hosts' shared secret
        /// (`[cluster] secret`), not a user's token.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        forwarded_for: Option<String>,
    },
    /// The server accepts the connection.
    Welcome {
        /// The major version in use.
        protocol: u32,
        /// The minor version in use (the lower of both sides').
        minor: u32,
        /// The user the token belongs to.
        user: String,
        /// The server's name and version.
        server: String,
    },
    /// The server refuses the connection; it closes it after this message.
    Refused {
        /// Why (`unauthorized`, `unsupported`, `malformed`).
        error: ToolError,
    },

    /// Agent to server: run a tool in a session.
    Call {
        /// Request id, echoed in the answer.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Tool name (see [`ToolName`]).
        tool: String,
        /// The tool's arguments, including the optional `workspace`.
        args: Value,
    },
    /// Agent to server (minor [`AGENT_MINOR`] or later): a user's message for the session's
    /// built-in agent. Answered on the same stream by [`Message::AgentEvent`]s as the turn runs
    /// and one [`Message::TurnDone`] (or an [`Message::Error`] when the turn cannot start).
    /// Resetting the stream cancels the turn: the model's stream and any running tool call.
    Prompt {
        /// Request id, echoed in the answers.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// What the user said.
        text: String,
        /// (minor [`PERMISSION_MINOR`] or later; never sent when false) The front answers
        /// [`crate::agent::AgentEvent::Permission`] with [`Message::PermissionAnswer`] on this
        /// stream, so keeps its sending side open. Without it, restricted calls go straight to
        /// the folder's owner, as before.
        #[serde(default, skip_serializing_if = "is_false")]
        ask: bool,
        /// This turn's model instead of the session's `llm.model` (minor [`CHAT_MINOR`] or
        /// later, never sent when `None`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// This turn's API base URL instead of the session's `llm.base_url` (minor
        /// [`CHAT_MINOR`] or later, never sent when `None`). The server refuses a URL its
        /// operator did not allow (`llm.allowed_base_urls`): the operator's key never goes to a
        /// URL a client chose.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base_url: Option<String>,
    },
    /// Agent to server, on a prompt's stream (minor [`PERMISSION_MINOR`] or later, after a
    /// `prompt` with `ask: true`): the front's answer to
    /// [`crate::agent::AgentEvent::Permission`]. `allow: false` denies the call without asking
    /// the folder's owner; `allow: true` lets it go on to the folder's own policy and prompt,
    /// which still decide.
    PermissionAnswer {
        /// The prompt's id.
        id: u64,
        /// The call the answer is for (the event's `call_id`).
        call_id: String,
        /// Whether the front's user allowed it.
        allow: bool,
    },
    /// Agent to server (minor [`CHAT_MINOR`] or later): what the chat front shows about a
    /// session's agent (`/workspace`, `/context`). Answered by [`Message::ChatInfoIs`].
    ChatInfo {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Server to agent: the answer to [`Message::ChatInfo`].
    ChatInfoIs {
        /// The request id.
        id: u64,
        /// What the server knows about the session's agent.
        info: ChatInfo,
    },
    /// Server to agent: one thing that happened in a prompt's turn.
    AgentEvent {
        /// The prompt's id.
        id: u64,
        /// What happened.
        event: crate::agent::AgentEvent,
    },
    /// Server to agent: the prompt's turn ended; the last message on its stream.
    TurnDone {
        /// The prompt's id.
        id: u64,
        /// The session the turn ran in.
        session: String,
        /// How it ended.
        result: crate::agent::TurnResult,
    },
    /// While a call waits (for approval, for a slow client): a line for the caller.
    Progress {
        /// The request id.
        id: u64,
        /// What is happening.
        message: String,
    },
    /// The answer to [`Message::Call`] and to [`Message::Run`].
    Result {
        /// The request id.
        id: u64,
        /// The workspace that ran the call (absent when none was reached).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<WorkspaceRef>,
        /// How it ended.
        outcome: Outcome,
        /// When present, one string field of the result is not in `outcome`: its bytes follow
        /// this message on the stream, raw (see [`Body`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<Body>,
    },
    /// Agent to server: the user's sessions, most recently active first: all of them, or one
    /// page when `limit` is given.
    ListSessions {
        /// Request id.
        id: u64,
        /// Page size, 1 to 100; absent: every session in one answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// The `next` token of the previous page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// The answer to [`Message::ListSessions`].
    Sessions {
        /// The request id.
        id: u64,
        /// The sessions the user owns (this page of them).
        sessions: Vec<SessionInfo>,
        /// Token for the next page; absent on the last (and when no `limit` was given).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// Agent to server: the workspaces of a session.
    ListWorkspaces {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Agent to server: the workspaces of a session now and after every change (a folder
    /// attached, detached, gone offline). The server answers with [`Message::Workspaces`] at
    /// once and again on each change, until the agent closes the stream.
    Watch {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The answer to [`Message::ListWorkspaces`], and each update of a [`Message::Watch`].
    Workspaces {
        /// The request id.
        id: u64,
        /// The session (its id resolved).
        session: String,
        /// Primary first, then attached in attach order.
        workspaces: Vec<WorkspaceInfo>,
    },
    /// Client to server, before its [`Message::Result`]: how the call was decided, for the
    /// audit log.
    Decided {
        /// The request id.
        id: u64,
        /// Whether it ran.
        allowed: bool,
        /// Who decided (see [`Decider`]).
        by: Decider,
    },
    /// Agent to server: open a session (resuming it when it exists, creating it when it does
    /// not); without an id, create a new session with a fresh UUID. Binds the device to it.
    OpenSession {
        /// Request id.
        id: u64,
        /// The session id, or `None` for a new session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// With `session: None` (minor [`ROOTS_MINOR`] or later): an absolute path on the
        /// sender's device (`sessions --new` run in a folder). When a folder this device
        /// attached contains it, the new session becomes that folder's active session and the
        /// folder, when attached now, serves it too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        folder: Option<String>,
        /// With `session: None` (minor [`CLI_MINOR`] or later): the new session's human name
        /// (at most [`MAX_SESSION_NAME`] bytes).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
    /// Agent to server (minor [`CLI_MINOR`] or later): detach a folder from a session by its
    /// short name (or URI) and forget it there: an online folder's `attach` is told
    /// ([`Message::Detached`]) and stops; an offline one is no longer listed. Answered by
    /// [`Message::Done`].
    Detach {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// The folder's short name or URI.
        workspace: String,
    },
    /// Agent to server (minor [`ROOTS_MINOR`] or later): an MCP host's roots. The server finds
    /// the folder this device attached that is, or contains, a root and answers with the
    /// session to work in (that folder's active session, made on first use) and its focus.
    Land {
        /// Request id.
        id: u64,
        /// The roots as the host sent them (`file://` URIs; at most [`MAX_ROOTS`], each at most
        /// [`MAX_ROOT_LEN`] bytes). The first root that matches a folder wins.
        roots: Vec<String>,
        /// A session the host asked for (`_meta.sessionId`, `mcp --session`): it wins over the
        /// roots, which then only set its focus when the folder is attached there.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The answer to [`Message::Land`].
    Landed {
        /// The request id.
        id: u64,
        /// The session to work in (its id resolved).
        session: String,
        /// The folder (absolute path on the device) a root matched, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        folder: Option<String>,
        /// The session's focus workspace after landing (short name), if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        focus: Option<String>,
        /// True when that focus is a folder offline now: calls that name no workspace fail
        /// until it is attached again (minor [`OFFLINE_FOCUS_MINOR`] or later).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        focus_offline: bool,
        /// With `folder`: whether that folder is the focus now (not when it is not attached
        /// there, or the focus is held by another device's folder). Minor
        /// [`FOLDER_FOCUS_MINOR`] or later; absent from an older server.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        folder_focus: Option<bool>,
    },
    /// The answer to [`Message::OpenSession`].
    SessionOpened {
        /// The request id.
        id: u64,
        /// The session.
        session: SessionInfo,
    },
    /// Agent to server: append a message to the session's conversation.
    HistoryAppend {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// The message.
        message: HistoryMessage,
    },
    /// Agent to server: the session's conversation.
    HistoryGet {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Agent to server: replace the conversation with a snapshot (overwrite semantics; it is
    /// also kept as the session's `session_history` artifact).
    HistoryReplace {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// The new conversation.
        history: History,
    },
    /// Agent to server: clear the conversation (the frontmatter and the workspace stay).
    HistoryClear {
        /// Request id.
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// The answer to [`Message::HistoryGet`].
    HistoryIs {
        /// The request id.
        id: u64,
        /// The session (its id resolved).
        session: String,
        /// The conversation.
        history: History,
    },
    /// A request without a result of its own succeeded.
    Done {
        /// The request id.
        id: u64,
        /// The session it applied to (its id resolved).
        session: String,
    },
    /// Host to host, on a forwarded connection (several hosts on one store): give up `session`
    /// if nothing uses it on this host (no folder attached, no call or conversation running, no
    /// agent following its workspaces, no background command), so that the asking host, where
    /// a folder is attaching, takes its lease at once. Answered by [`Message::Done`] once it
    /// left this host (or was not here), or by [`Message::Error`] (`denied`) saying what keeps
    /// it here.
    Yield {
        /// Request id.
        id: u64,
        /// The session, by its exact id.
        session: String,
    },
    /// Agent to server: the user's workspace records.
    ListRecords {
        /// Request id.
        id: u64,
    },
    /// The answer to [`Message::ListRecords`].
    Records {
        /// The request id.
        id: u64,
        /// Most recently active first.
        records: Vec<WorkspaceRecord>,
    },
    /// Agent to server: one page of the sessions a workspace record was used in, most recent
    /// first.
    RecordSessions {
        /// Request id.
        id: u64,
        /// The record id.
        record: String,
        /// Page size, 1 to 100 (default 20).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// The `next` token of the previous page.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// The answer to [`Message::RecordSessions`].
    RecordSessionsPage {
        /// The request id.
        id: u64,
        /// This page.
        sessions: Vec<WorkspaceSession>,
        /// Token for the next page; absent on the last.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    /// A request failed as a whole (bad session, malformed request).
    Error {
        /// The request id (0 when it could not be read).
        id: u64,
        /// What went wrong.
        error: ToolError,
    },

    /// Client to server: attach a folder to a session. The stream stays open for as long as the
    /// folder is attached; finishing or resetting it detaches.
    Attach {
        /// Request id; the server names the attachment by it in [`Message::Run`].
        id: u64,
        /// The session; default: the device's bound session, else `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Short name wanted; default: the folder's base name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The folder as the user gave it (for the URI; the server never opens it).
        path: String,
        /// Trust level the user chose.
        trust: Trust,
        /// The tools the client offers for this folder.
        tools: Vec<ToolName>,
        /// Make the folder the session's focus: calls that name no workspace try it first
        /// (`attach --focus`; minor [`FOCUS_MINOR`] or later, never sent when false).
        #[serde(default, skip_serializing_if = "is_false")]
        focus: bool,
        /// The folder's absolute, canonical path on the client's device (minor
        /// [`ROOTS_MINOR`] or later): what an MCP host's roots are matched against. Without
        /// `session`, a folder with an active session (see [`Message::Land`]) attaches there.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        folder: Option<String>,
        /// `name` must be used as given (`attach --name`; minor [`CLI_MINOR`] or later, never
        /// sent when false): the attach is refused when the name is taken in the session,
        /// reserved (`primary`) or not a valid short name, instead of being made unique.
        #[serde(default, skip_serializing_if = "is_false")]
        exact_name: bool,
        /// What network the folder's commands get, in a few words (its `[exec] network`
        /// policy; minor [`NETWORK_POLICY_MINOR`] or later): listed with the workspace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<String>,
    },
    /// Server to client, on the attach stream (minor [`CLI_MINOR`] or later): the folder is no
    /// longer attached (another `attach` of it took over, or `monad-client detach` detached
    /// it). The server finishes the stream after it; the client stops and does not reconnect.
    Detached {
        /// The attachment (the id of its [`Message::Attach`]).
        attachment: u64,
        /// Why, for the user of the `attach` that stops.
        reason: String,
    },
    /// Server to client, on the attach stream (minor [`FOCUSED_MINOR`] or later): the session's
    /// focus moved to this folder, or away from it, other than at the client's own asking
    /// (`focus` in [`Message::Attach`]): a folder that joins its active session without a focus,
    /// an MCP host landing, another folder attached with `focus`. Its owner is told: calls that
    /// name no workspace try the focus first.
    Focused {
        /// The attachment (the id of its [`Message::Attach`]).
        attachment: u64,
        /// True when this folder is now the session's focus.
        focus: bool,
        /// The session's focus now (its short name), when it has one; absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        now: Option<String>,
        /// The session whose focus moved, when it is another than the one the folder attached
        /// to: one the folder was shared into and serves too (minor [`SHARED_FOCUS_MINOR`] or
        /// later). Absent: the session it attached to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Server to client, the answer to an [`Message::Attach`] (minor [`ELSEWHERE_MINOR`] or
    /// later) that this host cannot take: another host of the same deployment serves the
    /// session, and keeps it (something uses it there). The client attaches at `host` instead,
    /// over a connection pinned to the same certificate; nothing was attached here.
    Elsewhere {
        /// The request id of the [`Message::Attach`].
        id: u64,
        /// The session.
        session: String,
        /// The `HOST:PORT` the other host advertised (`serve --advertise`).
        host: String,
        /// Why that host keeps the session, for the folder's owner (one sentence).
        reason: String,
    },
    /// The server accepted an attachment.
    Attached {
        /// The request id of the [`Message::Attach`].
        id: u64,
        /// The session it joined.
        session: String,
        /// The workspace as the session now lists it.
        workspace: WorkspaceInfo,
    },
    /// Server to client: run a tool in an attached folder.
    Run {
        /// Request id.
        id: u64,
        /// The attachment (the id of its [`Message::Attach`]).
        attachment: u64,
        /// The session the call comes from.
        session: String,
        /// The tool.
        tool: ToolName,
        /// Its arguments.
        args: Value,
        /// Run only if this path exists in the folder (minor [`IF_PRESENT_MINOR`] or later;
        /// never sent when `None`). The client answers [`Message::Probed`] first, as to a
        /// [`Message::Probe`] of the path; with `exists: false` it checks nothing else, asks
        /// nobody, runs nothing and ends the stream; with `exists: true` the run follows as any
        /// run. Routing sends it, for tools that change nothing, where finding the path would run
        /// the call at once: a probe and a run in one round trip.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        if_present: Option<String>,
    },
    /// Server to client: does this path exist in the attached folder? Used for routing only;
    /// answered without a prompt, since it reveals only existence.
    Probe {
        /// Request id.
        id: u64,
        /// The attachment.
        attachment: u64,
        /// The path, as the tool call gave it.
        path: String,
    },
    /// Client to server, on the attach stream (minor [`NETWORK_MINOR`] or later): connections
    /// the folder's commands asked its network proxy for, as they happen, for the session's
    /// audit log.
    Network {
        /// The attachment (the id of its [`Message::Attach`]).
        attachment: u64,
        /// The connections, oldest first (at most [`MAX_NETWORK_EVENTS`]).
        events: Vec<NetworkEvent>,
        /// Connections that happened while too many were waiting: not reported, only counted.
        #[serde(default, skip_serializing_if = "is_zero")]
        dropped: u64,
    },
    /// The answer to [`Message::Probe`].
    Probed {
        /// The request id.
        id: u64,
        /// True when the path exists inside the folder.
        exists: bool,
    },
}

/// [`Message::Result`] as a plain struct, for [`Message::from_json`]'s fast path: the same
/// fields, and a `type` that must be `result` (written first by [`Message::to_json`], so another
/// message is turned away at its first field).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultMessage<O> {
    #[serde(rename = "type")]
    _type: ResultTag,
    id: u64,
    #[serde(default)]
    workspace: Option<WorkspaceRef>,
    outcome: O,
    #[serde(default)]
    body: Option<Body>,
}

/// The `type` of a [`ResultMessage`]: only `result`.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum ResultTag {
    Result,
}

impl Message {
    /// Encodes the message as JSON (the payload that [`crate::frame::frames`] cuts up).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("messages always serialize")
    }

    /// The message's frames, headers and payloads, as the bytes a stream carries: for a writer
    /// that must be able to stop between two writes and go on later without cutting a frame.
    pub fn to_frames(&self) -> Vec<u8> {
        let json = self.to_json();
        let mut bytes = Vec::with_capacity(json.len() + crate::frame::HEADER_LEN);
        for (header, chunk) in crate::frame::frames(&json) {
            bytes.extend_from_slice(&header);
            bytes.extend_from_slice(chunk);
        }
        bytes
    }

    /// Decodes a message from JSON.
    ///
    /// A tool's result, the one message that can be large, is decoded straight into its fields;
    /// every other message through serde's derive for the internally tagged enum, which buffers
    /// the whole message first (cheap for small ones). A result message that the fast path
    /// refuses is decoded by the derive too, so its error is the same as for any message. The
    /// fast path is only tried on what starts as [`Message::to_json`] starts a result: trying
    /// it on every message cost each of them a formatted error ("unknown variant"), a few
    /// percent of the server's time per call.
    pub fn from_json(bytes: &[u8]) -> Result<Message, serde_json::Error> {
        Message::decode::<Outcome>(bytes)
    }

    /// [`Message::from_json`], with a tool's result kept as the JSON text it came in
    /// ([`ToolResult`]): for a server, which relays and records an attached client's result
    /// without looking inside it. A result the fast path refuses is a tree, as there, when it
    /// is at most [`MAX_TREE_RESULT`] bytes; a larger one is refused.
    pub fn from_json_relayed(bytes: &[u8]) -> Result<Message, serde_json::Error> {
        let message = Message::decode::<RelayedOutcome>(bytes)?;
        // What a server passes on must be what every reader can decode (see `passes_as_text`).
        if matches!(&message, Message::Result { outcome: Outcome::Ok { result }, .. } if result.is_text())
            && !passes_as_text(bytes, MAX_NESTING)
        {
            // Made a tree, which can be many times the text's size (a list of small numbers,
            // each 32 bytes in memory for 2 on the wire): only a small one. Monad's own clients
            // never write what does not pass.
            if bytes.len() > MAX_TREE_RESULT {
                return Err(serde::de::Error::custom(format!(
                    "a result over {MAX_TREE_RESULT} bytes must be plain JSON text to be relayed \
                     (no exponents, escaped surrogates, runs of over {MAX_DIGITS} digits or \
                     nesting over {MAX_NESTING} levels)"
                )));
            }
            return Message::from_json(bytes);
        }
        Ok(message)
    }

    fn decode<'de, O: Deserialize<'de> + Into<Outcome>>(
        bytes: &'de [u8],
    ) -> Result<Message, serde_json::Error> {
        if bytes.starts_with(br#"{"type":"result","#)
            && let Ok(result) = serde_json::from_slice::<ResultMessage<O>>(bytes)
        {
            return Ok(Message::Result {
                id: result.id,
                workspace: result.workspace,
                outcome: result.outcome.into(),
                body: result.body,
            });
        }
        serde_json::from_slice(bytes)
    }

    /// The message as a peer speaking minor version `minor` can read it: fields newer than that
    /// are left out (a peer refuses fields it does not know). Only answers carry such fields;
    /// requests are never built with them for an older peer.
    pub fn for_minor(mut self, minor: u32) -> Message {
        if let Message::Landed {
            focus_offline,
            folder_focus,
            ..
        } = &mut self
        {
            if minor < OFFLINE_FOCUS_MINOR {
                *focus_offline = false;
            }
            if minor < FOLDER_FOCUS_MINOR {
                *folder_focus = None;
            }
        }
        if minor < NETWORK_POLICY_MINOR {
            let unknown = |list: &mut [WorkspaceInfo]| {
                for w in list {
                    w.network = None;
                }
            };
            match &mut self {
                Message::Sessions { sessions, .. } => {
                    for s in sessions {
                        unknown(&mut s.workspaces);
                    }
                }
                Message::SessionOpened { session, .. } => unknown(&mut session.workspaces),
                Message::Workspaces { workspaces, .. } => unknown(workspaces),
                Message::Attached { workspace, .. } => workspace.network = None,
                Message::ChatInfoIs { info, .. } => unknown(&mut info.workspaces),
                _ => {}
            }
        }
        if minor < CLI_MINOR {
            match &mut self {
                Message::Sessions { sessions, .. } => {
                    for s in sessions {
                        s.name = None;
                    }
                }
                Message::SessionOpened { session, .. } => session.name = None,
                _ => {}
            }
        }
        self
    }

    /// The variant's wire name, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Welcome { .. } => "welcome",
            Message::Refused { .. } => "refused",
            Message::Call { .. } => "call",
            Message::Progress { .. } => "progress",
            Message::Prompt { .. } => "prompt",
            Message::PermissionAnswer { .. } => "permission_answer",
            Message::AgentEvent { .. } => "agent_event",
            Message::TurnDone { .. } => "turn_done",
            Message::ChatInfo { .. } => "chat_info",
            Message::ChatInfoIs { .. } => "chat_info_is",
            Message::Result { .. } => "result",
            Message::ListSessions { .. } => "list_sessions",
            Message::Sessions { .. } => "sessions",
            Message::ListWorkspaces { .. } => "list_workspaces",
            Message::Watch { .. } => "watch",
            Message::Workspaces { .. } => "workspaces",
            Message::Decided { .. } => "decided",
            Message::OpenSession { .. } => "open_session",
            Message::SessionOpened { .. } => "session_opened",
            Message::Land { .. } => "land",
            Message::Landed { .. } => "landed",
            Message::HistoryAppend { .. } => "history_append",
            Message::HistoryGet { .. } => "history_get",
            Message::HistoryReplace { .. } => "history_replace",
            Message::HistoryClear { .. } => "history_clear",
            Message::HistoryIs { .. } => "history_is",
            Message::Done { .. } => "done",
            Message::Yield { .. } => "yield",
            Message::ListRecords { .. } => "list_records",
            Message::Records { .. } => "records",
            Message::RecordSessions { .. } => "record_sessions",
            Message::RecordSessionsPage { .. } => "record_sessions_page",
            Message::Error { .. } => "error",
            Message::Attach { .. } => "attach",
            Message::Detach { .. } => "detach",
            Message::Detached { .. } => "detached",
            Message::Focused { .. } => "focused",
            Message::Elsewhere { .. } => "elsewhere",
            Message::Attached { .. } => "attached",
            Message::Run { .. } => "run",
            Message::Probe { .. } => "probe",
            Message::Probed { .. } => "probed",
            Message::Network { .. } => "network",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`passes_as_text`] as it was, a byte at a time: the oracle for the one that skips
    /// through strings.
    fn passes_as_text_bytewise(text: &[u8], max: usize) -> bool {
        let (mut depth, mut in_string, mut escaped, mut digits) = (0usize, false, false, 0usize);
        for (i, &byte) in text.iter().enumerate() {
            if in_string {
                match byte {
                    b'u' if escaped => {
                        escaped = false;
                        if let [b'd' | b'D', b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F', ..] =
                            &text[i + 1..]
                        {
                            return false;
                        }
                    }
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'0'..=b'9' => {
                    digits += 1;
                    if digits > MAX_DIGITS {
                        return false;
                    }
                    continue;
                }
                b'e' | b'E' if digits > 0 || i > 0 && text[i - 1] == b'.' => return false,
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    if depth > max {
                        return false;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            digits = 0;
        }
        true
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Text made of what the check looks at (quotes, backslashes, `u`, surrogate digits,
        /// brackets, digits, exponents, points), cut anywhere: the same answer as a byte at a
        /// time, and no panic at an escape or a string cut off at the end.
        #[test]
        fn skipping_through_strings_answers_as_a_byte_at_a_time(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "\"", "\\", "\\\"", "u", "d", "8", "{", "[", "]", "1", "e", ".", "x",
                    "1e", "\\ud83d", "\\u00e9",
                ]),
                0..60,
            ),
            max in 0usize..4,
        ) {
            let text = pieces.concat();
            proptest::prop_assert_eq!(
                passes_as_text(text.as_bytes(), max),
                passes_as_text_bytewise(text.as_bytes(), max),
                "{:?}", text
            );
        }
    }

    #[test]
    fn plain_json_passes_and_what_a_tree_would_refuse_does_not() {
        let long = format!(
            "{{\"a\":\"{}\",\"b\":[1,2,{{\"c\":\"x\\\"y\"}}]}}",
            "z".repeat(100_000)
        );
        assert!(passes_as_text(long.as_bytes(), MAX_NESTING));
        for refused in [
            r#"{"a":"\ud800"}"#,
            r#"{"a":1e5}"#,
            r#"{"a":1.5E3}"#,
            "[[[[[[]]]]]]",
        ] {
            assert!(!passes_as_text(refused.as_bytes(), 4), "{refused}");
        }
        let digits = format!("[{}]", "9".repeat(MAX_DIGITS + 1));
        assert!(!passes_as_text(digits.as_bytes(), MAX_NESTING));
        // A surrogate escaped inside a long string, past a quote escaped before it.
        let hidden = format!(
            "{{\"a\":\"{}\\\"{}\\uDBFF\"}}",
            "q".repeat(5000),
            "r".repeat(5000)
        );
        assert!(!passes_as_text(hidden.as_bytes(), MAX_NESTING));
    }

    #[test]
    fn a_landing_s_offline_focus_is_left_out_for_a_peer_older_than_minor_10() {
        let landed = Message::Landed {
            id: 1,
            session: "default".into(),
            folder: Some("/home/ana/p".into()),
            focus: Some("p".into()),
            focus_offline: true,
            folder_focus: Some(false),
        };
        let older =
            serde_json::to_value(landed.clone().for_minor(OFFLINE_FOCUS_MINOR - 1)).unwrap();
        assert!(older.get("focus_offline").is_none(), "{older}");
        let newer = serde_json::to_value(landed.clone().for_minor(OFFLINE_FOCUS_MINOR)).unwrap();
        assert_eq!(newer["focus_offline"], true, "{newer}");
        // Whether the matched folder is the focus: from minor 11.
        assert!(newer.get("folder_focus").is_none(), "{newer}");
        let newest = serde_json::to_value(landed.for_minor(FOLDER_FOCUS_MINOR)).unwrap();
        assert_eq!(newest["folder_focus"], false, "{newest}");
    }

    #[test]
    fn a_device_id_is_a_uuid_in_its_canonical_form_only() {
        assert!(is_device_id("6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60"));
        for bad in [
            "",
            "nope",
            "6F1C3B9E-2D4A-4C8E-9F1A-0B2C3D4E5F60",
            "6f1c3b9e2d4a4c8e9f1a0b2c3d4e5f60",
            "{6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f60}",
            "6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f6g",
            "6f1c3b9e-2d4a-4c8e-9f1a0-b2c3d4e5f60",
            "6f1c3b9e-2d4a-4c8e-9f1a-0b2c3d4e5f6\u{e9}",
        ] {
            assert!(!is_device_id(bad), "{bad}");
        }
    }
    use crate::error::ErrorCode;
    use serde_json::json;

    fn workspace() -> WorkspaceInfo {
        WorkspaceInfo {
            name: "monad".into(),
            uri: "macbook:~/dev/monad".into(),
            trust: Trust::Restricted,
            host: Host::Client,
            online: true,
            tools: ToolName::WORKSPACE_TOOLS.to_vec(),
            network: Some("network to pypi.org only".into()),
        }
    }

    fn session() -> SessionInfo {
        SessionInfo {
            id: "default".into(),
            owner: "ana".into(),
            created_at: "2026-11-26T00:00:00Z".into(),
            last_active: "2026-11-26T00:00:00Z".into(),
            name: None,
            workspaces: vec![workspace()],
        }
    }

    fn history() -> History {
        History {
            provider: Some("claude".into()),
            model: None,
            created_at: "t".into(),
            messages: vec![HistoryMessage {
                role: HistoryRole::Assistant,
                text: "hello".into(),
            }],
        }
    }

    fn every_message() -> Vec<Message> {
        vec![
            Message::Hello {
                protocol: PROTOCOL_MAJOR,
                minor: PROTOCOL_MINOR,
                role: Role::Client,
                token: "t".into(),
                device_id: "d".into(),
                client_name: "macbook".into(),
                capabilities: vec!["progress".into()],
                forwarded_for: None,
            },
            Message::Hello {
                protocol: PROTOCOL_MAJOR,
                minor: 0,
                role: Role::Agent,
                token: "the hosts' secret".into(),
                device_id: "d".into(),
                client_name: "host-a".into(),
                capabilities: Vec::new(),
                forwarded_for: Some("ana".into()),
            },
            Message::Welcome {
                protocol: 1,
                minor: 0,
                user: "ana".into(),
                server: "monad-server 0.1.0".into(),
            },
            Message::Refused {
                error: ToolError::new(ErrorCode::Unauthorized, "bad token"),
            },
            Message::Call {
                id: 7,
                session: Some("default".into()),
                tool: "read_file".into(),
                args: json!({"path": "a"}),
            },
            Message::Progress {
                id: 7,
                message: "waiting for approval".into(),
            },
            Message::Prompt {
                id: 9,
                session: Some("default".into()),
                text: "read a.txt".into(),
                ask: true,
                model: None,
                base_url: None,
            },
            Message::PermissionAnswer {
                id: 9,
                call_id: "call_1".into(),
                allow: false,
            },
            Message::Prompt {
                id: 10,
                session: None,
                text: "hi".into(),
                ask: false,
                model: Some("m".into()),
                base_url: Some("http://127.0.0.1:9/v1".into()),
            },
            Message::ChatInfo {
                id: 11,
                session: Some("default".into()),
            },
            Message::ChatInfoIs {
                id: 11,
                info: ChatInfo {
                    session: "default".into(),
                    provider: "openai".into(),
                    model: "m".into(),
                    messages: 3,
                    context_messages: 2,
                    conversation_messages: 2,
                    workspaces: Vec::new(),
                },
            },
            Message::AgentEvent {
                id: 9,
                event: crate::agent::AgentEvent::Text { text: "Hi".into() },
            },
            Message::TurnDone {
                id: 9,
                session: "default".into(),
                result: crate::agent::TurnResult {
                    stop: crate::agent::StopReason::Answered,
                    tool_calls: 1,
                    input_tokens: 10,
                    output_tokens: 5,
                },
            },
            Message::Result {
                id: 7,
                workspace: Some(WorkspaceRef {
                    name: "primary".into(),
                    uri: "server:/sessions/default".into(),
                }),
                outcome: Outcome::Ok {
                    result: json!({"content": "x"}).into(),
                },
                body: None,
            },
            Message::Result {
                id: 7,
                workspace: None,
                outcome: Outcome::Ok {
                    result: json!({"path": "big.txt", "lines": 2}).into(),
                },
                body: Some(Body {
                    field: "content".into(),
                    len: 70_000,
                }),
            },
            Message::Result {
                id: 8,
                workspace: None,
                outcome: Outcome::Error {
                    error: ToolError::new(ErrorCode::NotFound, "nope"),
                },
                body: None,
            },
            Message::ListSessions {
                id: 1,
                limit: None,
                next: None,
            },
            Message::ListSessions {
                id: 1,
                limit: Some(20),
                next: Some("00ff".into()),
            },
            Message::Sessions {
                id: 1,
                sessions: vec![SessionInfo {
                    id: "default".into(),
                    owner: "ana".into(),
                    created_at: "2026-11-26T00:00:00Z".into(),
                    last_active: "2026-11-26T00:00:00Z".into(),
                    name: Some("refactor".into()),
                    workspaces: vec![workspace()],
                }],
                next: Some("00ff".into()),
            },
            Message::ListWorkspaces {
                id: 4,
                session: None,
            },
            Message::Watch {
                id: 5,
                session: Some("default".into()),
            },
            Message::Workspaces {
                id: 4,
                session: "default".into(),
                workspaces: vec![workspace()],
            },
            Message::Decided {
                id: 9,
                allowed: true,
                by: Decider::User,
            },
            Message::OpenSession {
                id: 11,
                session: None,
                folder: Some("/home/ana/p".into()),
                name: Some("refactor".into()),
            },
            Message::Detach {
                id: 12,
                session: Some("default".into()),
                workspace: "monad".into(),
            },
            Message::Detached {
                attachment: 1,
                reason: "attached again from another terminal".into(),
            },
            Message::Focused {
                attachment: 1,
                focus: true,
                now: Some("monad".into()),
                session: None,
            },
            Message::Focused {
                attachment: 1,
                focus: false,
                now: None,
                session: Some("0b0c7f2e-54a4-4f3c-9d6e-1c2b3a4d5e6f".into()),
            },
            Message::Land {
                id: 18,
                roots: vec!["file:///home/ana/p".into()],
                session: None,
            },
            Message::Landed {
                id: 18,
                session: "default".into(),
                folder: Some("/home/ana/p".into()),
                focus: Some("p".into()),
                focus_offline: true,
                folder_focus: Some(true),
            },
            Message::SessionOpened {
                id: 11,
                session: session(),
            },
            Message::HistoryAppend {
                id: 12,
                session: None,
                message: HistoryMessage {
                    role: HistoryRole::User,
                    text: "hi".into(),
                },
            },
            Message::HistoryGet {
                id: 13,
                session: Some("default".into()),
            },
            Message::HistoryReplace {
                id: 14,
                session: None,
                history: history(),
            },
            Message::HistoryClear {
                id: 15,
                session: None,
            },
            Message::HistoryIs {
                id: 13,
                session: "default".into(),
                history: history(),
            },
            Message::Done {
                id: 15,
                session: "default".into(),
            },
            Message::Yield {
                id: 15,
                session: "default".into(),
            },
            Message::Elsewhere {
                id: 1,
                session: "default".into(),
                host: "b.example:4433".into(),
                reason: "a call is running there".into(),
            },
            Message::ListRecords { id: 16 },
            Message::Records {
                id: 16,
                records: vec![WorkspaceRecord {
                    id: "r".into(),
                    user: "ana".into(),
                    device_id: "d".into(),
                    path: "~/p".into(),
                    uri: "lap:~/p".into(),
                    created_at: "t".into(),
                    last_active: "t".into(),
                }],
            },
            Message::RecordSessions {
                id: 17,
                record: "r".into(),
                limit: Some(20),
                next: None,
            },
            Message::RecordSessionsPage {
                id: 17,
                sessions: vec![WorkspaceSession {
                    session: "default".into(),
                    first_at: "t".into(),
                    last_active: "t".into(),
                    calls: 3,
                }],
                next: Some("abc".into()),
            },
            Message::Error {
                id: 0,
                error: ToolError::new(ErrorCode::Malformed, "x"),
            },
            Message::Attach {
                id: 3,
                session: None,
                name: Some("monad".into()),
                path: "~/dev/monad".into(),
                trust: Trust::Restricted,
                tools: vec![ToolName::ReadFile],
                focus: false,
                folder: None,
                exact_name: true,
                network: None,
            },
            Message::Attach {
                id: 4,
                session: None,
                name: None,
                path: "~/dev/monad".into(),
                trust: Trust::Restricted,
                tools: vec![ToolName::ReadFile],
                focus: true,
                folder: Some("/home/ana/dev/monad".into()),
                exact_name: false,
                network: Some("no network".into()),
            },
            Message::Attached {
                id: 3,
                session: "default".into(),
                workspace: workspace(),
            },
            Message::Run {
                id: 9,
                attachment: 3,
                session: "default".into(),
                tool: ToolName::EditFile,
                args: json!({"path": "a", "old_string": "x", "new_string": "y"}),
                if_present: None,
            },
            Message::Run {
                id: 11,
                attachment: 3,
                session: "default".into(),
                tool: ToolName::ReadFile,
                args: json!({"path": "src/lib.rs"}),
                if_present: Some("src/lib.rs".into()),
            },
            Message::Probe {
                id: 10,
                attachment: 3,
                path: "src/lib.rs".into(),
            },
            Message::Probed {
                id: 10,
                exists: true,
            },
            Message::Network {
                attachment: 3,
                events: vec![NetworkEvent {
                    host: "example.com".into(),
                    port: 443,
                    allowed: false,
                    address: None,
                    reason: Some("not in the allowlist".into()),
                }],
                dropped: 2,
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        let all = every_message();
        let kinds: std::collections::HashSet<&str> = all.iter().map(Message::kind).collect();
        assert_eq!(kinds.len(), 44, "one case per message type");
        for message in all {
            let bytes = message.to_json();
            let back = Message::from_json(&bytes).unwrap();
            assert_eq!(back, message);
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(value["type"], message.kind());
            // As frames, whole or cut anywhere, it decodes to the same.
            let frames = message.to_frames();
            let mut decoder = crate::frame::Decoder::new(crate::frame::DEFAULT_MAX_MESSAGE);
            match decoder.decode(&frames).unwrap() {
                crate::frame::Decoded::Message(json, used) => {
                    assert_eq!((json, used), (bytes, frames.len()));
                }
                incomplete => panic!("{incomplete:?}"),
            }
            let cut = frames.len() / 2;
            assert!(matches!(
                crate::frame::Decoder::new(1 << 20).decode(&frames[..cut]),
                Ok(crate::frame::Decoded::Incomplete(_))
            ));
        }
    }

    #[test]
    fn unknown_types_and_fields_are_refused() {
        assert!(Message::from_json(br#"{"type":"launch_missiles","id":1}"#).is_err());
        assert!(Message::from_json(br#"{"type":"list_sessions","id":1,"extra":true}"#).is_err());
        assert!(Message::from_json(br#"{"type":"list_sessions"}"#).is_err());
        assert!(Message::from_json(b"not json").is_err());
    }

    #[test]
    fn session_names_are_left_out_for_a_peer_older_than_cli_minor() {
        let mut named = session();
        named.name = Some("refactor".into());
        let opened = Message::SessionOpened {
            id: 1,
            session: named.clone(),
        };
        let old = String::from_utf8(opened.clone().for_minor(CLI_MINOR - 1).to_json()).unwrap();
        assert!(!old.contains("refactor"), "{old}");
        let new = String::from_utf8(opened.for_minor(CLI_MINOR).to_json()).unwrap();
        assert!(new.contains("refactor"), "{new}");
        let listed = Message::Sessions {
            id: 1,
            sessions: vec![named],
            next: None,
        };
        let old = String::from_utf8(listed.for_minor(CLI_MINOR - 1).to_json()).unwrap();
        assert!(!old.contains("refactor"), "{old}");
        // What an older client parses: no field it does not know.
        let older: SessionInfo = serde_json::from_str(
            r#"{"id":"default","owner":"ana","created_at":"t","last_active":"t","workspaces":[]}"#,
        )
        .unwrap();
        assert_eq!(older.name, None);
    }

    #[test]
    fn a_workspaces_network_is_left_out_for_a_peer_older_than_minor_14() {
        let listed = |minor: u32| {
            let messages = [
                Message::Workspaces {
                    id: 1,
                    session: "default".into(),
                    workspaces: vec![workspace()],
                },
                Message::Attached {
                    id: 1,
                    session: "default".into(),
                    workspace: workspace(),
                },
                Message::Sessions {
                    id: 1,
                    sessions: vec![session()],
                    next: None,
                },
                Message::SessionOpened {
                    id: 1,
                    session: session(),
                },
                Message::ChatInfoIs {
                    id: 1,
                    info: ChatInfo {
                        session: "default".into(),
                        provider: "openai".into(),
                        model: "m".into(),
                        messages: 0,
                        context_messages: 0,
                        conversation_messages: 0,
                        workspaces: vec![workspace()],
                    },
                },
            ];
            messages
                .map(|m| String::from_utf8(m.for_minor(minor).to_json()).unwrap())
                .to_vec()
        };
        for json in listed(NETWORK_POLICY_MINOR - 1) {
            assert!(!json.contains("network"), "{json}");
        }
        for json in listed(NETWORK_POLICY_MINOR) {
            assert!(json.contains("network to pypi.org only"), "{json}");
        }
        // A `workspaces` tool result, as an older agent's own output schema takes it.
        let result = |minor: u32, tool: &str| {
            let mut outcome = Outcome::Ok {
                result: ToolResult::from(json!({
                    "session": "default",
                    "workspaces": [serde_json::to_value(workspace()).unwrap()],
                })),
            };
            outcome.for_minor(tool, minor);
            let Outcome::Ok { result } = outcome else {
                unreachable!()
            };
            result.value()["workspaces"][0].get("network").cloned()
        };
        assert_eq!(result(NETWORK_POLICY_MINOR - 1, "workspaces"), None);
        assert!(result(NETWORK_POLICY_MINOR, "workspaces").is_some());
        assert!(result(NETWORK_POLICY_MINOR - 1, "stat").is_some());
        // What a workspace's `network` holds is bounded, cut on a character's boundary.
        assert_eq!(bounded_network("no network"), "no network");
        let long = format!("network to {} only", "é".repeat(MAX_NETWORK_SUMMARY));
        let kept = bounded_network(&long);
        assert!(
            kept.len() <= MAX_NETWORK_SUMMARY && kept.ends_with('…'),
            "{kept}"
        );
        assert!(kept.starts_with("network to éé"), "{kept}");
    }

    #[test]
    fn a_recalls_count_of_notes_left_out_is_left_out_for_a_peer_older_than_minor_15() {
        let result = |minor: u32, tool: &str| {
            let mut outcome = Outcome::Ok {
                result: ToolResult::from(json!({"notes": [], "not_shown": 3})),
            };
            outcome.for_minor(tool, minor);
            let Outcome::Ok { result } = outcome else {
                unreachable!()
            };
            result.value().get("not_shown").cloned()
        };
        assert_eq!(result(RECALL_BOUND_MINOR - 1, "memory_recall"), None);
        assert_eq!(result(RECALL_BOUND_MINOR, "memory_recall"), Some(json!(3)));
        assert_eq!(result(RECALL_BOUND_MINOR - 1, "stat"), Some(json!(3)));
    }

    #[test]
    fn an_attach_without_focus_is_what_older_peers_send_and_read() {
        let older = br#"{"type":"attach","id":1,"path":"~/p","trust":"restricted","tools":[]}"#;
        let Message::Attach { focus, .. } = Message::from_json(older).unwrap() else {
            panic!("an attach");
        };
        assert!(!focus, "an older client's attach asks for no focus");
        let plain = Message::Attach {
            id: 1,
            session: None,
            name: None,
            path: "~/p".into(),
            trust: Trust::Restricted,
            tools: vec![],
            focus: false,
            folder: None,
            exact_name: false,
            network: None,
        };
        let json = String::from_utf8(plain.to_json()).unwrap();
        assert!(
            !json.contains("network"),
            "an older server reads it: {json}"
        );
        assert!(
            !json.contains("exact_name"),
            "an older server reads it: {json}"
        );
        assert!(!json.contains("focus"), "an older server reads it: {json}");
        assert!(!json.contains("folder"), "an older server reads it: {json}");
    }

    #[test]
    fn a_run_without_if_present_is_what_older_peers_send_and_read() {
        let older =
            br#"{"type":"run","id":1,"attachment":1,"session":"s","tool":"read_file","args":{}}"#;
        let Message::Run { if_present, .. } = Message::from_json(older).unwrap() else {
            panic!("a run");
        };
        assert_eq!(if_present, None, "an older server's run is unconditional");
        let plain = Message::Run {
            id: 1,
            attachment: 1,
            session: "s".into(),
            tool: ToolName::ReadFile,
            args: json!({}),
            if_present: None,
        };
        let json = String::from_utf8(plain.to_json()).unwrap();
        assert!(
            !json.contains("if_present"),
            "an older client reads it: {json}"
        );
    }

    #[test]
    fn large_content_splits_into_a_body_and_joins_back() {
        let content = "line of text\n".repeat(BODY_THRESHOLD / 10);
        let original = Outcome::Ok {
            result: json!({"path": "a.txt", "content": content, "lines": 1}).into(),
        };
        let mut outcome = original.clone();
        let (body, bytes) = outcome.split_body().expect("large content splits");
        assert_eq!(body.field, "content");
        assert_eq!(body.len, bytes.len() as u64);
        assert_eq!(bytes, content.as_bytes());
        assert!(outcome_result(&outcome).get("content").is_none());
        assert!(outcome.split_body().is_none(), "nothing left to split");
        outcome.join_body(&body, bytes).unwrap();
        assert_eq!(outcome, original);
    }

    #[test]
    fn small_content_and_errors_do_not_split() {
        let mut small = Outcome::Ok {
            result: json!({"content": "x".repeat(BODY_THRESHOLD - 1)}).into(),
        };
        let before = small.clone();
        assert!(small.split_body().is_none());
        assert_eq!(small, before);
        let mut error = Outcome::Error {
            error: ToolError::new(ErrorCode::NotFound, "nope"),
        };
        assert!(error.split_body().is_none());
        let mut not_text = Outcome::Ok {
            result: json!({"content": 5}).into(),
        };
        assert!(not_text.split_body().is_none());
    }

    #[test]
    fn bad_bodies_are_refused_and_change_nothing() {
        let body = Body {
            field: "content".into(),
            len: 2,
        };
        let mut present = Outcome::Ok {
            result: json!({"content": "already"}).into(),
        };
        let before = present.clone();
        assert_eq!(
            present.join_body(&body, b"ab".to_vec()),
            Err(BodyError::FieldPresent("content".into()))
        );
        assert_eq!(present, before);
        let mut ok = Outcome::Ok {
            result: json!({}).into(),
        };
        assert_eq!(
            ok.join_body(&body, vec![0xff, 0xfe]),
            Err(BodyError::NotText("content".into()))
        );
        assert_eq!(
            ok,
            Outcome::Ok {
                result: json!({}).into()
            }
        );
        let mut error = Outcome::Error {
            error: ToolError::new(ErrorCode::NotFound, "nope"),
        };
        assert_eq!(
            error.join_body(&body, b"ab".to_vec()),
            Err(BodyError::NotAnObject)
        );
    }

    fn outcome_result(outcome: &Outcome) -> Value {
        match outcome {
            Outcome::Ok { result } => result.value().into_owned(),
            Outcome::Error { .. } => panic!("not ok"),
        }
    }

    #[test]
    fn utf8_checked_in_pieces_agrees_with_checking_it_whole() {
        let text = "aé✓🦀\u{1}z".repeat(3);
        let bytes = text.as_bytes();
        // Every way to cut it in two or three pieces.
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let mut check = Utf8Stream::default();
                assert!(check.feed(&bytes[..i]) && check.feed(&bytes[i..j]));
                assert!(check.feed(&bytes[j..]) && check.finish(), "cut at {i}, {j}");
            }
        }
        // One byte at a time.
        let mut check = Utf8Stream::default();
        assert!(bytes.iter().all(|b| check.feed(std::slice::from_ref(b))));
        assert!(check.finish());
        // Not text: a bad byte, a bad continuation across a cut, a character left unfinished.
        let mut check = Utf8Stream::default();
        assert!(!check.feed(&[b'a', 0xff]));
        let mut check = Utf8Stream::default();
        assert!(check.feed(&[0xe2, 0x9c]));
        assert!(!check.feed(b"x"));
        let mut check = Utf8Stream::default();
        assert!(check.feed(&[b'a', 0xf0, 0x9f]));
        assert!(!check.finish());
        // Whole-vs-pieces agreement on many generated byte strings.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5_000 {
            let len = (seed % 12) as usize;
            let mut bytes = Vec::new();
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                bytes.push(
                    *[
                        b'a', 0xc3, 0xa9, 0xe2, 0x9c, 0x93, 0xf0, 0x9f, 0xa6, 0x80, 0xff,
                    ]
                    .get((seed % 11) as usize)
                    .unwrap(),
                );
            }
            let whole = std::str::from_utf8(&bytes).is_ok();
            let cut = (seed as usize) % (bytes.len() + 1);
            let mut check = Utf8Stream::default();
            let pieces = check.feed(&bytes[..cut]) && check.feed(&bytes[cut..]) && check.finish();
            assert_eq!(pieces, whole, "{bytes:02x?} cut at {cut}");
        }
    }

    #[test]
    fn deciders_round_trip_and_unknown_words_fall_back_to_client() {
        for d in Decider::ALL {
            let json = serde_json::to_value(d).unwrap();
            assert_eq!(json, serde_json::json!(d.as_str()));
            assert_eq!(serde_json::from_value::<Decider>(json).unwrap(), d);
        }
        let old: Message = serde_json::from_str(
            r#"{"type": "decided", "id": 3, "allowed": false, "by": "a_word_from_the_future"}"#,
        )
        .unwrap();
        assert!(matches!(
            old,
            Message::Decided {
                by: Decider::Client,
                ..
            }
        ));
    }

    #[test]
    fn an_outcome_reads_its_fields_in_any_order_and_refuses_what_the_derive_refused() {
        use serde_json::json;
        let ok = |v: Value| serde_json::from_value::<Outcome>(v);
        assert_eq!(
            ok(json!({"result": {"a": 1}, "status": "ok"})).unwrap(),
            Outcome::Ok {
                result: json!({"a": 1}).into()
            }
        );
        let error = json!({"code": "not_found", "message": "no such file"});
        assert!(matches!(
            ok(json!({"error": error, "status": "error"})).unwrap(),
            Outcome::Error { .. }
        ));
        for (bad, says) in [
            (json!({"result": {}}), "missing field `status`"),
            (json!({"status": "ok"}), "missing field `result`"),
            (json!({"status": "error"}), "missing field `error`"),
            (
                json!({"status": "maybe", "result": {}}),
                "unknown variant `maybe`",
            ),
            (
                json!({"status": "ok", "result": {}, "error": error}),
                "unknown field `error`",
            ),
            (
                json!({"status": "error", "result": {}, "error": error}),
                "unknown field `result`",
            ),
            (
                json!({"status": "ok", "result": {}, "extra": 1}),
                "unknown field `extra`",
            ),
            (json!([1, 2]), "an outcome"),
        ] {
            let err = ok(bad.clone()).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let twice = br#"{"status":"ok","result":{},"result":{}}"#;
        let err = serde_json::from_slice::<Outcome>(twice).unwrap_err();
        assert!(
            err.to_string().contains("duplicate field `result`"),
            "{err}"
        );
    }

    #[test]
    fn a_relayed_result_is_kept_as_the_text_it_came_in_and_written_out_unchanged() {
        use serde_json::json;
        // Refused with the error `from_json` gives.
        let refused_alike = |text: &str| {
            assert_eq!(
                Message::from_json_relayed(text.as_bytes())
                    .unwrap_err()
                    .to_string(),
                Message::from_json(text.as_bytes()).unwrap_err().to_string(),
                "{text}"
            );
        };
        // As a client writes it: the server relays these bytes, it does not re-encode them.
        let sent = Message::Result {
            id: 7,
            workspace: None,
            outcome: Outcome::Ok {
                result: json!({"path": "a.txt", "content": "é\t\"x\"\n", "size": 1e3}).into(),
            },
            body: None,
        }
        .to_json();
        let relayed = Message::from_json_relayed(&sent).unwrap();
        let Message::Result {
            outcome: Outcome::Ok { result },
            ..
        } = &relayed
        else {
            panic!("{relayed:?}");
        };
        assert!(result.is_text());
        assert_eq!(relayed.to_json(), sent, "written out byte for byte");
        // The same message as a tree, whoever reads it.
        assert_eq!(relayed, Message::from_json(&sent).unwrap());
        assert_eq!(result.value()["content"], "é\t\"x\"\n");
        let text = String::from_utf8(sent.clone()).unwrap();
        assert!(text.contains(&format!(r#""result":{result}}}"#)), "{text}");
        // A relayed result is never split into a body (its client sends large ones as bodies);
        // a body is put back into it like into any result.
        let mut outcome = Outcome::Ok {
            result: result.clone(),
        };
        assert_eq!(outcome.split_body(), None);
        let Message::Result {
            outcome: Outcome::Ok { result: head },
            ..
        } = Message::from_json_relayed(
            br#"{"type":"result","id":1,"outcome":{"status":"ok","result":{"path":"b"}}}"#,
        )
        .unwrap()
        else {
            panic!("not a result");
        };
        let mut joined = Outcome::Ok { result: head };
        let body = Body {
            field: "content".into(),
            len: 2,
        };
        joined.join_body(&body, b"hi".to_vec()).unwrap();
        assert_eq!(
            joined,
            Outcome::Ok {
                result: json!({"path": "b", "content": "hi"}).into()
            }
        );
        // An error, and anything not valid JSON, are as with `from_json`.
        let error = Message::Result {
            id: 8,
            workspace: None,
            outcome: Outcome::Error {
                error: ToolError::new(crate::error::ErrorCode::Denied, "no"),
            },
            body: None,
        };
        assert_eq!(Message::from_json_relayed(&error.to_json()).unwrap(), error);
        for bad in [
            r#"{"type":"result","id":1,"outcome":{"status":"ok","result":{"a":}}}"#,
            r#"{"type":"result","id":1,"outcome":{"status":"ok"}}"#,
            r#"{"type":"result","id":1,"outcome":{"status":"ok","result":1,"error":{"code":"denied","message":"x"}}}"#,
        ] {
            refused_alike(bad);
        }
        // A surrogate pair escaped is decoded as a tree; half of one is refused as there.
        let escaped = |pair: &str| {
            format!(r#"{{"type":"result","id":1,"outcome":{{"status":"ok","result":"{pair}"}}}}"#)
        };
        let pair = Message::from_json_relayed(escaped(r"\uD83E\uDD80").as_bytes()).unwrap();
        assert!(
            matches!(&pair, Message::Result { outcome: Outcome::Ok { result }, .. }
            if !result.is_text() && *result.value() == json!("🦀"))
        );
        for half in [r"\ud83e", r"\uDD80x", r"a\\\udd80"] {
            refused_alike(&escaped(half));
        }
        // A number out of a double's range is refused as in a tree; one with an exponent in
        // range, or a long one in range, is decoded as a tree; `true` and `false` are plain.
        let numbered = |number: &str| {
            format!(
                r#"{{"type":"result","id":1,"outcome":{{"status":"ok","result":{{"n":{number},"t":true,"f":false}}}}}}"#
            )
        };
        let long = format!("1{}", "0".repeat(320));
        let long_fraction = format!("0.{}1", "0".repeat(320));
        for number in ["1e400", "-1E+400", "1.5e400", long.as_str()] {
            refused_alike(&numbered(number));
        }
        for number in [
            "1e3",
            "2.5E-3",
            "0.5e1",
            long_fraction.as_str(),
            "12345",
            "-0.25",
        ] {
            let relayed = Message::from_json_relayed(numbered(number).as_bytes()).unwrap();
            assert_eq!(
                relayed,
                Message::from_json(numbered(number).as_bytes()).unwrap()
            );
            let Message::Result {
                outcome: Outcome::Ok { result },
                ..
            } = &relayed
            else {
                panic!("{relayed:?}");
            };
            let plain = !number.contains(['e', 'E']) && number.len() <= MAX_DIGITS;
            assert_eq!(result.is_text(), plain, "{number}");
        }
        // An escaped backslash before a `u` is not an escape.
        let not_escape = Message::from_json_relayed(escaped(r"\\ud800").as_bytes()).unwrap();
        assert!(
            matches!(&not_escape, Message::Result { outcome: Outcome::Ok { result }, .. }
            if result.is_text())
        );
        // Nested as deep as serde_json allows, and one deeper, with brackets in strings that
        // do not count: kept as text, and refused as a tree is.
        let nested = |depth: usize| {
            format!(
                r#"{{"type":"result","id":1,"outcome":{{"status":"ok","result":{}"[{{\"\\"{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let deepest = (1..200)
            .take_while(|&depth| Message::from_json(nested(depth).as_bytes()).is_ok())
            .last()
            .expect("some depth decodes");
        assert!(deepest > 100, "{deepest}");
        let kept = Message::from_json_relayed(nested(deepest).as_bytes()).unwrap();
        assert!(
            matches!(&kept, Message::Result { outcome: Outcome::Ok { result }, .. } if result.is_text())
        );
        refused_alike(&nested(deepest + 1));
        // One that does not pass, over what is made a tree (a list of numbers with exponents,
        // many times its size as a tree), is refused, saying why; at the bound it is decoded.
        let list = |len: usize| {
            let mut numbers = "1e0,".repeat(len / 4);
            numbers.pop();
            numbered(&format!("[{numbers}]"))
        };
        let under = list(MAX_TREE_RESULT - 200);
        assert!(under.len() <= MAX_TREE_RESULT, "{}", under.len());
        assert!(Message::from_json_relayed(under.as_bytes()).is_ok());
        let over = list(MAX_TREE_RESULT + 200);
        let refused = Message::from_json_relayed(over.as_bytes()).unwrap_err();
        assert!(
            refused.to_string().contains("must be plain JSON text"),
            "{refused}"
        );
    }

    /// A client could say that the server, a session tool, the network policy or the editor
    /// decided its call, or that trust did for a restricted folder, and the audit log said so.
    #[test]
    fn a_client_says_only_what_a_client_decides() {
        for by in Decider::ALL {
            let own = matches!(
                by,
                Decider::Policy | Decider::User | Decider::Timeout | Decider::NoTerminal
            );
            let full = if own || by == Decider::Trust {
                by
            } else {
                Decider::Client
            };
            assert_eq!(by.said_by_client(true), full, "{by}");
            let restricted = if own { by } else { Decider::Client };
            assert_eq!(by.said_by_client(false), restricted, "{by}");
        }
    }

    #[test]
    fn a_result_message_decodes_the_same_on_the_fast_path_as_through_the_derive() {
        use serde_json::json;
        let messages = [
            Message::Result {
                id: 7,
                workspace: Some(WorkspaceRef {
                    name: "lap".into(),
                    uri: "vm:/p".into(),
                }),
                outcome: Outcome::Ok {
                    result: json!({"entries": ["a/", "a/b"], "truncated": false}).into(),
                },
                body: Some(Body {
                    field: "content".into(),
                    len: 3,
                }),
            },
            Message::Result {
                id: 8,
                workspace: None,
                outcome: Outcome::Error {
                    error: ToolError::new(crate::error::ErrorCode::Denied, "no"),
                },
                body: None,
            },
        ];
        for message in messages {
            let bytes = message.to_json();
            assert_eq!(Message::from_json(&bytes).unwrap(), message);
            let derived: Message = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(derived, message);
        }
        // Fields in another order, or space between them, and other messages, go through the
        // derive.
        let spaced = br#"{ "type": "result", "id": 4, "outcome": {"status": "ok", "result": 1}}"#;
        assert!(matches!(
            Message::from_json(spaced).unwrap(),
            Message::Result { id: 4, .. }
        ));
        let reordered = br#"{"id":3,"outcome":{"result":1,"status":"ok"},"type":"result"}"#;
        assert!(matches!(
            Message::from_json(reordered).unwrap(),
            Message::Result { id: 3, .. }
        ));
        let bad = br#"{"type":"result","id":3,"outcome":{"status":"ok"}}"#;
        let err = Message::from_json(bad).unwrap_err().to_string();
        assert!(err.contains("missing field `result`"), "{err}");
        let unknown = br#"{"type":"result","id":3,"outcome":{"status":"ok","result":1},"x":1}"#;
        assert!(Message::from_json(unknown).is_err());
    }
}
