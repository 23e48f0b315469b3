//! Per-user counters: how much of something (connections, calls in flight, bytes in memory) each
//! user holds, against a bound. A slot is taken with [`PerUser::try_acquire`], a varying amount
//! with a [`Held`] ([`PerUser::holder`]); both are given back when dropped, and a user holding
//! nothing takes no room. And per-user locks ([`UserLocks`]): what must be one step for a user
//! (a quota's check and its write) need not wait for another user's long work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// One lock (`T`: a mutex of either kind, or a user's [`Turns`]) per user, made on first use and gone once nobody
/// holds it: one user's long work under it (deleting a workspace of thousands of sessions)
/// holds up only that user's own.
#[derive(Debug)]
pub struct UserLocks<T> {
    live: Mutex<Vec<(String, Weak<T>)>>,
}

impl<T: Default> UserLocks<T> {
    /// `user`'s lock: the one someone holds or waits for, else a new one.
    pub fn of(&self, user: &str) -> Arc<T> {
        self.of_or(user, T::default)
    }
}

impl<T> UserLocks<T> {
    /// No lock yet.
    pub const fn new() -> UserLocks<T> {
        UserLocks {
            live: Mutex::new(Vec::new()),
        }
    }

    /// `user`'s: the one someone holds or waits for, else a new one that `make` makes.
    pub fn of_or(&self, user: &str, make: impl FnOnce() -> T) -> Arc<T> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|(_, lock)| lock.strong_count() > 0);
        if let Some(lock) = live
            .iter()
            .find(|(name, _)| name == user)
            .and_then(|(_, lock)| lock.upgrade())
        {
            return lock;
        }
        let lock = Arc::new(make());
        live.push((user.to_owned(), Arc::downgrade(&lock)));
        lock
    }
}

impl<T: Default> Default for UserLocks<T> {
    fn default() -> Self {
        UserLocks::new()
    }
}

/// Turns per user, `limit` at once: a user's next waits for one of theirs to end, and never
/// for another user's; at most `limit` wait (each holds its request), the next is refused.
#[derive(Debug)]
pub struct Turns {
    limit: usize,
    users: UserLocks<UserTurns>,
}

/// One user's turns, and how many wait for one.
#[derive(Debug)]
struct UserTurns {
    turns: Arc<tokio::sync::Semaphore>,
    waiting: std::sync::atomic::AtomicUsize,
}

impl UserTurns {
    /// Waits for one of these turns.
    async fn turn(user_turns: Arc<UserTurns>) -> Turn {
        let permit = user_turns
            .turns
            .clone()
            .acquire_owned()
            .await
            .expect("a user's turns are never closed");
        Turn {
            _permit: permit,
            _user: user_turns,
        }
    }
}

/// One turn of one user's ([`Turns::take`]); given back when dropped.
#[derive(Debug)]
pub struct Turn {
    _permit: tokio::sync::OwnedSemaphorePermit,
    _user: Arc<UserTurns>,
}

impl Turns {
    /// Turns of `limit` (at least 1) at once per user.
    pub fn new(limit: usize) -> Turns {
        Turns {
            limit: limit.max(1),
            users: UserLocks::new(),
        }
    }

    /// The most turns of one user's at once (and waiting).
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// One user's turns.
    fn of(&self, user: &str) -> Arc<UserTurns> {
        self.users.of_or(user, || UserTurns {
            turns: Arc::new(tokio::sync::Semaphore::new(self.limit)),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Waits for one of `user`'s turns, however many of theirs wait: for work whose waiting is
    /// bounded otherwise (a request that holds a call slot, or one small message of a
    /// connection's bounded streams) and that must not fail for a burst.
    pub async fn wait_for(&self, user: &str) -> Turn {
        UserTurns::turn(self.of(user)).await
    }

    /// Waits for one of `user`'s turns; `None` when `limit` of theirs already wait.
    pub async fn take(&self, user: &str) -> Option<Turn> {
        use std::sync::atomic::Ordering;
        let user_turns = self.of(user);
        let waiting = &user_turns.waiting;
        let room = waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < self.limit).then_some(n + 1)
        });
        if room.is_err() {
            return None;
        }
        // No longer waiting once it has its turn, or once it is dropped before.
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _waiting = Waiting(waiting);
        Some(UserTurns::turn(user_turns.clone()).await)
    }
}

/// Counts per user, each bounded by `limit`.
#[derive(Debug)]
pub struct PerUser {
    limit: usize,
    held: Mutex<HashMap<String, usize>>,
}

impl PerUser {
    /// Counters bounded by `limit` per user.
    pub fn new(limit: usize) -> Arc<PerUser> {
        Arc::new(PerUser {
            limit,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes one of `user`'s slots, or `None` when they hold `limit` already.
    pub fn try_acquire(self: &Arc<Self>, user: &str) -> Option<Slot> {
        self.take(user, 1).then(|| Slot {
            counter: self.clone(),
            user: user.to_owned(),
        })
    }

    /// What `user` will hold a varying amount of, starting at none ([`Held::take`]).
    pub fn holder(self: &Arc<Self>, user: &str) -> Held {
        Held {
            counter: self.clone(),
            user: user.to_owned(),
            taken: Mutex::new(0),
        }
    }

    /// Adds `n` to what `user` holds, unless that would pass the bound.
    fn take(&self, user: &str, n: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let fits = |now: usize| now.checked_add(n).filter(|&after| after <= self.limit);
        match held.get_mut(user) {
            Some(now) => fits(*now).map(|after| *now = after).is_some(),
            // A user holding nothing takes no room.
            None => fits(0)
                .map(|after| {
                    if after > 0 {
                        held.insert(user.to_owned(), after);
                    }
                })
                .is_some(),
        }
    }

    /// Adds `n` to what `user` holds, past the bound if need be.
    fn add(&self, user: &str, n: usize) {
        if n == 0 {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = held.entry(user.to_owned()).or_default();
        *now = now.saturating_add(n);
    }

    /// Takes `n` off what `user` holds.
    fn give_back(&self, user: &str, n: usize) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(now) = held.get_mut(user) {
            *now = now.saturating_sub(n);
            if *now == 0 {
                held.remove(user);
            }
        }
    }

    /// How many slots (or, for a [`Held`] bound, bytes) `user` holds.
    pub fn held(&self, user: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(user).copied().unwrap_or(0)
    }

    /// How many users hold a slot.
    pub fn users(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// One slot of one user; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    counter: Arc<PerUser>,
    user: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counter.give_back(&self.user, 1);
    }
}

/// A varying amount one user holds against a [`PerUser`] bound (the bytes a call's request and
/// answers hold in memory), taken a piece at a time; all of it is given back when dropped.
#[derive(Debug)]
pub struct Held {
    counter: Arc<PerUser>,
    user: String,
    taken: Mutex<usize>,
}

impl Held {
    /// Takes `n` more, or `false` (and takes nothing) when the user's total would pass the
    /// bound.
    pub fn take(&self, n: usize) -> bool {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if !self.counter.take(&self.user, n) {
            return false;
        }
        *taken += n;
        true
    }

    /// Takes `n` more even past the bound: for what must be kept whatever the user holds
    /// (a call's records on their way to the store). The user's next [`Held::take`]s fail
    /// until they are back under it.
    pub fn take_anyway(&self, n: usize) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        self.counter.add(&self.user, n);
        *taken += n;
    }

    /// Gives back `n` of what was taken (what was kept for a while, then let go).
    pub fn give_back(&self, n: usize) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let n = n.min(*taken);
        *taken -= n;
        self.counter.give_back(&self.user, n);
    }

    /// The bound it is held against.
    pub fn limit(&self) -> usize {
        self.counter.limit
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let taken = *self.taken.get_mut().unwrap_or_else(|p| p.into_inner());
        self.counter.give_back(&self.user, taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's turns: `limit` at once, as many waiting (in order), the next refused; another
    /// user's are their own; a waiter that gives up leaves its place.
    #[tokio::test]
    async fn a_users_turns_wait_in_a_bounded_line_of_their_own() {
        let turns = Arc::new(Turns::new(2));
        let held = [turns.take("ana").await, turns.take("ana").await];
        assert!(held.iter().all(Option::is_some));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let turns = turns.clone();
                tokio::spawn(async move { turns.take("ana").await.is_some() })
            })
            .collect();
        // Both in line.
        let line = || {
            let live = turns.users.live.lock().unwrap();
            let (_, ana) = live.iter().find(|(name, _)| name == "ana").unwrap();
            ana.upgrade()
                .unwrap()
                .waiting
                .load(std::sync::atomic::Ordering::SeqCst)
        };
        while line() < 2 {
            tokio::task::yield_now().await;
        }
        assert!(turns.take("ana").await.is_none(), "the line is full");
        assert!(turns.take("ben").await.is_some(), "ben's turns are his");
        drop(held);
        for waiter in waiters {
            assert!(waiter.await.unwrap(), "each waiter has its turn");
        }
        // One that gives up leaves its place.
        let held = [turns.take("ana").await, turns.take("ana").await];
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(50), turns.take("ana"));
        assert!(gave_up.await.is_err());
        assert_eq!(line(), 0);
        // Work whose line is bounded otherwise waits however long the line: not refused, and
        // still one of the user's turns at a time.
        let patient: Vec<_> = (0..5)
            .map(|_| {
                let turns = turns.clone();
                tokio::spawn(async move { drop(turns.wait_for("ana").await) })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            patient.iter().all(|p| !p.is_finished()),
            "they wait for a turn"
        );
        drop(held);
        for waiter in patient {
            waiter.await.unwrap();
        }
    }

    #[test]
    fn a_users_lock_is_theirs_alone_and_goes_when_nobody_holds_it() {
        let locks: UserLocks<Mutex<()>> = UserLocks::new();
        let ana = locks.of("ana");
        assert!(Arc::ptr_eq(&ana, &locks.of("ana")), "the same while held");
        let ben = locks.of("ben");
        let held = ana.lock().unwrap();
        assert!(ben.try_lock().is_ok(), "another user's is free");
        drop(held);
        drop((ana, ben));
        let _new = locks.of("cy");
        assert_eq!(locks.live.lock().unwrap().len(), 1, "the others went");
    }

    #[test]
    fn each_user_is_bounded_alone_and_slots_come_back() {
        let counter = PerUser::new(2);
        let a1 = counter.try_acquire("ana").unwrap();
        let _a2 = counter.try_acquire("ana").unwrap();
        assert!(counter.try_acquire("ana").is_none());
        let b = counter.try_acquire("ben").unwrap();
        assert_eq!((counter.held("ana"), counter.held("ben")), (2, 1));
        drop(a1);
        assert!(counter.try_acquire("ana").is_some());
        drop(b);
        assert_eq!(counter.users(), 1, "a user holding nothing takes no room");
    }

    #[test]
    fn what_is_held_grows_within_the_users_bound_and_all_of_it_comes_back() {
        let bytes = PerUser::new(100);
        let one = bytes.holder("ana");
        let two = bytes.holder("ana");
        assert!(one.take(60));
        assert!(!two.take(41), "over the user's bound together");
        assert!(two.take(40));
        assert_eq!(bytes.held("ana"), 100);
        assert!(
            bytes.holder("ben").take(100),
            "another user's bound is their own"
        );
        two.give_back(30);
        assert_eq!(bytes.held("ana"), 70);
        two.give_back(1_000);
        assert_eq!(bytes.held("ana"), 60, "only what it took");
        assert!(!one.take(usize::MAX), "no overflow");
        drop(one);
        assert_eq!(bytes.held("ana"), 0);
        assert_eq!(bytes.users(), 0);
    }

    #[test]
    fn what_must_be_kept_is_counted_past_the_bound_and_holds_off_the_next() {
        let bytes = PerUser::new(100);
        let records = bytes.holder("ana");
        records.take_anyway(150);
        assert_eq!(bytes.held("ana"), 150);
        assert!(!bytes.holder("ana").take(1), "over the bound: nothing more");
        assert!(
            bytes.holder("ben").take(100),
            "another user's bound is their own"
        );
        drop(records);
        assert_eq!(bytes.held("ana"), 0);
        assert!(bytes.holder("ana").take(100));
    }
}
