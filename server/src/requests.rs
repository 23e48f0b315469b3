//! Agent requests about sessions rather than tools: opening sessions, the conversation
//! (`session.md`), and workspace records.

use std::sync::Arc;

use monad_protocol::wire::{History, Message};
use monad_protocol::{ErrorCode, ToolError};

use crate::auth::DeviceId;
use crate::fsutil::now_rfc3339;
use crate::recorder::Recorder;
use crate::server::State;
use crate::session::{HostHold, Session, store_error};
use crate::store::{self, ArtifactKind, ArtifactMeta, history};

/// Default page size of session lists.
const DEFAULT_PAGE: u32 = 20;

/// Who asks.
pub(crate) struct Caller<'a> {
    pub user: &'a str,
    pub device: Option<&'a DeviceId>,
    /// Where the connection keeps its MCP host's hold on the focus it landed on (a landing
    /// replaces it; the connection's end drops it).
    pub landing: &'a HostSlot,
}

/// A connection's [`HostHold`], when its host landed on the focus.
pub(crate) type HostSlot = Arc<std::sync::Mutex<Option<HostHold>>>;

/// Answers a session, history or record request; `None` when `request` is none of those.
pub(crate) async fn answer(
    state: &Arc<State>,
    caller: &Caller<'_>,
    request: Message,
    slot: crate::state::StoreTurn,
) -> Option<Message> {
    let id = request_id(&request)?;
    let state = state.clone();
    let user = caller.user.to_owned();
    let device = caller.device.cloned();
    let landing = caller.landing.clone();
    // Store calls block (fsync); they run on the blocking pool, holding the user's `slot` to
    // their end: a request whose connection went away goes on there, and a slot given back
    // then let a user pile up work on the pool every user shares (send, close, again).
    let answer = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        handle(&state, &user, device.as_ref(), &landing, request)
    })
    .await
    .unwrap_or_else(|e| Err(ToolError::new(ErrorCode::Internal, e.to_string())));
    Some(answer.unwrap_or_else(|error| Message::Error { id, error }))
}

/// A session's human name as given, trimmed; refused when empty, too long, or holding
/// characters a terminal would act on.
fn session_name(raw: &str) -> Result<String, ToolError> {
    let name = raw.trim();
    let printable = monad_protocol::text::printable(name);
    // A tab too: it would split the name's column in the tab-separated listings.
    if name.is_empty()
        || name.len() > monad_protocol::wire::MAX_SESSION_NAME
        || printable != name
        || name.contains('\t')
    {
        let printable = printable.replace('\t', "\\t");
        return Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "`{printable}` cannot be a session's name: 1 to {} bytes, no tab, control, \
                 escape, bidi or invisible characters",
                monad_protocol::wire::MAX_SESSION_NAME
            ),
        ));
    }
    Ok(name.to_owned())
}

fn request_id(request: &Message) -> Option<u64> {
    match request {
        Message::OpenSession { id, .. }
        | Message::Land { id, .. }
        | Message::HistoryAppend { id, .. }
        | Message::HistoryGet { id, .. }
        | Message::HistoryReplace { id, .. }
        | Message::HistoryClear { id, .. }
        | Message::ChatInfo { id, .. }
        | Message::ListRecords { id }
        | Message::Detach { id, .. }
        | Message::RecordSessions { id, .. } => Some(*id),
        _ => None,
    }
}

fn handle(
    state: &State,
    user: &str,
    device: Option<&DeviceId>,
    landing: &HostSlot,
    request: Message,
) -> Result<Message, ToolError> {
    let registry = &state.registry;
    let store = registry.store();
    let session = |requested: Option<String>| registry.resolve(requested.as_deref(), user, device);
    let done = |id: u64, session: &Session| {
        touch(state, session);
        Message::Done {
            id,
            session: session.id.clone(),
        }
    };
    match request {
        Message::OpenSession {
            id,
            session: None,
            folder,
            name,
        } => {
            let name = name.map(|n| session_name(&n)).transpose()?;
            let s = registry.create(user)?;
            if let Some(name) = name {
                store.save(&s.set_name(name)).map_err(store_error)?;
            }
            if let Some(device) = device {
                registry.bind(user, device, &s.id);
                if let Some(folder) = folder {
                    crate::landing::start_in_folder(
                        registry,
                        user,
                        device,
                        &folder,
                        &s,
                        crate::landing::now_ms(),
                    );
                }
            }
            Ok(Message::SessionOpened {
                id,
                session: s.info(),
            })
        }
        Message::Land {
            id,
            roots,
            session: requested,
        } => {
            let Some(device) = device else {
                return Err(ToolError::new(
                    ErrorCode::InvalidArguments,
                    "landing by roots needs a device (monad-client mcp)",
                ));
            };
            // This host's hold from an earlier landing holds nothing against its landing
            // again (its roots changed, and may move the focus it held); it is let go once the
            // new landing holds, and kept when the landing fails, as the host stays where it
            // was.
            let mut held = landing.lock().unwrap_or_else(|p| p.into_inner());
            let landed = crate::landing::land(
                registry,
                user,
                device,
                &roots,
                requested.as_deref(),
                crate::landing::now_ms(),
                held.as_ref(),
            )?;
            // The host holds the focus exactly when its folder is it.
            let folder_focus = landed.folder.as_ref().map(|_| landed.hold.is_some());
            *held = landed.hold;
            drop(held);
            Ok(Message::Landed {
                id,
                session: landed.session.id.clone(),
                folder: landed.folder,
                focus: landed.focus,
                focus_offline: landed.focus_offline,
                folder_focus,
            })
        }
        Message::OpenSession {
            id,
            session: Some(requested),
            ..
        } => {
            let s = session(Some(requested))?;
            Ok(Message::SessionOpened {
                id,
                session: s.info(),
            })
        }
        Message::Detach {
            id,
            session: requested,
            workspace,
        } => {
            // Acts on the session named, without going to work there: binds nothing, and
            // creates nothing (`docs/protocol.md`, device bindings).
            let s = match requested {
                Some(requested) => registry.open_existing(&requested, user)?,
                None => session(None)?,
            };
            let gone = registry.forget(
                &s,
                &workspace,
                "detached by `monad-client detach` (the folder is no longer in the session)",
            )?;
            tracing::info!(session = %s.id, workspace = %gone.name, "detached and forgotten by name");
            Ok(done(id, &s))
        }
        Message::HistoryAppend {
            id,
            session: requested,
            message,
        } => {
            let s = session(requested)?;
            store.append(&s.id, &message).map_err(store_error)?;
            Ok(done(id, &s))
        }
        Message::HistoryGet {
            id,
            session: requested,
        } => {
            let s = session(requested)?;
            let history = store.history(&s.id).map_err(store_error)?;
            Ok(Message::HistoryIs {
                id,
                session: s.id.clone(),
                history,
            })
        }
        Message::HistoryReplace {
            id,
            session: requested,
            history,
        } => {
            let s = session(requested)?;
            // Refused past what a conversation holds before anything else changes.
            store::history_fits(&s.id, store::history_bytes(&history.messages))
                .map_err(store_error)?;
            let meta = s.set_model(history.provider.clone(), history.model.clone());
            Recorder::save_after(state.executor.recorder.as_ref(), store.as_ref(), &meta)
                .map_err(store_error)?;
            let history = History {
                created_at: meta.created_at.clone(),
                ..history
            };
            store.replace(&s.id, &history).map_err(store_error)?;
            let snapshot = serde_json::to_vec_pretty(&history).unwrap_or_default();
            let size = snapshot.len() as u64;
            store
                .put_artifact(
                    &ArtifactMeta {
                        id: "session_history".into(),
                        session: s.id.clone(),
                        kind: ArtifactKind::SessionHistory,
                        workspace: None,
                        tool: None,
                        call_id: None,
                        created_at: now_rfc3339(),
                        content_type: "application/json".into(),
                        size,
                        truncated: false,
                        original_size: size,
                        upload: None,
                    },
                    &snapshot,
                )
                .map_err(store_error)?;
            Ok(done(id, &s))
        }
        Message::HistoryClear {
            id,
            session: requested,
        } => {
            let s = session(requested)?;
            let meta = s.meta();
            let cleared = history::empty(meta.created_at, meta.provider, meta.model);
            store.replace(&s.id, &cleared).map_err(store_error)?;
            Ok(done(id, &s))
        }
        Message::ChatInfo {
            id,
            session: requested,
        } => {
            let s = session(requested)?;
            let history = store.history(&s.id).map_err(store_error)?;
            Ok(Message::ChatInfoIs {
                id,
                info: crate::agent::chat_info(&s, history),
            })
        }
        Message::ListRecords { id } => Ok(Message::Records {
            id,
            records: store.records(Some(user)).map_err(store_error)?,
        }),
        Message::RecordSessions {
            id,
            record,
            limit,
            next,
        } => {
            let owned = store
                .record(&record)
                .map_err(store_error)?
                .is_some_and(|r| r.user == user);
            if !owned {
                return Err(ToolError::new(
                    ErrorCode::NotFound,
                    format!("you have no workspace record `{record}`"),
                ));
            }
            let page = store
                .record_sessions(
                    &record,
                    limit.unwrap_or(DEFAULT_PAGE) as usize,
                    next.as_deref(),
                )
                .map_err(store_error)?;
            Ok(Message::RecordSessionsPage {
                id,
                sessions: page.items,
                next: page.next,
            })
        }
        other => Err(ToolError::new(
            ErrorCode::Malformed,
            format!("`{}` is not a session request", other.kind()),
        )),
    }
}

/// Notes activity in `session` (its `last_active`, which retention and `session gc` go by),
/// saved through the recorder at most every few seconds.
pub(crate) fn touch(state: &State, session: &Session) {
    if let Some(meta) = session.touch()
        && let Some(recorder) = &state.executor.recorder
    {
        recorder.save_meta(meta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a request's slot was given back when its future was dropped (its connection
    /// gone), while its store work went on on the blocking pool: a user could pile up work
    /// there that every user shares (send, close, again). The work holds the slot to its end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_requests_slot_is_held_until_its_store_work_ends() {
        let (_data, server) = crate::server::bound_for_test();
        let state = server.state().clone();
        let device = DeviceId::parse("00000000-0000-4000-8000-000000000009").unwrap();
        // The connection's landing slot, held by a thread of the test's until told: the
        // landing waits for it on the pool.
        let landing: HostSlot = Arc::default();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let landing = landing.clone();
            std::thread::spawn(move || {
                let _held = landing.lock().unwrap();
                locked_tx.send(()).unwrap();
                let _ = release_rx.recv();
            })
        };
        locked_rx.recv().unwrap();
        let request = Message::Land {
            id: 1,
            roots: vec!["file:///nowhere".into()],
            session: None,
        };
        let slot = state.store_turn("ana").await.unwrap();
        let asked = {
            let (state, landing, device) = (state.clone(), landing.clone(), device.clone());
            tokio::spawn(async move {
                let caller = Caller {
                    user: "ana",
                    device: Some(&device),
                    landing: &landing,
                };
                answer(&state, &caller, request, slot).await
            })
        };
        // Time for the task to reach the pool, where its work waits for the landing slot.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        asked.abort();
        assert!(asked.await.unwrap_err().is_cancelled());
        assert_eq!(state.user_calls.held("ana"), 1, "its work still runs");
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        let given_back = async {
            while state.user_calls.held("ana") > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(20), given_back)
            .await
            .expect("the slot comes back once the work ends");
    }
}
