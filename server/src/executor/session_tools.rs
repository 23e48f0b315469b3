//! The session tools, which the server answers itself: `workspaces` (the session's
//! workspaces, its focus and where un-targeted calls go), `memory_store` and `memory_recall`
//! (notes kept as `memory/<key>.md` in the primary workspace).

use monad_protocol::tools::{
    MEMORY_RECALL_MAX_BYTES, MEMORY_RECALL_SCAN_MAX_BYTES, MemoryRecallArgs, MemoryRecallResult,
    MemoryStoreArgs, Note, WorkspacesArgs, WorkspacesResult,
};
use monad_protocol::{ErrorCode, ToolError, ToolName};
use serde_json::{Value, json};

use crate::route;
use crate::session::Session;

/// Longest memory key.
const MAX_KEY_LEN: usize = 100;

fn parse<A: serde::de::DeserializeOwned>(tool: ToolName, args: Value) -> Result<A, ToolError> {
    tool.decode_args(args)
        .map_err(|why| ToolError::new(ErrorCode::InvalidArguments, why))
}

pub(super) fn workspaces(session: &Session, args: &Value) -> Result<Value, ToolError> {
    let _: WorkspacesArgs = parse(ToolName::Workspaces, args.clone())?;
    let list: Vec<_> = session.workspaces().into_iter().map(|s| s.info).collect();
    let focus = session
        .focus()
        .filter(|f| list.iter().any(|w| &w.name == f));
    // Where calls go now: an offline focus stays the focus, and says so.
    let views: Vec<route::View<'_>> = list
        .iter()
        .map(|w| route::View {
            name: &w.name,
            uri: &w.uri,
            online: w.online,
            offers: w.tools.contains(&ToolName::WriteFile),
        })
        .collect();
    let routing = route::describe(
        &views,
        focus
            .as_ref()
            .and_then(|f| list.iter().position(|w| &w.name == f)),
    );
    let result = WorkspacesResult {
        session: session.id.clone(),
        focus,
        routing,
        workspaces: list,
    };
    serde_json::to_value(result).map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
}

/// A memory key: 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting with a dot.
fn check_key(key: &str) -> Result<(), ToolError> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "memory key `{key}` must be 1 to {MAX_KEY_LEN} letters, digits, `.`, `_` or `-`, \
                 not starting with `.`"
            ),
        ))
    }
}

pub(super) async fn memory_store(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryStoreArgs = parse(ToolName::MemoryStore, args)?;
    check_key(&args.key)?;
    let write = json!({
        "path": format!("memory/{}.md", args.key),
        "content": args.text,
        "create_parents": true,
    });
    session
        .primary
        .sandbox()
        .await?
        .call(ToolName::WriteFile, write)
        .await
        .map_err(|e| e.to_tool_error())?;
    Ok(json!({ "key": args.key, "stored": true }))
}

/// The notes of `memory/` in the primary workspace whose key or text holds the query, in key
/// order, bounded: the answer holds at most [`MEMORY_RECALL_MAX_BYTES`] of notes (each that
/// fits, keys counted) and the recall reads at most [`MEMORY_RECALL_SCAN_MAX_BYTES`] (notes are
/// files any command there can make: 5,000 of 256 KiB, or links to one, were one answer of
/// 1.25 GiB in the server's memory); what is left out is counted (`not_shown`). A note is
/// `memory/KEY.md`, read whole up to the workspace's read cap.
pub(super) async fn memory_recall(session: &Session, args: Value) -> Result<Value, ToolError> {
    let args: MemoryRecallArgs = parse(ToolName::MemoryRecall, args)?;
    let sandbox = session.primary.sandbox().await?;
    let query = args.query.map(|q| q.to_lowercase());
    tokio::task::spawn_blocking(move || {
        let listing = match sandbox.list_dir(&monad_protocol::tools::ListDirArgs {
            path: Some("memory".into()),
            depth: None,
            include_hidden: None,
            workspace: None,
        }) {
            Ok(listing) => listing,
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Ok(json!({ "notes": [] }));
            }
            Err(e) => return Err(e.to_tool_error()),
        };
        let mut recalled = MemoryRecallResult {
            notes: Vec::new(),
            not_matching: 0,
            not_shown: 0,
        };
        let (mut shown, mut read) = (0usize, 0u64);
        for entry in listing.entries {
            let Some(key) = entry
                .path
                .strip_prefix("memory/")
                .and_then(|n| n.strip_suffix(".md"))
            else {
                continue;
            };
            if read >= MEMORY_RECALL_SCAN_MAX_BYTES {
                recalled.not_shown += 1;
                continue;
            }
            let Ok(file) = sandbox.read_file(&monad_protocol::tools::ReadFileArgs {
                path: entry.path.clone(),
                offset: None,
                // Whole, up to the read cap: a note of many short lines is not cut at the
                // default page.
                limit: Some(u64::MAX),
                workspace: None,
            }) else {
                continue;
            };
            // What was read, not what it decoded to: a binary note's content is empty, and
            // its reading still looked at its start.
            read = read.saturating_add(file.size.max(file.content.len() as u64));
            let matches = query.as_deref().is_none_or(|q| {
                key.to_lowercase().contains(q) || file.content.to_lowercase().contains(q)
            });
            // The key counts too: 5,000 empty notes are an answer of their keys.
            let size = key.len() + file.content.len();
            if !matches {
                recalled.not_matching += 1;
            } else if shown.saturating_add(size) <= MEMORY_RECALL_MAX_BYTES {
                shown += size;
                recalled.notes.push(Note {
                    key: key.to_owned(),
                    text: file.content,
                });
            } else {
                // Left out, and the next that fits is still shown: a note larger than the
                // bound (a read cap raised past it) does not hide every note after it.
                recalled.not_shown += 1;
            }
        }
        serde_json::to_value(recalled)
            .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
    })
    .await
    .map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))?
}
