//! Leases: one owner per live session, fenced by an epoch.
//!
//! Several hosts share one database. The host that serves a session live (a laptop attached to
//! it, an agent calling in it) holds the session's row in `leases` (see `0002_leases.sql`):
//! its host id, the address other hosts forward calls to, an epoch and an expiry. It renews the
//! lease while it serves ([`spawn_renewal`]) and releases it when the session leaves its memory
//! or the server stops. Expiry is decided by the database's clock (`now()`), never a host's.
//!
//! A lease that expired may be taken by any host, and that take-over bumps the epoch. Every
//! durable write for a session checks, in its own transaction and under a key-share lock on the
//! lease row (`FOR KEY SHARE`, which the renewal's `UPDATE` of the expiry does not wait for),
//! that this host still holds the lease at the epoch it took ([`may_write`]): a
//! former owner that was paused past its expiry, or whose lease was taken over, is refused with
//! [`StoreError::Fenced`] and writes nothing, until it takes the lease again (a lease found
//! lost stays remembered as lost, so the former owner never writes as a bystander). A lease that
//! expired while nobody took it (a database outage, a pause) is renewed at its epoch: its row
//! unchanged means no other host wrote under another. A take-over locks the row `FOR UPDATE`
//! first, so it waits for the writes in flight under the old epoch, and no write of the old
//! owner lands after it.
//!
//! A host that never held the session's lease is a bystander: it records what reaches it
//! (a history append through an agent connected to it) as any host of a shared store does,
//! but it does not delete a session another host serves live.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_postgres::GenericClient;

use super::{PgStore, db};
use crate::store::StoreError;

/// This host, as its leases name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Unique per server process: `MACHINE.PROCESS`, where `MACHINE` is the data dir's own id
    /// (kept in `<data_dir>/host_id`) and `PROCESS` is fresh at every start. Only one process
    /// serves a data dir at a time (its lock), so a process that finds a live lease of its own
    /// data dir under another process id knows that process is gone and takes it over at once
    /// (at a higher epoch), instead of waiting for it to expire after a restart.
    pub id: String,
    /// Where other hosts reach this one (`HOST:PORT`, QUIC), for forwarded calls; empty when
    /// it does not say.
    pub address: String,
    /// How long a lease lasts without a renewal.
    pub ttl: Duration,
}

impl Host {
    /// A host with a fresh id (a data dir of its own), reachable at `address`, whose leases
    /// last `ttl`.
    pub fn new(address: impl Into<String>, ttl: Duration) -> Host {
        Host::of_machine(&uuid::Uuid::new_v4().simple().to_string(), address, ttl)
    }

    /// The host of the data dir whose id is `machine`, this process.
    pub fn of_machine(machine: &str, address: impl Into<String>, ttl: Duration) -> Host {
        Host {
            id: format!("{machine}.{}", uuid::Uuid::new_v4().simple()),
            address: address.into(),
            ttl,
        }
    }

    /// The id of the data dir at `data_dir` (`<data_dir>/host_id`), made on first use.
    pub fn machine_id(data_dir: &std::path::Path) -> Result<String, crate::ServerError> {
        let path = data_dir.join("host_id");
        match std::fs::read_to_string(&path) {
            Ok(text) if is_machine_id(text.trim()) => return Ok(text.trim().to_owned()),
            Ok(_) => {
                return Err(crate::ServerError::Invalid(format!(
                    "{}: not a host id (32 hex digits); remove it and a new one is made",
                    path.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(crate::ServerError::io("read", &path, e)),
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        crate::fsutil::write_atomic(&path, id.as_bytes(), crate::fsutil::PRIVATE_FILE)?;
        Ok(id)
    }
}

fn is_machine_id(text: &str) -> bool {
    text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Who serves a session, after this host tried to take its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This host, at this epoch.
    Held {
        /// The fencing epoch this host's writes carry.
        epoch: i64,
    },
    /// Another host, whose lease has not expired.
    Elsewhere {
        /// Its host id.
        holder: String,
        /// Where it said it can be reached (`HOST:PORT`; empty when it said nothing).
        address: String,
        /// The epoch it holds.
        epoch: i64,
    },
}

/// A session's lease row as a write finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The holder's host id.
    pub holder: String,
    /// The epoch it took.
    pub epoch: i64,
    /// Whether it has not expired yet (by the database's clock).
    pub live: bool,
}

/// What a write does, for [`may_write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Adds or replaces records of the session (history, audit, artifacts, metadata).
    Record,
    /// Deletes the session.
    Delete,
}

/// Why a write is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// This host held the lease at `held`; another host holds it now.
    TakenOver {
        /// The epoch this host had.
        held: i64,
        /// The epoch the row has now.
        now: i64,
    },
    /// This host held the lease, and it expired before this write (a pause past the expiry).
    Expired,
    /// This host never held it, and another host serves the session now.
    Elsewhere,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fence::TakenOver { held, now } => write!(
                f,
                "another host took over its lease (epoch {now}; this host had epoch {held})"
            ),
            Fence::Expired => write!(f, "this host's lease on it expired"),
            Fence::Elsewhere => write!(f, "another host serves it now"),
        }
    }
}

/// Whether host `me`, which took the session's lease at epoch `held` (or never took it), may
/// make `write` to the session whose lease row is `row`: a host that took the lease only while
/// it is live and still at the epoch it took; a bystander records, and deletes only while
/// nobody serves the session live.
pub fn may_write(
    me: &str,
    held: Option<i64>,
    row: Option<&LeaseRow>,
    write: Write,
) -> Result<(), Fence> {
    match (held, row) {
        (Some(held), Some(row)) if row.holder == me && row.epoch == held => {
            if row.live {
                Ok(())
            } else {
                Err(Fence::Expired)
            }
        }
        (Some(held), Some(row)) => Err(Fence::TakenOver {
            held,
            now: row.epoch,
        }),
        // The row went (the session was deleted and made again): nobody serves it.
        (Some(_), None) => Err(Fence::Expired),
        (None, None) => Ok(()),
        (None, Some(row)) if !row.live || row.holder == me || write == Write::Record => Ok(()),
        (None, Some(_)) => Err(Fence::Elsewhere),
    }
}

/// What a write of one session checks: this host and the epoch it holds the session at.
#[derive(Debug, Clone)]
pub(super) struct Fencing {
    me: String,
    held: Option<i64>,
    write: Write,
}

impl Fencing {
    /// Checks the lease of `session` inside the caller's transaction `c`, locking its row
    /// (shared) until the transaction ends, so no take-over commits in between.
    pub(super) async fn check(
        &self,
        c: &impl GenericClient,
        session: &str,
    ) -> Result<(), StoreError> {
        self.check_row(c, session).await.map(|_| ())
    }

    /// [`Fencing::check`], and whether a save of the session's record replaces all of it: when
    /// this host holds the lease, or no host ever took it. Otherwise this host is a bystander
    /// (it forwards the session's calls to its holder, answers its history requests, or let
    /// the lease go), whose copy of the record was read before the holder's later changes.
    pub(super) async fn check_whole_record(
        &self,
        c: &impl GenericClient,
        session: &str,
    ) -> Result<bool, StoreError> {
        let row = self.check_row(c, session).await?;
        Ok(self.held.is_some() || row.is_none())
    }

    /// The lease row of `session`, locked (`FOR KEY SHARE`), once [`may_write`] allowed the
    /// write.
    async fn check_row(
        &self,
        c: &impl GenericClient,
        session: &str,
    ) -> Result<Option<LeaseRow>, StoreError> {
        let row = c
            .query_opt(
                "SELECT holder, epoch, expires_at > now() FROM leases WHERE session_id = $1
                 FOR KEY SHARE",
                &[&session],
            )
            .await
            .map_err(db)?
            .map(|r| LeaseRow {
                holder: r.get(0),
                epoch: r.get(1),
                live: r.get(2),
            });
        may_write(&self.me, self.held, row.as_ref(), self.write).map_err(|fence| {
            StoreError::Fenced {
                session: session.to_owned(),
                why: fence.to_string(),
            }
        })?;
        Ok(row)
    }
}

/// What a host does with a session whose lease it finds lost ([`PgStore::on_lease_lost`]).
pub type LostHook = Box<dyn Fn(&str) + Send + Sync>;

/// A lease this host took: still held, or found lost (expired or taken over) by a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Held at `epoch`, surely until `until`: the database's lease lasts its time from when the
    /// statement ran, which was after `until`'s count began (see [`held_until`]).
    Held { epoch: i64, until: Instant },
    /// Lost at `epoch`; `told` once the hook heard that another host serves it now.
    Lost { epoch: i64, told: bool },
}

/// Until when a lease taken or renewed by a statement sent at `asked` surely lasts, by this
/// host's clock: nine tenths of the lease time from `asked` (the database counts the whole time
/// from its own `now()`, later). A host that was paused, or cut off from the database, past it
/// no longer takes its memory's word that it serves the session: it asks the database again,
/// and runs nothing if it cannot.
fn held_until(asked: Instant, ttl: Duration) -> Instant {
    asked + ttl.mul_f64(0.9)
}

/// The leases this host took: session → epoch, held or lost.
#[derive(Debug, Default)]
pub(super) struct Held(Mutex<HashMap<String, Taken>>);

impl Held {
    /// The epoch this host's writes of `session` carry: the one it took, held or lost (a lost
    /// one fails the check), or none when it never took the lease.
    fn epoch(&self, session: &str) -> Option<i64> {
        match self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
        {
            Some(Taken::Held { epoch: e, .. } | Taken::Lost { epoch: e, .. }) => Some(*e),
            None => None,
        }
    }

    fn held(&self, session: &str) -> Option<i64> {
        match self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
        {
            Some(Taken::Held { epoch, until }) if Instant::now() < *until => Some(*epoch),
            _ => None,
        }
    }

    fn set(&self, session: &str, taken: Taken) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.to_owned(), taken);
    }

    fn forget(&self, session: &str) -> Option<Taken> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session)
    }

    /// Notes that the lease of `session` at `epoch` was renewed: held until `until`, unless it
    /// was taken again (at another epoch) or lost meanwhile.
    fn renewed(&self, session: &str, epoch: i64, until: Instant) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Taken::Held {
            epoch: e,
            until: kept,
        }) = held.get_mut(session)
            && *e == epoch
        {
            *kept = until.max(*kept);
        }
    }

    /// Marks `session` lost, unless it was taken again (at another epoch), lost or given up
    /// meanwhile; true when it was marked.
    fn lose(&self, session: &str, epoch: i64) -> bool {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let marked = matches!(held.get(session), Some(Taken::Held { epoch: e, .. }) if *e == epoch);
        if marked {
            let told = false;
            held.insert(session.to_owned(), Taken::Lost { epoch, told });
        }
        marked
    }

    /// Marks `session` lost to another host, which holds its lease at `now` (a take found
    /// it): true when the hook is to hear of it, as it was held here or lost without the hook
    /// told. A lease taken here again at `now` or later (by a take that ran meanwhile) stays.
    fn lost_to(&self, session: &str, now: i64) -> bool {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (epoch, tell) = match held.get(session) {
            Some(Taken::Held { epoch, .. }) if *epoch < now => (*epoch, true),
            Some(Taken::Lost { epoch, told }) => (*epoch, !told),
            _ => return false,
        };
        let told = true;
        held.insert(session.to_owned(), Taken::Lost { epoch, told });
        tell
    }

    /// The sessions lost whose hook has not heard that another host serves them.
    fn untold(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, t)| matches!(t, Taken::Lost { told: false, .. }))
            .map(|(s, _)| s.clone())
            .collect()
    }

    fn all_held(&self) -> Vec<(String, i64)> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(s, t)| match t {
                Taken::Held { epoch, .. } => Some((s.clone(), *epoch)),
                Taken::Lost { .. } => None,
            })
            .collect()
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl PgStore {
    /// Names this store's host in leases (a fresh id per server process, its advertised
    /// address, the lease time).
    pub fn with_host(mut self, host: Host) -> PgStore {
        self.host = host;
        self
    }

    /// This store's host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// What a `write` of `session` checks.
    pub(super) fn fencing(&self, session: &str, write: Write) -> Fencing {
        Fencing {
            me: self.host.id.clone(),
            held: self.held.epoch(session),
            write,
        }
    }

    /// The epoch at which this host holds the lease of `session`, if it believes it does (a
    /// renewal that found it lost marks it lost: none).
    pub fn held_epoch(&self, session: &str) -> Option<i64> {
        self.held.held(session)
    }

    /// Takes (or keeps) the lease of `session` for this host: when nobody holds it, when its
    /// holder's lease expired or its holder was an earlier process of this data dir (the epoch
    /// goes up by one), or when this host holds it already (renewed, same epoch). Otherwise says
    /// which host serves it.
    pub fn take_lease(&self, session: &str) -> Result<Lease, StoreError> {
        let (session, host) = (session.to_owned(), self.host.clone());
        let key = session.clone();
        let asked = Instant::now();
        let lease = self.with(move |mut c| async move {
            let tx = c.transaction().await.map_err(db)?;
            // The row locked first, `FOR UPDATE`: a take waits for the writes in flight under
            // the lease as it is (each holds the row `FOR KEY SHARE` from its check to its
            // commit), so none lands after a take-over. The renewal's `UPDATE` of `expires_at`
            // alone does not wait for them.
            tx.query_opt(
                "SELECT 1 FROM leases WHERE session_id = $1 FOR UPDATE",
                &[&session],
            )
            .await
            .map_err(db)?;
            let taken = tx
                .query_opt(
                    "INSERT INTO leases AS l (session_id, holder, address, epoch, expires_at)
                     VALUES ($1, $2, $3, 1, now() + $4::float8 * interval '1 millisecond')
                     ON CONFLICT (session_id) DO UPDATE SET
                         holder = EXCLUDED.holder,
                         address = EXCLUDED.address,
                         epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now()
                                      THEN l.epoch ELSE l.epoch + 1 END,
                         expires_at = EXCLUDED.expires_at
                     WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
                        OR split_part(l.holder, '.', 1) = split_part(EXCLUDED.holder, '.', 1)
                     RETURNING epoch",
                    &[&session, &host.id, &host.address, &millis(host.ttl)],
                )
                .await
                .map_err(db)?;
            if let Some(row) = taken {
                tx.commit().await.map_err(db)?;
                return Ok(Lease::Held { epoch: row.get(0) });
            }
            let row = tx
                .query_one(
                    "SELECT holder, address, epoch FROM leases WHERE session_id = $1",
                    &[&session],
                )
                .await
                .map_err(db)?;
            tx.commit().await.map_err(db)?;
            Ok(Lease::Elsewhere {
                holder: row.get(0),
                address: row.get(1),
                epoch: row.get(2),
            })
        })?;
        let lease = match lease {
            // This host's own take, which ran meanwhile, holds it (read after this one's
            // statement failed): held, as that take notes too.
            Lease::Elsewhere { holder, epoch, .. } if holder == self.host.id => {
                Lease::Held { epoch }
            }
            lease => lease,
        };
        match &lease {
            Lease::Held { epoch } => self.held.set(
                &key,
                Taken::Held {
                    epoch: *epoch,
                    until: held_until(asked, self.host.ttl),
                },
            ),
            // Taken before and lost: stays lost (its writes stay fenced), and the hook hears
            // once that another host serves it.
            Lease::Elsewhere { epoch, .. } => {
                if self.held.lost_to(&key, *epoch) {
                    self.lost(&key);
                }
            }
        }
        Ok(lease)
    }

    /// Renews every lease this host holds for another lease time, an expired one too when its
    /// row still names this host at the same epoch: nobody took it meanwhile (a take by another
    /// host, or by this one, changes the holder or the epoch), so after a database outage or a
    /// pause longer than the lease the host keeps its sessions rather than losing them all at
    /// once to whichever host a call reaches first. Returns the sessions whose lease was lost
    /// (taken over, or gone): they are marked lost (their writes stay fenced), and their next
    /// use takes the lease again or finds their new owner.
    pub fn renew_leases(&self) -> Result<Vec<String>, StoreError> {
        let held = self.held.all_held();
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let host = self.host.clone();
        let asked = Instant::now();
        let (sessions, epochs): (Vec<String>, Vec<i64>) = held.iter().cloned().unzip();
        let renewed: Vec<String> = self.with_renewal(move |c| async move {
            let rows = c
                .query(
                    "UPDATE leases AS l
                     SET expires_at = now() + $4::float8 * interval '1 millisecond'
                     FROM unnest($2::text[], $3::bigint[]) AS h(session_id, epoch)
                     WHERE l.session_id = h.session_id AND l.epoch = h.epoch
                       AND l.holder = $1
                     RETURNING l.session_id",
                    &[&host.id, &sessions, &epochs, &millis(host.ttl)],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })?;
        for (session, epoch) in held.iter().filter(|(s, _)| renewed.contains(s)) {
            self.held
                .renewed(session, *epoch, held_until(asked, self.host.ttl));
        }
        let lost: Vec<String> = held
            .into_iter()
            .filter(|(s, _)| !renewed.contains(s))
            .filter(|(s, epoch)| self.held.lose(s, *epoch))
            .map(|(s, _)| s)
            .collect();
        // The renewal itself went through: a failure to look for take-overs is told, and
        // looked at again at the next renewal.
        if let Err(e) = self.tell_taken_over() {
            tracing::warn!("cannot look for leases other hosts took over (tried again soon): {e}");
        }
        Ok(lost)
    }

    /// Tells the hook of the sessions lost here that another host serves now (a lease that
    /// only expired, the database unreachable or this host paused, is not: nobody else serves
    /// it, and its next use here takes it again). Looked at again at each renewal, so that one
    /// taken over later is told then.
    fn tell_taken_over(&self) -> Result<(), StoreError> {
        let untold = self.held.untold();
        if untold.is_empty() || self.on_lost.get().is_none() {
            return Ok(());
        }
        let me = self.host.id.clone();
        let served: Vec<(String, i64)> = self.with_renewal(move |c| async move {
            let rows = c
                .query(
                    "SELECT session_id, epoch FROM leases
                     WHERE session_id = ANY($1) AND holder <> $2 AND expires_at > now()",
                    &[&untold, &me],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })?;
        for (session, epoch) in served {
            if self.held.lost_to(&session, epoch) {
                self.lost(&session);
            }
        }
        Ok(())
    }

    /// Has `hook` called, once, with each session whose lease this host held and another host
    /// holds now (a host paused past its lease, woken after another took it over), as a take or
    /// a renewal finds it: the server lets the session's folders go, so that they attach again
    /// where it is served now. A lease that only expired (nobody took it) is not told. Set
    /// once; a second hook is ignored.
    pub fn on_lease_lost(&self, hook: LostHook) {
        let _ = self.on_lost.set(hook);
    }

    /// Tells the hook, if any, that the lease of `session` was lost.
    fn lost(&self, session: &str) {
        if let Some(hook) = self.on_lost.get() {
            hook(session);
        }
    }

    /// Gives up the lease of `session` (it expires now; the epoch stays, so the next holder's
    /// is higher). The row no longer names this host as its holder (its id, marked released):
    /// a renewal running meanwhile, which renews an expired lease whose row still names this
    /// host, cannot renew it for nobody; a take by this host later goes up an epoch, as any.
    pub fn release_lease(&self, session: &str) -> Result<(), StoreError> {
        let Some(Taken::Held { epoch, .. }) = self.held.forget(session) else {
            return Ok(());
        };
        let (session, holder) = (session.to_owned(), self.host.id.clone());
        self.with(move |c| async move {
            c.execute(
                "UPDATE leases SET expires_at = now(), holder = holder || ' (released)'
                 WHERE session_id = $1 AND holder = $2 AND epoch = $3",
                &[&session, &holder, &epoch],
            )
            .await
            .map_err(db)?;
            Ok(())
        })
    }

    /// Gives up every lease this host holds (the server stops).
    pub fn release_leases(&self) {
        for (session, _) in self.held.all_held() {
            if let Err(e) = self.release_lease(&session) {
                tracing::warn!("the lease of session {session} stays until it expires: {e}");
            }
        }
    }

    /// Forgets the lease of `session` without touching its row (the session was deleted, its
    /// row with it).
    pub(super) fn forget_lease(&self, session: &str) {
        self.held.forget(session);
    }
}

/// Renews `store`'s leases on a thread of its own, every third of the lease time, until the
/// store is dropped. A renewal that fails (the database unreachable) is logged and tried again
/// at the next tick; the leases it could not renew expire, and their writes are then fenced.
pub fn spawn_renewal(store: Weak<PgStore>) {
    let Some(ttl) = store.upgrade().map(|s| s.host.ttl) else {
        return;
    };
    let every = (ttl / 3).max(Duration::from_millis(50));
    let spawned = std::thread::Builder::new()
        .name("lease-renewal".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(store) = store.upgrade() else {
                    return;
                };
                match store.renew_leases() {
                    Ok(lost) => {
                        for session in lost {
                            tracing::warn!(
                                "lost the lease of session {session} (taken over by another \
                                 host, or gone): this host no longer writes it"
                            );
                        }
                    }
                    Err(e) => tracing::warn!("cannot renew leases (tried again soon): {e}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("lease renewal did not start: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(holder: &str, epoch: i64, live: bool) -> LeaseRow {
        LeaseRow {
            holder: holder.into(),
            epoch,
            live,
        }
    }

    /// Regression: a host took its memory's word that it held a lease with no time limit, so
    /// one that was paused (or cut off from the database) past its lease ran calls for the
    /// session on its laptops after another host had taken it over, until a renewal found it
    /// lost. Past nine tenths of the lease time from the statement that took or renewed it, the
    /// lease is no longer held by memory alone (the database is asked again); its epoch still
    /// fences its writes.
    #[test]
    fn a_lease_is_held_by_memory_only_within_its_time() {
        let held = Held::default();
        let ttl = Duration::from_secs(10);
        let long_ago = Instant::now() - Duration::from_secs(60);
        held.set(
            "s",
            Taken::Held {
                epoch: 3,
                until: held_until(long_ago, ttl),
            },
        );
        assert_eq!(held.held("s"), None);
        assert_eq!(held.epoch("s"), Some(3));
        // A renewal at the epoch held extends it; one of another epoch does not.
        held.renewed("s", 2, held_until(Instant::now(), ttl));
        assert_eq!(held.held("s"), None);
        held.renewed("s", 3, held_until(Instant::now(), ttl));
        assert_eq!(held.held("s"), Some(3));
        assert_eq!(held.all_held(), [("s".to_owned(), 3)]);
        assert!(held_until(long_ago, ttl) < long_ago + ttl);
    }

    #[test]
    fn the_holder_writes_only_at_its_epoch_while_its_lease_is_live() {
        assert_eq!(
            may_write("a", Some(1), Some(&row("a", 1, true)), Write::Record),
            Ok(())
        );
        assert_eq!(
            may_write("a", Some(1), Some(&row("a", 1, false)), Write::Record),
            Err(Fence::Expired)
        );
        assert_eq!(
            may_write("a", Some(1), Some(&row("b", 2, true)), Write::Record),
            Err(Fence::TakenOver { held: 1, now: 2 })
        );
        assert_eq!(
            may_write("a", Some(1), Some(&row("b", 2, false)), Write::Record),
            Err(Fence::TakenOver { held: 1, now: 2 }),
            "a take-over that expired since still fences the old holder"
        );
        assert_eq!(
            may_write("a", Some(1), Some(&row("a", 3, true)), Write::Record),
            Err(Fence::TakenOver { held: 1, now: 3 }),
            "its own later epoch is not the one this write was made under"
        );
        assert_eq!(
            may_write("a", Some(1), None, Write::Record),
            Err(Fence::Expired)
        );
    }

    #[test]
    fn a_bystander_records_but_deletes_only_while_nobody_serves_the_session() {
        for write in [Write::Record, Write::Delete] {
            assert_eq!(may_write("a", None, None, write), Ok(()));
            assert_eq!(
                may_write("a", None, Some(&row("b", 4, false)), write),
                Ok(())
            );
            assert_eq!(
                may_write("a", None, Some(&row("a", 4, true)), write),
                Ok(())
            );
        }
        assert_eq!(
            may_write("a", None, Some(&row("b", 4, true)), Write::Record),
            Ok(())
        );
        assert_eq!(
            may_write("a", None, Some(&row("b", 4, true)), Write::Delete),
            Err(Fence::Elsewhere)
        );
    }
}
