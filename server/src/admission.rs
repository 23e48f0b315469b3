//! Admission of connections that have not shown a token yet, on both listeners.
//!
//! A [`Table`] is a pure decision: which connections are held, from which [`Source`], and
//! whether each has proved something ([`Standing`]). It bounds them over all peers and per source,
//! and makes room for a newcomer by evicting the oldest connection that counts for less than it,
//! so that peers who hold connections open without ever authenticating cannot keep others out:
//! they can only keep churning, each time paying for a new handshake.
//!
//! - QUIC ([`Table::handshake`]): every connection that has not said hello. A peer whose address
//!   is not validated is asked to prove it (a QUIC Retry, one round trip) when the server is under
//!   pressure or its source is at its bound, so that Initial packets with a forged source address
//!   take nothing; a validated newcomer evicts its own source's oldest unvalidated connection (a
//!   forged one) before it is refused, and the oldest connection of all when the table is full.
//! - HTTP ([`Table::admit`] with [`Standing::Unverified`], [`Table::promote`] on the first request
//!   that authenticates): every open connection; only connections that never authenticated are
//!   evicted, and a source at its bound is refused.
//!
//! [`Admissions`] is the table shared by a listener's tasks: an admitted connection holds an
//! [`Admitted`] guard, which gives its place back when dropped and says when it was evicted.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Where a connection comes from, for the per-source bound: an IPv4 address, or the /64 prefix
/// of an IPv6 address (one host commonly holds a whole /64). An IPv4 address mapped into IPv6 is
/// the IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    /// The source `ip` belongs to.
    pub fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Source(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Source(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// What a held connection has proved; a connection is only evicted for one that has proved at
/// least as much.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    /// Nothing yet: a QUIC peer whose address is not validated, an HTTP connection that has not
    /// authenticated.
    Unverified,
    /// A QUIC peer that proved it receives at its address (validated by a Retry token), or an
    /// HTTP connection that authenticated with a token.
    Verified,
}

/// The bounds of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections held at most, over all sources.
    pub total: usize,
    /// Connections held at most from one source.
    pub per_source: usize,
}

/// A place in a table.
pub type Ticket = u64;

/// What to do with a newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it in; end the connection `evict` to make room for it.
    Admit {
        /// The newcomer's place.
        ticket: Ticket,
        /// The connection that must go, when one must.
        evict: Option<Ticket>,
        /// Whether the table was under pressure when it came (see [`Table::handshake`]).
        pressure: bool,
    },
    /// Ask it to prove its address first (a QUIC Retry); it takes no place.
    Retry,
    /// Refuse it: its source is at its bound, or the table is full, with nobody it may evict.
    Refuse(Refusal),
}

/// Why a newcomer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds as many connections as it may, none of them evictable for it.
    SourceFull,
    /// The table is full, and no connection in it may be evicted for it.
    Full,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    source: Source,
    standing: Standing,
}

/// The connections held, oldest first (tickets only grow).
#[derive(Debug)]
pub struct Table {
    bounds: Bounds,
    next: Ticket,
    entries: BTreeMap<Ticket, Entry>,
    per_source: HashMap<Source, usize>,
}

impl Table {
    /// An empty table (each bound at least 1).
    pub fn new(bounds: Bounds) -> Table {
        Table {
            bounds: Bounds {
                total: bounds.total.max(1),
                per_source: bounds.per_source.max(1),
            },
            next: 0,
            entries: BTreeMap::new(),
            per_source: HashMap::new(),
        }
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Connections held from `source`.
    pub fn held(&self, source: Source) -> usize {
        self.per_source.get(&source).copied().unwrap_or(0)
    }

    /// A QUIC connection attempt from `source`, whose address is `validated` or not. The table
    /// is under pressure from `pressure_from` pending handshakes on (0: always). An unvalidated
    /// address is asked to prove itself (Retry) under pressure or when its source is at its
    /// bound; otherwise it is admitted as [`Table::admit`] says.
    pub fn handshake(&mut self, source: Source, validated: bool, pressure_from: usize) -> Verdict {
        let pressure = self.len() >= pressure_from;
        if !validated && (pressure || self.held(source) >= self.bounds.per_source) {
            return Verdict::Retry;
        }
        let standing = if validated {
            Standing::Verified
        } else {
            Standing::Unverified
        };
        match self.admit(source, standing) {
            Verdict::Admit { ticket, evict, .. } => Verdict::Admit {
                ticket,
                evict,
                pressure,
            },
            other => other,
        }
    }

    /// A newcomer from `source` with `standing`. At its source's bound, the source's oldest
    /// connection of a lower standing makes room, else it is refused. In a full table, the oldest
    /// connection of the lowest standing makes room when that standing is not above the
    /// newcomer's, else it is refused.
    pub fn admit(&mut self, source: Source, standing: Standing) -> Verdict {
        let evict = if self.held(source) >= self.bounds.per_source {
            match self.oldest(|e| e.source == source && e.standing < standing) {
                Some(victim) => Some(victim),
                None => return Verdict::Refuse(Refusal::SourceFull),
            }
        } else if self.len() >= self.bounds.total {
            let lowest = self.entries.values().map(|e| e.standing).min();
            match lowest.filter(|&lowest| lowest <= standing) {
                Some(lowest) => self.oldest(|e| e.standing == lowest),
                None => return Verdict::Refuse(Refusal::Full),
            }
        } else {
            None
        };
        if let Some(victim) = evict {
            self.release(victim);
        }
        let ticket = self.next;
        self.next += 1;
        self.entries.insert(ticket, Entry { source, standing });
        *self.per_source.entry(source).or_default() += 1;
        Verdict::Admit {
            ticket,
            evict,
            pressure: false,
        }
    }

    /// Raises a held connection's standing (an HTTP connection that authenticated).
    pub fn promote(&mut self, ticket: Ticket, standing: Standing) {
        if let Some(entry) = self.entries.get_mut(&ticket) {
            entry.standing = entry.standing.max(standing);
        }
    }

    /// Gives a place back (nothing when it was evicted already).
    pub fn release(&mut self, ticket: Ticket) {
        let Some(entry) = self.entries.remove(&ticket) else {
            return;
        };
        if let Some(n) = self.per_source.get_mut(&entry.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&entry.source);
            }
        }
    }

    fn oldest(&self, pick: impl Fn(&Entry) -> bool) -> Option<Ticket> {
        self.entries
            .iter()
            .find(|(_, e)| pick(e))
            .map(|(&ticket, _)| ticket)
    }
}

/// A [`Table`] shared by a listener's tasks, with a way to tell an evicted connection to go.
#[derive(Debug)]
pub struct Admissions {
    inner: Mutex<Shared>,
}

#[derive(Debug)]
struct Shared {
    table: Table,
    /// Cancelled when its connection is evicted.
    tokens: HashMap<Ticket, CancellationToken>,
}

/// What became of a newcomer at a shared table.
#[derive(Debug)]
pub enum Outcome {
    /// It holds a place until the guard drops.
    Admitted(Admitted),
    /// Ask it to prove its address first.
    Retry,
    /// Refuse it.
    Refused(Refusal),
}

impl Admissions {
    /// A shared table with `bounds`.
    pub fn new(bounds: Bounds) -> Arc<Admissions> {
        Arc::new(Admissions {
            inner: Mutex::new(Shared {
                table: Table::new(bounds),
                tokens: HashMap::new(),
            }),
        })
    }

    /// [`Table::handshake`], carried out.
    pub fn handshake(
        self: &Arc<Self>,
        source: Source,
        validated: bool,
        pressure_from: usize,
    ) -> Outcome {
        self.decide(|table| table.handshake(source, validated, pressure_from))
    }

    /// [`Table::admit`], carried out.
    pub fn admit(self: &Arc<Self>, source: Source, standing: Standing) -> Outcome {
        self.decide(|table| table.admit(source, standing))
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.lock().table.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn decide(self: &Arc<Self>, verdict: impl FnOnce(&mut Table) -> Verdict) -> Outcome {
        let mut shared = self.lock();
        match verdict(&mut shared.table) {
            Verdict::Admit {
                ticket,
                evict,
                pressure,
            } => {
                if let Some(victim) = evict
                    && let Some(token) = shared.tokens.remove(&victim)
                {
                    token.cancel();
                }
                let evicted = CancellationToken::new();
                shared.tokens.insert(ticket, evicted.clone());
                Outcome::Admitted(Admitted {
                    admissions: self.clone(),
                    ticket,
                    evicted,
                    pressure,
                })
            }
            Verdict::Retry => Outcome::Retry,
            Verdict::Refuse(why) => Outcome::Refused(why),
        }
    }
}

/// A connection's place in an [`Admissions`] table, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    admissions: Arc<Admissions>,
    ticket: Ticket,
    evicted: CancellationToken,
    pressure: bool,
}

impl Admitted {
    /// Resolves when the connection was evicted to make room for another.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await
    }

    /// Whether it was evicted.
    pub fn is_evicted(&self) -> bool {
        self.evicted.is_cancelled()
    }

    /// Whether the table was under pressure when it was admitted.
    pub fn under_pressure(&self) -> bool {
        self.pressure
    }

    /// Raises its standing (it authenticated): it is no longer evicted for newcomers that have
    /// not.
    pub fn promote(&self, standing: Standing) {
        self.admissions.lock().table.promote(self.ticket, standing);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut shared = self.admissions.lock();
        shared.table.release(self.ticket);
        shared.tokens.remove(&self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(n: u8) -> Source {
        Source::of(IpAddr::V4(Ipv4Addr::new(192, 0, 2, n)))
    }

    fn admitted(verdict: Verdict) -> (Ticket, Option<Ticket>) {
        match verdict {
            Verdict::Admit { ticket, evict, .. } => (ticket, evict),
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn ipv6_addresses_of_one_64_prefix_are_one_source_and_mapped_ipv4_is_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        assert_eq!(Source::of(a).to_string(), "2001:db8:1:2::/64");
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(Source::of(mapped), v4(7));
    }

    #[test]
    fn one_source_never_holds_more_than_its_bound_and_others_still_get_in() {
        let mut table = Table::new(Bounds {
            total: 8,
            per_source: 2,
        });
        admitted(table.admit(v4(1), Standing::Verified));
        admitted(table.admit(v4(1), Standing::Verified));
        assert_eq!(
            table.admit(v4(1), Standing::Verified),
            Verdict::Refuse(Refusal::SourceFull)
        );
        assert_eq!(table.held(v4(1)), 2);
        let (_, evict) = admitted(table.admit(v4(2), Standing::Unverified));
        assert_eq!(evict, None);
    }

    #[test]
    fn a_validated_newcomer_evicts_its_sources_oldest_unvalidated_connection_first() {
        let mut table = Table::new(Bounds {
            total: 8,
            per_source: 2,
        });
        // Forged Initials in a victim's name hold its source's places...
        let (forged, _) = admitted(table.handshake(v4(1), false, 8));
        admitted(table.handshake(v4(1), false, 8));
        // ...an unvalidated third is asked to prove its address...
        assert_eq!(table.handshake(v4(1), false, 8), Verdict::Retry);
        // ...and, proved, takes the oldest forged one's place.
        let (_, evict) = admitted(table.handshake(v4(1), true, 8));
        assert_eq!(evict, Some(forged));
        assert_eq!(table.held(v4(1)), 2);
    }

    #[test]
    fn a_full_table_evicts_its_oldest_lowest_connection_for_a_newcomer() {
        let mut table = Table::new(Bounds {
            total: 4,
            per_source: 4,
        });
        let (first, _) = admitted(table.admit(v4(1), Standing::Verified));
        let (unverified, _) = admitted(table.admit(v4(2), Standing::Unverified));
        admitted(table.admit(v4(3), Standing::Verified));
        admitted(table.admit(v4(4), Standing::Verified));
        // The unverified one goes first, though it is not the oldest.
        let (_, evict) = admitted(table.admit(v4(5), Standing::Verified));
        assert_eq!(evict, Some(unverified));
        // Then the oldest of the verified.
        let (_, evict) = admitted(table.admit(v4(6), Standing::Verified));
        assert_eq!(evict, Some(first));
        assert_eq!(table.len(), 4);
        // An unverified newcomer may not evict verified connections.
        assert_eq!(
            table.admit(v4(7), Standing::Unverified),
            Verdict::Refuse(Refusal::Full)
        );
    }

    #[test]
    fn under_pressure_only_validated_addresses_get_in() {
        let mut table = Table::new(Bounds {
            total: 8,
            per_source: 8,
        });
        for n in 0..3 {
            match table.handshake(v4(n), false, 3) {
                Verdict::Admit { pressure, .. } => assert!(!pressure),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(table.handshake(v4(9), false, 3), Verdict::Retry);
        match table.handshake(v4(9), true, 3) {
            Verdict::Admit { pressure, .. } => assert!(pressure),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            table.handshake(v4(10), false, 0),
            Verdict::Retry,
            "0: always"
        );
    }

    #[test]
    fn places_come_back_and_a_promoted_connection_is_not_evicted_for_unverified_ones() {
        let mut table = Table::new(Bounds {
            total: 2,
            per_source: 2,
        });
        let (a, _) = admitted(table.admit(v4(1), Standing::Unverified));
        let (b, _) = admitted(table.admit(v4(1), Standing::Unverified));
        table.promote(a, Standing::Verified);
        let (_, evict) = admitted(table.admit(v4(2), Standing::Unverified));
        assert_eq!(
            evict,
            Some(b),
            "the unverified one went, not the promoted one"
        );
        table.release(a);
        table.release(a);
        assert_eq!(table.len(), 1);
        assert_eq!(table.held(v4(1)), 0);
    }

    #[tokio::test]
    async fn an_evicted_guard_is_told_and_a_dropped_one_gives_its_place_back() {
        let shared = Admissions::new(Bounds {
            total: 1,
            per_source: 1,
        });
        let Outcome::Admitted(first) = shared.admit(v4(1), Standing::Unverified) else {
            panic!("admitted")
        };
        let Outcome::Admitted(second) = shared.admit(v4(2), Standing::Unverified) else {
            panic!("admitted")
        };
        first.evicted().await;
        assert!(!second.is_evicted());
        drop(first);
        assert_eq!(
            shared.len(),
            1,
            "an evicted guard's drop frees nothing more"
        );
        drop(second);
        assert!(shared.is_empty());
    }
}
