//! Per-user counters: how many of something (connections, calls in flight) each user holds,
//! against a bound. A slot is taken with [`PerUser::try_acquire`] and given back when dropped;
//! a user holding nothing takes no room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(user.to_owned()).or_default();
        if *n >= self.limit {
            if *n == 0 {
                held.remove(user);
            }
            return None;
        }
        *n += 1;
        Some(Slot {
            counter: self.clone(),
            user: user.to_owned(),
        })
    }

    /// How many slots `user` holds.
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
        let mut held = self.counter.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
